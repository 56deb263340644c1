"""Stops a storm of identical permanent provider errors from failing every context (§6).

After ``threshold`` consecutive ``PermanentError``s from one provider (each still permanent for
its own context) the breaker opens: for ``cooldown_seconds`` no call is made and every attempt
raises ``TransientError``, so stages stay
``PROCESSING`` for the rescan instead of ending ``FAILED`` because of a bad key or model name.
The first call after the cooldown probes the provider again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from app.errors import InvalidInputError, PermanentError, TransientError

logger = logging.getLogger(__name__)
T = TypeVar("T")


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        *,
        threshold: int,
        cooldown_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._name = name
        self._threshold = threshold
        self._cooldown_seconds = cooldown_seconds
        self._clock = clock
        self._consecutive_permanent = 0
        self._opened_at: float | None = None

    @property
    def is_open(self) -> bool:
        return (
            self._opened_at is not None and self._clock() - self._opened_at < self._cooldown_seconds
        )

    async def call(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run ``operation``; raises ``TransientError`` instead while the breaker is open."""
        if self.is_open:
            raise TransientError(f"{self._name} circuit open")
        try:
            result = await operation()
        except InvalidInputError:
            raise  # about this input only, says nothing about the provider
        except PermanentError:
            self._consecutive_permanent += 1
            if self._consecutive_permanent >= self._threshold:
                if not self.is_open:
                    logger.error(
                        "%s circuit opened after %d consecutive permanent errors",
                        self._name,
                        self._consecutive_permanent,
                    )
                self._opened_at = self._clock()
            raise
        self._consecutive_permanent = 0
        self._opened_at = None
        return result
