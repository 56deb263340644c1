"""A keyword reprocess through the provider's Batch API (``pinlog-core reprocess keywords --via
batch``; docs/operations.md "Reprocess via the Batch API"; docs/contract.md §2 and §9,
Deviation "batch-held work").

**Submit** (``POST /internal/v1/batch/keywords``): the keyword stages the core marked are
claimed (``keyword_batches.claim``: marked, the text digest and owner the core's, a live vector
of this profile; ``keyword_attempt + 1`` as fencing token). Each one's candidates are chosen as
on the synchronous path (the same preset snapshot for the whole batch, ``top_k``, the
similarity floor); a stage with none is saved at once with no keyword (no call, as the
synchronous path); a text that cannot be judged (blank, too long) ends ``FAILED`` at once. The
others go in one JSONL input file (``POST /v1/files``, purpose ``batch``), one
``/v1/chat/completions`` request a line, the synchronous judge's very request
(``openai_compatible.judge_messages`` / ``judge_request``: prompt, schema, candidate enum),
``custom_id`` ``<context>:<attempt>``, and one batch (``POST /v1/batches``). One statement then
records the batch, holds each claimed stage in it and stores each one's candidates
(``keyword_batches.hold``). The upload or the create failing leaves the claims ``PROCESSING``
with no batch: they are claimed again after the processing expiry (503 to the core). The
batch's estimated prompt tokens count against the daily cap at once (the usage ledger, stage
``keyword_batch``, priced at the batch discount).

**Poll**: the poll loop of ``batch_backfill.ProviderBatchPoller`` (kind ``keyword``): any
worker of the profile, a restarted one too, polls and settles it. Settling:

- each output line is mapped as the synchronous answer (``openai_wire.parse_verdict``,
  ``judgment.map_verdict``) and saved by the synchronous path's guarded, fenced save
  (``stage_saves.save_keywords``): a context deleted or edited meanwhile is ``CANCELLED`` and
  nothing is written, an attempt no longer current stores nothing;
- an answer with no usable judgment (the synchronous judge would have asked again) goes back
  to the normal path, once: its mark is cleared, so it is never batched again by this run;
  a refusal or truncation is the note's own fault (``FAILED``), as on the synchronous path;
- each error line is classified by ``failure_policy.status_error`` (docs/failures.md): the
  note's own fault ends the stage ``FAILED`` with its reason; anything else (provider-wide,
  transient, ``batch_expired``) returns it to the normal path, failing no note;
- what the batch did not answer (expired, failed, cancelled) returns to the normal path; a
  cancelled batch's results are discarded, never saved;
- the tokens the results report settle the estimate (``batch_backfill`` module docstring);
- the items and the provider's files are deleted.

Returning to the normal path leaves the stage ``PROCESSING`` without a batch or mark (the
worker never moves a stage back to ``PENDING``, §2): the rescan re-requests it and the
synchronous claim takes it over after the processing expiry, as after a transient fault.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.errors import (
    DatabaseStatementError,
    InvalidInputError,
    InvalidOutputError,
    WorkerError,
)
from app.metrics import WorkerMetrics
from app.providers import openai_wire
from app.providers.openai_batches import BatchClient
from app.providers.openai_compatible import judge_messages, judge_request
from app.providers.usage import BatchUsageSink, CallUsage
from app.repository import context_ai_state, keyword_batches, stage_saves
from app.repository.keyword_batches import BatchItems, HeldItem, KeywordAsk
from app.repository.stage_pool import StagePool
from app.service import context_text
from app.service.batch_backfill import ProviderBatchPoller, Settlement, SubmitReport
from app.service.judgment import map_verdict
from app.service.presets import PresetCache
from app.service.profile_backfill import DEFAULT_RETRY_AFTER_SECONDS, BackfillRefused
from app.service.provider_gate import ProviderGate
from app.service.requests import ProcessRequest
from pinlog_platform.contract.states import Stage
from pinlog_platform.contract.states.failure_reasons import FailureReason

logger = logging.getLogger(__name__)

ENDPOINT = "/v1/chat/completions"
# The usage ledger's stage of keyword batches (priced at the batch discount: usage_ledger).
STAGE = "keyword_batch"
# Results of a batch saved at once (connections of the stage pool they take at most).
SAVES_AT_ONCE = 4


@dataclass(slots=True)
class KeywordSubmitReport(SubmitReport):
    """A ``SubmitReport`` of keyword stages, and those ``completed`` at once (no candidate: no
    call)."""

    completed: list[int] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {**SubmitReport.as_json(self), "completed": len(self.completed)}


def custom_id(context_id: int, attempt: int) -> str:
    """The batch line's ``custom_id``: the claim, no user text."""
    return f"{context_id}:{attempt}"


