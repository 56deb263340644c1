"""Embedding and judge providers. No database imports (STYLE: data flows one way)."""
