"""The unit of work the API hands to the pipeline (§3)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProcessRequest:
    """One validated ``POST /internal/v1/context/process`` body; ids are 1..2^63-1."""

    context_id: int
    user_id: int
    record_id: int
    text: str
