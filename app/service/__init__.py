"""Service layer: decides what repository facts mean and orchestrates providers (§3, §4)."""
