"""Read-only checks of the ``ai`` schema against the contract's invariants (``pinlog-ai doctor``).

Every check is one statement returning up to ``:examples`` rows of ``(example, total)``:
``example`` names one offending row (a context id, a preset id, a column) and ``total`` is the
number of offending rows overall (a window count taken before the LIMIT). The worker reads
``ai.*`` and the system catalogs only, never ``core.*`` (§0, §8).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from pinlog_platform.contract.states import STAGE_ORDER, Status

# Embeddings of CANCELLED contexts still visible to search: the core's delete sets is_deleted
# in the same transaction as CANCELLED (§9), so this never happens legally.
CANCELLED_EMBEDDING_NOT_DELETED = text(
    """
    SELECT e.context_id::text AS example, count(*) OVER () AS total
    FROM ai.context_embedding e JOIN ai.context_ai_state s ON s.context_id = e.context_id
    WHERE s.embedding_status = 'CANCELLED' AND NOT e.is_deleted
    ORDER BY e.context_id LIMIT :examples
    """
)

# A COMPLETED embedding stage whose vector is missing: the save writes both in one
# transaction (§3 step 2).
COMPLETED_EMBEDDING_WITHOUT_ROW = text(
    """
    SELECT s.context_id::text AS example, count(*) OVER () AS total
    FROM ai.context_ai_state s
    WHERE s.embedding_status = 'COMPLETED'
      AND NOT EXISTS (SELECT 1 FROM ai.context_embedding e WHERE e.context_id = s.context_id)
    ORDER BY s.context_id LIMIT :examples
    """
)

# Keyword stage COMPLETED without a COMPLETED embedding stage: its claim and its save both
# require embedding_status = 'COMPLETED' (§2).
KEYWORD_COMPLETED_BEFORE_EMBEDDING = text(
    """
    SELECT context_id::text AS example, count(*) OVER () AS total
    FROM ai.context_ai_state
    WHERE keyword_status = 'COMPLETED' AND embedding_status <> 'COMPLETED'
    ORDER BY context_id LIMIT :examples
    """
)

# PROCESSING past the expiry with the retry budget spent: only the core's finalizer moves
# these to FAILED (§9 step 1), so it is not running.
STALE_PROCESSING_EXHAUSTED = text(
    """
    SELECT context_id::text AS example, count(*) OVER () AS total
    FROM ai.context_ai_state
    WHERE retry_count >= :max_retry
      AND """  # noqa: S608 (constant fragments, the stage order's columns)
    + f"'{Status.PROCESSING}' IN ({', '.join(stage.status_column for stage in STAGE_ORDER)})"
    + """
      AND updated_at < now() - make_interval(secs => :expiry_seconds)
    ORDER BY context_id LIMIT :examples
    """
)

# Presets whose vector of the current profile cannot be compared by cosine: zero norm, or
# another dimension (the vectors' column declares none, 0050: each profile has its own).
BROKEN_PRESET_VECTORS = text(
    """
    SELECT preset_id::text AS example, count(*) OVER () AS total
    FROM ai.keyword_preset_embedding
    WHERE embedding_profile = :profile
      AND (vector_dims(embedding) <> :dimension OR vector_norm(embedding) = 0)
    ORDER BY preset_id LIMIT :examples
    """
)

# The ai vector columns the worker writes whose declared dimension (the type modifier) is not
# the configured one; a column that declares none (-1: the vectors of every profile, 0050 and
# 0060) is not one, nor the frozen keyword_preset.embedding (0050: written by nobody).
VECTOR_COLUMNS_OF_OTHER_DIMENSION = text(
    """
    SELECT format('ai.%s.%s is %s', c.relname, a.attname,
                  format_type(a.atttypid, a.atttypmod)) AS example,
           count(*) OVER () AS total
    FROM pg_catalog.pg_attribute a
    JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'ai' AND c.relname IN ('context_embedding', 'keyword_preset_embedding')
      AND a.attname = 'embedding' AND NOT a.attisdropped AND a.atttypmod <> :dimension
      AND a.atttypmod <> -1
    ORDER BY c.relname LIMIT :examples
    """
)

# Legal: keyword rows of a context whose keyword stage is not COMPLETED (an operational
# COMPLETED -> PENDING reset leaves them until the next save replaces them, §0; readers
# join the state, §9).
KEYWORDS_OF_UNFINISHED_STAGE = text(
    """
    SELECT k.context_id::text AS example, count(*) OVER () AS total
    FROM (SELECT DISTINCT context_id FROM ai.context_keyword) k
    LEFT JOIN ai.context_ai_state s ON s.context_id = k.context_id
    WHERE s.keyword_status IS DISTINCT FROM 'COMPLETED'
    ORDER BY k.context_id LIMIT :examples
    """
)

# Legal: vectors of another profile than the current one; never reused (§5).
EMBEDDINGS_OF_OTHER_PROFILE = text(
    """
    SELECT context_id::text AS example, count(*) OVER () AS total
    FROM ai.context_embedding
    WHERE embedding_profile <> :profile
    ORDER BY context_id LIMIT :examples
    """
)

# Legal: the stored context vectors by profile (more than one during a switch, 0060); one
# example per profile, the total is the number of profiles.
VECTORS_BY_PROFILE = text(
    """
    SELECT format('%s: %s live, %s hidden', embedding_profile,
                  count(*) FILTER (WHERE NOT is_deleted), count(*) FILTER (WHERE is_deleted))
               AS example,
           count(*) OVER () AS total
    FROM ai.context_embedding
    GROUP BY embedding_profile
    ORDER BY embedding_profile LIMIT :examples
    """
)

# Legal: presets usable under each profile with vectors and that profile's list version
# (pinlog_platform/contract/preset_list.py's rule); the total is the number of profiles.
PRESETS_BY_PROFILE = text(
    """
    SELECT format('%s: %s usable, list version %s', e.embedding_profile, count(*),
                  max(p.version)) AS example,
           count(*) OVER () AS total
    FROM ai.keyword_preset_embedding AS e
    JOIN ai.keyword_preset AS p ON p.id = e.preset_id AND e.preset_version = p.version
    WHERE p.is_active AND p.visibility <> 'BLOCKED'
    GROUP BY e.embedding_profile
    ORDER BY e.embedding_profile LIMIT :examples
    """
)

# Legal during a switch: contexts, not cancelled, whose embedding stage is COMPLETED but which
# have no visible vector of this worker's profile (embedded under another: the backfill, or
# the keyword stage, gives them one).
COMPLETED_WITHOUT_VECTOR_OF_PROFILE = text(
    """
    SELECT s.context_id::text AS example, count(*) OVER () AS total
    FROM ai.context_ai_state s
    WHERE s.embedding_status = 'COMPLETED'
      AND NOT EXISTS (SELECT 1 FROM ai.context_embedding e
                      WHERE e.context_id = s.context_id AND e.embedding_profile = :profile
                        AND NOT e.is_deleted)
    ORDER BY s.context_id LIMIT :examples
    """
)

# Legal: a re-embedding backfill in progress, rows by profile and status; the total is the
# number of rows still open (PENDING or PROCESSING).
BACKFILL_ROWS = text(
    """
    SELECT format('%s %s: %s', embedding_profile, status, count(*)) AS example,
           sum(count(*) FILTER (WHERE status IN ('PENDING', 'PROCESSING'))) OVER () AS total
    FROM ai.context_embedding_backfill
    GROUP BY embedding_profile, status
    ORDER BY embedding_profile, status LIMIT :examples
    """
)


@dataclass(frozen=True, slots=True)
class CheckResult:
    """``total`` offending rows; ``examples`` names at most the requested number of them."""

    total: int
    examples: tuple[str, ...]


# doctor's profile check: live context vectors of the configured profile, and of every other
# one (a doctor run with the wrong profile, e.g. without PINLOG_OFFLINE on the offline demo's
# database, would otherwise check a profile nothing uses and report no problem).
LIVE_VECTORS_OF_PROFILE = text(
    """
    SELECT count(*) FILTER (WHERE embedding_profile = :profile) AS this_profile,
           count(*) FILTER (WHERE embedding_profile <> :profile) AS other_profiles,
           coalesce(string_agg(DISTINCT embedding_profile, ', ')
                    FILTER (WHERE embedding_profile <> :profile), '') AS others
    FROM ai.context_embedding
    WHERE NOT is_deleted
    """
)


@dataclass(frozen=True, slots=True)
class ProfileVectors:
    """Live context vectors of the configured profile and of the others (names, comma-separated)."""

    this_profile: int
    other_profiles: int
    others: str


async def live_vectors_of_profile(conn: AsyncConnection, profile: str) -> ProfileVectors:
    """``LIVE_VECTORS_OF_PROFILE`` for ``profile``."""
    row = (await conn.execute(LIVE_VECTORS_OF_PROFILE, {"profile": profile})).one()
    return ProfileVectors(int(row.this_profile), int(row.other_profiles), row.others)


async def run_check(
    conn: AsyncConnection, statement: TextClause, *, examples: int, **params: object
) -> CheckResult:
    """Run one check statement of this module; no rows means nothing offends."""
    rows = (await conn.execute(statement, {"examples": examples, **params})).all()
    return CheckResult(int(rows[0].total) if rows else 0, tuple(row.example for row in rows))
