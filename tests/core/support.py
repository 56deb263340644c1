"""Read-only facts about core and ai rows, for assertions in core-service tests, and the one
builder of a known mix of rows for the status figures (``STATUS_MIX``, ``SPEND_MIX``)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.repository import embedding_switch
from tests.core.harness import bearer
from tests.worker.harness import PROFILE
from tests.worker.open_transactions import lock_waiters_reach
from tests.worker.support import make_embedding

T = TypeVar("T")


@dataclass(frozen=True)
class StateRow:
    embedding_status: str
    keyword_status: str
    retry_count: int
    updated_at: datetime
    rescanned_at: datetime | None
    user_id: int | None
    record_id: int | None

    @property
    def statuses(self) -> tuple[str, str]:
        return self.embedding_status, self.keyword_status


@dataclass(frozen=True)
class ContextRow:
    record_id: int
    member_id: int
    body: str
    origin_created_at: datetime
    created_at: datetime
    deleted: bool


async def state(engine: AsyncEngine, context_id: int) -> StateRow | None:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT embedding_status, keyword_status, retry_count, updated_at, "
                    "rescanned_at, user_id, record_id FROM ai.context_ai_state "
                    "WHERE context_id = :id"
                ),
                {"id": context_id},
            )
        ).one_or_none()
    return None if row is None else StateRow(*row)


async def created_and_completed(core, engine: AsyncEngine, member_id: int, body: str, place: str):
    """A note created through ``core``'s client API (its JSON answer), once both its stages
    are ``COMPLETED`` by the worker (polls the database: there is no event to wait on)."""
    created = (await core.create(member_id, body, place=place)).json()
    async with asyncio.timeout(15):
        while (await state(engine, created["contextId"])).statuses != (  # noqa: ASYNC110
            "COMPLETED",
            "COMPLETED",
        ):
            await asyncio.sleep(0.05)
    return created


async def context(engine: AsyncEngine, context_id: int) -> ContextRow | None:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT record_id, member_id, body, origin_created_at, created_at, "
                    "deleted_at IS NOT NULL FROM core.context WHERE id = :id"
                ),
                {"id": context_id},
            )
        ).one_or_none()
    return None if row is None else ContextRow(*row)


async def embedding_deleted(engine: AsyncEngine, context_id: int) -> bool | None:
    """``is_deleted`` of the context's vector; ``None`` when there is none."""
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text("SELECT is_deleted FROM ai.context_embedding WHERE context_id = :id"),
                {"id": context_id},
            )
        ).scalar_one_or_none()


async def public_id(engine: AsyncEngine, record_id: int) -> str:
    """The record's public id, as stored."""
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text("SELECT public_id FROM core.record WHERE id = :id"), {"id": record_id}
            )
        ).scalar_one()


async def count(engine: AsyncEngine, sql: str, **params: object) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text(sql), params)).scalar_one())


async def invariant_violations(engine: AsyncEngine) -> dict[str, int]:
    """Counts of states the lifecycle must never leave behind (all zero when sound)."""
    checks = {
        "live_context_under_deleted_record": (
            "SELECT count(*) FROM core.context c JOIN core.record r ON r.id = c.record_id "
            "WHERE c.deleted_at IS NULL AND r.deleted_at IS NOT NULL"
        ),
        "deleted_context_not_cancelled": (
            "SELECT count(*) FROM core.context c JOIN ai.context_ai_state s "
            "ON s.context_id = c.id WHERE c.deleted_at IS NOT NULL "
            "AND (s.embedding_status <> 'CANCELLED' OR s.keyword_status <> 'CANCELLED')"
        ),
        "live_vector_under_cancelled_state": (
            "SELECT count(*) FROM ai.context_embedding e JOIN ai.context_ai_state s "
            "ON s.context_id = e.context_id WHERE e.is_deleted = false "
            "AND s.embedding_status = 'CANCELLED'"
        ),
        "active_record_without_active_context": (
            "SELECT count(*) FROM core.record r WHERE r.deleted_at IS NULL AND NOT EXISTS "
            "(SELECT 1 FROM core.context c WHERE c.record_id = r.id AND c.deleted_at IS NULL)"
        ),
        "two_active_records_for_one_place": (
            "SELECT count(*) FROM (SELECT member_id, place_id FROM core.record "
            "WHERE deleted_at IS NULL GROUP BY 1, 2 HAVING count(*) > 1) AS d"
        ),
        "retry_count_above_three": "SELECT count(*) FROM ai.context_ai_state WHERE retry_count > 3",
    }
    return {name: await count(engine, sql) for name, sql in checks.items()}


