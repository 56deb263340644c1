"""Quotas per member on the client API: token buckets for writes and for searches. (The daily
cap on notes is taken by the statement that writes the note: ``repository/member_daily_notes``.)

Rates are per minute with a burst (the bucket's capacity): the defaults (600 writes and 600
searches a minute, burst 200) let a member import 100 notes in a second. 0 turns a limit off.
Buckets live in ``core.rate_bucket`` (``pinlog_platform/token_bucket.py``), so every replica
shares them; each check is its own short transaction before the request's own. The limiter
fails open: when the database refuses the bucket write (read-only, unavailable), the request
goes on and the failure is counted, so a read-only spell does not also stop reads.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import RateLimitedError
from core_service.metrics import CoreMetrics
from pinlog_platform import token_bucket

logger = logging.getLogger(__name__)

BUCKET_TABLE = "core.rate_bucket"


class QuotaKind(StrEnum):
    WRITE = "write"
    SEARCH = "search"


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    """Per member: writes and searches per minute (0 = off) and the burst."""

    writes_per_minute: int
    searches_per_minute: int
    burst: int


class MemberQuotas:
    def __init__(self, engine: AsyncEngine, settings: QuotaSettings, metrics: CoreMetrics) -> None:
        self._engine = engine
        self._settings = settings
        self._metrics = metrics

    async def admit(self, member_id: int, kind: QuotaKind) -> None:
        """Take one token of ``member_id``'s ``kind`` bucket; ``RateLimitedError`` (429 with
        ``Retry-After``) when it is empty. Returns at once when the limit is off."""
        per_minute = (
            self._settings.writes_per_minute
            if kind is QuotaKind.WRITE
            else self._settings.searches_per_minute
        )
        if per_minute <= 0 or self._settings.burst <= 0:
            return
        try:
            async with self._engine.begin() as conn:
                taken = await token_bucket.take(
                    conn,
                    table=BUCKET_TABLE,
                    bucket_key=f"{kind.value}:{member_id}",
                    rate_per_second=per_minute / 60,
                    capacity=self._settings.burst,
                )
        except Exception as exc:  # fail open (module docstring)
            self._count(kind.value, "failed_open")
            logger.warning("member quota not checked (%s); request admitted", type(exc).__name__)
            return
        if not taken.granted:
            self._count(kind.value, "limited")
            raise RateLimitedError(taken.retry_after_seconds)
        self._count(kind.value, "admitted")

    def _count(self, kind: str, outcome: str) -> None:
        self._metrics.member_quota.labels(kind, outcome).inc()
