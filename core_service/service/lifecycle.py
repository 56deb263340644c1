"""Context lifecycle transactions of the core service (§9), in one lock order.

Lock order (docs/lock-order.md), the same in every transaction of both services that touches
more than one of these rows: ``core.member`` -> ``core.record`` -> ``core.context`` ->
``ai.context_ai_state`` -> ``ai.context_embedding`` -> ``ai.context_keyword``. The worker's
saves lock the state row before writing result rows; a cancellation here does the same, so a
delete racing a save waits instead of deadlocking, and never leaves a live vector under a
``CANCELLED`` state. Per-record operations lock the record first, which serialises them and
makes the last-context guard and record deletion race-free.

Every change commits first and dispatches afterwards; the dispatch is never part of the
transaction (§9 "After-commit dispatch").
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from functools import partial
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from core_service.errors import (
    ConflictError,
    NotFoundError,
    RateLimitedError,
    UnauthenticatedError,
    UnavailableError,
)
from core_service.metrics import CoreMetrics
from core_service.repository import (
    context,
    context_ai_state,
    context_embedding,
    context_search,
    context_writes,
    member,
    member_daily_notes,
    place,
    record,
)
from core_service.repository.db import client_single_statement, client_transaction
from core_service.service.context_body import (
    normalize_body,
    normalize_text,
    refuse_control_characters,
)
from core_service.service.dispatch import DispatchRequest, WorkerDispatcher
from core_service.service.search_terms import SearchAnalyser
from pinlog_platform.contract.search.terms import Terms

logger = logging.getLogger(__name__)

# core.place column widths (0005_core_tables.sql).
PLACE_ID_CHARACTERS = 100
PLACE_NAME_CHARACTERS = 200
# A record deleted between our conflicting insert and our lock: try the get-or-create again.
_RECORD_RACE_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class CreatedContext:
    """``record_created``: a new record (HTTP 201) or the member's existing one (200);
    ``public_id``: the record's public id (22 characters), which only its owner is told."""

    record_id: int
    context_id: int
    record_created: bool
    public_id: str


@dataclass(frozen=True, slots=True)
class ModifiedContext:
    """``context_id`` is the id to use from now on; ``replaced`` is False for a no-op edit."""

    context_id: int
    replaced: bool


