"""Stage attempts this worker process gave up while it still owned them (docs/contract.md,
§2 Deviation).

A stage that meets a fault not the note's own (the database or a provider unavailable, the
stage deadline) is left ``PROCESSING`` (§6); by §2 a re-request may reclaim it only once it is
older than the processing expiry. But this process knows the attempt is dead: its task has
finished and nothing of it can save any more (the save needs the attempt, and the stage ran
to its end). So a re-request that reaches this process takes such a stage over at once
(``context_ai_state.CLAIM_EMBEDDING``'s ``:abandoned_attempt``), fenced by the attempt number:
a stage claimed again meanwhile (another attempt) is not touched. A short outage then costs a
note seconds, not the processing expiry. Another replica does not know the attempt and waits
for the expiry as before.

Entries are kept for the processing expiry at most (after it any request reclaims the stage)
and at most ``MAX_ENTRIES`` of them, the oldest dropped first.
"""

from __future__ import annotations

import time
from collections import OrderedDict

from pinlog_platform.contract.states import Stage

MAX_ENTRIES = 10_000


class AbandonedClaims:
    """``(stage, context_id) -> attempt`` of the attempts this process gave up."""

    def __init__(self) -> None:
        # (stage, context id) -> (attempt, monotonic seconds after which it is dropped)
        self._entries: OrderedDict[tuple[Stage, int], tuple[int, float]] = OrderedDict()

    def note(self, stage: Stage, context_id: int, attempt: int, *, keep_seconds: float) -> None:
        """``attempt`` of ``stage`` was left ``PROCESSING`` and nothing of it runs any more;
        remembered for ``keep_seconds`` (the processing expiry: then any request reclaims)."""
        key = (stage, context_id)
        self._entries.pop(key, None)
        self._entries[key] = (attempt, time.monotonic() + keep_seconds)
        self._prune()

    def attempt_of(self, stage: Stage, context_id: int) -> int | None:
        """The attempt of ``stage`` this process gave up for ``context_id``, if any."""
        entry = self._entries.get((stage, context_id))
        if entry is None or entry[1] < time.monotonic():
            return None
        return entry[0]

    def forget(self, stage: Stage, context_id: int) -> None:
        """The stage was claimed again (by this process): the entry has served."""
        self._entries.pop((stage, context_id), None)

    def _prune(self) -> None:
        # Oldest first: every entry is kept for the same expiry, so the first is the
        # first to lapse.
        now = time.monotonic()
        while self._entries:
            key, (_, until) = next(iter(self._entries.items()))
            if until >= now and len(self._entries) <= MAX_ENTRIES:
                break
            del self._entries[key]
