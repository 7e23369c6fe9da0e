"""EAGLE-3 training: conversations -> (optional dump of target states) -> TTT training -> export."""
