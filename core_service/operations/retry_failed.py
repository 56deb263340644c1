"""A way back for ``FAILED`` notes, within the contract: ``pinlog-core retry-failed``.

Nothing is reset in place (§9: a context's state only moves forward; an edit with an unchanged
body is a no-op). Instead each selected live context with a ``FAILED`` stage is **replaced**
by a new context with the same body, as seed 001 §5.3 describes for a failed note: a new
``context_id`` with a fresh budget (``PENDING``/``PENDING``/0), the old one cancelled as a
delete cancels it and naming its replacement (``replaced_by``: a client that changes or deletes
the old id gets 409 with ``replacedBy``). One transaction per record, in the lock order of
docs/lock-order.md (member, record, its contexts, their state rows, vectors); each new context
is dispatched after its commit, in batches, through the dispatcher: nothing is sent while
dispatching is paused, and between batches the command waits while the workers refuse.

Contexts failed for their input (``INPUT_REASONS``) are left alone unless ``--reason`` names
their reason, so a second run does not replace the same hopeless notes again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import groupby

import typer
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from core_service.command_startup import load, run_operation
from core_service.composition import Operations
from core_service.metrics import CoreMetrics
from core_service.operations import counts
from core_service.repository import (
    context,
    context_ai_state,
    context_search,
    failed_contexts,
    member,
    record,
)
from core_service.repository.db import autocommit, transaction
from core_service.repository.failed_contexts import FailedContext
from core_service.service.dispatch import DispatchRequest, WorkerDispatcher
from core_service.service.lifecycle import cancel_contexts, insert_context
from pinlog_platform.cli import numbers
from pinlog_platform.contract.states.failure_reasons import FailureReason

logger = logging.getLogger(__name__)

# Reasons that say the note itself cannot be processed: replaced only when named.
INPUT_REASONS = frozenset(
    {
        FailureReason.INPUT_TOO_LONG,
        FailureReason.INPUT_BLANK,
        FailureReason.INPUT_REJECTED,
        FailureReason.DIMENSION_MISMATCH,
    }
)
# Contexts replaced, then dispatched, per batch.
BATCH_CONTEXTS = 100
# Dispatches of a batch in flight at once, as the rescan's.
DISPATCH_CONCURRENCY = 8
# Longest wait for the workers between batches and at the end (seconds).
READY_WAIT_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Selection:
    """What to replace: ``reason`` (None: any but ``INPUT_REASONS``), the owner, failures no
    older than ``since_seconds``, at most ``limit`` contexts."""

    reason: str | None = None
    member_id: int | None = None
    since_seconds: float | None = None
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class Replacement:
    old_id: int
    new_id: int
    reason: str


@dataclass(slots=True)
class RetryFailedReport:
    """``selected``: matching contexts; ``replaced``: old -> new; ``skipped``: selected but
    changed meanwhile (deleted, or no longer ``FAILED``); ``taken``: new contexts a worker
    took before the command ended (the rest are ``PENDING`` for the rescan)."""

    selected: list[FailedContext]
    replaced: list[Replacement] = field(default_factory=list)
    skipped: int = 0
    taken: int = 0

    def by_reason(self) -> dict[str, int]:
        reasons = (
            [r.reason for r in self.replaced]
            if self.replaced
            else [c.reason for c in self.selected]
        )
        return dict(sorted(Counter(reasons).items()))


class FailedReplacer:
    """Selects and replaces failed contexts (module docstring)."""

    def __init__(
        self, engine: AsyncEngine, dispatcher: WorkerDispatcher | None, metrics: CoreMetrics
    ) -> None:
        self._engine = engine
        self._dispatcher = dispatcher
        self._metrics = metrics

    async def select(self, selection: Selection) -> list[FailedContext]:
        skipped = [] if selection.reason else sorted(INPUT_REASONS)
        async with autocommit(self._engine) as conn:
            return await failed_contexts.select(
                conn,
                reason=selection.reason,
                skipped_reasons=skipped,
                member_id=selection.member_id,
                since_seconds=selection.since_seconds,
                limit=selection.limit if selection.limit is not None else 2**31 - 1,
            )

    async def replace(self, selection: Selection) -> RetryFailedReport:
        """Replace every selected context, dispatching the new ones batch by batch."""
        assert self._dispatcher is not None, "replacing needs a dispatcher"
        report = RetryFailedReport(await self.select(selection))
        stop = asyncio.Event()
        for batch in _batches(report.selected):
            if not await self._dispatcher.paused():
                await self._dispatcher.wait_until_ready(READY_WAIT_SECONDS, stop)
            requests = []
            for (record_id, member_id), contexts in groupby(
                batch, key=lambda c: (c.record_id, c.member_id)
            ):
                contexts = list(contexts)
                done = await self._replace_in_record(record_id, member_id, contexts)
                report.skipped += len(contexts) - len(done)
                for replacement, request in done:
                    report.replaced.append(replacement)
                    requests.append(request)
            await self._dispatch(requests)
        if report.replaced and not await self._dispatcher.paused():
            await self._dispatcher.wait_until_ready(READY_WAIT_SECONDS, stop)
        async with autocommit(self._engine) as conn:
            report.taken = await context_ai_state.count_taken(
                conn, [r.new_id for r in report.replaced]
            )
        return report

    async def _replace_in_record(
        self, record_id: int, member_id: int, contexts: Sequence[FailedContext]
    ) -> list[tuple[Replacement, DispatchRequest]]:
        """One transaction: member, record, contexts, state rows, vectors (lock order)."""
        async with transaction(self._engine) as conn:
            if not await member.lock_active(conn, member_id):
                return []
            place = await record.touch_active(conn, record_id=record_id, member_id=member_id)
            if place is None:
                return []
            locked = []
            for failed in sorted(contexts, key=lambda c: c.context_id):
                old = await context.lock(conn, failed.context_id)
                if not old.deleted:
                    locked.append((failed, old))
            still = [
                (failed, old)
                for failed, old in locked
                if await failed_contexts.lock_still_failed(conn, failed.context_id)
            ]
            done = []
            for failed, old in still:
                new_id = await insert_context(
                    conn, member_id, record_id, old.body, old.origin_created_at
                )
                # The same body: the same search terms (docs/search.md).
                await context_search.copy_terms(conn, old_id=failed.context_id, new_id=new_id)
                done.append(
                    (
                        Replacement(failed.context_id, new_id, failed.reason),
                        DispatchRequest(new_id, member_id, record_id, old.body,
                                        place.external_place_id, place.name),
                    )
                )  # fmt: skip
            await cancel_contexts(conn, [failed.context_id for failed, _ in still])
            await _name_replacements(conn, [replacement for replacement, _ in done])
        self._metrics.lifecycle_operations.labels("retry_failed", "replaced").inc(len(done))
        return done

    async def _dispatch(self, requests: list[DispatchRequest]) -> None:
        assert self._dispatcher is not None
        dispatcher, limit = self._dispatcher, asyncio.Semaphore(DISPATCH_CONCURRENCY)

        async def one(request: DispatchRequest) -> None:
            async with limit:
                await dispatcher.dispatch(request, origin="retry_failed")

        await asyncio.gather(*(one(request) for request in requests))


async def _name_replacements(conn: AsyncConnection, replacements: list[Replacement]) -> None:
    for replacement in replacements:
        await context.mark_replaced(conn, context_id=replacement.old_id, new_id=replacement.new_id)


def _batches(selected: list[FailedContext]) -> list[list[FailedContext]]:
    """About ``BATCH_CONTEXTS`` contexts each, never splitting a record."""
    ordered = sorted(selected, key=lambda c: (c.record_id, c.context_id))
    batches: list[list[FailedContext]] = [[]]
    for _record, contexts in groupby(ordered, key=lambda c: c.record_id):
        if len(batches[-1]) >= BATCH_CONTEXTS:
            batches.append([])
        batches[-1].extend(contexts)
    return [batch for batch in batches if batch]


commands = typer.Typer(rich_markup_mode=None)


async def retry_failed(
    operations: Operations, selection: Selection, *, dry_run: bool
) -> list[FailedContext] | RetryFailedReport:
    """What ``selection`` matches (``dry_run``: nothing written), or the report of replacing
    it, the new contexts dispatched through the operations' dispatcher."""
    if dry_run:
        return await FailedReplacer(operations.engine, None, operations.metrics).select(selection)
    replacer = FailedReplacer(operations.engine, operations.dispatcher(), operations.metrics)
    return await replacer.replace(selection)