async def backdate(engine: AsyncEngine, context_id: int, seconds: float) -> None:
    """Move ``updated_at`` and ``rescanned_at`` into the past, as time passing would."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET "
                "updated_at = updated_at - make_interval(secs => :s), "
                "rescanned_at = rescanned_at - make_interval(secs => :s) "
                "WHERE context_id = :id"
            ),
            {"id": context_id, "s": float(seconds)},
        )


# (member, record deleted, context deleted, embedding, keyword, retry_count, seconds ago) of
# the known mix; member 2 is withdrawn; the rows of REPROCESSED_MIX_ROWS were sent back by a
# reprocess (keyword_reprocess_version set). The expected status is STATUS_OF_MIX (or
# STATUS_OF_MIX_ON_THE_FIRST: ``build_status_mix`` returns the one of the database's day).
STATUS_MIX = (
    (1, False, False, "COMPLETED", "COMPLETED", 0, 50),
    (1, False, False, "COMPLETED", "COMPLETED", 1, 50),
    (1, False, False, "PENDING", "PENDING", 0, 100),  # backlog
    (1, False, False, "PROCESSING", "PENDING", 0, 10),  # in flight: not backlog
    (1, False, False, "PROCESSING", "PENDING", 0, 700),  # past the expiry: backlog, the lag
    (1, False, False, "COMPLETED", "PENDING", 0, 5),  # backlog (keyword next)
    (1, False, False, "COMPLETED", "FAILED", 3, 3600),  # failed within 24 h (retries_exhausted)
    (1, False, False, "FAILED", "FAILED", 0, 2 * 86400),  # failed before
    (1, False, False, "FAILED", "FAILED", 0, 60),  # two within 24 h: input_too_long + unknown
    (1, False, True, "CANCELLED", "CANCELLED", 0, 60),  # deleted context: not live
    (1, True, False, "PENDING", "PENDING", 0, 5000),  # deleted record: not live
    (2, False, False, "PENDING", "PENDING", 0, 9000),  # withdrawn member: not live
    (1, False, False, "COMPLETED", "PENDING", 0, 9000),  # reprocess waiting: no backlog, no lag
    (1, False, False, "COMPLETED", "PROCESSING", 0, 10),  # reprocess running
    (1, False, False, "COMPLETED", "FAILED", 0, 2 * 86400),  # reprocess failed (days ago)
    (1, False, False, "COMPLETED", "COMPLETED", 0, 50),  # reprocessed, judged again
)
REPROCESSED_MIX_ROWS = frozenset({12, 13, 14, 15})
STATUS_OF_MIX = {
    "paused": True,
    "stages": {
        "embedding": {"PENDING": 1, "PROCESSING": 2, "COMPLETED": 8, "FAILED": 2, "CANCELLED": 0},
        "keyword": {"PENDING": 5, "PROCESSING": 1, "COMPLETED": 3, "FAILED": 4, "CANCELLED": 0},
    },
    "backlog": 3,
    "lag_seconds": 700,  # about: the database clock moves meanwhile
    "coverage": round(3 / 13, 6),
    "failed_24h": {"input_too_long": 1, "retries_exhausted": 1, "unknown": 1},
    "retry_count": {"0": 11, "1": 1, "2": 0, "3": 1},
    # per_1000_contexts: divided by the 3 live contexts whose keyword stage completed (50 s
    # ago: rows 1, 2 and 16; the deleted, failed and waiting ones are not counted).
    "spend": {
        "today": {
            "usd": 0.0003,
            "tokens": 3200,
            "calls": 6,
            "unpriced_tokens": 500,
            "per_1000_contexts": {"tokens": 1066667, "usd": 0.1},
        },
        "month": {
            "usd": 0.0004,
            "tokens": 9200,
            "calls": 20,
            "unpriced_tokens": 1500,
            "per_1000_contexts": {"tokens": 3066667, "usd": 0.133333},
        },
    },
    # failed_context_ids: the failed reprocess's id (assert_status_of_mix checks it apart)
    "reprocess": {"pending": 1, "processing": 1, "failed": 1},
}
# On the first day of a month its earlier rows are today's.
STATUS_OF_MIX_ON_THE_FIRST = {
    **STATUS_OF_MIX,
    "spend": {period: STATUS_OF_MIX["spend"]["month"] for period in ("today", "month")},
}
# The line of ``pinlog-core status`` for the spend of STATUS_OF_MIX, and on the first.
SPEND_LINE = (
    "spend:         today $0.000300 (3200 tokens, 500 unpriced), "
    "this month $0.000400 (9200 tokens, 1500 unpriced)"
)
SPEND_LINE_ON_THE_FIRST = (
    "spend:         today $0.000400 (9200 tokens, 1500 unpriced), "
    "this month $0.000400 (9200 tokens, 1500 unpriced)"
)
# The line of the cost per 1,000 contexts of STATUS_OF_MIX, and on the first.
PER_1000_LINE = (
    "per 1,000:     today $0.100000 (1066667 tokens), this month $0.133333 (3066667 tokens) "
    "(contexts whose keyword stage completed)"
)
PER_1000_LINE_ON_THE_FIRST = (
    "per 1,000:     today $0.133333 (3066667 tokens), this month $0.133333 (3066667 tokens) "
    "(contexts whose keyword stage completed)"
)

# The UTC day on the database clock, as the workers' ledger writes it, and days before it.
LEDGER_DAYS = {
    "today": "(now() AT TIME ZONE 'UTC')::date",
    "month_start": "date_trunc('month', now() AT TIME ZONE 'UTC')::date",
    "last_month": "date_trunc('month', now() AT TIME ZONE 'UTC')::date - 1",
}
# (day of LEDGER_DAYS, provider, model, stage, calls, prompt, completion, embedding tokens,
# cost_usd) of the mix's provider usage ledger; "local-judge" has no price (cost NULL).
SPEND_MIX = (
    ("today", "embedding", "text-embedding-3-small", "embedding", 3, 0, 0, 1500, "0.00003"),
    ("today", "judge", "gpt-4o-mini", "keyword", 2, 1000, 200, 0, "0.00027"),
    ("today", "judge", "local-judge", "keyword", 1, 400, 100, 0, None),
    ("month_start", "embedding", "text-embedding-3-small", "search", 10, 0, 0, 5000, "0.0001"),
    ("month_start", "judge", "local-judge", "probe", 4, 800, 200, 0, None),
    ("last_month", "judge", "gpt-4o-mini", "keyword", 50, 100000, 20000, 0, "0.027"),
    ("last_month", "judge", "local-judge", "keyword", 7, 7000, 700, 0, None),
)


async def build_status_mix(engine: AsyncEngine) -> dict[str, object]:
    """Write ``STATUS_MIX`` (members 1 and 2, a place and a record per row), pause, and write
    ``SPEND_MIX``; return the status it reads as today (``STATUS_OF_MIX``, or
    ``STATUS_OF_MIX_ON_THE_FIRST`` on the first day of a UTC month)."""
    async with engine.begin() as conn:
        await conn.execute(
            text("INSERT INTO core.member (id, deleted_at) VALUES (1, NULL), (2, now())")
        )
        for index, row in enumerate(STATUS_MIX):
            member, record_deleted, deleted, embedding, keyword, retries, ago = row
            place_id = (
                await conn.execute(
                    text(
                        "INSERT INTO core.place (external_place_id, name) "
                        "VALUES (:place, '카페') RETURNING id"
                    ),
                    {"place": f"mix-{index}"},
                )
            ).scalar_one()
            record_id = (
                await conn.execute(
                    text(
                        "INSERT INTO core.record (member_id, place_id, deleted_at) VALUES "
                        "(:m, :p, CASE WHEN :d THEN now() END) RETURNING id"
                    ),
                    {"m": member, "p": place_id, "d": record_deleted},
                )
            ).scalar_one()
            context_id = (
                await conn.execute(
                    text(
                        "INSERT INTO core.context (record_id, member_id, body, deleted_at) "
                        "VALUES (:r, :m, '메모', CASE WHEN :d THEN now() END) RETURNING id"
                    ),
                    {"r": record_id, "m": member, "d": deleted},
                )
            ).scalar_one()
            await conn.execute(
                text(
                    "INSERT INTO ai.context_ai_state (context_id, embedding_status, "
                    "keyword_status, retry_count, updated_at, user_id, record_id, "
                    "keyword_reprocess_version) VALUES "
                    "(:c, :e, :k, :n, now() - make_interval(secs => :ago), :m, :r, :v)"
                ),
                {"c": context_id, "e": embedding, "k": keyword, "n": retries, "ago": float(ago),
                 "m": member, "r": record_id,
                 "v": 2 if index + 1 in REPROCESSED_MIX_ROWS else None},
            )  # fmt: skip
        await conn.execute(
            text("INSERT INTO core.dispatch_control (singleton, paused) VALUES (true, true)")
        )
        # Reasons (0010_stage_failure_reasons.sql): one each on rows 7 and 9; the rest unknown.
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET keyword_failure = 'retries_exhausted' "
                "WHERE keyword_status = 'FAILED' AND retry_count = 3"
            )
        )
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET embedding_failure = 'input_too_long' "
                "WHERE embedding_status = 'FAILED' AND updated_at > now() - interval '1 hour'"
            )
        )
        for day, *row, cost in SPEND_MIX:
            await conn.execute(
                text(
                    "INSERT INTO ai.provider_usage_daily (day, provider, model, stage, calls, "
                    "prompt_tokens, completion_tokens, embedding_tokens, cost_usd) VALUES "
                    f"({LEDGER_DAYS[day]}, :p, :m, :s, :n, :pt, :ct, :et, CAST(:usd AS numeric))"
                ),
                dict(zip(("p", "m", "s", "n", "pt", "ct", "et"), row, strict=True), usd=cost),
            )
        first_of_month = f"SELECT {LEDGER_DAYS['today']} = {LEDGER_DAYS['month_start']}"
        first = (await conn.execute(text(first_of_month))).scalar_one()
    return STATUS_OF_MIX_ON_THE_FIRST if first else STATUS_OF_MIX


def assert_status_of_mix(status: dict[str, object], expected: dict[str, object]) -> None:
    """``status`` is the JSON of the mix: exactly the keys and figures of ``expected`` (what
    ``build_status_mix`` returned; the lag about 700 s; the failed reprocess's id apart)."""
    assert list(status) == list(expected)
    assert abs(status["lag_seconds"] - expected["lag_seconds"]) < 30
    reprocess = dict(status["reprocess"])
    assert len(reprocess.pop("failed_context_ids")) == 1
    assert {k: v for k, v in status.items() if k not in ("lag_seconds", "reprocess")} == {
        k: v for k, v in expected.items() if k not in ("lag_seconds", "reprocess")
    }
    assert reprocess == expected["reprocess"]


def spend_line(expected: dict[str, object]) -> str:
    """The text status line of the mix's spend, for ``expected`` of ``build_status_mix``."""
    return SPEND_LINE_ON_THE_FIRST if expected is STATUS_OF_MIX_ON_THE_FIRST else SPEND_LINE


def per_1000_line(expected: dict[str, object]) -> str:
    """The text status line of the mix's cost per 1,000 contexts (``build_status_mix``)."""
    first = expected is STATUS_OF_MIX_ON_THE_FIRST
    return PER_1000_LINE_ON_THE_FIRST if first else PER_1000_LINE


async def make_judged(
    engine: AsyncEngine,
    *,
    context_id: int,
    user_id: int,
    record_id: int,
    profile: str,
    preset_version: int | None = 1,
    keyword_ids: tuple[int, ...] = (),
    keyword_status: str = "COMPLETED",
) -> None:
    """What the worker leaves for a context of the core: its vector of ``profile``, both
    stages ``COMPLETED`` (or the keyword stage as given), the keyword rows and the analysis row
    of a judgment with list ``preset_version`` (``None``: no analysis row)."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO ai.context_embedding (context_id, user_id, record_id, embedding, "
                "embedding_profile) VALUES (:id, :u, :r, :v, :p)"
            ),
            {"id": context_id, "u": user_id, "r": record_id, "p": profile,
             "v": [1.0] + [0.0] * 1535},
        )  # fmt: skip
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET embedding_status = 'COMPLETED', "
                "keyword_status = :k, embedding_attempt = 1, keyword_attempt = 1, "
                "updated_at = now() WHERE context_id = :id"
            ),
            {"id": context_id, "k": keyword_status},
        )
        for keyword_id in keyword_ids:
            await conn.execute(
                text(
                    "INSERT INTO ai.context_keyword (context_id, keyword_id, confidence, "
                    "preset_version) VALUES (:id, :k, 0.9, :v)"
                ),
                {"id": context_id, "k": keyword_id, "v": preset_version or 1},
            )
        if preset_version is not None:
            await conn.execute(
                text(
                    "INSERT INTO ai.context_keyword_analysis (context_id, preset_version, "
                    "model_profile) VALUES (:id, :v, 'fake-judge')"
                ),
                {"id": context_id, "v": preset_version},
            )


# The core's record of the last dispatch a worker took (0096): written by the dispatcher's
# background counting whenever a dispatch settles, so a snapshot taken around another
# statement leaves it out.
DISPATCH_RECORD_COLUMNS = frozenset(
    {"last_dispatch_at", "last_dispatch_worker", "last_dispatch_outcome"}
)


async def state_rows(engine: AsyncEngine) -> dict[int, tuple]:
    """Every state row as a tuple of all its columns but ``DISPATCH_RECORD_COLUMNS``, by
    context id (to compare snapshots)."""
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT * FROM ai.context_ai_state ORDER BY context_id"))
        kept = [i for i, name in enumerate(rows.keys()) if name not in DISPATCH_RECORD_COLUMNS]
        return {row.context_id: tuple(row[i] for i in kept) for row in rows}


# The lifecycle operations that cancel a context (one of member 1's, on its record), over HTTP.
LIFECYCLE_OPERATIONS = {
    "delete_context": lambda client, record_id, context_id: client.delete(
        f"/api/v1/contexts/{context_id}", headers=bearer(1)
    ),
    "modify_context": lambda client, record_id, context_id: client.put(
        f"/api/v1/contexts/{context_id}", json={"body": "고친 메모"}, headers=bearer(1)
    ),
    "delete_record": lambda client, record_id, context_id: client.delete(
        f"/api/v1/records/{record_id}", headers=bearer(1)
    ),
    "withdraw_member": lambda client, record_id, context_id: client.delete(
        "/api/v1/members/me", headers=bearer(1)
    ),
}


# --- the embedding-profile switch (0060, 0061) -----------------------------------------------

TARGET = "local-use-multilingual-v3-512-cosine-v1"
THIRD = "other-model-1536-cosine-v1"


async def created(core, body: str, *, member: int = 1, place: str = "place-1") -> tuple[int, int]:
    """A note saved through the core's API: (record id, context id)."""
    response = await core.create(member, body, place=place)
    assert response.status_code in (200, 201), response.text
    return response.json()["recordId"], response.json()["contextId"]


async def judged(core, engine, body: str, *, place: str, profile: str = PROFILE, **kw) -> int:
    """A note whose stages completed with a vector of ``profile``; its context id."""
    record_id, context_id = await created(core, body, place=place)
    await make_judged(
        engine, context_id=context_id, user_id=1, record_id=record_id, profile=profile, **kw
    )
    return context_id


async def add_vector(engine, context_id: int, profile: str, *, hidden: bool = False) -> None:
    """A vector of ``profile`` for the context (``hidden``: ``is_deleted``), as a worker of
    that profile saves it."""
    note = await context(engine, context_id)
    await make_embedding(
        engine,
        context_id=context_id,
        user_id=note.member_id,
        record_id=note.record_id,
        profile=profile,
        is_deleted=hidden,
    )


async def vector_profiles(engine, context_ids: list[int]) -> dict[int, list[str]]:
    """``{context_id: [profile, ...]}``: the profiles of each context's live vectors, sorted."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT context_id, embedding_profile FROM ai.context_embedding "
                "WHERE context_id = ANY(CAST(:ids AS bigint[])) AND NOT is_deleted "
                "ORDER BY 1, 2"
            ),
            {"ids": list(context_ids)},
        )
        found: dict[int, list[str]] = {context_id: [] for context_id in context_ids}
        for context_id, profile in rows:
            found[context_id].append(profile)
        return found


async def set_backfill_completed(engine, profile: str, context_id: int) -> None:
    """The context's backfill row of ``profile`` COMPLETED (made if missing), as a worker of
    that profile leaves it after saving the vector."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO ai.context_embedding_backfill (embedding_profile, context_id, "
                "status) VALUES (:p, :id, 'COMPLETED') "
                "ON CONFLICT (embedding_profile, context_id) DO UPDATE SET status = 'COMPLETED'"
            ),
            {"p": profile, "id": context_id},
        )


