"""The client-facing HTTP API of the core service."""
