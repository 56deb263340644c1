"""The status figures over a known mix of rows (docs/operations.md "Status"): exact counts for
every key, live contexts only, today's and this month's spend from the ledger (last month's rows
left out, unpriced tokens named), and the gauges set from the same statement."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from sqlalchemy import text

from core_service.metrics import CoreMetrics
from core_service.repository.status_counts import STATUS_COUNTS, UNKNOWN_REASON
from core_service.service.status import StatusGauges, read_status
from tests.core.support import assert_status_of_mix, build_status_mix, spend_line
from tests.worker.harness import sample_value

PROCESSING_EXPIRY_SECONDS = 600
PERIODS = ("today", "month")


async def test_the_status_of_a_known_mix_is_exact(engine):
    expected = await build_status_mix(engine)

    report = await read_status(engine, processing_expiry_seconds=PROCESSING_EXPIRY_SECONDS)

    assert_status_of_mix(report.as_json(), expected)
    assert "PAUSED" in report.as_text()
    assert spend_line(expected) in report.as_text().splitlines()


async def test_the_spend_reads_this_months_rows_by_the_primary_key(engine):
    """The ledger's month is one range of its primary key (``day`` first): with sequential
    scans off, the plan reads it through the key with a condition on ``day``."""
    await build_status_mix(engine)
    async with engine.connect() as conn:
        await conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(
            (
                await conn.execute(
                    text("EXPLAIN " + STATUS_COUNTS.text),
                    {
                        "processing_expiry_seconds": float(PROCESSING_EXPIRY_SECONDS),
                        "unknown_reason": UNKNOWN_REASON,
                    },
                )
            ).scalars()
        )
        await conn.rollback()

    assert "provider_usage_daily_pkey" in plan
    assert "Index Cond: (day >= (date_trunc('month'" in plan


async def test_an_empty_database_reads_as_nothing_waiting(engine):
    report = await read_status(engine, processing_expiry_seconds=PROCESSING_EXPIRY_SECONDS)

    assert report.as_json() == {
        "paused": False,
        "stages": {
            stage: dict.fromkeys(("PENDING", "PROCESSING", "COMPLETED", "FAILED", "CANCELLED"), 0)
            for stage in ("embedding", "keyword")
        },
        "backlog": 0,
        "lag_seconds": 0.0,
        "coverage": 1.0,
        "failed_24h": {},
        "retry_count": {"0": 0, "1": 0, "2": 0, "3": 0},
        "spend": {
            period: {"usd": 0.0, "tokens": 0, "calls": 0, "unpriced_tokens": 0}
            for period in PERIODS
        },
        "reprocess": {"pending": 0, "processing": 0, "failed": 0, "failed_context_ids": []},
    }
    assert "spend:         today $0.000000 (0 tokens), this month $0.000000 (0 tokens)" in (
        report.as_text().splitlines()
    )


async def test_the_gauges_come_from_one_refresh_with_its_duration(engine):
    expected = await build_status_mix(engine)
    metrics = CoreMetrics()
    gauges = StatusGauges(
        engine, metrics, processing_expiry_seconds=PROCESSING_EXPIRY_SECONDS, period_seconds=60
    )

    await gauges.refresh_once()

    text = generate_latest(metrics.registry).decode()
    assert sample_value(text, "pinlog_core_dispatch_paused") == 1
    assert sample_value(text, "pinlog_core_backlog_contexts") == 3
    assert sample_value(text, "pinlog_core_coverage_ratio") == pytest.approx(3 / 13, abs=1e-6)
    assert sample_value(text, "pinlog_core_lag_seconds") == pytest.approx(700, abs=30)
    assert sample_value(text, "pinlog_core_failed_stages_24h", reason="unknown") == 1
    assert sample_value(text, "pinlog_core_failed_stages_24h", reason="input_too_long") == 1
    assert sample_value(text, "pinlog_core_live_retry_count", retry_count="3") == 1
    assert sample_value(text, "pinlog_core_live_stages", stage="keyword", status="FAILED") == 4
    for state in ("pending", "processing", "failed"):
        assert sample_value(text, "pinlog_core_reprocess_contexts", state=state) == 1
    assert sample_value(text, "pinlog_core_status_query_seconds_count") == 1
    spend = {p: sample_value(text, "pinlog_core_provider_spend_usd", period=p) for p in PERIODS}
    assert spend == pytest.approx({p: expected["spend"][p]["usd"] for p in PERIODS})