async def backfill_rows(engine, profile: str) -> dict[int, tuple[str, bool]]:
    """``{context_id: (status, sent)}`` of ``profile``'s backfill rows."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT context_id, status, requested_at IS NOT NULL AS sent "
                "FROM ai.context_embedding_backfill WHERE embedding_profile = :p"
            ),
            {"p": profile},
        )
        return {row.context_id: (row.status, row.sent) for row in rows}


async def switch_row(engine):
    async with engine.connect() as conn:
        return await embedding_switch.read(conn)


async def _generation(conn) -> int | None:
    row = await embedding_switch.read(conn)
    return None if row is None else row.generation


async def switch_start(conn, *, in_use: str = PROFILE, target: str = TARGET, rate: int = 50):
    """``embedding_switch.start`` from the row as it is now."""
    return await embedding_switch.start(
        conn, in_use=in_use, target=target, rate=rate, generation=await _generation(conn)
    )


async def switch_cut_over(conn, *, force: bool = True):
    """``embedding_switch.cut_over`` of the row as it is now (``force``: coverage aside)."""
    row = await embedding_switch.read(conn)
    if row is None or row.other_profile is None:
        return None
    return await embedding_switch.cut_over(
        conn, generation=row.generation, target=row.other_profile, force=force
    )


async def switch_roll_back(conn):
    """``embedding_switch.roll_back`` of the row as it is now."""
    generation = await _generation(conn)
    if generation is None:
        return None
    return await embedding_switch.roll_back(conn, generation=generation)


async def switch_finish(conn, *, force: bool = False, window_seconds: float = 0.0):
    """``embedding_switch.finish`` of the row as it is now."""
    row = await embedding_switch.read(conn)
    if row is None:
        return None
    return await embedding_switch.finish(
        conn,
        generation=row.generation,
        in_use=row.profile_in_use,
        force=force,
        window_seconds=window_seconds,
    )


async def racing_behind_the_switch_row(engine, calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Run ``calls`` at once, each queued on the switch row that another transaction holds
    (``FOR UPDATE``) until all of them wait, then released; their results, in order."""
    async with engine.connect() as blocker:
        blocking = await blocker.begin()
        await blocker.execute(text("SELECT 1 FROM core.embedding_switch FOR UPDATE"))
        racing = [asyncio.create_task(call) for call in calls]
        await lock_waiters_reach(engine, len(calls))
        await blocking.rollback()
        return await asyncio.wait_for(asyncio.gather(*racing), 10)
