"""MTP training (frozen target): conversations -> the target's final states -> MTP layers -> DeepSeek-V3 layout."""
