"""The request body limit a worker may be configured to (``PINLOG_MAX_REQUEST_BYTES``), in
bytes: the worker's settings enforce it, and the core believes a ``maxRequestBytes`` that a
worker's ``/readyz`` reports only within it (a value outside would cut every backfill batch to
nothing and fail notes for a fault that is not theirs)."""

MIN_REQUEST_BYTES = 1024
MAX_REQUEST_BYTES = 16 * 1024 * 1024
