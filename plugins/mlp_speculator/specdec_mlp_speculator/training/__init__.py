"""``specdec train mlp-speculator``: IBM's first training stage on the core loop."""
