"""Medusa-1 training (frozen target): conversations -> the target's final states -> heads -> FasterDecoding layout."""
