"""The unit of work the API hands to the pipeline (§3)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ProcessRequest:
    """One validated ``POST /internal/v1/context/process`` body; ids are 1..2^63-1."""

    context_id: int
    user_id: int
    record_id: int
    text: str
    # The trace of the request that queued it (``pinlog_platform.tracing.current_context``),
    # continued by the pool task that runs it; ``None`` without tracing.
    trace_context: Any = field(default=None, compare=False, repr=False)
