"""PinLog AI worker: advances ``ai.*`` state rows, stores embeddings and keywords (§0)."""
