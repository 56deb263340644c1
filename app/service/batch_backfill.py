"""The re-embedding backfill through the provider's Batch API (docs/operations.md "Backfill via
the Batch API"; docs/contract.md §2 and §9, Deviation "batch-held work").

**Submit** (``POST /internal/v1/backfill/embed`` with ``"via": "batch"``): the rows the core
proposed are claimed as on the synchronous path (``profile_vectors.claim``: the context live,
text digest and owner the core's, attempt + 1 as fencing token); a text that cannot be embedded
(blank, too long) ends ``FAILED`` at once; the others go in one JSONL input file
(``POST /v1/files``, purpose ``batch``), one ``/v1/embeddings`` request a line, ``custom_id``
``<context>:<attempt>:<user>:<record>``, and one batch (``POST /v1/batches``). One statement
then records the batch in ``ai.provider_batch`` and holds each claimed row in it
(``provider_batches.hold``): a held row is not reclaimed after the processing expiry nor resent
by the core. The upload or the create failing puts the claims back to ``PENDING`` (503 to the
core, as on the synchronous path). The batch's estimated tokens count against the daily cap
now (the usage ledger, stage ``backfill_batch``).

**Poll** (``ProviderBatchPoller.run_forever``, one loop per kind of batch: this module's
``embed`` and ``app.service.keyword_batches``'s ``keyword``): any worker of the profile, a
restarted one too, leases each
unsettled batch nobody polled within ``poll_seconds`` (``provider_batches.lease``), cancels it
when the core asked (a rollback or finish abandoned the profile; at once, not at the next
interval), and polls it. Once the batch is over it is **settled**:

- each output line is saved by the synchronous path's guarded, fenced save
  (``profile_vectors.save_backfill_vector``): a context deleted or replaced meanwhile is
  discarded (``CANCELLED``), an attempt no longer current stores nothing;
- each error line is classified by ``failure_policy.status_error`` (docs/failures.md): the
  note's own fault ends the row ``FAILED`` with its reason; anything else (provider-wide,
  transient, ``batch_expired``) returns the row to the synchronous path, failing no note;
- what the batch did not answer (expired, failed, cancelled) returns to the synchronous path;
  a cancelled profile's results are discarded, never saved;
- the tokens the results report settle the estimate: what exceeds it is counted then, what
  it counted above them (unanswered lines included) is taken back from the ledger row of the
  submission day (``UsageLedger.release``), so the ledger and the spend it prices show what
  the provider bills;
- the input, output and error files are deleted at the provider.

Settling is re-runnable: a worker killed while settling leaves the lease to run out, and the
next one settles again (a saved row is no longer ``PROCESSING``: nothing is written twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import orjson

from app import failure_policy
from app.errors import DatabaseStatementError, InvalidInputError, PermanentError, WorkerError
from app.metrics import WorkerMetrics
from app.providers import openai_wire
from app.providers.openai_batches import TERMINAL, BatchClient
from app.providers.openai_http import error_fields
from app.providers.padding import zero_pad
from app.providers.usage import BatchUsageSink, CallUsage, estimate_tokens
from app.repository import profile_vectors, provider_batches
from app.repository.profile_vectors import BackfillClaim
from app.repository.provider_batches import LeasedBatch, NewBatch
from app.repository.stage_pool import StagePool
from app.service import context_text
from app.service.profile_backfill import (
    DEFAULT_RETRY_AFTER_SECONDS,
    BackfillRefused,
    WrongProfile,
    claim_rows,
)
from app.service.provider_gate import ProviderGate
from app.service.requests import ProcessRequest

logger = logging.getLogger(__name__)

ENDPOINT = "/v1/embeddings"
# The usage ledger's stage of batch work (priced at the batch discount: usage_ledger).
STAGE = "backfill_batch"
# How long one poll (and its settlement) may hold a batch before another worker may take it.
LEASE_SECONDS = 300.0
# Results of a batch saved at once (connections of the stage pool they take at most).
SAVES_AT_ONCE = 4


@dataclass(slots=True)
class SubmitReport:
    """What became of a submitted request: ``batched`` rows held in batch ``batch_id``,
    ``failed`` (the note's own fault, before any call), ``not_claimed``."""

    batch_id: str | None = None
    batched: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    not_claimed: list[int] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "batchId": self.batch_id,
            "batched": len(self.batched),
            "failed": len(self.failed),
            "notClaimed": len(self.not_claimed),
        }


