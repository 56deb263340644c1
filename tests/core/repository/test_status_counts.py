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
from tests.core.support import assert_status_of_mix, build_status_mix, per_1000_line, spend_line
from tests.worker.harness import sample_value

PROCESSING_EXPIRY_SECONDS = 600
PERIODS = ("today", "month")


async def test_the_status_of_a_known_mix_is_exact(engine):
    expected = await build_status_mix(engine)

    report = await read_status(engine, processing_expiry_seconds=PROCESSING_EXPIRY_SECONDS)

    assert_status_of_mix(report.as_json(), expected)
    assert "PAUSED" in report.as_text()
    assert spend_line(expected) in report.as_text().splitlines()
    assert per_1000_line(expected) in report.as_text().splitlines()


async def test_the_cost_per_1000_contexts_counts_completions_of_the_period_only(engine):
    """A keyword stage completed before today counts in the month's divisor, not today's; one
    completed before this month in neither."""
    await build_status_mix(engine)
    async with engine.begin() as conn:
        ids = (
            await conn.execute(text("SELECT context_id FROM ai.context_ai_state ORDER BY 1"))
        ).scalars()
        row_1, row_2, *_ = ids
        # Row 1 completed yesterday (UTC), row 2 in the previous month.
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET updated_at = CASE context_id "
                "WHEN :row_1 THEN ((now() AT TIME ZONE 'UTC')::date - 1)::timestamp "
                "AT TIME ZONE 'UTC' + interval '1 hour' "
                "ELSE (date_trunc('month', now() AT TIME ZONE 'UTC') - interval '1 day') "
                "AT TIME ZONE 'UTC' END WHERE context_id IN (:row_1, :row_2)"
            ),
            {"row_1": row_1, "row_2": row_2},
        )
        first = (
            await conn.execute(text("SELECT extract(day FROM now() AT TIME ZONE 'UTC') = 1"))
        ).scalar_one()

    spend = (await read_status(engine, processing_expiry_seconds=600)).as_json()["spend"]

    # Today: row 16 only. The month: rows 16 and 1 (row 1 is last month's on the first).
    today, month = spend["today"], spend["month"]
    assert today["per_1000_contexts"]["tokens"] == today["tokens"] * 1000
    assert month["per_1000_contexts"]["tokens"] == round(
        month["tokens"] * 1000 / (1 if first else 2)
    )
    assert month["per_1000_contexts"]["usd"] == round(month["usd"] * 1000 / (1 if first else 2), 6)


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
        # No context completed: no cost per 1,000 (null, not 0).
        "spend": {
            period: {
                "usd": 0.0,
                "tokens": 0,
                "calls": 0,
                "unpriced_tokens": 0,
                "per_1000_contexts": None,
            }
            for period in PERIODS
        },
        "reprocess": {"pending": 0, "processing": 0, "failed": 0, "failed_context_ids": []},
    }
    lines = report.as_text().splitlines()
    assert "spend:         today $0.000000 (0 tokens), this month $0.000000 (0 tokens)" in lines
    assert (
        "per 1,000:     today n/a (no context completed), this month n/a (no context "
        "completed) (contexts whose keyword stage completed)"
    ) in lines


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
