"""Core service logic: lifecycle transactions, dispatch, rescan, reads, search, tokens."""