@commands.command("retry-failed")
def retry_failed_command(
    reason: str | None = typer.Option(
        None, "--reason", metavar="CODE", help="Only this failure reason"
    ),
    since: float | None = typer.Option(
        None,
        "--since",
        metavar="DURATION",
        help="Only failures this recent: 30m, 24h, 7d (at most 36500d)",
        parser=numbers.duration_seconds(),
    ),
    member: int | None = typer.Option(
        None, "--member", parser=numbers.whole(1), metavar="ID", help="Only this member's"
    ),
    limit: int | None = typer.Option(
        None, "--limit", parser=numbers.whole(1), metavar="N", help="At most N contexts"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only count; write nothing"),
    list_them: bool = typer.Option(
        False,
        "--list",
        help="With --dry-run: also one line per context (context, record, member, reason)",
    ),
) -> None:
    """Replace each live context with a FAILED stage by a new one with the same body (a
    fresh budget), dispatched at once; input failures only when --reason names them."""
    from core_service.settings import RescanSettings, StateClockSettings

    if reason is not None and reason not in {code.value for code in FailureReason}:
        raise typer.BadParameter(
            "one of " + ", ".join(code.value for code in FailureReason), param_hint="--reason"
        )
    if list_them and not dry_run:
        raise typer.BadParameter("only with --dry-run", param_hint="--list")
    settings = load(StateClockSettings if dry_run else RescanSettings)
    selection = Selection(reason=reason, member_id=member, since_seconds=since, limit=limit)
    result = run_operation(settings, lambda ops: retry_failed(ops, selection, dry_run=dry_run))
    if dry_run:
        if list_them:
            for failed in result:
                typer.echo(
                    f"context {failed.context_id} record {failed.record_id} "
                    f"member {failed.member_id} {failed.reason}"
                )
        typer.echo(f"would replace {len(result)} context(s)")
        typer.echo("by reason: " + counts(Counter(failed.reason for failed in result)))
        return
    for replacement in result.replaced:
        typer.echo(f"{replacement.old_id} -> {replacement.new_id} ({replacement.reason})")
    typer.echo(
        f"replaced {len(result.replaced)} context(s); skipped {result.skipped} changed meanwhile"
    )
    typer.echo("by reason: " + counts(result.by_reason()))
    typer.echo(
        f"taken by a worker {result.taken}; "
        f"left PENDING for the rescan {len(result.replaced) - result.taken}"
    )
