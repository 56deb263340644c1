"""The HTTP serving settings both services have, declared once (prefix per service).

A part (a pydantic model) that each service's settings class inherits, so ``PINLOG_`` and
``PINLOG_CORE_`` read the same fields with the same bounds. The limits are enforced by
``pinlog_platform.http.server`` (head size and deadline, connections, keep-alive) and
``pinlog_platform.http.request_deadline`` (the whole request); docs/deployment.md ("Limits").
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class HttpServingSettings(BaseModel):
    """Durations in seconds, sizes in bytes."""

    request_timeout_seconds: float = Field(
        default=10.0, gt=0, description="Overall deadline of one HTTP request; then 503"
    )
    limit_concurrency: int = Field(
        default=900, ge=1, description="Open connections and requests at once; beyond, 503"
    )
    max_header_bytes: int = Field(
        default=16384, ge=1024, le=1024 * 1024, description="Larger request heads answer 431"
    )
    head_timeout: float = Field(
        default=10.0, gt=0, description="Seconds to receive a request head; then closed"
    )
    timeout_keep_alive: int = Field(
        default=30, ge=1, description="Seconds an idle keep-alive connection stays open"
    )