class ContextLifecycle:
    """Create, add, modify, delete contexts; delete records; withdraw members (§9)."""

    def __init__(
        self,
        engine: AsyncEngine,
        dispatcher: WorkerDispatcher,
        metrics: CoreMetrics,
        *,
        daily_notes: int = 0,
        analyser: SearchAnalyser,
    ) -> None:
        """``daily_notes``: notes (creates, added contexts, edits that write a new context) a
        member may make per UTC day; 0 = off (``PINLOG_CORE_MEMBER_DAILY_NOTES``)."""
        self._engine = engine
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._daily_notes = daily_notes
        self._analyser = analyser

    async def create_record(
        self, *, member_id: int, external_place_id: str, place_name: str, body: str
    ) -> CreatedContext:
        """Get or create the member's active record for the place and add a first (or
        further) context with its ``PENDING`` state, in one statement (§9 Create;
        ``context_writes.CREATE_CONTEXT``).

        Raises ``InvalidBodyError`` (422), ``UnauthenticatedError`` (401: withdrawn member),
        ``RateLimitedError`` (429: the daily note cap; nothing written), ``UnavailableError``
        (503).
        """
        stored_body = normalize_body(body)
        # On the values as sent: trimming must not hide a line break at an edge.
        refuse_control_characters(external_place_id, field="externalPlaceId")
        refuse_control_characters(place_name, field="placeName")
        external_place_id = normalize_text(
            external_place_id, field="externalPlaceId", max_characters=PLACE_ID_CHARACTERS
        )
        place_name = normalize_text(
            place_name, field="placeName", max_characters=PLACE_NAME_CHARACTERS
        )
        created = await self._write_note(
            context_writes.create,
            stored_body,
            member_id=member_id,
            external_place_id=external_place_id,
            place_name=place_name,
        )
        if not created.member_active:
            raise UnauthenticatedError()
        if created.raced:
            own_record, record_created, context_id = await self._create_step_by_step(
                member_id,
                external_place_id,
                place_name,
                stored_body,
                # analysed again: a lost race is rare and an analysis costs about 0.5 ms
                await self._analyser.terms(stored_body),
            )
        else:
            assert created.record_id is not None and created.context_id is not None
            own_record = record.OwnRecord(
                created.record_id, created.record_place_name, created.public_id
            )
            record_created, context_id = created.record_created, created.context_id
        record_id, record_place_name = own_record.record_id, own_record.place_name
        self._count("create", "record_created" if record_created else "context_added")
        # The name the record's owner gave, as every later dispatch sends it (never a name
        # another member registered first for the place).
        self._dispatcher.dispatch_soon(
            DispatchRequest(
                context_id, member_id, record_id, stored_body, external_place_id, record_place_name
            )
        )
        return CreatedContext(record_id, context_id, record_created, own_record.public_id)

    async def add_context(self, *, member_id: int, record_id: int, body: str) -> int:
        """Add a context to an active record of the member; the new context id.

        Raises ``InvalidBodyError`` (422), ``UnauthenticatedError`` (401: withdrawn member),
        ``NotFoundError`` (404: missing, deleted or another member's record),
        ``RateLimitedError`` (429: the daily note cap), ``UnavailableError`` (503).
        """
        stored_body = normalize_body(body)
        added = await self._write_note(
            context_writes.add,
            stored_body,
            member_id=member_id,
            record_id=record_id,
        )
        if not added.member_active:
            raise UnauthenticatedError()
        if added.context_id is None:
            raise NotFoundError("record")
        self._count("add", "added")
        self._dispatcher.dispatch_soon(
            DispatchRequest(
                added.context_id,
                member_id,
                record_id,
                stored_body,
                added.external_place_id,
                added.place_name,
            )
        )
        return added.context_id

    async def modify_context(
        self, *, member_id: int, context_id: int, body: str
    ) -> ModifiedContext:
        """Edit = create the new context, then delete the old one naming the new one as its
        replacement, in one statement (§9; ``context_writes.MODIFY_CONTEXT``).

        An unchanged body (after normalisation) is a no-op: the old id, state untouched, no
        dispatch. Nothing is inherited by the new context; ``origin_created_at`` is carried.
        Raises ``InvalidBodyError`` (422), ``UnauthenticatedError`` (401: withdrawn member),
        ``NotFoundError`` (404: never existed or another member's), ``ConflictError`` (409:
        replaced, naming the live end of the replacement chain, or already deleted:
        ``_refuse_unless_live``), ``RateLimitedError`` (429: the daily note cap, which an edit that
        writes a new context takes like a create), ``UnavailableError`` (503).
        """
        stored_body = normalize_body(body)
        outcome = await self._write_note(
            context_writes.modify,
            stored_body,
            member_id=member_id,
            context_id=context_id,
        )
        _refuse_unless_live(outcome)
        if outcome.unchanged:
            self._count("modify", "unchanged")
            return ModifiedContext(context_id, replaced=False)
        assert outcome.new_id is not None and outcome.record_id is not None
        self._count("modify", "replaced")
        self._dispatcher.dispatch_soon(
            DispatchRequest(
                outcome.new_id,
                member_id,
                outcome.record_id,
                stored_body,
                outcome.external_place_id,
                outcome.place_name,
            )
        )
        return ModifiedContext(outcome.new_id, replaced=True)

    async def delete_context(self, *, member_id: int, context_id: int) -> None:
        """Soft-delete one context and cancel its AI work (§9 Delete).

        Raises ``UnauthenticatedError`` (401: withdrawn member), ``NotFoundError`` (404),
        ``ConflictError`` (409: replaced or already deleted, ``_refuse_unless_live``; or the
        record's last active context),
        ``UnavailableError`` (503).
        """
        outcome = await client_single_statement(
            self._engine,
            partial(context_writes.delete, member_id=member_id, context_id=context_id),
        )
        _refuse_unless_live(outcome)
        if not outcome.deleted:
            raise ConflictError(
                "context is the last active one of its record; delete the record instead"
            )
        self._count("delete", "deleted")

    async def delete_record(self, *, member_id: int, record_id: int) -> int:
        """Soft-delete a record and cancel every active context of it in bulk; their count.

        Raises ``NotFoundError`` (404: missing, already deleted or another member's record),
        ``UnavailableError`` (503).
        """
        async with client_transaction(self._engine) as conn:
            if not await record.delete(conn, record_id=record_id, member_id=member_id):
                raise NotFoundError("record")
            context_ids = await context.lock_active_in_records(conn, [record_id])
            await cancel_contexts(conn, context_ids)
        self._count("delete_record", "deleted")
        return len(context_ids)

    async def withdraw_member(self, member_id: int) -> int:
        """Withdraw the member: every record and context soft-deleted, all AI work cancelled,
        in one transaction; the number of contexts cancelled.

        Raises ``UnauthenticatedError`` (401: not active), ``UnavailableError`` (503).
        """
        async with client_transaction(self._engine) as conn:
            if not await member.withdraw(conn, member_id):
                raise UnauthenticatedError()
            record_ids = await record.delete_all_of_member(conn, member_id)
            context_ids = await context.lock_active_in_records(conn, record_ids)
            await cancel_contexts(conn, context_ids)
        self._count("withdraw", "withdrawn")
        return len(context_ids)

    async def _create_step_by_step(
        self,
        member_id: int,
        external_place_id: str,
        place_name: str,
        stored_body: str,
        terms: Terms,
    ) -> tuple[record.OwnRecord, bool, int]:
        """§9 Create as one statement per row, each with a new snapshot: for the rare create
        that met a place or record committed concurrently (``context_writes`` module
        docstring). ``(the record, record_created, context_id)``."""
        async with client_transaction(self._engine) as conn:
            if not await member.lock_active(conn, member_id):
                raise UnauthenticatedError()
            stored_place = await place.get_or_create(
                conn, external_place_id=external_place_id, name=place_name
            )
            own_record, record_created = await self._active_record(
                conn, member_id, stored_place.place_id, place_name
            )
            if not await member_daily_notes.take(
                conn, member_id=member_id, daily_notes=self._daily_notes
            ):
                self._count_daily_note("limited")
                raise RateLimitedError(seconds_to_next_utc_day())
            if self._daily_notes > 0:
                self._count_daily_note("admitted")
            context_id = await insert_context(conn, member_id, own_record.record_id, stored_body)
            await context_search.insert_terms(
                conn,
                context_id=context_id,
                member_id=member_id,
                terms=terms,
                analyser_version=self._analyser.version,
            )
        self._metrics.create_step_by_step.inc()
        return own_record, record_created, context_id

    async def _active_record(
        self, conn: AsyncConnection, member_id: int, place_id: int, place_name: str
    ) -> tuple[record.OwnRecord, bool]:
        """``(the record, created)``: a new record keeps ``place_name``; an existing one keeps
        the name its owner gave first."""
        for _attempt in range(_RECORD_RACE_ATTEMPTS):
            created = await record.insert_if_absent(
                conn, member_id=member_id, place_id=place_id, place_name=place_name
            )
            if created is not None:
                return created, True
            existing = await record.touch_active_of_place(
                conn, member_id=member_id, place_id=place_id
            )
            if existing is not None:
                return existing, False
        raise UnavailableError("record is changing concurrently; try again")

    async def _write_note(
        self, write: Callable[..., Awaitable[_Written]], stored_body: str, **arguments: object
    ) -> _Written:
        """Run one of the statements that write a note (create, add, modify) in a transaction of
        its own, with the body's search terms and the daily note cap (``_within_daily_cap``)."""
        terms = await self._analyser.terms(stored_body)
        return await client_single_statement(
            self._engine,
            partial(
                self._within_daily_cap,
                partial(
                    write,
                    body=stored_body,
                    daily_notes=self._daily_notes,
                    terms=terms,
                    analyser_version=self._analyser.version,
                    **arguments,
                ),
            ),
        )

    async def _within_daily_cap(
        self, write: Callable[[AsyncConnection], Awaitable[_Written]], conn: AsyncConnection
    ) -> _Written:
        """Run a write that takes the daily note cap; ``RateLimitedError`` (429) when the cap
        refused it, raised inside the transaction so that what the statement wrote before the
        refusal (a new record or place) is rolled back."""
        outcome = await write(conn)
        if outcome.daily_cap_reached:
            self._count_daily_note("limited")
            raise RateLimitedError(seconds_to_next_utc_day())
        if self._daily_notes > 0 and getattr(outcome, _WROTE[type(outcome)]) is not None:
            self._count_daily_note("admitted")
        return outcome

    def _count_daily_note(self, outcome: str) -> None:
        self._metrics.member_quota.labels("daily_notes", outcome).inc()

    def _count(self, operation: str, outcome: str) -> None:
        self._metrics.lifecycle_operations.labels(operation, outcome).inc()


