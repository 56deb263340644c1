"""Rate budgets per provider: requests and tokens per minute, rate-limit headers,
and the cooldown after a 429.

``PINLOG_{EMBEDDING,JUDGE}_{REQUESTS,TOKENS}_PER_MINUTE`` (0 = off) divided by
``PINLOG_WORKER_REPLICAS`` is this process's share. Before each provider request the caller
``acquire``\\ s one request and the tokens it is about to send (estimated as UTF-8 bytes ÷ 3);
after the answer, ``settle`` replaces the estimate by the answer's ``usage``. The budget is a
token bucket whose tokens come back exactly one window after they were taken (a sliding
window): so "at most N requests in any minute" holds for every minute, not only on average,
which a bucket refilling continuously with a burst of N would not give (up to 2N in a minute).
A request larger than the whole token budget is sent alone in an otherwise empty window.

A member's search goes first (``FIRST_STAGES``, read from ``usage.current_stage``): stage
requests wait in arrival order behind one lock, and one that finds a search waiting steps
aside until it has taken its share; the search still counts in the same windows, so the bound
holds for both together. A search never queues behind a backlog of stage work.

``observe`` reads every answer's headers: ``x-ratelimit-remaining-requests`` /
``-tokens`` of 0 pause this provider until ``x-ratelimit-reset-requests`` / ``-tokens``
(durations such as ``6m0s``, ``20ms``, ``1.5s``); a 429 rate limit (not a quota, which is
provider-wide) pauses it for its ``Retry-After`` (or the reset headers, else
``DEFAULT_COOLDOWN_SECONDS``, at most ``MAX_COOLDOWN_SECONDS``) and is reported by the
provider's gate as reason ``rate_limited`` meanwhile. A pause delays this provider's calls only:
each provider has its own budget, so an embedding 429 never delays a judge call.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from app.errors import ProviderUnavailableError, TransientError
from app.providers.usage import current_stage

logger = logging.getLogger(__name__)

DEFAULT_COOLDOWN_SECONDS = 1.0
MAX_COOLDOWN_SECONDS = 60.0
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
# Callers (``usage.current_stage``) whose requests are taken before any waiting stage request.
FIRST_STAGES = frozenset({"search"})


def parse_duration(value: str | None) -> float | None:
    """Seconds of an OpenAI rate-limit reset (``6m0s``, ``20ms``, ``1h2m3.5s``, ``0.5s``);
    a bare number is seconds; ``None`` when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    parts = _DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return None
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


class _Window:
    """Amounts taken in the last ``window`` seconds (a sliding window of ``limit``)."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self._entries: deque[list[float]] = deque()  # [taken_at, amount]
        self._used = 0.0

    def _expire(self, now: float) -> None:
        while self._entries and self._entries[0][0] <= now - self.window:
            self._used -= self._entries.popleft()[1]

    def wait(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` fits (0: now)."""
        self._expire(now)
        amount = min(amount, self.limit)  # larger than the budget: alone in a full window
        excess = self._used + amount - self.limit
        if excess <= 0:
            return 0.0
        freed = 0.0
        for taken_at, taken in self._entries:
            freed += taken
            if freed >= excess:
                return max(taken_at + self.window - now, 0.0)
        return self.window

    def take(self, amount: float, now: float) -> list[float]:
        entry = [now, amount]
        self._entries.append(entry)
        self._used += amount
        return entry

    def correct(self, entry: list[float], amount: float) -> None:
        if entry in self._entries:  # still inside the window
            self._used += amount - entry[1]
        entry[1] = amount


class Grant:
    """One acquired request; ``settle`` it with the tokens the answer reported."""

    __slots__ = ("_budget", "_entry")

    def __init__(self, budget: RateBudget, entry: list[float] | None) -> None:
        self._budget = budget
        self._entry = entry

    def settle(self, tokens: int) -> None:
        if self._entry is not None and self._budget._tokens is not None:
            self._budget._tokens.correct(self._entry, float(tokens))


