"""The offline demo behind ``make run``: plays the core side against a real worker (§9)."""
