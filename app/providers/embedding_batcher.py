"""Micro-batching of embedding stages: concurrent stages share one provider request (§3.2).

A stage's ``embed([text])`` joins the open batch; the batch is sent when it holds
``max_batch`` inputs or ``max_wait_seconds`` after its first input, whichever comes first.
Vectors come back matched by the response items' ``index`` (the provider's ``embed`` returns
them in input order). Failure of the batched request:

- an input-specific refusal (a ``PermanentError`` that does not count against the provider,
  e.g. a 400 ``context_length_exceeded`` or a zero vector) of a batch of several inputs is
  resolved by re-sending the inputs one by one, concurrently, so one bad note never fails
  another context; each stage then gets its own input's outcome;
- anything else (timeout, 429, 5xx, a provider-wide answer such as 401, 404, a 400 naming a
  request parameter or an unrecognised 4xx, a malformed body, a wrong dimension) is the same
  for every input and is never re-sent once per input: each waiting stage gets it and
  classifies it as before (§6).

With ``max_batch_tokens`` (this process's share of ``PINLOG_EMBEDDING_TOKENS_PER_MINUTE``) a
batch is also sent before an input would take its estimated tokens (UTF-8 bytes ÷ 3) over it:
batches are split by tokens as well as by count, so none exceeds what the budget can ever grant
(pgai #481).

A stage that stops waiting (its deadline fired) leaves the batch; the others are unaffected.
Search queries and preset loading call the wrapped provider directly and are never delayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import numpy as np

from app import failure_policy
from app.errors import PermanentError
from app.providers.base import EmbeddingProvider
from app.providers.usage import estimate_tokens

logger = logging.getLogger(__name__)


class _Batch:
    __slots__ = ("full", "texts", "tokens", "waiters")

    def __init__(self) -> None:
        self.tokens = 0
        self.texts: list[str] = []
        self.waiters: list[asyncio.Future[np.ndarray]] = []
        self.full = asyncio.Event()


class BatchingEmbedder:
    """An ``EmbeddingProvider`` for one input per call that coalesces concurrent calls.

    ``max_batch``: inputs per provider request (>= 1); ``max_wait_seconds``: how long the
    first input of a batch waits for company (>= 0). ``aclose`` cancels pending batches; the
    wrapped provider is closed by its owner.
    """

    def __init__(
        self,
        provider: EmbeddingProvider,
        *,
        max_batch: int,
        max_wait_seconds: float,
        max_batch_tokens: int | None = None,
    ) -> None:
        self.provider = provider
        self.dimension = provider.dimension
        self._max_batch = max_batch
        self._max_tokens = max_batch_tokens
        self._max_wait = max_wait_seconds
        self._open: _Batch | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def embed(self, texts: Sequence[str]) -> list[np.ndarray]:
        """One vector per input (float32 ``(dimension,)``); the errors of ``provider.embed``."""
        if len(texts) != 1 or self._max_batch == 1:
            return await self.provider.embed(texts)
        waiter: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        tokens = estimate_tokens(texts[0]) if self._max_tokens is not None else 0
        batch = self._open
        over = self._max_tokens is not None and batch is not None and batch.texts
        if over and batch.tokens + tokens > self._max_tokens:  # send it, open another
            self._open = None
            batch.full.set()
            batch = None
        if batch is None:
            batch = self._open = _Batch()
            task = asyncio.create_task(self._send_when_ready(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        batch.texts.append(texts[0])
        batch.tokens += tokens
        batch.waiters.append(waiter)
        if len(batch.texts) >= self._max_batch:
            self._open = None
            batch.full.set()
        return [await waiter]

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _send_when_ready(self, batch: _Batch) -> None:
        with contextlib.suppress(TimeoutError):  # the wait ran out: send what is there
            await asyncio.wait_for(batch.full.wait(), self._max_wait)
        if self._open is batch:
            self._open = None
        live = [(t, w) for t, w in zip(batch.texts, batch.waiters, strict=True) if not w.done()]
        if not live:
            return
        texts = [t for t, _ in live]
        try:
            vectors = await self.provider.embed(texts)
        except PermanentError as exc:
            if len(texts) > 1 and not failure_policy.counts_against_provider(exc):
                logger.info("embedding batch refused for one input: %d sent alone", len(texts))
                await asyncio.gather(*(self._send_alone(t, w) for t, w in live))
                return
            _fail_all(live, exc)
            return
        except asyncio.CancelledError:  # shutdown: the waiting stages stop too
            for _, waiter in live:
                waiter.cancel()
            raise
        except Exception as exc:  # every waiting stage classifies it on its own (§6)
            _fail_all(live, exc)
            return
        for (_, waiter), vector in zip(live, vectors, strict=True):
            if not waiter.done():
                waiter.set_result(vector)

    async def _send_alone(self, text: str, waiter: asyncio.Future[np.ndarray]) -> None:
        if waiter.done():
            return
        try:
            (vector,) = await self.provider.embed([text])
        except Exception as exc:
            if not waiter.done():
                waiter.set_exception(exc)
            return
        if not waiter.done():
            waiter.set_result(vector)


def _fail_all(live: list[tuple[str, asyncio.Future[np.ndarray]]], exc: BaseException) -> None:
    for _, waiter in live:
        if not waiter.done():
            waiter.set_exception(exc)
