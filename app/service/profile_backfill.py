"""The worker's half of the re-embedding backfill: ``POST /internal/v1/backfill/embed``
(docs/operations.md "Switching the embedding profile").

The core proposes a batch of contexts for this worker's profile; this service claims the
rows it may (``profile_vectors.claim``: PENDING or stale, fenced by attempt; the context
live, the request's text digest and owner the ones the core wrote on the state row, so a
request with another text or owner, or for a deleted context, claims nothing, is reported
``notClaimed`` and costs no provider call), embeds the
claimed texts (through the embedding gate, counted under stage ``backfill`` in the usage
ledger), and saves each vector in its own statement that re-checks the live state (a deleted
context's vector is never stored).

The texts go in **runs** that fit the embedding token budget (``token_runs``; one run without
a token budget), each embedded in one provider call and saved before the next is sent. A
batch has ``DEADLINE_SHARE`` of the worker's request deadline to embed its runs after the
first (which has the whole deadline, as a batch of one run): a run still waiting then (for the
budget's next window, or a slow provider) is abandoned and the rows not yet
saved go back to ``PENDING`` at once, answered 200 as ``putBack`` when some row of the batch
was settled (503 ``BackfillRefused`` when none was: the core backs off). So a batch larger
than one budget window makes progress: the core's next batch starts where this one stopped,
never the same batch cut whole by the deadline and sent first again forever. Outcomes, by the §6
classes of ``app.failure_policy``:

- the note's own fault (``InvalidInputError``: blank, too long, refused by the provider): that
  row ends ``FAILED`` with the reason; a batch the provider refuses as a whole is embedded
  again one by one to find the note;
- anything else (the provider unavailable or slow, the database): every claimed row goes back
  to ``PENDING`` and ``BackfillRefused`` tells the route to answer 503 with ``Retry-After``,
  so the core backs off. Nothing that is not the note's own ends a row ``FAILED``.

At most ``concurrency`` batches run at once; a further one waits up to ``SLOT_WAIT_SECONDS``
for a slot, then is refused (503).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from app.errors import (
    DatabaseStatementError,
    InvalidInputError,
    WorkerError,
)
from app.metrics import WorkerMetrics
from app.providers.base import EmbeddingProvider
from app.providers.usage import token_runs
from app.repository import profile_vectors
from app.repository.profile_vectors import BackfillAsk, BackfillClaim
from app.repository.stage_pool import StagePool
from app.service import context_text
from app.service.embedding_stage import require_dimension
from app.service.provider_gate import ProviderGate
from app.service.requests import ProcessRequest

logger = logging.getLogger(__name__)

# Contexts of one request at most (the core sends fewer).
MAX_BATCH = 256
# How long a batch waits for one of the running ones to finish before it is refused (seconds).
SLOT_WAIT_SECONDS = 5.0
# Seconds a refused batch should wait when nothing better is known.
DEFAULT_RETRY_AFTER_SECONDS = 2
# The share of the worker's request deadline within which a batch's runs after the first are
# embedded (module docstring); the rest saves the last run and puts the others back before the
# deadline answers 503.
DEADLINE_SHARE = 0.6


@dataclass(slots=True)
class BackfillReport:
    """What became of a batch, by context: ``completed`` (vector stored), ``cancelled``
    (deleted meanwhile), ``failed`` (the note's own fault, by reason), ``not_claimed`` (done,
    owned by another claim, or unknown), ``lost`` (the claim was taken over before the save),
    ``put_back`` (back to ``PENDING``: its save failed with a statement error, or its run was
    not embedded within the batch's share of the request deadline)."""

    completed: list[int] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    not_claimed: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    put_back: list[int] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "completed": len(self.completed),
            "cancelled": len(self.cancelled),
            "failed": len(self.failed),
            "notClaimed": len(self.not_claimed),
            "lost": len(self.lost),
            "putBack": len(self.put_back),
        }


class WrongProfile(Exception):
    """The batch names a profile this worker does not serve (HTTP 409)."""


class BackfillRefused(Exception):
    """Not now: busy, provider or database unavailable; claimed rows were put back
    (HTTP 503 with ``Retry-After: retry_after_seconds``)."""

    def __init__(self, cause: str, retry_after_seconds: int) -> None:
        super().__init__(cause)
        self.cause = cause
        self.retry_after_seconds = retry_after_seconds


async def claim_rows(
    stage_pool: StagePool,
    profile: str,
    items: Sequence[ProcessRequest],
    *,
    expiry_seconds: float,
) -> tuple[dict[int, ProcessRequest], list[BackfillClaim]]:
    """Claim the backfill rows of ``items`` under ``profile`` in one statement (a row ``PENDING``,
    or ``PROCESSING`` past ``expiry_seconds``: a reclaim); the items by context id and the claims
    won. Raises ``BackfillRefused`` when the statement fails (nothing claimed)."""
    by_id = {item.context_id: item for item in items}
    asks = [
        BackfillAsk(
            item.context_id, context_text.fingerprint(item.text), item.user_id, item.record_id
        )
        for item in by_id.values()
    ]
    try:
        claims = await profile_vectors.claim(
            stage_pool, embedding_profile=profile, asks=asks, expiry_seconds=expiry_seconds
        )
    except (WorkerError, DatabaseStatementError) as exc:
        raise BackfillRefused(type(exc).__name__, DEFAULT_RETRY_AFTER_SECONDS) from None
    return by_id, claims


