"""What the caller of a block of work watches of its commits: whether one has begun, and a
commit whose outcome is unknown (§6).

The HTTP request deadline (``pinlog_platform.http.request_deadline``) opens a ``CommitWatch``
per request; ``transactions.transaction`` marks it right before ``COMMIT`` (``committing``:
from then on the deadline must not cut the request, or a create that committed would not
answer and the client's retry would create a second context) and reports a commit whose
connection failed (``commit_outcome_unknown``). Outside a watch (CLI, rescan loop, worker
stages) both are no-ops. Here, not in ``http/``: the database helpers must not depend on the
HTTP layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar


class CommitWatch:
    """One watched block's commit state: ``committing`` once a ``COMMIT`` has begun;
    ``on_commit_unknown`` is called for each commit whose outcome is unknown."""

    __slots__ = ("committing", "on_commit_unknown")

    def __init__(self, on_commit_unknown: Callable[[], None] | None = None) -> None:
        self.committing = False
        self.on_commit_unknown = on_commit_unknown


_current: ContextVar[CommitWatch | None] = ContextVar("pinlog_commit_watch", default=None)


@contextlib.contextmanager
def watching(watch: CommitWatch) -> Iterator[CommitWatch]:
    """Watch the commits of the work run inside the block (in this context)."""
    token = _current.set(watch)
    try:
        yield watch
    finally:
        _current.reset(token)


@contextlib.contextmanager
def committing() -> Iterator[None]:
    """Mark the watched block as committing (module docstring); a no-op outside a watch."""
    watch = _current.get()
    if watch is not None:
        watch.committing = True
    yield


def commit_outcome_unknown() -> None:
    """Report a commit whose outcome is unknown (the connection failed or hit its deadline
    during ``COMMIT``) to the watch; a no-op outside a watch."""
    watch = _current.get()
    if watch is not None and watch.on_commit_unknown is not None:
        watch.on_commit_unknown()