@dataclass(slots=True)
class Settlement:
    """What a settled batch did to its rows: ``completed`` (saved), ``cancelled`` (deleted
    meanwhile, discarded), ``failed`` (the note's own fault), ``returned`` (back to the
    synchronous path), ``lost`` (another attempt owns the row), and the tokens reported."""

    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    returned: int = 0
    lost: int = 0
    tokens: int = 0
    completion_tokens: int = 0


def custom_id(claim: BackfillClaim) -> str:
    """The batch line's ``custom_id``: what the save needs, with no user text."""
    return f"{claim.context_id}:{claim.attempt}:{claim.user_id}:{claim.record_id}"


def parse_custom_id(value: object) -> BackfillClaim | None:
    """The claim a ``custom_id`` names; ``None`` when it is not one of ours."""
    if not isinstance(value, str):
        return None
    parts = value.split(":")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        return None
    context_id, attempt, user_id, record_id = map(int, parts)
    return BackfillClaim(context_id, attempt, user_id, record_id)


class HeldClaim(Protocol):
    """A row held in a batch, as a line of its output or error file names it."""

    @property
    def context_id(self) -> int: ...


class ProviderBatchPoller:
    """One kind of provider batch of one profile: submits a kind's lines as one batch
    (``_submit_lines``) and runs its poll loop (module docstring "Poll"): leases each due
    batch, cancels it when the core asked, polls it and, once it is over, settles it
    (``_settle``). Each kind gives its hooks: how an output line is saved, how a held row is
    failed or returned to the normal path, what its usage and counters are."""

    KIND = "embed"
    # The provider of its requests (``failure_policy``, the usage ledger's ``CallUsage``).
    PROVIDER = "embedding"
    # The provider's endpoint of its lines, and the usage ledger's stage of its batches.
    ENDPOINT = ENDPOINT
    STAGE = STAGE
    # What its logs and its input files' names call it.
    LABEL = "backfill"
    FILE_PREFIX = "backfill"

    def __init__(
        self,
        stage_pool: StagePool,
        client: BatchClient,
        gate: ProviderGate,
        *,
        usage: BatchUsageSink | None,
        profile: str,
        model: str,
        max_input_chars: int,
        expiry_seconds: float,
        poll_seconds: float,
    ) -> None:
        """``profile``: this worker's embedding profile; ``model``: the provider's model of
        the lines; ``expiry_seconds``: the processing expiry its claims honour;
        ``poll_seconds``: between polls of one batch."""
        self._stage_pool = stage_pool
        self._client = client
        self._gate = gate
        self._usage = usage
        self._profile = profile
        self._model = model
        self._max_input_chars = max_input_chars
        self._expiry_seconds = expiry_seconds
        self.poll_seconds = poll_seconds
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run_forever(), name=f"{self.KIND}-batch-poller")

    async def aclose(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._client.aclose()

    # --- submit ---------------------------------------------------------------------------

    def _refuse_unless_open(self, profile: str) -> None:
        """``WrongProfile`` (409) for another profile than this worker's, ``BackfillRefused``
        (503) while the provider is unavailable (its daily cap included)."""
        if profile != self._profile:
            raise WrongProfile(f"this worker serves profile {self._profile!r}")
        if not self._gate.available:
            raise BackfillRefused(
                f"{self.PROVIDER} provider unavailable",
                self._gate.retry_after_seconds() or DEFAULT_RETRY_AFTER_SECONDS,
            )

    async def _submit_lines(
        self,
        lines: Sequence[dict[str, object]],
        inputs: Sequence[str],
        *,
        purpose: str,
        hold: Callable[[NewBatch], Awaitable[list[int]]],
        put_back: Callable[[], Awaitable[None]] | None,
        unsent: str,
    ) -> tuple[str, list[int]]:
        """Upload ``lines`` as one JSONL input file, create one batch of it and record it by
        ``hold`` (the ids it held); the
        estimated tokens of ``inputs`` count against the daily cap at once. ``(batch_id,
        held ids)``.

        Raises ``BackfillRefused`` (503) when the upload or the create failed (``put_back``
        awaited first; ``unsent`` says in the log what became of the claims) or the batch was
        not recorded (then it is cancelled: nobody would save its results; its claims,
        without a batch, are claimed again after the expiry)."""
        content = b"".join(orjson.dumps(line) + b"\n" for line in lines)
        estimated = estimate_tokens(*inputs)
        try:
            file_id = await self._client.upload(
                content, f"{self.FILE_PREFIX}-{self._profile}.jsonl"
            )
            batch = await self._client.create(
                file_id, self.ENDPOINT, {"purpose": purpose, "profile": self._profile}
            )
        except WorkerError as exc:
            if put_back is not None:
                await put_back()
            logger.warning("%s batch not submitted, %s: cause=%s", self.LABEL, unsent, exc)
            raise BackfillRefused(type(exc).__name__, DEFAULT_RETRY_AFTER_SECONDS) from None
        batch_id = str(batch["id"])
        try:
            held = await hold(
                NewBatch(
                    batch_id, self._profile, str(batch.get("status") or "validating"), file_id,
                    estimated,
                )
            )  # fmt: skip
        except (WorkerError, DatabaseStatementError) as exc:
            with contextlib.suppress(WorkerError):
                await self._client.cancel(batch_id)
            raise BackfillRefused(type(exc).__name__, DEFAULT_RETRY_AFTER_SECONDS) from None
        if self._usage is not None:
            self._usage.record(self.STAGE, self._call_usage(estimated, 0, estimated=True))
        return batch_id, held

    # --- poll and settle ------------------------------------------------------------------

    async def run_forever(self) -> None:
        """Poll rounds until ``aclose``, half a poll interval apart: each round polls every
        batch of the profile not polled within ``poll_seconds`` (by any worker)."""
        while not self._stop.is_set():
            try:
                while await self.poll_once():
                    if self._stop.is_set():
                        return
            except Exception:
                logger.exception("batch poll failed; continuing")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.poll_seconds / 2)

    async def poll_once(self) -> bool:
        """Poll (and settle, when over) the next due batch; whether there was one. A batch
        not over, or not reached, is let go and polled again after ``poll_seconds``."""
        leased = await provider_batches.lease(
            self._stage_pool,
            embedding_profile=self._profile,
            lease_seconds=LEASE_SECONDS,
            every_seconds=self.poll_seconds,
            kind=self.KIND,
        )
        if leased is None:
            return False
        try:
            if leased.cancel_requested and leased.status not in TERMINAL:
                with contextlib.suppress(WorkerError):  # 409: over meanwhile
                    await self._client.cancel(leased.batch_id)
            batch = await self._client.retrieve(leased.batch_id)
        except WorkerError as exc:
            logger.warning("batch %s not polled: cause=%s", leased.batch_id, exc)
            await provider_batches.update(
                self._stage_pool, batch_id=leased.batch_id, status=leased.status,
                output_file_id=None, error_file_id=None,
            )  # fmt: skip
            return True
        status = str(batch["status"])
        if status not in TERMINAL:
            await provider_batches.update(
                self._stage_pool, batch_id=leased.batch_id, status=status,
                output_file_id=None, error_file_id=None,
            )  # fmt: skip
            return True
        await provider_batches.update(
            self._stage_pool, batch_id=leased.batch_id, status=status,
            output_file_id=batch.get("output_file_id"), error_file_id=batch.get("error_file_id"),
        )  # fmt: skip
        settlement = await self._settle(leased, status, batch)
        logger.info(
            "%s batch %s %s: completed=%d cancelled=%d failed=%d returned=%d lost=%d",
            self.KIND, leased.batch_id, status, settlement.completed, settlement.cancelled,
            settlement.failed, settlement.returned, settlement.lost,
        )  # fmt: skip
        return True

    async def _settle(self, leased: LeasedBatch, status: str, batch: dict) -> Settlement:
        """Settle an ended batch (module docstring): save its output lines (a few at once:
        each is one statement and one commit on the stage pool), fail or return its error
        lines, return what it did not answer (a cancelled batch's every row), record its
        tokens and delete its files."""
        settlement = Settlement()
        if not leased.cancel_requested:
            held = await self._read_held(leased.batch_id)
            output = await self._client.lines(batch.get("output_file_id"))
            errors = await self._client.lines(batch.get("error_file_id"))
            to_sync: list[int] = []
            for start in range(0, len(output), SAVES_AT_ONCE):
                await asyncio.gather(
                    *(
                        self._save_line(leased.batch_id, line, held, settlement, to_sync)
                        for line in output[start : start + SAVES_AT_ONCE]
                    )
                )
            for line in errors:
                await self._error_line(leased.batch_id, line, held, settlement, to_sync)
            if to_sync:
                settlement.returned += len(await self._return_to_sync(leased.batch_id, to_sync))
        settlement.returned += len(await self._return_to_sync(leased.batch_id, None))
        await provider_batches.settle(
            self._stage_pool, batch_id=leased.batch_id, status=status, tokens=settlement.tokens
        )
        await self._settled(leased.batch_id)
        # The estimate counted the inputs at submission (against the daily cap at once): the
        # results settle it, what they exceed it by and every completion token added, what it
        # counted above them (lines never answered included: the provider bills none) taken back.
        answered_inputs = settlement.tokens - settlement.completion_tokens
        extra = max(answered_inputs - leased.estimated_tokens, 0)
        over = max(leased.estimated_tokens - answered_inputs, 0)
        if self._usage is not None and (extra or settlement.completion_tokens):
            self._usage.record(self.STAGE, self._call_usage(extra, settlement.completion_tokens))
        if self._usage is not None and leased.estimated_tokens:
            self._usage.release(
                self.STAGE,
                self._call_usage(over, 0),
                batch_id=leased.batch_id,
                estimate=leased.estimated_tokens,
            )
        self._count_settled(settlement)
        await self._delete_files(
            leased.input_file_id, batch.get("output_file_id"), batch.get("error_file_id")
        )
        return settlement

    async def _error_line(
        self, batch_id: str, line: dict, held: object, settlement: Settlement, to_sync: list[int]
    ) -> None:
        """An error file's line: the note's own fault (``failure_policy.status_error``) fails
        its row; anything else (``batch_expired`` and the like included) returns it."""
        claim, response = self._claim_of(line, held)
        if claim is None:
            return
        code = response.get("status_code") if isinstance(response, dict) else None
        if type(code) is not int:
            to_sync.append(claim.context_id)  # batch_expired and the like: not answered
            return
        error_code, error_type, param = error_fields(orjson.dumps(response.get("body")))
        error = failure_policy.status_error(
            self.PROVIDER, code, code=error_code, error_type=error_type, param=param
        )
        if isinstance(error, InvalidInputError):
            await self._fail(batch_id, claim, error.reason.value, settlement)
        else:
            to_sync.append(claim.context_id)

    async def _unanswered(
        self,
        batch_id: str,
        claim: HeldClaim,
        exc: WorkerError,
        settlement: Settlement,
        to_sync: list[int],
    ) -> None:
        """An output line with no usable answer: the note's own fault (a permanent error not
        held against the provider) fails its row; anything else (a wrong dimension, a broken
        answer: provider-wide) returns it to the normal path."""
        if isinstance(exc, PermanentError) and not failure_policy.counts_against_provider(exc):
            await self._fail(batch_id, claim, exc.reason.value, settlement)
        else:
            to_sync.append(claim.context_id)

    # --- each kind's hooks ----------------------------------------------------------------

    def _call_usage(
        self, input_tokens: int, completion_tokens: int, *, estimated: bool = False
    ) -> CallUsage:
        raise NotImplementedError

    async def _read_held(self, batch_id: str) -> object:
        """What the lines of ``batch_id`` are matched against (none by default)."""
        return None

    def _claim_of(self, line: dict, held: object) -> tuple[HeldClaim | None, object]:
        raise NotImplementedError

    async def _save_line(
        self, batch_id: str, line: dict, held: object, settlement: Settlement, to_sync: list[int]
    ) -> None:
        raise NotImplementedError

    async def _fail(
        self, batch_id: str, claim: HeldClaim, reason: str, settlement: Settlement
    ) -> None:
        raise NotImplementedError

    async def _return_to_sync(self, batch_id: str, context_ids: list[int] | None) -> list[int]:
        raise NotImplementedError

    async def _settled(self, batch_id: str) -> None:
        """After the batch is recorded settled (nothing by default)."""

    def _count_settled(self, settlement: Settlement) -> None:
        raise NotImplementedError

    async def _delete_files(self, *file_ids: object) -> None:
        """The notes' texts and results leave the provider's storage once saved; a failed
        delete is logged (the provider keeps the file until its own retention ends)."""
        for file_id in file_ids:
            if not isinstance(file_id, str):
                continue
            try:
                await self._client.delete_file(file_id)
            except WorkerError as exc:
                logger.warning("batch file not deleted at the provider: cause=%s", exc)