class ProfileBackfill:
    """Embeds batches of contexts under ``profile`` (module docstring)."""

    def __init__(
        self,
        stage_pool: StagePool,
        provider: EmbeddingProvider,
        gate: ProviderGate,
        *,
        metrics: WorkerMetrics,
        profile: str,
        dimension: int,
        max_input_chars: int,
        expiry_seconds: float,
        concurrency: int = 4,
        batch_tokens: int | None = None,
        request_deadline_seconds: float | None = None,
    ) -> None:
        """``batch_tokens``: the embedding budget's tokens per window of this process (``None``:
        no token budget, one run); ``request_deadline_seconds``: the worker's request deadline
        (``None``: none, every run is waited for)."""
        self._stage_pool = stage_pool
        self._provider = provider
        self._gate = gate
        self._profile = profile
        self._dimension = dimension
        self._max_input_chars = max_input_chars
        self._expiry_seconds = expiry_seconds
        self._slots = asyncio.Semaphore(concurrency)
        self._batch_tokens = batch_tokens
        self._embed_seconds = (
            None if request_deadline_seconds is None else request_deadline_seconds * DEADLINE_SHARE
        )
        self._contexts = metrics.backfill_contexts

    async def run(self, profile: str, items: Sequence[ProcessRequest]) -> BackfillReport:
        """Claim, embed and save ``items`` (at most ``MAX_BATCH``) under ``profile``.

        Raises ``WrongProfile`` (409) for another profile and ``BackfillRefused`` (503) as the
        module docstring says; never leaves a claimed row ``PROCESSING`` on purpose.
        """
        if profile != self._profile:
            raise WrongProfile(f"this worker serves profile {self._profile!r}")
        if not self._gate.available:
            raise BackfillRefused(
                "embedding provider unavailable",
                self._gate.retry_after_seconds() or DEFAULT_RETRY_AFTER_SECONDS,
            )
        try:
            await asyncio.wait_for(self._slots.acquire(), SLOT_WAIT_SECONDS)
        except TimeoutError:
            raise BackfillRefused("busy", DEFAULT_RETRY_AFTER_SECONDS) from None
        try:
            return await self._run(items)
        finally:
            self._slots.release()

    async def _run(self, items: Sequence[ProcessRequest]) -> BackfillReport:
        report = BackfillReport()
        by_id, claims = await claim_rows(
            self._stage_pool, self._profile, items, expiry_seconds=self._expiry_seconds
        )
        claimed_ids = {claim.context_id for claim in claims}
        report.not_claimed = sorted(set(by_id) - claimed_ids)
        loop = asyncio.get_running_loop()
        until = None if self._embed_seconds is None else loop.time() + self._embed_seconds
        try:
            prepared = await self._prepare(claims, by_id, report)
            for index, run in enumerate(self._runs(prepared)):
                # The first run has the whole request deadline, as a batch of one run does.
                scope = asyncio.timeout_at(until if index else None)
                try:
                    async with scope:
                        vectors = await self._embed_all(run, report)
                except TimeoutError:
                    if not scope.expired():
                        raise
                    # Out of time: what is saved stays, the rest goes back now.
                    rest = self._unsettled(claims, report)
                    await self._release(rest)
                    logger.info("backfill batch out of time: %d row(s) put back", len(rest))
                    if len(rest) == len(claims):
                        # Nothing settled: the core backs off, as for a busy provider.
                        self._count(report)
                        raise BackfillRefused("deadline", DEFAULT_RETRY_AFTER_SECONDS) from None
                    report.put_back.extend(claim.context_id for claim in rest)
                    break
                for claim, vector in vectors:
                    await self._save_or_put_back(claim, vector, report)
        except (WorkerError, DatabaseStatementError) as exc:
            await self._release(self._unsettled(claims, report))
            self._count(report)
            retry_after = self._gate.retry_after_seconds() or DEFAULT_RETRY_AFTER_SECONDS
            logger.warning("backfill batch put back: cause=%s", type(exc).__name__)
            raise BackfillRefused(type(exc).__name__, retry_after) from None
        except asyncio.CancelledError:
            # The request's deadline or a shutdown: the rows go back now, not at the expiry.
            await asyncio.shield(self._release(self._unsettled(claims, report)))
            raise
        self._count(report)
        return report

    @staticmethod
    def _unsettled(claims: Sequence[BackfillClaim], report: BackfillReport) -> list[BackfillClaim]:
        settled = {
            *report.completed,
            *report.cancelled,
            *report.failed,
            *report.lost,
            *report.put_back,
        }
        return [claim for claim in claims if claim.context_id not in settled]

    async def _prepare(
        self,
        claims: Sequence[BackfillClaim],
        by_id: dict[int, ProcessRequest],
        report: BackfillReport,
    ) -> list[tuple[BackfillClaim, str]]:
        """Each claim with the text to embed; a claim whose text cannot be embedded (blank,
        too long) ends ``FAILED``."""
        prepared = []
        for claim in claims:
            try:
                text = context_text.prepare_for_embedding(
                    by_id[claim.context_id].text, max_chars=self._max_input_chars
                )
            except InvalidInputError as exc:
                await self._fail(claim, exc, report)
                continue
            prepared.append((claim, text))
        return prepared

    def _runs(
        self, prepared: Sequence[tuple[BackfillClaim, str]]
    ) -> list[Sequence[tuple[BackfillClaim, str]]]:
        """``prepared`` in order, cut into runs that fit the token budget (one without)."""
        if self._batch_tokens is None or not prepared:
            return [prepared]
        runs, start = [], 0
        for texts, _tokens in token_runs([text for _, text in prepared], self._batch_tokens):
            runs.append(prepared[start : start + len(texts)])
            start += len(texts)
        return runs

    async def _embed_all(
        self, prepared: Sequence[tuple[BackfillClaim, str]], report: BackfillReport
    ) -> list[tuple[BackfillClaim, np.ndarray]]:
        """One provider call for the batch; when the provider refuses it as the input's fault,
        one call per note, so only the faulty note fails."""
        if not prepared:
            return []
        texts = [text for _, text in prepared]
        try:
            vectors = await self._gate.call(lambda: self._provider.embed(texts))
        except InvalidInputError as exc:
            if len(prepared) == 1:
                await self._fail(prepared[0][0], exc, report)
                return []
            pairs = []
            for claim, text in prepared:
                try:
                    (vector,) = await self._gate.call(
                        lambda text=text: self._provider.embed([text])
                    )
                except InvalidInputError as one:
                    await self._fail(claim, one, report)
                    continue
                pairs.append((claim, require_dimension(vector, self._dimension)))
            return pairs
        return [
            (claim, require_dimension(vector, self._dimension))
            for (claim, _), vector in zip(prepared, vectors, strict=True)
        ]

    async def _save_or_put_back(
        self, claim: BackfillClaim, vector: np.ndarray, report: BackfillReport
    ) -> None:
        """Save one row; a statement error of this row alone (a bug, not the note's fault)
        puts it back to ``PENDING`` and the batch goes on: answered 200, the core sends the
        row again only after its resend delay, behind the rows after it, so one row the save
        cannot take never holds the backfill up (a 503 would have the same batch proposed
        first again, forever)."""
        try:
            await self._save(claim, vector, report)
        except DatabaseStatementError as exc:
            await self._release([claim])
            report.put_back.append(claim.context_id)
            logger.error(
                "backfill save failed, row put back: context_id=%d cause=%s",
                claim.context_id,
                exc,
            )

    async def _save(self, claim: BackfillClaim, vector: np.ndarray, report: BackfillReport) -> None:
        # Stored under the state row's owner (the claim's), never the request's.
        status = await profile_vectors.save_backfill_vector(
            self._stage_pool, claim, embedding_profile=self._profile, embedding=vector
        )
        if status == "COMPLETED":
            report.completed.append(claim.context_id)
        elif status == "CANCELLED":
            report.cancelled.append(claim.context_id)
        else:
            report.lost.append(claim.context_id)

    async def _fail(
        self, claim: BackfillClaim, exc: InvalidInputError, report: BackfillReport
    ) -> None:
        reason = exc.reason.value
        await profile_vectors.settle(
            self._stage_pool, [claim], embedding_profile=self._profile, reason=reason
        )
        report.failed[claim.context_id] = reason
        logger.info("backfill failed: context_id=%d reason=%s", claim.context_id, reason)

    async def _release(self, claims: Sequence[BackfillClaim]) -> None:
        """Put claims back to ``PENDING``; a database fault leaves them to the reclaim."""
        try:
            await profile_vectors.settle(
                self._stage_pool, claims, embedding_profile=self._profile, reason=None
            )
        except (WorkerError, DatabaseStatementError) as exc:
            logger.warning("backfill claims left to the reclaim: cause=%s", type(exc).__name__)

    def _count(self, report: BackfillReport) -> None:
        for result, count in (
            ("completed", len(report.completed)),
            ("cancelled", len(report.cancelled)),
            ("failed", len(report.failed)),
            ("not_claimed", len(report.not_claimed)),
            ("lost", len(report.lost)),
            ("put_back", len(report.put_back)),
        ):
            if count:
                self._contexts.labels(result).inc(count)
