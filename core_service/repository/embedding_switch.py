"""The embedding-profile switch: ``core.embedding_switch`` (0061) and the backfill rows the
core proposes (``ai.context_embedding_backfill``, 0060); docs/operations.md "Switching the
embedding profile", docs/contract.md §1 and §5 (Deviations).

A **live context** is one whose note, record and member are not deleted and whose state row
is not ``CANCELLED``. **Coverage** of a profile: the live contexts with a vector of it that is
not hidden. Each statement here is run alone (autocommit) unless its function says otherwise;
none locks a state row, so none takes part in the lock order of docs/lock-order.md.

Every **move** of the switch (start, cutover, rollback, finish, the backfill loop's move out of
``rolling_back``; 0062) is one statement that names the ``generation`` its command read and
re-checks, in its WHERE clause, the invariant the move protects; it returns nothing (and
changes nothing) when the row changed meanwhile or the invariant does not hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Live contexts (module docstring), aliased s (state) and c (context): a FROM and WHERE.
# The switch's own states, quoted by its statements (not stage statuses), and the encoding of
# the digest (VOUCH_STATE_ROWS).
NON_STATUS_LITERALS = frozenset({"idle", "backfilling", "cut_over", "rolling_back", "UTF8"})

_LIVE_CONTEXTS = """
    FROM ai.context_ai_state AS s
    JOIN core.context AS c ON c.id = s.context_id
    JOIN core.record AS r ON r.id = c.record_id
    JOIN core.member AS m ON m.id = c.member_id
    WHERE c.deleted_at IS NULL AND r.deleted_at IS NULL AND m.deleted_at IS NULL
      AND s.embedding_status <> 'CANCELLED'
