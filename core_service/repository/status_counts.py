"""Counts over live contexts and the provider spend, for ``pinlog-core status`` and the core's
gauges, in one statement.

A live context is not deleted, on an active record of an active member (its note can still be
read and searched). Its state row says how far the AI got: the stage counts, the backlog (the
stage that would run next is ``PENDING``, or ``PROCESSING`` past the processing expiry: work no
worker holds), the lag (the oldest ``updated_at`` among rows with a stage ``PENDING`` or
``PROCESSING``: how long that stage has waited, not the note's age), the stages ``FAILED`` in
the last 24 hours by reason (``pinlog_platform.contract.states.failure_reasons``), and
``retry_count``.

Rows a preset reclassification sent back (``keyword_reprocess_version`` set, keyword stage
``PENDING`` or ``PROCESSING``: ``pinlog-core reprocess keywords``) are not new work: they are
left out of the backlog and the lag and counted on their own, by keyword status, with the
reprocesses that ended ``FAILED`` (those keep showing their previous keywords) and the first
of their ids. The stage counts and the coverage count every live row as it is.
Stage columns come from ``STAGE_ORDER`` and ``Status``: the statement is built once, at import.

The same statement reads the provider spend from ``ai.provider_usage_daily`` (the workers'
ledger, 0030; read by the core's role since 0041): per period of ``SPEND_PERIODS`` (today and
this month, UTC days on the database clock, the day rule of ``app/repository/usage_ledger.py``)
the calls, the tokens (prompt + completion + embedding), the estimated cost in USD (the sum of
``cost_usd`` over the rows that have one) and the tokens of rows without a cost (models with no
price): a cost with unpriced tokens beside it is a lower bound. This month's rows are one range
of the primary key, whose first column is ``day``. Beside each period's spend it counts the
live contexts whose keyword stage (the last) is ``COMPLETED`` with its last change in the
period (``updated_at`` from the period's first UTC midnight): the divisor of the cost per 1,000
contexts. A context deleted since is not counted, and one reprocessed since counts in the
period of its last completion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from core_service.repository.context_ai_state import NEXT_STAGE_SQL
from core_service.repository.dispatch_control import PAUSED_SQL
from core_service.settings import RETRY_COUNT_CEILING
from pinlog_platform.contract.states import STAGE_ORDER, Stage, Status
from pinlog_platform.contract.states.failure_reasons import FAILURE_COLUMNS, FailureReason

# The reason of a FAILED stage without one (a row failed before the reasons existed).
UNKNOWN_REASON = FailureReason.UNKNOWN.value
FAILED_WINDOW_HOURS = 24

_UNFINISHED = "('PENDING', 'PROCESSING')"
_STAGE_COUNTS = ",\n".join(
    f"count(*) FILTER (WHERE {stage.status_column} = '{status}') AS {stage.label}_{status.lower()}"
    for stage in STAGE_ORDER
    for status in Status
)
_RETRY_COUNTS = ",\n".join(
    f"count(*) FILTER (WHERE retry_count = {n}) AS retry_{n}"
    for n in range(RETRY_COUNT_CEILING + 1)
)
_ANY_UNFINISHED = " OR ".join(f"{stage.status_column} IN {_UNFINISHED}" for stage in STAGE_ORDER)
_ALL_COMPLETED = " AND ".join(f"{stage.status_column} = 'COMPLETED'" for stage in STAGE_ORDER)
# A keyword stage a reprocess sent back (core_service/repository/keyword_reprocess.py).
_REPROCESSED = "keyword_reprocess_version IS NOT NULL"
_REPROCESSING = f"({_REPROCESSED} AND keyword_status IN {_UNFINISHED})"
# How many ids of failed reprocesses the status lists.
FAILED_REPROCESS_EXAMPLES = 10
# (status, reason) of every stage of a live row, for the failures by reason.
_STAGE_FAILURES = ", ".join(
    f"({stage.status_column}, coalesce({FAILURE_COLUMNS[stage.status_column]}, "
    "CAST(:unknown_reason AS text)))"
    for stage in STAGE_ORDER
)

# The ledger's UTC day on the database clock (app/repository/usage_ledger.py) and its month.
_TODAY = "(now() AT TIME ZONE 'UTC')::date"
_MONTH_START = "date_trunc('month', now() AT TIME ZONE 'UTC')::date"
# Which of this month's ledger rows (``spent``, in STATUS_COUNTS) each spend period sums.
SPEND_PERIODS = {"today": "spent.today", "month": "true"}
# The first instant of each spend period (a UTC midnight), for the contexts completed in it.
_PERIOD_STARTS = {"today": _TODAY, "month": _MONTH_START}
_KEYWORD_STATUS = Stage.KEYWORD.status_column
_COMPLETED_IN_PERIOD = ",\n".join(
    f"count(*) FILTER (WHERE {_KEYWORD_STATUS} = 'COMPLETED' "
    f"AND updated_at >= ({start})::timestamp AT TIME ZONE 'UTC') AS completed_{period}"
    for period, start in _PERIOD_STARTS.items()
)
_SPEND = ",\n".join(
    f"""'{period}', jsonb_build_object(
            'calls', coalesce(sum(calls) FILTER (WHERE {rows}), 0),
            'tokens', coalesce(sum(tokens) FILTER (WHERE {rows}), 0),
            'usd', coalesce(sum(cost_usd) FILTER (WHERE {rows}), 0)::text,
            'unpriced_tokens', coalesce(sum(tokens) FILTER (WHERE {rows} AND cost_usd IS NULL), 0)
        )"""
    for period, rows in SPEND_PERIODS.items()
)

# The quoted words of STATUS_COUNTS that are not statuses (the ledger's time zone and the spend
# object's keys): tests/platform/test_stage_vocabulary.py holds every other quoted word to the
# status vocabulary, so a misspelt status still fails there.
NON_STATUS_LITERALS = frozenset(
    {"UTC", "month", *SPEND_PERIODS, "calls", "tokens", "usd", "unpriced_tokens"}
)

# Every figure of the status over live contexts (module docstring), one scan of them, and the
# spend of this month's ledger rows.
STATUS_COUNTS = text(
    f"""
    WITH live AS MATERIALIZED (
        SELECT {", ".join(f"s.{stage.status_column}" for stage in STAGE_ORDER)},
               {", ".join(f"s.{FAILURE_COLUMNS[stage.status_column]}" for stage in STAGE_ORDER)},
               s.retry_count, s.updated_at, s.context_id, s.keyword_reprocess_version
        FROM core.context AS c
        JOIN core.record AS r ON r.id = c.record_id
        JOIN core.member AS m ON m.id = c.member_id
        JOIN ai.context_ai_state AS s ON s.context_id = c.id
        WHERE c.deleted_at IS NULL AND r.deleted_at IS NULL AND m.deleted_at IS NULL
    ),
    failed AS (
        SELECT stage.reason FROM live, LATERAL (VALUES {_STAGE_FAILURES}) AS stage(status, reason)
        WHERE stage.status = 'FAILED'
          AND live.updated_at > now() - make_interval(hours => {FAILED_WINDOW_HOURS})
    )
    SELECT
        {PAUSED_SQL} AS paused,
        count(*) AS live,
        {_STAGE_COUNTS},
        count(*) FILTER (WHERE {_ALL_COMPLETED}) AS completed,
        count(*) FILTER (
            WHERE NOT {_REPROCESSING} AND ({NEXT_STAGE_SQL} = 'PENDING'
               OR {NEXT_STAGE_SQL} = 'PROCESSING'
                  AND updated_at < now() - make_interval(secs => :processing_expiry_seconds))
        ) AS backlog,
        coalesce(
            extract(epoch FROM now() - min(updated_at) FILTER (
                WHERE ({_ANY_UNFINISHED}) AND NOT {_REPROCESSING})), 0
        )::float8 AS lag_seconds,
        count(*) FILTER (WHERE {_REPROCESSED} AND keyword_status = 'PENDING')
            AS reprocess_pending,
        count(*) FILTER (WHERE {_REPROCESSED} AND keyword_status = 'PROCESSING')
            AS reprocess_processing,
        count(*) FILTER (WHERE {_REPROCESSED} AND keyword_status = 'FAILED')
            AS reprocess_failed,
        coalesce((array_agg(context_id ORDER BY context_id)
                  FILTER (WHERE {_REPROCESSED} AND keyword_status = 'FAILED'))
                 [1:{FAILED_REPROCESS_EXAMPLES}], CAST(ARRAY[] AS bigint[]))
            AS reprocess_failed_ids,
        {_RETRY_COUNTS},
        {_COMPLETED_IN_PERIOD},
        (SELECT coalesce(jsonb_object_agg(reason, n), jsonb_build_object())
         FROM (SELECT reason, count(*) AS n FROM failed GROUP BY reason) AS f) AS failed_24h,
        (SELECT jsonb_build_object({_SPEND})
         FROM (SELECT day = {_TODAY} AS today, calls, cost_usd,
                      prompt_tokens + completion_tokens + embedding_tokens AS tokens
               FROM ai.provider_usage_daily WHERE day >= {_MONTH_START}) AS spent) AS spend
    FROM live
    """  # noqa: S608 (names from Stage, Status and SPEND_PERIODS only; values are bound)
)


@dataclass(frozen=True, slots=True)
class Spend:
    """The ledger's figures of one period: provider calls, tokens, the estimated cost in USD
    of the priced rows, and the tokens of rows without a price (not in ``usd``); ``contexts``:
    the live contexts whose keyword stage completed in the period."""

    calls: int
    tokens: int
    usd: Decimal
    unpriced_tokens: int
    contexts: int = 0


@dataclass(frozen=True, slots=True)
class StatusCounts:
    """The figures of ``STATUS_COUNTS``; ``stages[stage][status]`` over live contexts;
    ``reprocess`` the keyword stages a reprocess sent back, by ``pending``, ``processing`` and
    ``failed``, with the first ``FAILED_REPROCESS_EXAMPLES`` failed ids."""

    paused: bool
    live: int
    stages: dict[Stage, dict[Status, int]]
    completed: int
    backlog: int
    lag_seconds: float
    failed_24h: dict[str, int]
    retry_counts: dict[int, int]
    spend: dict[str, Spend]  # by period of SPEND_PERIODS
    reprocess: dict[str, int] = field(default_factory=dict)
    reprocess_failed_ids: tuple[int, ...] = ()


async def read(conn: AsyncConnection, *, processing_expiry_seconds: float) -> StatusCounts:
    params = {
        "processing_expiry_seconds": float(processing_expiry_seconds),
        "unknown_reason": UNKNOWN_REASON,
    }
    row = (await conn.execute(STATUS_COUNTS, params)).mappings().one()
    return StatusCounts(
        paused=bool(row["paused"]),
        live=int(row["live"]),
        stages={
            stage: {status: int(row[f"{stage.label}_{status.lower()}"]) for status in Status}
            for stage in STAGE_ORDER
        },
        completed=int(row["completed"]),
        backlog=int(row["backlog"]),
        lag_seconds=float(row["lag_seconds"]),
        failed_24h={str(k): int(v) for k, v in row["failed_24h"].items()},
        retry_counts={n: int(row[f"retry_{n}"]) for n in range(RETRY_COUNT_CEILING + 1)},
        spend={
            period: Spend(
                calls=int(row["spend"][period]["calls"]),
                tokens=int(row["spend"][period]["tokens"]),
                usd=Decimal(row["spend"][period]["usd"]),
                unpriced_tokens=int(row["spend"][period]["unpriced_tokens"]),
                contexts=int(row[f"completed_{period}"]),
            )
            for period in SPEND_PERIODS
        },
        reprocess={
            state: int(row[f"reprocess_{state}"]) for state in ("pending", "processing", "failed")
        },
        reprocess_failed_ids=tuple(int(i) for i in row["reprocess_failed_ids"]),
    )