class BatchBackfill(ProviderBatchPoller):
    """Submits backfill rows as provider batches and settles them (module docstring)."""

    def __init__(
        self,
        stage_pool: StagePool,
        client: BatchClient,
        gate: ProviderGate,
        *,
        usage: BatchUsageSink | None,
        metrics: WorkerMetrics,
        profile: str,
        model: str,
        model_dimension: int,
        dimension: int,
        max_input_chars: int,
        expiry_seconds: float,
        poll_seconds: float,
    ) -> None:
        """``model_dimension``: the model's vectors; ``dimension``: stored, zero-padded (§5);
        ``poll_seconds``: between polls while no batch is due."""
        super().__init__(
            stage_pool, client, gate, usage=usage, profile=profile, model=model,
            max_input_chars=max_input_chars, expiry_seconds=expiry_seconds,
            poll_seconds=poll_seconds,
        )  # fmt: skip
        self._contexts = metrics.backfill_contexts
        self._model_dimension = model_dimension
        self._dimension = dimension

    # --- submit ---------------------------------------------------------------------------

    async def submit(self, profile: str, items: Sequence[ProcessRequest]) -> SubmitReport:
        """Claim ``items`` and submit them as one provider batch (module docstring).

        Raises ``WrongProfile`` (409) for another profile and ``BackfillRefused`` (503) while
        the provider is unavailable (its daily cap included) or the upload or create failed
        (the claims were put back to ``PENDING``)."""
        self._refuse_unless_open(profile)
        report = SubmitReport()
        by_id, claims = await claim_rows(
            self._stage_pool, self._profile, items, expiry_seconds=self._expiry_seconds
        )
        report.not_claimed = sorted(set(by_id) - {c.context_id for c in claims})
        lines, texts, sent = [], [], []
        for claim in claims:
            try:
                text = context_text.prepare_for_embedding(
                    by_id[claim.context_id].text, max_chars=self._max_input_chars
                )
            except InvalidInputError as exc:
                await profile_vectors.settle(
                    self._stage_pool, [claim], embedding_profile=self._profile,
                    reason=exc.reason.value,
                )  # fmt: skip
                report.failed[claim.context_id] = exc.reason.value
                continue
            sent.append(claim)
            texts.append(text)
            lines.append({
                "custom_id": custom_id(claim), "method": "POST", "url": ENDPOINT,
                "body": {"model": self._model, "input": text, "encoding_format": "base64"},
            })  # fmt: skip
        if not sent:
            self._count("failed", len(report.failed))
            return report

        report.batch_id, report.batched = await self._submit_lines(
            lines,
            texts,
            purpose="backfill",
            hold=lambda batch: provider_batches.hold(
                self._stage_pool, batch, claims=[(c.context_id, c.attempt) for c in sent]
            ),
            put_back=lambda: self._release(sent),
            unsent="rows put back",
        )
        self._count("batched", len(report.batched))
        self._count("failed", len(report.failed))
        logger.info("backfill batch %s submitted: %d row(s)", report.batch_id, len(report.batched))
        return report

    # --- settle ---------------------------------------------------------------------------

    def _call_usage(
        self, input_tokens: int, completion_tokens: int, *, estimated: bool = False
    ) -> CallUsage:
        return CallUsage(
            "embedding", self._model, None, embedding_tokens=input_tokens, estimated=estimated
        )

    def _claim_of(self, line: dict, held: object) -> tuple[BackfillClaim | None, object]:
        """The claim a line's ``custom_id`` names (``None`` for a line that names none of
        ours) and its ``response`` as the provider wrote it."""
        return parse_custom_id(line.get("custom_id")), line.get("response")

    async def _return_to_sync(self, batch_id: str, context_ids: list[int] | None) -> list[int]:
        return await provider_batches.return_to_sync(
            self._stage_pool, batch_id=batch_id, embedding_profile=self._profile,
            context_ids=context_ids,
        )  # fmt: skip

    def _count_settled(self, settlement: Settlement) -> None:
        for result in ("completed", "cancelled", "failed", "returned", "lost"):
            self._count(result, getattr(settlement, result))

    async def _save_line(
        self, batch_id: str, line: dict, held: object, settlement: Settlement, to_sync: list[int]
    ) -> None:
        claim, response = self._claim_of(line, held)
        if claim is None:
            return
        body = response.get("body") if isinstance(response, dict) else None
        usage = body.get("usage") if isinstance(body, dict) else None
        if isinstance(usage, dict) and type(usage.get("total_tokens")) is int:
            settlement.tokens += max(int(usage["total_tokens"]), 0)
        try:
            (vector,) = openai_wire.parse_embeddings(body, 1, self._model_dimension)
        except WorkerError as exc:  # a vector with no direction is the note's own
            await self._unanswered(batch_id, claim, exc, settlement, to_sync)
            return
        status = await profile_vectors.save_backfill_vector(
            self._stage_pool, claim, embedding_profile=self._profile,
            embedding=zero_pad(vector, self._dimension),
        )  # fmt: skip
        if status == "COMPLETED":
            settlement.completed += 1
        elif status == "CANCELLED":
            settlement.cancelled += 1
        else:
            settlement.lost += 1

    async def _fail(
        self, batch_id: str, claim: BackfillClaim, reason: str, settlement: Settlement
    ) -> None:
        failed = await provider_batches.fail_held(
            self._stage_pool, batch_id=batch_id, embedding_profile=self._profile,
            context_id=claim.context_id, attempt=claim.attempt, reason=reason,
        )  # fmt: skip
        if failed:
            settlement.failed += 1
            logger.info("backfill failed: context_id=%d reason=%s", claim.context_id, reason)

    async def _release(self, claims: Sequence[BackfillClaim]) -> None:
        try:
            await profile_vectors.settle(
                self._stage_pool, claims, embedding_profile=self._profile, reason=None
            )
        except (WorkerError, DatabaseStatementError) as exc:
            logger.warning("backfill claims left to the reclaim: cause=%s", type(exc).__name__)

    def _count(self, result: str, count: int) -> None:
        if count:
            self._contexts.labels(result).inc(count)
