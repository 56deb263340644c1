"""The worker instances the core talks to: one pooled HTTP client each, used in turn.

``PINLOG_CORE_WORKER_BASE_URL`` may list several instances (comma-separated). Each call starts
at the next instance (round robin) and moves on when one refuses or cannot be reached, so a
dead or overloaded replica costs a retry, not a lost request. A load balancer in front of the
workers works too: give its one URL.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import httpx

# Idle pooled connections are dropped after this many seconds, before the worker's keep-alive
# (uvicorn's default is 5 s) closes them under a request.
KEEPALIVE_EXPIRY_SECONDS = 2.0


class WorkerEndpoints:
    def __init__(self, clients: Sequence[httpx.AsyncClient]) -> None:
        if not clients:
            raise ValueError("at least one worker endpoint is required")
        self._clients = tuple(clients)
        self._turn = itertools.count()

    @classmethod
    def connect(
        cls,
        base_urls: Sequence[str],
        *,
        internal_secret: str,
        connect_timeout_seconds: float,
        read_timeout_seconds: float,
    ) -> WorkerEndpoints:
        """One client per URL, each sending ``X-Internal-Secret`` (§8)."""
        return cls(
            [
                httpx.AsyncClient(
                    base_url=url,
                    headers={"X-Internal-Secret": internal_secret},
                    timeout=httpx.Timeout(read_timeout_seconds, connect=connect_timeout_seconds),
                    limits=httpx.Limits(
                        max_connections=32,
                        max_keepalive_connections=16,
                        keepalive_expiry=KEEPALIVE_EXPIRY_SECONDS,
                    ),
                )
                for url in base_urls
            ]
        )

    def in_turn(self) -> list[httpx.AsyncClient]:
        """Every client once, starting at the next one in round-robin order."""
        start = next(self._turn) % len(self._clients)
        return [*self._clients[start:], *self._clients[:start]]

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()
