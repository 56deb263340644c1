"""The spend guard: a provider's daily token cap as one more reason of its
provider gate.

``PINLOG_EMBEDDING_DAILY_TOKEN_CAP`` / ``PINLOG_JUDGE_DAILY_TOKEN_CAP`` (0 = off): once the
provider's tokens today (UTC; every process's, from the usage ledger) reach the cap, its gate
is unavailable until the next UTC day: no call is made, process requests are refused at accept
time with 503 and a ``Retry-After`` of the seconds to midnight UTC, and a stage already running
is left ``PROCESSING`` for the rescan (transient, never ``FAILED``; what it had stored stays).
One ERROR line when the cap is reached, one WARNING when it is released (a new day, or a
raised cap after a restart); ``pinlog_provider_spend_capped{provider}`` is 1 meanwhile and
``/readyz`` reports the gate's reason ``daily_token_cap``. ``pinlog_provider_daily_token_cap``
and ``pinlog_provider_tokens_today`` (read when scraped) let an alert warn before the cap.

The cap is a ceiling, not an exact budget: calls in flight when it is reached still finish,
and another replica's tokens are seen with the ledger's write interval of delay.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

from app.metrics import WorkerMetrics

logger = logging.getLogger(__name__)

SECONDS_PER_DAY = 86_400
REASON = "daily_token_cap"


class TokensToday(Protocol):
    def tokens_today(self, provider: str) -> int: ...


class DailyTokenCap:
    """``provider``'s cap of ``cap`` tokens per UTC day (0: none) over ``totals``, shown in
    ``metrics`` (the cap, today's tokens, whether it is reached)."""

    def __init__(
        self,
        provider: str,
        cap: int,
        totals: TokensToday,
        metrics: WorkerMetrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.provider = provider
        self.cap = cap
        self._totals = totals
        self._gauge = metrics.spend_capped.labels(provider)
        self._gauge.set(0)
        metrics.daily_token_cap.labels(provider).set(cap)
        metrics.tokens_today.labels(provider).set_function(lambda: totals.tokens_today(provider))
        self._clock = clock
        self._reached = False

    def reached(self) -> bool:
        """True while today's tokens are at or over the cap (logged once per change)."""
        if self.cap <= 0:
            return False
        spent = self._totals.tokens_today(self.provider)
        reached = spent >= self.cap
        if reached != self._reached:
            self._reached = reached
            self._gauge.set(1 if reached else 0)
            if reached:
                logger.error(
                    "%s provider daily token cap reached: %d of %d tokens today (UTC); no "
                    "calls and process requests refused until the next UTC day, in %d s",
                    self.provider,
                    spent,
                    self.cap,
                    self.retry_after_seconds(),
                )
            else:
                logger.warning("%s provider daily token cap released", self.provider)
        return reached

    def retry_after_seconds(self) -> int:
        """Whole seconds to the next UTC midnight (at least 1)."""
        return max(1, math.ceil(SECONDS_PER_DAY - self._clock() % SECONDS_PER_DAY))
