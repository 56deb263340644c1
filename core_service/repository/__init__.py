"""Core repositories: one module per table, each statement a named ``text()`` constant."""