def parse_custom_id(value: object) -> tuple[int, int] | None:
    """The ``(context_id, attempt)`` a ``custom_id`` names; ``None`` when not one of ours."""
    if not isinstance(value, str):
        return None
    parts = value.split(":")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


class KeywordBatches(ProviderBatchPoller):
    """Submits marked keyword stages as provider batches and settles them (module
    docstring)."""

    KIND = "keyword"
    PROVIDER = "judge"
    ENDPOINT = ENDPOINT
    STAGE = STAGE
    LABEL = "keyword"
    FILE_PREFIX = "keywords"

    def __init__(
        self,
        stage_pool: StagePool,
        client: BatchClient,
        gate: ProviderGate,
        presets: PresetCache,
        *,
        usage: BatchUsageSink | None,
        metrics: WorkerMetrics,
        profile: str,
        model: str,
        model_profile: str,
        top_k: int,
        similarity_floor: float,
        max_input_chars: int,
        expiry_seconds: float,
        poll_seconds: float,
    ) -> None:
        """``profile``: this worker's embedding profile (the candidates' presets);
        ``model``: the judge's chat model; ``model_profile``: stored with each judgment (the
        synchronous OpenAI judge's); ``poll_seconds``: between polls of one batch."""
        super().__init__(
            stage_pool, client, gate, usage=usage, profile=profile, model=model,
            max_input_chars=max_input_chars, expiry_seconds=expiry_seconds,
            poll_seconds=poll_seconds,
        )  # fmt: skip
        self._presets = presets
        self._counts = metrics.stages[Stage.KEYWORD]
        self._model_profile = model_profile
        self._top_k = top_k
        self._floor = similarity_floor

    # --- submit ---------------------------------------------------------------------------

    async def submit(self, profile: str, items: Sequence[ProcessRequest]) -> KeywordSubmitReport:
        """Claim the marked keyword stages of ``items`` and submit them as one provider batch
        (module docstring).

        Raises ``WrongProfile`` (409) for another profile and ``BackfillRefused`` (503) while
        the judge is unavailable (its daily cap included), the claim failed, or the upload or
        create failed (the claims are taken again after the processing expiry)."""
        self._refuse_unless_open(profile)
        report = KeywordSubmitReport()
        by_id = {item.context_id: item for item in items}
        asks = [
            KeywordAsk(i.context_id, context_text.fingerprint(i.text), i.user_id, i.record_id)
            for i in by_id.values()
        ]
        try:
            claims = await keyword_batches.claim(
                self._stage_pool, embedding_profile=self._profile, asks=asks,
                expiry_seconds=self._expiry_seconds,
            )  # fmt: skip
        except (WorkerError, DatabaseStatementError) as exc:
            raise BackfillRefused(type(exc).__name__, DEFAULT_RETRY_AFTER_SECONDS) from None
        report.not_claimed = sorted(set(by_id) - {c for c, _ in claims})
        snapshot = self._presets.snapshot()  # one snapshot for the whole batch (§4)
        lines: list[dict[str, object]] = []
        prompts: list[str] = []
        held: list[HeldItem] = []
        for context_id, attempt in claims:
            vector = await keyword_batches.read_vector(
                self._stage_pool, context_id=context_id, embedding_profile=self._profile
            )
            if vector is None:  # hidden meanwhile: the claim is taken over after the expiry
                report.not_claimed.append(context_id)
                continue
            try:
                text = context_text.prepare_for_embedding(
                    by_id[context_id].text, max_chars=self._max_input_chars
                )
            except InvalidInputError as exc:
                await context_ai_state.fail(
                    self._stage_pool, Stage.KEYWORD, context_id, attempt=attempt,
                    reason=exc.reason,
                )  # fmt: skip
                report.failed[context_id] = exc.reason.value
                continue
            candidates = snapshot.candidates(vector, top_k=self._top_k, floor=self._floor)
            if not candidates:
                # No candidate: COMPLETED with no keyword and no call, as the synchronous path.
                saved = await stage_saves.save_keywords(
                    self._stage_pool, context_id=context_id, attempt=attempt, selections=(),
                    preset_version=snapshot.version, unmatched_concepts=(),
                    model_profile=self._model_profile, embedding_profile=snapshot.profile,
                )  # fmt: skip
                if saved:
                    report.completed.append(context_id)
                continue
            messages = judge_messages(text, candidates)
            ids = list(dict.fromkeys(c.id for c in candidates))
            lines.append({
                "custom_id": custom_id(context_id, attempt), "method": "POST", "url": ENDPOINT,
                "body": judge_request(self._model, messages, ids),
            })  # fmt: skip
            prompts.extend(m["content"] for m in messages)
            held.append(HeldItem(
                context_id, attempt, tuple((c.id, c.similarity) for c in candidates)
            ))  # fmt: skip
        if not held:
            self._count_submit(report)
            return report

        report.batch_id, report.batched = await self._submit_lines(
            lines,
            prompts,
            purpose="keyword_reprocess",
            hold=lambda batch: keyword_batches.hold(
                self._stage_pool, batch, preset_version=snapshot.version, held=held
            ),
            put_back=None,
            unsent="claims left to expire",
        )
        self._count_submit(report)
        logger.info("keyword batch %s submitted: %d stage(s)", report.batch_id, len(report.batched))
        return report

    def _count_submit(self, report: KeywordSubmitReport) -> None:
        if report.completed:
            self._counts.completed.inc(len(report.completed))
        if report.failed:
            self._counts.failed.inc(len(report.failed))

    # --- settle ---------------------------------------------------------------------------

    def _call_usage(
        self, input_tokens: int, completion_tokens: int, *, estimated: bool = False
    ) -> CallUsage:
        return CallUsage(
            "judge", self._model, None, prompt_tokens=input_tokens,
            completion_tokens=completion_tokens, estimated=estimated,
        )  # fmt: skip

    async def _read_held(self, batch_id: str) -> BatchItems:
        return await keyword_batches.read_items(self._stage_pool, batch_id=batch_id)

    def _claim_of(self, line: dict, held: BatchItems) -> tuple[HeldItem | None, object]:
        """The held item a line's ``custom_id`` names (``None`` for a line that names none
        of this batch's, or another attempt) and its ``response`` as the provider wrote it."""
        claim = parse_custom_id(line.get("custom_id"))
        item = None if claim is None else held.items.get(claim[0])
        if item is None or claim is None or item.attempt != claim[1]:
            return None, line.get("response")
        return item, line.get("response")

    async def _return_to_sync(self, batch_id: str, context_ids: list[int] | None) -> list[int]:
        return await keyword_batches.return_to_sync(
            self._stage_pool, batch_id=batch_id, context_ids=context_ids
        )

    async def _settled(self, batch_id: str) -> None:
        await keyword_batches.delete_items(self._stage_pool, batch_id=batch_id)

    def _count_settled(self, settlement: Settlement) -> None:
        if settlement.completed:
            self._counts.completed.inc(settlement.completed)
        if settlement.cancelled:
            self._counts.discarded.inc(settlement.cancelled)
        if settlement.failed:
            self._counts.failed.inc(settlement.failed)

    async def _save_line(
        self,
        batch_id: str,
        line: dict,
        held: BatchItems,
        settlement: Settlement,
        to_sync: list[int],
    ) -> None:
        item, response = self._claim_of(line, held)
        if item is None:
            settlement.lost += 1
            return
        body = response.get("body") if isinstance(response, dict) else None
        usage = body.get("usage") if isinstance(body, dict) else None
        if isinstance(usage, dict):
            completion = _count(usage.get("completion_tokens"))
            settlement.tokens += _count(usage.get("prompt_tokens")) + completion
            settlement.completion_tokens += completion
        try:
            verdict = openai_wire.parse_verdict(body)
        except InvalidOutputError:
            to_sync.append(item.context_id)  # no usable judgment: the normal path, once
            return
        except WorkerError as exc:  # a refusal or truncation is the note's own
            await self._unanswered(batch_id, item, exc, settlement, to_sync)
            return
        judgment = map_verdict(verdict, {keyword_id for keyword_id, _ in item.candidates})
        saved = await stage_saves.save_keywords(
            self._stage_pool,
            context_id=item.context_id,
            attempt=item.attempt,
            selections=judgment.selections,
            preset_version=held.preset_version,
            unmatched_concepts=judgment.unmatched_concepts,
            model_profile=self._model_profile,
            embedding_profile=held.embedding_profile,
            candidates=item.candidates,
        )
        if saved:
            settlement.completed += 1
        else:
            # Deleted or edited meanwhile (CANCELLED wins), or another attempt owns it.
            settlement.cancelled += 1
            logger.info("keyword batch result discarded: context_id=%d", item.context_id)

    async def _fail(
        self, batch_id: str, item: HeldItem, reason: str, settlement: Settlement
    ) -> None:
        failed = await keyword_batches.fail_held(
            self._stage_pool, batch_id=batch_id, context_id=item.context_id,
            attempt=item.attempt, reason=FailureReason(reason).value,
        )  # fmt: skip
        if failed:
            settlement.failed += 1
            logger.info("keyword failed: context_id=%d reason=%s", item.context_id, reason)


def _count(value: object) -> int:
    return value if type(value) is int and value > 0 else 0
