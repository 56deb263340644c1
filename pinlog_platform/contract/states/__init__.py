"""The AI state machine's vocabulary, shared by both services (CONTRACT §2, §9).

``Status`` is the value set of every stage column; ``Stage`` names a stage's columns in
``ai.context_ai_state`` (its status column, ``0002_ai_tables.sql``, and its attempt column,
``0008_stage_attempts.sql``) and what it requires of the other stages; ``STAGE_ORDER`` is the
pipeline's order. ``WORKER_TRANSITIONS`` and ``CORE_TRANSITIONS`` are the two sides'
transition tables, as data. Every SQL constant of both services that names a stage's status
column must name every stage's, unless it is declared for one stage: ``ONE_STAGE_STATEMENTS``
and the ``{Stage: statement}`` maps of ``PER_STAGE_STATEMENTS``.

Drift tests hold the services to this module: ``tests/platform/test_stage_vocabulary.py`` (the
schema's CHECK lists equal ``Status``; every statement naming one stage names every stage unless
declared per stage),
``tests/worker/repository/test_transition_table.py`` (the worker's statements from every status) and
``tests/core/repository/test_core_transition_table.py`` (the core's).

Leaf module: imports neither service (statements are named as ``"module:attribute"`` text).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType


class Status(StrEnum):
    """One stage's status; the value set is an interface shared with the core side (§2) and
    equals the CHECK list of every stage column (§1)."""

    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class Stage(StrEnum):
    """A pipeline stage; the value is the ``ai.context_ai_state`` column holding its status.

    Each member is declared with its three columns, ``(status column, attempt column, failure
    column)``, so a stage cannot exist without its attempt counter and its failure reason
    (``0010_stage_failure_reasons.sql``, ``failure_reasons.FailureReason``). Repository
    functions accept only ``Stage``: each stage has its own statements (§2).
    """

    EMBEDDING = "embedding_status", "embedding_attempt", "embedding_failure"
    KEYWORD = "keyword_status", "keyword_attempt", "keyword_failure"

    attempt_column: str
    failure_column: str

    def __new__(cls, status_column: str, attempt_column: str, failure_column: str) -> Stage:
        member = str.__new__(cls, status_column)
        member._value_ = status_column
        member.attempt_column = attempt_column
        member.failure_column = failure_column
        return member

    @property
    def label(self) -> str:
        """Short name for logs and metrics: ``embedding`` or ``keyword``."""
        return self.name.lower()

    @property
    def status_column(self) -> str:
        """The column holding this stage's ``Status`` (the member's value)."""
        return self.value

    @property
    def requires(self) -> Mapping[Stage, Status]:
        """What the other stages must be before this one may be claimed or saved (§2
        "Start": the keyword stage requires the embedding stage ``COMPLETED``)."""
        return STAGE_REQUIREMENTS[self]


# The pipeline's order (§3): a stage runs after every stage before it. A stage requires only
# stages before it (a test checks both).
STAGE_ORDER: tuple[Stage, ...] = (Stage.EMBEDDING, Stage.KEYWORD)

# ``Stage.requires``, declared per stage (§2 "Start", §3.3).
STAGE_REQUIREMENTS: Mapping[Stage, Mapping[Stage, Status]] = MappingProxyType(
    {
        Stage.EMBEDDING: MappingProxyType({}),
        Stage.KEYWORD: MappingProxyType({Stage.EMBEDDING: Status.COMPLETED}),
    }
)

# A stage in one of these statuses may still be claimed (§2 start/reclaim); the core side calls
# such a stage unfinished: it rescans and finalizes only these (§9).
CLAIMABLE: frozenset[Status] = frozenset({Status.PENDING, Status.PROCESSING})

# Transitions the worker itself may perform on one stage (§2). The WHERE clauses in
# app/repository/context_ai_state.py, context_start.py and stage_saves.py enforce them.
WORKER_TRANSITIONS: frozenset[tuple[Status, Status]] = frozenset(
    {
        (Status.PENDING, Status.PROCESSING),
        (Status.PROCESSING, Status.PROCESSING),
        (Status.PROCESSING, Status.COMPLETED),
        (Status.PROCESSING, Status.FAILED),
    }
)


class CoreOperation(StrEnum):
    """The core side's statements on ``ai.context_ai_state`` (§9), one per operation
    (``core_service/repository/context_ai_state.py``; the operational reset of §0 in
    ``core_service/repository/keyword_reprocess.py``)."""

    CREATE = "create"  # INSERT_PENDING_STATE (§9 Create)
    CANCEL = "cancel"  # CANCEL_STATES (§9 Delete, record deletion, withdrawal)
    FINALIZE = "finalize"  # FINALIZE_EXHAUSTED (§9 rescan step 1)
    CLOSE_BLOCKED = "close_blocked"  # CLOSE_BLOCKED_KEYWORD_STAGES (docs/rescan.md)
    RESCAN_CLAIM = "rescan_claim"  # CLAIM_STALE (§9 rescan steps 2-3)
    COUNT_DISPATCH = "count_dispatch"  # RECORD_ACCEPTED_DISPATCH (docs/rescan.md "Budget")
    DEFER_DISPATCH = "defer_dispatch"  # DEFER_DISPATCH (docs/rescan.md "Backlog")
    REPROCESS_KEYWORDS = "reprocess_keywords"  # RESET_KEYWORD_STAGES (§0 operational reset)


# How each core operation may change one stage's status (§0, §9); ``None`` is "no row yet". A
# stage an operation leaves at its status is no transition (the cancel rewrites a CANCELLED
# stage unchanged). CANCELLED wins: nothing moves it. Closing a blocked stage applies only to
# stages with requirements (one the pipeline can never reach). The rescan claim changes no
# status: it stamps rescanned_at; counting an accepted dispatch changes no status either: it
# spends a retry (all but a context's first); deferring one only sets next_dispatch_at. The
# §0 operational reset of a preset reclassification moves a keyword stage COMPLETED ->
# PENDING, only while the embedding stage is COMPLETED too.
CORE_TRANSITIONS: Mapping[CoreOperation, frozenset[tuple[Status | None, Status]]] = (
    MappingProxyType(
        {
            CoreOperation.CREATE: frozenset({(None, Status.PENDING)}),
            CoreOperation.CANCEL: frozenset(
                {
                    (Status.PENDING, Status.CANCELLED),
                    (Status.PROCESSING, Status.CANCELLED),
                    (Status.COMPLETED, Status.CANCELLED),
                    (Status.FAILED, Status.CANCELLED),
                }
            ),
            CoreOperation.FINALIZE: frozenset(
                {(Status.PENDING, Status.FAILED), (Status.PROCESSING, Status.FAILED)}
            ),
            CoreOperation.CLOSE_BLOCKED: frozenset(
                {(Status.PENDING, Status.FAILED), (Status.PROCESSING, Status.FAILED)}
            ),
            CoreOperation.RESCAN_CLAIM: frozenset(),
            CoreOperation.COUNT_DISPATCH: frozenset(),
            CoreOperation.DEFER_DISPATCH: frozenset(),
            CoreOperation.REPROCESS_KEYWORDS: frozenset({(Status.COMPLETED, Status.PENDING)}),
        }
    )
)

# Statements written for one stage, as "module:attribute" -> the stage: each names its stage's
# status column and need not name the others'. Every other SQL constant of both services that
# names a stage's status column must name every stage's (tests/platform/test_stage_vocabulary.py
# finds them all): a stage it forgot would be created without a status, never cancelled, never
# rescanned or finalized, not read by the pre-check, the record reads or the status counts, or
# not checked by ``pinlog-ai doctor``. The statements of the ``PER_STAGE_STATEMENTS`` maps are
# declared by their map. Attempt columns are not required: only a stage's own claim writes its
# attempt (docs/state-machine.md "Attempts"); the core never names one.
ONE_STAGE_STATEMENTS: Mapping[str, Stage] = MappingProxyType(
    {
        # doctor's per-stage invariants (docs/operations.md "doctor")
        "app.repository.invariants:CANCELLED_EMBEDDING_NOT_DELETED": Stage.EMBEDDING,
        "app.repository.invariants:COMPLETED_EMBEDDING_WITHOUT_ROW": Stage.EMBEDDING,
        "app.repository.invariants:COMPLETED_WITHOUT_VECTOR_OF_PROFILE": Stage.EMBEDDING,
        "app.repository.invariants:KEYWORDS_OF_UNFINISHED_STAGE": Stage.KEYWORD,
        # the embedding-profile switch: vectors under another profile (docs/operations.md)
        "app.repository.profile_vectors:SAVE_BACKFILL_VECTOR": Stage.EMBEDDING,
        "app.repository.profile_vectors:CLAIM_BACKFILL": Stage.EMBEDDING,
        "core_service.repository.embedding_switch:PROPOSE_BATCH": Stage.EMBEDDING,
        "core_service.repository.embedding_switch:SEED_BACKFILL": Stage.EMBEDDING,
        # the core vouches for old state rows a backfill is to claim (live: embedding not CANCELLED)
        "core_service.repository.embedding_switch:VOUCH_STATE_ROWS": Stage.EMBEDDING,
        "core_service.repository.embedding_switch:COVERAGE": Stage.EMBEDDING,
        "core_service.repository.embedding_switch:FAILED_BY_REASON": Stage.EMBEDDING,
        # personal search's lists: keywords the owner may see (keyword_reads, §9)
        "core_service.repository.context_search:SEARCH_LISTS": Stage.KEYWORD,
        # search's re-check reads the keywords each result shows its owner (keyword_reads, §9)
        "core_service.repository.context_search:SEARCH_RECHECK": Stage.KEYWORD,
        # a record's public view: the keywords every member may see (keyword_reads, §9)
        "core_service.repository.record_view:LOAD_PUBLIC_RECORD": Stage.KEYWORD,
        # the switch's guarded moves check the embedding coverage of a profile
        "core_service.repository.embedding_switch:CUT_OVER": Stage.EMBEDDING,
        "core_service.repository.embedding_switch:FINISH": Stage.EMBEDDING,
        "core_service.repository.embedding_switch:MOVE_TO_IDLE": Stage.EMBEDDING,
        "core_service.repository.embedding_switch:STAGES_OPEN_FROM_BEFORE": Stage.EMBEDDING,
        # a keyword reprocess by the provider's Batch API: the stages a batch holds
        "app.repository.keyword_batches:HOLD_KEYWORDS": Stage.KEYWORD,
        "app.repository.keyword_batches:RETURN_TO_SYNC": Stage.KEYWORD,
        "app.repository.keyword_batches:FAIL_HELD": Stage.KEYWORD,
        "core_service.repository.keyword_batches:OPEN_VIA_BATCH": Stage.KEYWORD,
    }
)

# Statements written once per stage, as "module:attribute" naming a ``{Stage: statement}`` map:
# every map has every stage, and each statement names its stage's status and attempt columns
# (a claim takes the next attempt, a fail is fenced by it).
PER_STAGE_STATEMENTS: tuple[str, ...] = (
    "app.repository.context_ai_state:CLAIM_STAGE",
    "app.repository.context_ai_state:FAIL_STAGE",
)
