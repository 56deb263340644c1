"""What an operator sees: ``pinlog-core status`` and the core's gauges (docs/operations.md).

``read_status`` runs the one statement of ``repository.status_counts`` and shapes it as the
command prints it; ``StatusGauges`` runs it periodically in every core process (never per
scrape) and sets the gauges of ``CoreMetrics`` from it, timing the statement itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import CoreError
from core_service.metrics import CoreMetrics
from core_service.repository import context_search, provider_batches, status_counts
from core_service.repository.db import autocommit
from pinlog_platform.contract.states import Status

logger = logging.getLogger(__name__)

# The keys of ``reprocess`` counted, each a series of ``pinlog_core_reprocess_contexts``.
REPROCESS_STATES = ("pending", "processing", "failed")


@dataclass(frozen=True, slots=True)
class StatusReport:
    """The status of the live contexts and the provider spend (``repository.status_counts``);
    ``spend[period]`` for ``today`` and ``month``: ``usd`` (rounded to 6 decimals, the priced
    rows only), ``tokens``, ``calls``, ``unpriced_tokens`` (tokens of models without a price,
    not in ``usd``) and ``per_1000_contexts``: ``{"tokens", "usd"}`` of the period × 1,000 ÷
    the live contexts whose keyword stage completed in the period (tokens rounded to a whole
    token, usd to 6 decimals), ``None`` (JSON null) when none completed: no divisor, not a
    cost of 0."""

    paused: bool
    stages: dict[str, dict[str, int]]
    backlog: int
    lag_seconds: float
    coverage: float
    failed_24h: dict[str, int]
    retry_count: dict[str, int]
    spend: dict[str, dict[str, Any]]
    reprocess: dict[str, object]
    # {"indexed", "total"} live contexts (docs/operations.md); None where not read (gauges).
    search_index: dict[str, int] | None = None
    # {"submitted", "in_progress", "completed", "failed", "items"}: the provider batches of
    # every profile (docs/operations.md "Backfill via the Batch API"); None where not read.
    batches: dict[str, int] | None = None

    @classmethod
    def from_counts(
        cls,
        counts: status_counts.StatusCounts,
        search_index: dict[str, int] | None = None,
        batches: dict[str, int] | None = None,
    ) -> StatusReport:
        return cls(
            paused=counts.paused,
            stages={
                stage.label: {status.value: n for status, n in by_status.items()}
                for stage, by_status in counts.stages.items()
            },
            backlog=counts.backlog,
            lag_seconds=round(counts.lag_seconds, 3),
            # No live context: nothing is missing.
            coverage=round(counts.completed / counts.live, 6) if counts.live else 1.0,
            failed_24h=dict(sorted(counts.failed_24h.items())),
            retry_count={str(n): count for n, count in sorted(counts.retry_counts.items())},
            spend={
                period: {
                    "usd": round(float(spend.usd), 6),
                    "tokens": spend.tokens,
                    "calls": spend.calls,
                    "unpriced_tokens": spend.unpriced_tokens,
                    "per_1000_contexts": _per_1000_contexts(spend),
                }
                for period, spend in counts.spend.items()
            },
            reprocess={
                **counts.reprocess,
                "failed_context_ids": list(counts.reprocess_failed_ids),
            },
            search_index=search_index,
            batches=batches,
        )

    def as_json(self) -> dict[str, object]:
        """Exactly the keys of docs/operations.md "Status"; ``reprocess`` is
        ``{"pending", "processing", "failed", "failed_context_ids"}``, ``spend`` is
        ``{"today": {...}, "month": {...}}``, ``search_index`` ``{"indexed", "total"}`` (when
        read), ``batches`` ``{"submitted", "in_progress", "completed", "failed", "items"}``
        (when read)."""
        search_index = {} if self.search_index is None else {"search_index": self.search_index}
        batches = {} if self.batches is None else {"batches": self.batches}
        return {
            "paused": self.paused,
            "stages": self.stages,
            "backlog": self.backlog,
            "lag_seconds": self.lag_seconds,
            "coverage": self.coverage,
            "failed_24h": self.failed_24h,
            "retry_count": self.retry_count,
            "spend": self.spend,
            "reprocess": self.reprocess,
            **search_index,
            **batches,
        }

    def as_text(self) -> str:
        """A few lines for people."""
        statuses = [status.value for status in Status]
        width = max(len(stage) for stage in self.stages) + 2
        header = " " * width + " ".join(f"{status:>10}" for status in statuses)
        rows = [
            f"{stage:<{width}}" + " ".join(f"{counts[s]:>10}" for s in statuses)
            for stage, counts in self.stages.items()
        ]
        failed = ", ".join(f"{reason} {n}" for reason, n in self.failed_24h.items()) or "none"
        retries = ", ".join(f"{k}: {n}" for k, n in self.retry_count.items())
        today, month = (_spent(self.spend[period]) for period in ("today", "month"))
        reprocess = self.reprocess
        failed_ids = ", ".join(str(i) for i in reprocess["failed_context_ids"])
        return "\n".join(
            [
                f"dispatch:      {'PAUSED' if self.paused else 'running'}",
                f"backlog:       {self.backlog} context(s) waiting for a worker",
                f"lag:           {self.lag_seconds:.1f} s",
                f"coverage:      {self.coverage * 100:.1f} % of live contexts with every stage "
                "COMPLETED",
                f"failed (24 h): {failed}",
                f"retry_count:   {retries}",
                f"spend:         today {today}, this month {month}",
                "per 1,000:     today "
                f"{_per_1000(self.spend['today'])}, this month {_per_1000(self.spend['month'])} "
                "(contexts whose keyword stage completed)",
                f"reprocess:     {reprocess['pending']} waiting, {reprocess['processing']} "
                f"running, {reprocess['failed']} failed (showing their previous keywords)"
                + (f": {failed_ids}" if failed_ids else ""),
                *(
                    [
                        f"search index:  {self.search_index['indexed']} of "
                        f"{self.search_index['total']} live contexts indexed (`pinlog-core "
                        "reindex search` indexes the rest)"
                    ]
                    if self.search_index is not None
                    else []
                ),
                "stages of live contexts:",
                header,
                *rows,
            ]
        )


def _per_1000_contexts(spend: status_counts.Spend) -> dict[str, float | int] | None:
    if not spend.contexts:
        return None
    return {
        "tokens": round(spend.tokens * 1000 / spend.contexts),
        "usd": round(float(spend.usd * 1000 / spend.contexts), 6),
    }


def _spent(spend: dict[str, Any]) -> str:
    """``$usd (N tokens)``, and ``, U unpriced`` when U of the tokens are of models without a
    price (not in ``usd``)."""
    unpriced = f", {spend['unpriced_tokens']} unpriced" if spend["unpriced_tokens"] else ""
    return f"${spend['usd']:.6f} ({spend['tokens']} tokens{unpriced})"


def _per_1000(spend: dict[str, Any]) -> str:
    """``$usd (N tokens)`` per 1,000 contexts, or ``n/a`` when no context completed."""
    per = spend["per_1000_contexts"]
    if not isinstance(per, dict):
        return "n/a (no context completed)"
    return f"${per['usd']:.6f} ({per['tokens']} tokens)"


async def read_status(
    engine: AsyncEngine,
    *,
    processing_expiry_seconds: float,
    analyser_version: str | None = None,
) -> StatusReport:
    """The status now; with ``analyser_version`` (the command, not the gauges) also the
    search index's coverage under it and the provider batches, two more statements. Raises
    ``UnavailableError`` if the database is down."""
    async with autocommit(engine) as conn:
        counts = await status_counts.read(conn, processing_expiry_seconds=processing_expiry_seconds)
        search_index = batches = None
        if analyser_version is not None:
            indexed, total = await context_search.index_coverage(
                conn, analyser_version=analyser_version
            )
            search_index = {"indexed": indexed, "total": total}
            batches = (await provider_batches.counts(conn, profile=None)).as_json()
    return StatusReport.from_counts(counts, search_index, batches)


class StatusGauges:
    """Refreshes the status gauges every ``period_seconds`` from one statement."""

    def __init__(
        self,
        engine: AsyncEngine,
        metrics: CoreMetrics,
        *,
        processing_expiry_seconds: float,
        period_seconds: float,
    ) -> None:
        self._engine = engine
        self._metrics = metrics
        self._processing_expiry_seconds = processing_expiry_seconds
        self._period_seconds = period_seconds

    async def refresh_once(self) -> StatusReport:
        started = time.perf_counter()
        report = await read_status(
            self._engine, processing_expiry_seconds=self._processing_expiry_seconds
        )
        self._metrics.status_query_seconds.observe(time.perf_counter() - started)
        self._set(report)
        return report

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Refresh until ``stop``; a failed refresh keeps the last values and is logged."""
        while not stop.is_set():
            try:
                await self.refresh_once()
            except CoreError as exc:
                logger.warning("status gauges not refreshed (%s)", type(exc).__name__)
            except Exception:
                logger.exception("status gauges refresh failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._period_seconds)

    def _set(self, report: StatusReport) -> None:
        metrics = self._metrics
        metrics.paused.set(1 if report.paused else 0)
        for stage, counts in report.stages.items():
            for status, n in counts.items():
                metrics.live_stages.labels(stage, status).set(n)
        metrics.backlog.set(report.backlog)
        metrics.lag.set(report.lag_seconds)
        metrics.coverage.set(report.coverage)
        metrics.failed_24h.clear()
        for reason, n in report.failed_24h.items():
            metrics.failed_24h.labels(reason).set(n)
        for retries, n in report.retry_count.items():
            metrics.retry_counts.labels(retries).set(n)
        for period, spend in report.spend.items():
            metrics.provider_spend.labels(period).set(spend["usd"])
        for state in REPROCESS_STATES:
            metrics.reprocess_contexts.labels(state).set(report.reprocess[state])
        metrics.status_refreshed.set_to_current_time()
