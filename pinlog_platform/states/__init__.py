"""Status and Stage enums of the AI state machine (CONTRACT §2).

Leaf module: imports nothing from the app.
"""

from enum import StrEnum


class Status(StrEnum):
    """One stage's status; the value set is an interface shared with the core side (§2)."""

    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class Stage(StrEnum):
    """A pipeline stage; the value is the ``ai.context_ai_state`` column holding its status.

    Repository functions accept only ``Stage``: each stage has its own statements (§2).
    """

    EMBEDDING = "embedding_status"
    KEYWORD = "keyword_status"

    @property
    def label(self) -> str:
        """Short name for logs and metrics: ``embedding`` or ``keyword``."""
        return self.name.lower()


# Transitions the worker itself may perform on one stage (§2). The WHERE clauses in
# repository/context_ai_state.py enforce them; tests/worker/repository/test_transition_table.py
# drives every statement from every status and checks the outcome against this table.
WORKER_TRANSITIONS: frozenset[tuple[Status, Status]] = frozenset(
    {
        (Status.PENDING, Status.PROCESSING),
        (Status.PROCESSING, Status.PROCESSING),
        (Status.PROCESSING, Status.COMPLETED),
        (Status.PROCESSING, Status.FAILED),
    }
)

# A stage in one of these statuses may still be claimed (§2 start/reclaim).
CLAIMABLE: frozenset[Status] = frozenset({Status.PENDING, Status.PROCESSING})
