"""The dispatcher's memory of refused work: a bounded, fair set and the gate that paces it.

``RetrySet`` holds dispatches the workers refused (or could not be reached for), at most
``capacity`` contexts, each until its deadline (the pending expiry after it entered; then the
rescan owns it again). It hands them out **round robin over owners, oldest first within an
owner** (``DispatchRequest.member_id``), the order the rescan's claim uses too
(docs/scaling.md "Fairness"): a member's bulk import never stands in front of everyone else's
notes.

``RefusalGate`` says when the workers may be asked again: closed after a round every instance
refused, for the shortest ``Retry-After`` they gave (plus up to 20 % jitter, so several core
processes do not return in step), or, without one, for a backoff of 1 s doubling to a cap (30 s
by default; up to 20 % less, for the same reason) that any accepted dispatch resets. Both are
plain data structures on the event loop; the dispatcher drives them.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from core_service.service.process_requests import DispatchRequest

# The gate stays closed Retry-After x [1, 1 + JITTER], or the backoff x [1 - JITTER, 1].
JITTER = 0.2
BACKOFF_INITIAL_SECONDS = 1.0


@dataclass(slots=True)
class _Held:
    request: DispatchRequest
    deadline: float  # monotonic seconds: leaves the set then


class RetrySet:
    """Refused dispatches by owner; round robin over owners, oldest first within one."""

    def __init__(self, capacity: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self._clock = clock
        # Owner -> their held requests, oldest first; owners in round-robin turn order.
        self._owners: OrderedDict[int, deque[_Held]] = OrderedDict()
        self._ids: set[int] = set()

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, context_id: int) -> bool:
        return context_id in self._ids

    @property
    def room(self) -> int:
        return self.capacity - len(self._ids)

    def add(self, request: DispatchRequest, *, hold_seconds: float, first: bool = False) -> bool:
        """Hold ``request`` for at most ``hold_seconds``; False when the set is full. A request
        already held is not added twice (True). ``first`` puts it at the front of its owner's
        line (a request taken out and refused again keeps its place)."""
        if request.context_id in self._ids:
            return True
        if len(self._ids) >= self.capacity:
            return False
        held = _Held(request, self._clock() + hold_seconds)
        line = self._owners.get(request.member_id)
        if line is None:
            line = self._owners[request.member_id] = deque()
        if first:
            line.appendleft(held)
        else:
            line.append(held)
        self._ids.add(request.context_id)
        return True

    def put_back(self, held: list[tuple[DispatchRequest, float]]) -> list[DispatchRequest]:
        """Return requests taken by ``take`` (with their deadlines) to the front of their
        owners' lines, in their order; those past their deadline or without room are
        returned instead."""
        now, rejected = self._clock(), []
        for request, deadline in reversed(held):
            if deadline <= now or not self.add(request, hold_seconds=deadline - now, first=True):
                rejected.append(request)
        return rejected

    def take(self, count: int) -> list[tuple[DispatchRequest, float]]:
        """Up to ``count`` requests, one per owner in turn (round robin), each owner's oldest
        first; with their deadlines (for ``put_back``)."""
        taken: list[tuple[DispatchRequest, float]] = []
        while len(taken) < count and self._owners:
            owner, line = next(iter(self._owners.items()))
            held = line.popleft()
            self._ids.discard(held.request.context_id)
            taken.append((held.request, held.deadline))
            if line:
                self._owners.move_to_end(owner)
            else:
                del self._owners[owner]
        return taken

    def expire(self) -> list[DispatchRequest]:
        """Remove and return every request past its deadline."""
        now, expired = self._clock(), []
        for owner in list(self._owners):
            line = self._owners[owner]
            kept = deque(held for held in line if held.deadline > now)
            if len(kept) == len(line):
                continue
            expired.extend(held.request for held in line if held.deadline <= now)
            if kept:
                self._owners[owner] = kept
            else:
                del self._owners[owner]
        for request in expired:
            self._ids.discard(request.context_id)
        return expired

    def clear(self) -> int:
        """Forget everything (shutdown: the rows are still ``PENDING``); how many were held."""
        held = len(self._ids)
        self._owners.clear()
        self._ids.clear()
        return held


class RefusalGate:
    """When the workers may be asked again (module docstring)."""

    def __init__(
        self,
        *,
        backoff_max_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._backoff_max_seconds = backoff_max_seconds
        self._clock = clock
        self._jitter = jitter
        self._backoff_seconds = BACKOFF_INITIAL_SECONDS
        self._closed_until = 0.0

    @property
    def is_open(self) -> bool:
        return self._clock() >= self._closed_until

    def seconds_until_open(self) -> float:
        return max(0.0, self._closed_until - self._clock())

    def refused(self, retry_after_seconds: float | None) -> float:
        """Every instance refused: close (or keep closed) the gate; the seconds it stays shut.

        A ``Retry-After`` is honoured with jitter; without one, the backoff is used and
        doubles, once per closing (refusals of dispatches in flight together count once)."""
        now, was_open = self._clock(), self.is_open
        if retry_after_seconds is not None:
            wait = retry_after_seconds * (1 + JITTER * self._jitter())
        elif was_open:
            wait = self._backoff_seconds * (1 - JITTER * self._jitter())
            self._backoff_seconds = min(self._backoff_seconds * 2, self._backoff_max_seconds)
        else:
            return self.seconds_until_open()
        self._closed_until = max(self._closed_until, now + wait)
        return self.seconds_until_open()

    def accepted(self) -> None:
        """A worker took a dispatch: the next refusal without ``Retry-After`` waits 1 s again."""
        self._backoff_seconds = BACKOFF_INITIAL_SECONDS