_Written = TypeVar(
    "_Written",
    context_writes.CreateOutcome,
    context_writes.AddedContext,
    context_writes.ModifyOutcome,
)
# The field that holds the new context's id in each outcome (None: nothing written).
_WROTE = {
    context_writes.CreateOutcome: "context_id",
    context_writes.AddedContext: "context_id",
    context_writes.ModifyOutcome: "new_id",
}


def seconds_to_next_utc_day() -> int:
    """Seconds until the daily note cap's next UTC day begins, at least 1 (``Retry-After``)."""
    now = datetime.now(UTC)
    tomorrow = datetime.combine(now.date() + timedelta(days=1), time(), tzinfo=UTC)
    return max(1, math.ceil((tomorrow - now).total_seconds()))


def _refuse_unless_live(found: context_writes.ExistingContextLocks) -> None:
    """The answer to an edit or delete of a context that is not the caller's live one: 401 for
    an inactive member, 404 for another member's or a missing context, 409 for a deleted one:
    "context was replaced" naming the live end of its replacement chain (``replacedBy``), or
    "context is already deleted" (naming the chain's last context when that one is deleted)."""
    if not found.member_active:
        raise UnauthenticatedError()
    if not found.owned:
        raise NotFoundError("context")
    if found.owner_deleted or (found.record_active and found.old_deleted):
        if found.replaced_by is not None and not found.replacement_deleted:
            raise ConflictError("context was replaced", replaced_by=found.replaced_by)
        raise ConflictError("context is already deleted", replaced_by=found.replaced_by)
    if not found.record_active:
        raise ConflictError("context is already deleted")


async def insert_context(
    conn: AsyncConnection, member_id: int, record_id: int, body: str, origin_created_at=None
) -> int:
    """A new context with its ``PENDING``/``PENDING``/0 state row (§9 Create); its id."""
    context_id = await context.insert(
        conn,
        record_id=record_id,
        member_id=member_id,
        body=body,
        origin_created_at=origin_created_at,
    )
    await context_ai_state.insert_pending(
        conn, context_id=context_id, user_id=member_id, record_id=record_id, body=body
    )
    return context_id


async def cancel_contexts(conn: AsyncConnection, context_ids: Sequence[int]) -> None:
    """Soft-delete contexts, cancel both stages, hide their vectors: one statement per table,
    in lock order (context -> state -> embedding). Keyword rows stay; reads filter them."""
    if not context_ids:
        return
    await context.soft_delete(conn, context_ids)
    await context_ai_state.cancel(conn, context_ids)
    await context_embedding.mark_deleted(conn, context_ids)