class RateBudget:
    """One provider's budget (module docstring). ``requests`` / ``tokens``: per ``window``
    seconds for this process, 0 = no limit of that kind; ``clock``: monotonic seconds."""

    def __init__(
        self,
        provider: str,
        *,
        requests: int,
        tokens: int,
        window_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.provider = provider
        self._requests = _Window(requests, window_seconds) if requests > 0 else None
        self._tokens = _Window(tokens, window_seconds) if tokens > 0 else None
        self._clock = clock
        self._lock = asyncio.Lock()  # stage requests: first come, first served
        self._first_waiting = 0  # searches waiting for their share
        self._no_first_waiting = asyncio.Event()
        self._no_first_waiting.set()
        self._paused_until = 0.0
        self._cooldown_until = 0.0

    @property
    def token_limit(self) -> int | None:
        """Tokens per window of this process (``None``: unlimited); an embedding batch never
        carries more."""
        return self._tokens.limit if self._tokens is not None else None

    def cooldown_seconds(self) -> float:
        """Seconds left of the cooldown after a 429 (0 when none): the gate's ``rate_limited``."""
        return max(self._cooldown_until - self._clock(), 0.0)

    async def acquire(self, tokens: int) -> Grant:
        """Wait until one request with ``tokens`` fits (and no pause holds), then take it;
        a caller of ``FIRST_STAGES`` ahead of every waiting stage request (module docstring)."""
        if (
            self._requests is None
            and self._tokens is None
            and not self._lock.locked()
            and self._paused_until <= self._clock()
        ):
            return Grant(self, None)  # nothing to count and nothing to wait for
        if current_stage.get() in FIRST_STAGES:
            return await self._acquire_first(tokens)
        async with self._lock:
            while True:
                await self._no_first_waiting.wait()
                now = self._clock()
                wait = self._wait(tokens, now)
                if wait <= 0 and self._no_first_waiting.is_set():
                    return self._take(tokens, now)
                if wait > 0:
                    await asyncio.sleep(wait)

    async def _acquire_first(self, tokens: int) -> Grant:
        self._first_waiting += 1
        self._no_first_waiting.clear()
        try:
            while True:
                now = self._clock()
                wait = self._wait(tokens, now)
                if wait <= 0:
                    return self._take(tokens, now)
                await asyncio.sleep(wait)
        finally:
            self._first_waiting -= 1
            if self._first_waiting == 0:
                self._no_first_waiting.set()

    def _wait(self, tokens: int, now: float) -> float:
        """Seconds until one request with ``tokens`` fits and no pause holds (0: now)."""
        wait = max(self._paused_until - now, 0.0)
        if self._requests is not None:
            wait = max(wait, self._requests.wait(1, now))
        if self._tokens is not None:
            wait = max(wait, self._tokens.wait(tokens, now))
        return wait

    def _take(self, tokens: int, now: float) -> Grant:
        if self._requests is not None:
            self._requests.take(1, now)
        entry = self._tokens.take(tokens, now) if self._tokens is not None else None
        return Grant(self, entry)

    def observe(self, status: int, headers: Mapping[str, Any], error: Exception | None) -> None:
        """Read one answer's rate-limit headers; a 429 rate limit starts a cooldown."""
        now = self._clock()
        resets = []
        for kind in ("requests", "tokens"):
            remaining = headers.get(f"x-ratelimit-remaining-{kind}")
            reset = parse_duration(headers.get(f"x-ratelimit-reset-{kind}"))
            if reset is not None:
                resets.append(reset)
            if remaining is not None and remaining.strip() == "0" and reset is not None:
                self._paused_until = max(self._paused_until, now + min(reset, MAX_COOLDOWN_SECONDS))
        rate_limited = isinstance(error, TransientError) and not isinstance(
            error,
            ProviderUnavailableError,  # a quota 429 is provider-wide: the gate's
        )
        if status != 429 or not rate_limited:
            return
        seconds = _retry_after(headers)
        if seconds is None:
            seconds = max(resets) if resets else DEFAULT_COOLDOWN_SECONDS
        seconds = min(max(seconds, 0.001), MAX_COOLDOWN_SECONDS)
        if self._cooldown_until <= now:
            # INFO: the stage's own transient WARNING already names the 429 (FC-07).
            logger.info(
                "%s provider rate limited (429): cooling down for %.3g s", self.provider, seconds
            )
        self._cooldown_until = max(self._cooldown_until, now + seconds)
        self._paused_until = max(self._paused_until, self._cooldown_until)


def _retry_after(headers: Mapping[str, Any]) -> float | None:
    try:
        milliseconds = headers.get("retry-after-ms")
        if milliseconds:
            return float(milliseconds) / 1000
        value = headers.get("retry-after")
        return float(value) if value else None
    except ValueError:
        return None


def per_process(limit: int, replicas: int) -> int:
    """This process's share of a per-minute ``limit`` (0 = off) among ``replicas``."""
    if limit <= 0:
        return 0
    return max(1, math.floor(limit / max(replicas, 1)))
