"""``pinlog-ai doctor``: which contract invariants the database breaks, read-only (§1-§5, §9).

Violations (any makes the exit code 1) are states the two services never leave behind when
they follow the contract; information findings are legal states worth knowing. All checks
run in one read-only, repeatable-read transaction, so they describe one snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import TextClause
from sqlalchemy.ext.asyncio import AsyncEngine

from app.repository import invariants
from app.repository.db import read_only_snapshot

EXAMPLES = 5
# The core side's retry budget (§9: the finalizer fails stages of rows at retry_count 3).
MAX_RETRY = 3


@dataclass(frozen=True, slots=True)
class Check:
    """One named check: ``statement`` from ``app.repository.invariants``."""

    name: str
    description: str
    statement: TextClause
    violation: bool


CHECKS = (
    Check(
        "cancelled_embedding_not_deleted",
        "embeddings of CANCELLED contexts with is_deleted = false (§9)",
        invariants.CANCELLED_EMBEDDING_NOT_DELETED,
        violation=True,
    ),
    Check(
        "completed_embedding_without_row",
        "COMPLETED embedding stages without an embedding row (§3)",
        invariants.COMPLETED_EMBEDDING_WITHOUT_ROW,
        violation=True,
    ),
    Check(
        "keyword_completed_before_embedding",
        "keyword stages COMPLETED while the embedding stage is not (§2)",
        invariants.KEYWORD_COMPLETED_BEFORE_EMBEDDING,
        violation=True,
    ),
    Check(
        "stale_processing_retries_exhausted",
        "stale PROCESSING with retry_count 3: the core's finalizer is not running (§9)",
        invariants.STALE_PROCESSING_EXHAUSTED,
        violation=True,
    ),
    Check(
        "broken_preset_vectors",
        "presets with a zero-norm or wrong-dimension vector (§4)",
        invariants.BROKEN_PRESET_VECTORS,
        violation=True,
    ),
    Check(
        "vector_column_dimension",
        "ai vector columns whose dimension is not PINLOG_VECTOR_DIMENSION (§5)",
        invariants.VECTOR_COLUMNS_OF_OTHER_DIMENSION,
        violation=True,
    ),
    Check(
        "keywords_of_unfinished_stage",
        "keyword rows of contexts whose keyword stage is not COMPLETED "
        "(a cancelled context keeps its rows, §9; or after a reset, §0)",
        invariants.KEYWORDS_OF_UNFINISHED_STAGE,
        violation=False,
    ),
    Check(
        "embeddings_of_other_profile",
        "embeddings of another profile than this worker's (kept for a switch or until "
        "`pinlog-core reembed finish`, §5)",
        invariants.EMBEDDINGS_OF_OTHER_PROFILE,
        violation=False,
    ),
    Check(
        "vectors_by_profile",
        "context vectors by embedding profile (the total is the number of profiles; more "
        "than one during a switch, §1)",
        invariants.VECTORS_BY_PROFILE,
        violation=False,
    ),
    Check(
        "presets_by_profile",
        "usable presets by embedding profile and their list version (§4)",
        invariants.PRESETS_BY_PROFILE,
        violation=False,
    ),
    Check(
        "completed_without_vector_of_profile",
        "COMPLETED embeddings with no visible vector of this worker's profile (a switch's "
        "remaining backfill, §1)",
        invariants.COMPLETED_WITHOUT_VECTOR_OF_PROFILE,
        violation=False,
    ),
    Check(
        "backfill_rows",
        "re-embedding backfill rows by profile and status (the total is the open ones; "
        "`pinlog-core reembed status` shows the coverage)",
        invariants.BACKFILL_ROWS,
        violation=False,
    ),
)


@dataclass(frozen=True, slots=True)
class Finding:
    """The outcome of one check: ``total`` offending rows, up to 5 ``examples``."""

    check: Check
    total: int
    examples: tuple[str, ...]

    @property
    def label(self) -> str:
        """``VIOLATION`` or ``ok`` for violation checks, ``info`` for the others."""
        if not self.check.violation:
            return "info"
        return "VIOLATION" if self.total else "ok"


@dataclass(frozen=True, slots=True)
class DoctorReport:
    """The findings, and ``warnings``: lines about how the report was made that a reader must
    see (the checked profile has no vectors while another has: the wrong profile was checked),
    which do not change the exit code."""

    findings: tuple[Finding, ...]
    warnings: tuple[str, ...] = ()

    @property
    def violations(self) -> int:
        """Offending rows over every violation check (0 means healthy)."""
        return sum(f.total for f in self.findings if f.check.violation)

    def by_name(self, name: str) -> Finding:
        return next(f for f in self.findings if f.check.name == name)


async def examine(
    engine: AsyncEngine, *, dimension: int, profile: str, processing_expiry_seconds: float
) -> DoctorReport:
    """Run every check on one snapshot. ``dimension`` and ``profile`` are the configured
    ones (§5); ``processing_expiry_seconds`` is the PROCESSING expiry (§2). Writes nothing."""
    params = {
        "dimension": dimension,
        "profile": profile,
        "expiry_seconds": processing_expiry_seconds,
        "max_retry": MAX_RETRY,
    }
    findings = []
    async with read_only_snapshot(engine) as conn:
        for check in CHECKS:
            result = await invariants.run_check(
                conn, check.statement, examples=EXAMPLES, **_used(check, params)
            )
            findings.append(Finding(check, result.total, result.examples))
        vectors = await invariants.live_vectors_of_profile(conn, profile)
    warnings = []
    if vectors.this_profile == 0 and vectors.other_profiles > 0:
        warnings.append(
            f"profile {profile} has no vectors, but {vectors.other_profiles} belong to "
            f"{vectors.others}: the profile-specific checks looked at a profile nothing uses; "
            "set PINLOG_EMBEDDING_PROFILE (or PINLOG_OFFLINE=true) to the workers' profile"
        )
    return DoctorReport(tuple(findings), tuple(warnings))


def _used(check: Check, params: dict[str, object]) -> dict[str, object]:
    # Each statement gets only the parameters it names.
    return {name: value for name, value in params.items() if f":{name}" in check.statement.text}