"""

# A live vector of context s under :profile exists; the same under :in_use.
_HAS_VECTOR = """EXISTS (SELECT 1 FROM ai.context_embedding AS e
                  WHERE e.context_id = s.context_id AND e.embedding_profile = :profile
                    AND NOT e.is_deleted)"""
_HAS_IN_USE_VECTOR = """EXISTS (SELECT 1 FROM ai.context_embedding AS e
                  WHERE e.context_id = s.context_id AND e.embedding_profile = :in_use
                    AND NOT e.is_deleted)"""

_SWITCH_COLUMNS = """profile_in_use, other_profile, state, rate_per_second, started_at,
                     cut_over_at, generation, via,
                     extract(epoch FROM now() - updated_at) AS changed_seconds_ago"""

READ_SWITCH = text("SELECT " + _SWITCH_COLUMNS + " FROM core.embedding_switch WHERE id = 1")

# The profile in use, the switch row share-locked until the transaction ends: a cutover or
# rollback (an UPDATE of the row) waits for it, so what the transaction writes under that
# profile commits before the profile changes. No row: none recorded (the configured one).
LOCK_PROFILE_IN_USE = text(
    "SELECT profile_in_use FROM core.embedding_switch WHERE id = 1 FOR SHARE"
)

# Every move of the switch (0062): only from the generation the command read, which it
# advances; updated_at is when the switch last changed (the profile cache window counts from
# it).
_MOVED = "generation = generation + 1, updated_at = now()"

# Live contexts lacking a live vector of :profile whose backfill of it did not end FAILED
# (EXISTS over _LIVE_CONTEXTS): what keeps a profile from being complete.
_UNCOVERED = (
    """EXISTS (SELECT 1"""
    + _LIVE_CONTEXTS
    + """ AND NOT """
    + _HAS_VECTOR
    + """
      AND NOT EXISTS (SELECT 1 FROM ai.context_embedding_backfill AS f
                      WHERE f.embedding_profile = :profile AND f.context_id = s.context_id
                        AND f.status = 'FAILED'))"""
)
# The same, among live contexts whose embedding stage is COMPLETED, under :in_use; a FAILED
# backfill of :in_use excuses a context only when :force.
_IN_USE_GAP = (
    """EXISTS (SELECT 1"""
    + _LIVE_CONTEXTS
    + """ AND s.embedding_status = 'COMPLETED' AND NOT """
    + _HAS_IN_USE_VECTOR
    + """
      AND NOT (CAST(:force AS boolean) AND EXISTS (
          SELECT 1 FROM ai.context_embedding_backfill AS f
          WHERE f.embedding_profile = :in_use AND f.context_id = s.context_id
            AND f.status = 'FAILED')))"""
)

# No live context's embedding stage that began before the profile cache window after the
# switch (w) last changed is still open: one dispatched by a process acting on its cached
# profile may yet be embedded under that profile alone. (Its state row is written when the
# stage is created, claimed or put back, so an open stage older than that was sent before
# every process saw the change.)
_NO_STAGE_OPEN_FROM_BEFORE = (
    """NOT EXISTS (SELECT 1"""
    + _LIVE_CONTEXTS
    + """ AND s.embedding_status IN ('PENDING', 'PROCESSING')
      AND s.updated_at < w.updated_at + make_interval(secs => :window_seconds))"""
)

# Begin backfilling :target beside the profile in use (:in_use when no row exists yet);
# only from idle at :generation (NULL: no row was read, so an existing row refuses), never to
# the profile in use (no row is proposed then: the table's CHECK would refuse it before the
# conflict is seen). Returns the row as it is after the statement, or nothing when refused.
# :via (sync or batch, 0115) is how the rows the start proposes are sent.
START_SWITCH = text(
    """
    INSERT INTO core.embedding_switch AS w
        (id, profile_in_use, other_profile, state, rate_per_second, started_at, next_batch_at,
         via)
    SELECT 1, CAST(:in_use AS varchar), CAST(:target AS varchar), 'backfilling',
           CAST(:rate AS int), now(), now(), CAST(:via AS varchar)
    WHERE CAST(:in_use AS varchar) <> CAST(:target AS varchar)
    ON CONFLICT (id) DO UPDATE SET
        other_profile = EXCLUDED.other_profile,
        state = 'backfilling',
        rate_per_second = EXCLUDED.rate_per_second,
        via = EXCLUDED.via,
        started_at = now(),
        cut_over_at = NULL,
        next_batch_at = now(),
        generation = w.generation + 1,
        updated_at = now()
    WHERE w.state = 'idle' AND w.generation = CAST(:generation AS bigint)
      AND w.profile_in_use = EXCLUDED.profile_in_use
      AND w.profile_in_use <> EXCLUDED.other_profile
    RETURNING """
    + _SWITCH_COLUMNS
)

# The other profile becomes the one in use; the previous one is kept complete (rollback).
# Only while backfilling at :generation, with :profile (the target) complete unless :force,
# and no judgment left without its profile (`reembed start` stamps them; a cutover would
# take them for judgments of the new profile and never judge them again).
CUT_OVER = text(
    """
    UPDATE core.embedding_switch
    SET profile_in_use = other_profile, other_profile = profile_in_use, state = 'cut_over',
        cut_over_at = now(), next_batch_at = now(), """
    + _MOVED
    + """
    WHERE id = 1 AND state = 'backfilling' AND generation = :generation
      AND other_profile = :profile
      AND (CAST(:force AS boolean) OR NOT """
    + _UNCOVERED
    + """)
      AND NOT EXISTS (SELECT 1 FROM ai.context_keyword_analysis WHERE embedding_profile IS NULL)
    RETURNING """
    + _SWITCH_COLUMNS
)

# Back to the profile in use before the switch, at :generation. From backfilling the profile
# in use stays and the switch is idle; from cut_over the two swap back and the switch is
# rolling_back (the backfill loop fills the restored profile's gaps, then moves it to idle:
# MOVE_TO_IDLE). Either way the abandoned profile is other_profile until `reembed finish`.
ROLL_BACK = text(
    """
    UPDATE core.embedding_switch
    SET profile_in_use = CASE WHEN state = 'cut_over' THEN other_profile ELSE profile_in_use END,
        other_profile = CASE WHEN state = 'cut_over' THEN profile_in_use ELSE other_profile END,
        state = CASE WHEN state = 'cut_over' THEN 'rolling_back' ELSE 'idle' END,
        next_batch_at = now(), """
    + _MOVED
    + """
    WHERE id = 1 AND state IN ('backfilling', 'cut_over') AND generation = :generation
    RETURNING """
    + _SWITCH_COLUMNS
)

# The backfill loop's move out of rolling_back, at :generation: once every process acts on
# the restored profile (the switch unchanged for :window_seconds), no embedding stage sent
# before that is still open, and no live context whose embedding stage is COMPLETED lacks a
# vector of it (other than those whose backfill of it FAILED). :in_use is the restored
# profile.
MOVE_TO_IDLE = text(
    """
    UPDATE core.embedding_switch AS w
    SET state = 'idle', """
    + _MOVED
    + """
    WHERE id = 1 AND state = 'rolling_back' AND generation = :generation
      AND profile_in_use = :in_use
      AND w.updated_at <= now() - make_interval(secs => :window_seconds)
      AND """
    + _NO_STAGE_OPEN_FROM_BEFORE
    + """
      AND NOT EXISTS (SELECT 1"""
    + _LIVE_CONTEXTS
    + """ AND s.embedding_status = 'COMPLETED' AND NOT """
    + _HAS_IN_USE_VECTOR
    + """
          AND NOT EXISTS (SELECT 1 FROM ai.context_embedding_backfill AS f
                          WHERE f.embedding_profile = :in_use AND f.context_id = s.context_id
                            AND f.status = 'FAILED'))
    RETURNING """
    + _SWITCH_COLUMNS
)

# The switch is over: idle, no other profile (its vectors are removed or kept by the caller).
# Only from idle or cut_over at :generation, once every process acts on the profile in use
# (unchanged for :window_seconds) and no embedding stage sent before that is still open,
# while no live context whose embedding stage is COMPLETED lacks a live vector of it (a FAILED
# backfill of it excuses one only with :force) and no backfill row of it is open.
FINISH = text(
    """
    UPDATE core.embedding_switch AS w
    SET other_profile = NULL, state = 'idle', """
    + _MOVED
    + """
    WHERE id = 1 AND state IN ('idle', 'cut_over') AND generation = :generation
      AND profile_in_use = :in_use
      AND w.updated_at <= now() - make_interval(secs => :window_seconds)
      AND """
    + _NO_STAGE_OPEN_FROM_BEFORE
    + """
      AND NOT """
    + _IN_USE_GAP
    + """
      AND NOT EXISTS (SELECT 1 FROM ai.context_embedding_backfill AS o
                      WHERE o.embedding_profile = :in_use
                        AND o.status IN ('PENDING', 'PROCESSING'))
    RETURNING """
    + _SWITCH_COLUMNS
)

# Whether a judgment without its profile is left (`reembed start` stamps them).
UNSTAMPED_JUDGMENTS = text(
    "SELECT EXISTS (SELECT 1 FROM ai.context_keyword_analysis WHERE embedding_profile IS NULL)"
)

# Live contexts whose embedding stage, open, began before the profile cache window after the
# switch last changed (_NO_STAGE_OPEN_FROM_BEFORE).
STAGES_OPEN_FROM_BEFORE = text(
    """
    SELECT count(*)"""
    + _LIVE_CONTEXTS
    + """ AND s.embedding_status IN ('PENDING', 'PROCESSING')
      AND s.updated_at < (SELECT w.updated_at FROM core.embedding_switch AS w WHERE w.id = 1)
                         + make_interval(secs => :window_seconds)
    """
)

# Open rows of :profile marked for the Batch API (what `reembed start --wait` waits for).
OPEN_VIA_BATCH = text(
    """
    SELECT count(*) FROM ai.context_embedding_backfill
    WHERE embedding_profile = :profile AND via_batch AND status IN ('PENDING', 'PROCESSING')
    """
)

# Open backfill rows of :profile (what `reembed finish` waits for).
OPEN_BACKFILL = text(
    """
    SELECT count(*) FROM ai.context_embedding_backfill
    WHERE embedding_profile = :profile AND status IN ('PENDING', 'PROCESSING')
    """
)

# The shared pace (0061): take the next batch slot when it is due and move it on by
# batch / rate seconds (never more than one second of credit saved up); a batch is
# rate_per_second contexts, at most :max_batch, so a slot is about a second at most.
TAKE_BATCH_SLOT = text(
    """
    UPDATE core.embedding_switch
    SET next_batch_at = greatest(next_batch_at, now() - interval '1 second')
                        + make_interval(secs => CAST(least(:max_batch, rate_per_second) AS float8)
                                                / rate_per_second)
    WHERE id = 1 AND state <> 'idle' AND next_batch_at <= now()
    RETURNING profile_in_use, other_profile, state, generation,
              least(:max_batch, rate_per_second) AS batch
    """
)

# Seconds until the next batch slot is due (0 when due; NULL when idle).
SECONDS_UNTIL_SLOT = text(
    """
    SELECT greatest(extract(epoch FROM next_batch_at - now()), 0) AS seconds
    FROM core.embedding_switch WHERE id = 1 AND state <> 'idle'
    """
)

# Propose a backfill row for every live context without a vector under :profile (only those
# whose embedding stage is COMPLETED when :completed_only: the profile in use, whose live
# stage embeds the others itself); rows that exist are left as they are. Only while the switch
# is still at :generation, under way and naming :profile (its row shared-locked, so a move
# waits for the rows or the rows for the move): a command or pass that read the switch before
# a rollback or finish proposes nothing for a switch that is over (NULL: no switch guard).
# :via_batch marks the new rows for the Batch API (`reembed start --via batch`, 0115); an
# existing PENDING row no batch holds is marked too, so a start run again marks what is left.
SEED_BACKFILL = text(
    """
    INSERT INTO ai.context_embedding_backfill (embedding_profile, context_id, via_batch)
    SELECT CAST(:profile AS varchar), s.context_id, CAST(:via_batch AS boolean)"""
    + _LIVE_CONTEXTS
    + """
      AND (CAST(:generation AS bigint) IS NULL OR EXISTS (
          SELECT 1 FROM core.embedding_switch AS w
          WHERE w.id = 1 AND w.generation = CAST(:generation AS bigint) AND w.state <> 'idle'
            AND CAST(:profile AS varchar) IN (w.profile_in_use, w.other_profile)
          FOR SHARE))
      AND (NOT CAST(:completed_only AS boolean) OR s.embedding_status = 'COMPLETED')
      AND NOT """
    + _HAS_VECTOR
    + """
    ON CONFLICT (embedding_profile, context_id) DO UPDATE SET via_batch = true
    WHERE EXCLUDED.via_batch AND NOT ai.context_embedding_backfill.via_batch
      AND ai.context_embedding_backfill.status = 'PENDING'
      AND ai.context_embedding_backfill.batch_id IS NULL
    """
)

# Up to :batch live contexts whose state row lacks the core's digest (written before the core
# recorded it, 0020, or its owner, 0006) get both as a create writes them: the owner the core
# holds where none is recorded, and the digest of its note (pinlog_platform/contract/
# text_fingerprint.py: SHA-256 of the NFC text's UTF-8), marked the core's. A backfill worker
# claims only a context whose digest and owner are the core's. State rows locked in id order.
VOUCH_STATE_ROWS = text(
    """
    WITH locked AS (
        SELECT s.context_id"""
    + _LIVE_CONTEXTS
    + """ AND NOT s.text_sha256_from_core
        ORDER BY s.context_id
        LIMIT :batch
        FOR UPDATE OF s
    )
    UPDATE ai.context_ai_state AS s
    SET user_id = coalesce(s.user_id, c.member_id),
        record_id = coalesce(s.record_id, c.record_id),
        text_sha256 = sha256(convert_to(normalize(c.body, NFC), 'UTF8')),
        text_sha256_from_core = true
    FROM locked AS l
    JOIN core.context AS c ON c.id = l.context_id
    WHERE s.context_id = l.context_id
    """
)

# Only while the switch is still at :generation (the batch slot's), under way, and :profile is
# one it fills (in rolling_back the restored profile in use only; NULL: no switch guard): a
# pass whose slot a rollback or finish overtook sends nothing.
# The next :limit open rows of :profile to send to a worker, not sent within :resend_seconds:
# PENDING, or PROCESSING past :expiry_seconds (a worker died holding them). Rows another core
# process is marking are skipped. Those of a context no longer live (module docstring: deleted,
# replaced, its record deleted, its member withdrawn) are closed CANCELLED, never sent: no
# provider call for them; the others are marked sent and returned with what the worker needs.
# Only rows whose via_batch is :via_batch (0115), and never a row a provider batch holds
# (batch_id): its batch returns it, however long it takes.
PROPOSE_BATCH = text(
    """
    WITH picked AS (
        SELECT b.context_id
        FROM ai.context_embedding_backfill AS b
        WHERE b.embedding_profile = :profile AND b.status IN ('PENDING', 'PROCESSING')
          AND b.via_batch = CAST(:via_batch AS boolean) AND b.batch_id IS NULL
          AND (CAST(:generation AS bigint) IS NULL OR EXISTS (
              SELECT 1 FROM core.embedding_switch AS w
              WHERE w.id = 1 AND w.generation = CAST(:generation AS bigint)
                AND w.state <> 'idle'
                AND (CAST(:profile AS varchar) = w.profile_in_use
                     OR (w.state <> 'rolling_back'
                         AND CAST(:profile AS varchar) = w.other_profile))))
          AND (b.requested_at IS NULL
               OR b.requested_at < now() - make_interval(secs => :resend_seconds))
          AND (b.status = 'PENDING'
               OR b.updated_at < now() - make_interval(secs => :expiry_seconds))
        ORDER BY b.context_id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), judged AS (
        SELECT p.context_id, EXISTS (SELECT 1"""
    + _LIVE_CONTEXTS
    + """ AND s.context_id = p.context_id) AS live
        FROM picked AS p
    ), closed AS (
        UPDATE ai.context_embedding_backfill AS b
        SET status = 'CANCELLED', requested_at = NULL, updated_at = now()
        FROM judged AS j
        WHERE b.embedding_profile = :profile AND b.context_id = j.context_id AND NOT j.live
    ), marked AS (
        UPDATE ai.context_embedding_backfill AS b
        SET requested_at = now()
        FROM judged AS j
        WHERE b.embedding_profile = :profile AND b.context_id = j.context_id AND j.live
        RETURNING b.context_id
    )
    SELECT c.id AS context_id, c.member_id, c.record_id, c.body
    FROM marked AS k
    JOIN core.context AS c ON c.id = k.context_id
    ORDER BY c.id
    """
)

# Rows of a batch no worker took: sendable again at once (a PROCESSING one only once past
# the processing expiry, as before it was sent).
UNMARK_BATCH = text(
    """
    UPDATE ai.context_embedding_backfill
    SET requested_at = NULL
    WHERE embedding_profile = :profile AND context_id = ANY(CAST(:context_ids AS bigint[]))
      AND status IN ('PENDING', 'PROCESSING')
    """
)

# Rows marked for the Batch API that no instance of the profile takes by batch any more (every
# one reports "batch": false): the synchronous way, sendable at once; rows a batch holds stay.
RETURN_BACKFILL_TO_SYNC = text(
    """
    UPDATE ai.context_embedding_backfill
    SET via_batch = false, requested_at = NULL
    WHERE embedding_profile = :profile AND context_id = ANY(CAST(:context_ids AS bigint[]))
      AND via_batch AND batch_id IS NULL
    """
)

# Rows of a batch whose context cannot fit in a request the worker takes (its body limit,
# maxRequestBytes): FAILED with :reason (the note's own fault), never sent again.
FAIL_UNSENDABLE = text(
    """
    UPDATE ai.context_embedding_backfill
    SET status = 'FAILED', failure_reason = :reason, requested_at = NULL, updated_at = now()
    WHERE embedding_profile = :profile AND context_id = ANY(CAST(:context_ids AS bigint[]))
      AND status IN ('PENDING', 'PROCESSING')
    """
)

# Coverage of :profile, of :previous (0 when NULL) and what :in_use lacks (module docstring);
# the backfill's pace over the last :window_seconds (rows of :profile completed).
COVERAGE = text(
    """
    SELECT count(*) AS total,
           count(*) FILTER (WHERE """
    + _HAS_VECTOR
    + """) AS done,
           count(*) FILTER (WHERE s.embedding_status = 'COMPLETED' AND NOT """
    + _HAS_IN_USE_VECTOR
    + """) AS missing_in_use,
           count(*) FILTER (WHERE EXISTS (
               SELECT 1 FROM ai.context_embedding AS e
               WHERE e.context_id = s.context_id AND e.embedding_profile = :previous
                 AND NOT e.is_deleted)) AS previous_done,
           (SELECT count(*) FROM ai.context_embedding_backfill AS b
            WHERE b.embedding_profile = :profile AND b.status = 'COMPLETED'
              AND b.updated_at > now() - make_interval(secs => :window_seconds))
               AS completed_recently"""
    + _LIVE_CONTEXTS
)

# Live contexts whose backfill under :profile ended FAILED with no vector, by reason.
FAILED_BY_REASON = text(
    """
    SELECT coalesce(b.failure_reason, 'unknown') AS reason, count(*) AS contexts
    FROM ai.context_embedding_backfill AS b
    JOIN ai.context_ai_state AS s ON s.context_id = b.context_id
    JOIN core.context AS c ON c.id = s.context_id
    JOIN core.record AS r ON r.id = c.record_id
    JOIN core.member AS m ON m.id = c.member_id
    WHERE b.embedding_profile = :profile AND b.status = 'FAILED'
      AND c.deleted_at IS NULL AND r.deleted_at IS NULL AND m.deleted_at IS NULL
      AND s.embedding_status <> 'CANCELLED'
      AND NOT """
    + _HAS_VECTOR
    + """
    GROUP BY 1 ORDER BY 1
    """
)

# Stored vectors by profile (hidden ones apart).
VECTORS_BY_PROFILE = text(
    """
    SELECT embedding_profile AS profile, count(*) FILTER (WHERE NOT is_deleted) AS live,
           count(*) FILTER (WHERE is_deleted) AS hidden
    FROM ai.context_embedding GROUP BY 1 ORDER BY 1
    """
)

# Judgments made before their profile was recorded belong to the profile then in use: :batch
# of them stamped with :profile (repeated until none is left).
STAMP_JUDGMENT_PROFILE = text(
    """
    UPDATE ai.context_keyword_analysis
    SET embedding_profile = :profile
    WHERE context_id IN (SELECT context_id FROM ai.context_keyword_analysis
                         WHERE embedding_profile IS NULL LIMIT :batch)
    """
)

# The switch is still as `reembed finish` left it (:generation): a removal statement does
# nothing once another switch started.
_FINISHED = """EXISTS (SELECT 1 FROM core.embedding_switch AS w
                   WHERE w.id = 1 AND w.generation = :generation AND w.state = 'idle'
                     AND w.other_profile IS NULL AND w.profile_in_use = :in_use)"""

# Up to :batch vectors, backfill rows and preset vectors of profiles other than :in_use,
# removed (repeated until none is left: `reembed finish`). A live vector is removed only when
# its context has a live vector of :in_use: never a context's last one (a note embedded by a
# process that still acted on a cached profile keeps the vector search may yet need).
REMOVE_OTHER_VECTORS = text(
    """
    DELETE FROM ai.context_embedding
    WHERE (context_id, embedding_profile) IN (
        SELECT o.context_id, o.embedding_profile FROM ai.context_embedding AS o
        WHERE o.embedding_profile <> :in_use
          AND (o.is_deleted OR EXISTS (
              SELECT 1 FROM ai.context_embedding AS k
              WHERE k.context_id = o.context_id AND k.embedding_profile = :in_use
                AND NOT k.is_deleted))
        LIMIT :batch)
      AND """
    + _FINISHED
)
REMOVE_OTHER_BACKFILL_ROWS = text(
    """
    DELETE FROM ai.context_embedding_backfill
    WHERE (embedding_profile, context_id) IN (
        SELECT embedding_profile, context_id FROM ai.context_embedding_backfill
        WHERE embedding_profile <> :in_use LIMIT :batch)
      AND """
    + _FINISHED
)
REMOVE_OTHER_PRESET_VECTORS = text(
    "DELETE FROM ai.keyword_preset_embedding WHERE embedding_profile <> :in_use AND " + _FINISHED
)


@dataclass(frozen=True, slots=True)
class SwitchRow:
    """``core.embedding_switch`` (0061, 0062); ``state`` idle, backfilling, cut_over or
    rolling_back; ``generation`` advances on every move; ``changed_seconds_ago`` is the time
    since the last move (seconds, the database's clock; not compared)."""

    profile_in_use: str
    other_profile: str | None
    state: str
    rate_per_second: int
    started_at: datetime | None
    cut_over_at: datetime | None
    generation: int
    changed_seconds_ago: float = field(default=0.0, compare=False)
    via: str = "sync"


@dataclass(frozen=True, slots=True)
class BackfillSource:
    """A proposed context: what the worker needs to embed it."""

    context_id: int
    member_id: int
    record_id: int
    body: str


@dataclass(frozen=True, slots=True)
class Coverage:
    """``total`` live contexts, ``done`` with a vector of the profile, ``previous_done`` with
    one of the previous profile (0 when none is named), ``missing_in_use`` with a completed
    embedding but no vector of the profile in use, ``completed_recently`` backfill rows
    completed in the window."""

    total: int
    done: int
    missing_in_use: int
    completed_recently: int
    previous_done: int = 0


def _switch(row) -> SwitchRow | None:
    if row is None:
        return None
    return SwitchRow(
        row.profile_in_use,
        row.other_profile,
        row.state,
        int(row.rate_per_second),
        row.started_at,
        row.cut_over_at,
        int(row.generation),
        float(row.changed_seconds_ago),
        str(row.via),
    )


async def read(conn: AsyncConnection) -> SwitchRow | None:
    """The switch row; ``None`` before any ``reembed start``."""
    return _switch((await conn.execute(READ_SWITCH)).first())


async def lock_profile_in_use(conn: AsyncConnection) -> str | None:
    """The profile in use, the switch row share-locked for the transaction
    (``LOCK_PROFILE_IN_USE``); ``None`` when no switch was ever started."""
    return (await conn.execute(LOCK_PROFILE_IN_USE)).scalar_one_or_none()


async def start(
    conn: AsyncConnection,
    *,
    in_use: str,
    target: str,
    rate: int,
    generation: int | None,
    via: str = "sync",
) -> SwitchRow | None:
    """Begin a switch to ``target`` from the row read at ``generation`` (``None``: no row was
    read), its rows sent ``via`` (``sync`` or ``batch``); ``None``: refused (not idle,
    changed meanwhile, or ``target`` is in use)."""
    params = {
        "in_use": in_use,
        "target": target,
        "rate": rate,
        "generation": generation,
        "via": via,
    }
    return _switch((await conn.execute(START_SWITCH, params)).first())


async def cut_over(
    conn: AsyncConnection, *, generation: int, target: str, force: bool
) -> SwitchRow | None:
    """The target in use (``CUT_OVER``); ``None``: refused (not backfilling at
    ``generation``, the target incomplete without ``force``, or unstamped judgments)."""
    params = {"generation": generation, "profile": target, "force": force}
    return _switch((await conn.execute(CUT_OVER, params)).first())


async def roll_back(conn: AsyncConnection, *, generation: int) -> SwitchRow | None:
    """Back to the profile in use before the switch (``ROLL_BACK``); ``None``: refused."""
    return _switch((await conn.execute(ROLL_BACK, {"generation": generation})).first())


async def move_to_idle(
    conn: AsyncConnection, *, generation: int, in_use: str, window_seconds: float
) -> SwitchRow | None:
    """The rollback done (``MOVE_TO_IDLE``); ``None``: not yet, or the row changed."""
    params = {"generation": generation, "in_use": in_use, "window_seconds": float(window_seconds)}
    return _switch((await conn.execute(MOVE_TO_IDLE, params)).first())


async def finish(
    conn: AsyncConnection, *, generation: int, in_use: str, force: bool, window_seconds: float
) -> SwitchRow | None:
    """End the switch (``FINISH``); ``None``: refused (see the statement)."""
    params = {
        "generation": generation,
        "in_use": in_use,
        "force": force,
        "window_seconds": float(window_seconds),
    }
    return _switch((await conn.execute(FINISH, params)).first())


async def unstamped_judgments(conn: AsyncConnection) -> bool:
    """Whether a judgment without its profile is left."""
    return bool((await conn.execute(UNSTAMPED_JUDGMENTS)).scalar_one())


async def stages_open_from_before(conn: AsyncConnection, *, window_seconds: float) -> int:
    """Live contexts whose embedding stage began before the cache window after the last move
    and is still open (``STAGES_OPEN_FROM_BEFORE``)."""
    params = {"window_seconds": float(window_seconds)}
    return int((await conn.execute(STAGES_OPEN_FROM_BEFORE, params)).scalar_one())


async def open_via_batch(conn: AsyncConnection, *, profile: str) -> int:
    """Open rows of ``profile`` marked for the Batch API (``OPEN_VIA_BATCH``)."""
    return int((await conn.execute(OPEN_VIA_BATCH, {"profile": profile})).scalar_one())


async def open_backfill(conn: AsyncConnection, *, profile: str) -> int:
    """Backfill rows of ``profile`` still PENDING or PROCESSING."""
    return int((await conn.execute(OPEN_BACKFILL, {"profile": profile})).scalar_one())


@dataclass(frozen=True, slots=True)
class BatchSlot:
    """A taken batch slot: up to ``batch`` contexts may be sent now, for the switch as it was
    at ``generation`` in ``state``."""

    profile_in_use: str
    other_profile: str
    state: str
    generation: int
    batch: int


async def take_batch_slot(conn: AsyncConnection, *, max_batch: int) -> BatchSlot | None:
    """A batch slot when one is due (it is taken), else ``None`` (idle, or not due yet)."""
    row = (await conn.execute(TAKE_BATCH_SLOT, {"max_batch": max_batch})).first()
    if row is None:
        return None
    return BatchSlot(
        row.profile_in_use, row.other_profile, row.state, int(row.generation), int(row.batch)
    )


async def seconds_until_slot(conn: AsyncConnection) -> float | None:
    """Seconds until the next batch may go; ``None`` when idle."""
    value = (await conn.execute(SECONDS_UNTIL_SLOT)).scalar()
    return None if value is None else float(value)


async def seed(
    conn: AsyncConnection,
    *,
    profile: str,
    completed_only: bool,
    generation: int | None,
    via_batch: bool = False,
) -> int:
    """Propose rows for live contexts lacking a vector of ``profile`` while the switch is at
    ``generation`` and under way (``SEED_BACKFILL``; ``None``: unguarded, for tests and
    repairs by hand), marked for the Batch API with ``via_batch``; how many were new or
    newly marked (0 also when the switch moved)."""
    params = {
        "profile": profile,
        "completed_only": completed_only,
        "generation": generation,
        "via_batch": via_batch,
    }
    return (await conn.execute(SEED_BACKFILL, params)).rowcount


async def vouch_state_rows(conn: AsyncConnection, *, batch: int) -> int:
    """Write the core's owner and digest on up to ``batch`` live state rows that lack them
    (``VOUCH_STATE_ROWS``); how many."""
    return (await conn.execute(VOUCH_STATE_ROWS, {"batch": batch})).rowcount


async def propose(
    conn: AsyncConnection,
    *,
    profile: str,
    limit: int,
    resend_seconds: float,
    expiry_seconds: float,
    generation: int | None,
    via_batch: bool = False,
) -> list[BackfillSource]:
    """The next open rows of ``profile`` (``PROPOSE_BATCH``) of live contexts, marked sent,
    while the switch is at ``generation`` (the batch slot's; ``None``: unguarded, for tests);
    rows of contexts no longer live are closed ``CANCELLED`` on the way. Only rows marked for
    the Batch API with ``via_batch``, only the others without; never a row a batch holds."""
    params = {
        "via_batch": via_batch,
        "generation": generation,
        "profile": profile,
        "limit": limit,
        "resend_seconds": float(resend_seconds),
        "expiry_seconds": float(expiry_seconds),
    }
    return [
        BackfillSource(row.context_id, row.member_id, row.record_id, row.body)
        for row in await conn.execute(PROPOSE_BATCH, params)
    ]


async def unmark(conn: AsyncConnection, *, profile: str, context_ids: Sequence[int]) -> None:
    """Make rows no worker took sendable again at once."""
    await conn.execute(UNMARK_BATCH, {"profile": profile, "context_ids": list(context_ids)})


async def return_to_sync(
    conn: AsyncConnection, *, profile: str, context_ids: Sequence[int]
) -> None:
    """Send these rows marked for the Batch API the synchronous way
    (``RETURN_BACKFILL_TO_SYNC``)."""
    await conn.execute(
        RETURN_BACKFILL_TO_SYNC, {"profile": profile, "context_ids": list(context_ids)}
    )


async def fail_unsendable(
    conn: AsyncConnection, *, profile: str, context_ids: Sequence[int], reason: str
) -> None:
    """End rows too large for any request the worker takes ``FAILED`` with ``reason``
    (``FAIL_UNSENDABLE``)."""
    params = {"profile": profile, "context_ids": list(context_ids), "reason": reason}
    await conn.execute(FAIL_UNSENDABLE, params)


async def coverage(
    conn: AsyncConnection,
    *,
    profile: str,
    in_use: str,
    window_seconds: float,
    previous: str | None = None,
) -> Coverage:
    """Coverage of ``profile`` (and of ``previous``) and what the profile in use lacks
    (``COVERAGE``)."""
    params = {
        "profile": profile,
        "in_use": in_use,
        "previous": previous,
        "window_seconds": float(window_seconds),
    }
    row = (await conn.execute(COVERAGE, params)).one()
    return Coverage(
        int(row.total),
        int(row.done),
        int(row.missing_in_use),
        int(row.completed_recently),
        int(row.previous_done),
    )


async def failed_by_reason(conn: AsyncConnection, *, profile: str) -> dict[str, int]:
    """Live contexts whose backfill of ``profile`` failed, by reason."""
    rows = await conn.execute(FAILED_BY_REASON, {"profile": profile})
    return {row.reason: int(row.contexts) for row in rows}


async def vectors_by_profile(conn: AsyncConnection) -> dict[str, tuple[int, int]]:
    """``{profile: (live, hidden)}`` of the stored context vectors."""
    rows = await conn.execute(VECTORS_BY_PROFILE)
    return {row.profile: (int(row.live), int(row.hidden)) for row in rows}


async def stamp_judgment_profile(conn: AsyncConnection, *, profile: str, batch: int) -> int:
    """Stamp up to ``batch`` judgments without a profile with ``profile``; how many."""
    return (
        await conn.execute(STAMP_JUDGMENT_PROFILE, {"profile": profile, "batch": batch})
    ).rowcount


async def remove_other_profiles(
    conn: AsyncConnection, *, in_use: str, generation: int, batch: int
) -> int:
    """Remove up to ``batch`` context vectors and up to ``batch`` backfill rows of profiles
    other than ``in_use`` (and every such preset vector) while the switch is as ``finish``
    left it at ``generation`` (``REMOVE_OTHER_VECTORS``: never a context's last live vector);
    how many rows in all."""
    params = {"in_use": in_use, "generation": generation, "batch": batch}
    removed = (await conn.execute(REMOVE_OTHER_VECTORS, params)).rowcount
    removed += (await conn.execute(REMOVE_OTHER_BACKFILL_ROWS, params)).rowcount
    removed += (
        await conn.execute(
            REMOVE_OTHER_PRESET_VECTORS, {"in_use": in_use, "generation": generation}
        )
    ).rowcount
    return removed
