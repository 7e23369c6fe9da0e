"""Training-side tooling shared by the drafter plugins (data synthesis first)."""
