"""A record as a member sees it (§9 "Keyword read rules"): its owner, by record id, sees
bodies, ``PUBLIC`` + ``PRIVATE_ONLY`` keywords and each context's AI state (``summarize``);
every member, by public id, sees the public view: no bodies, ids, private keywords or AI
states. A record without finished
AI reads fine with ``keywords: []`` (scenario 21)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import NotFoundError, UnauthenticatedError
from core_service.repository import record_view
from core_service.repository.db import client_autocommit
from core_service.repository.record_view import AiStatuses, PublicRecordView, RecordView
from pinlog_platform.contract.states import STAGE_ORDER, Status
from pinlog_platform.contract.states.failure_reasons import FailureReason


@dataclass(frozen=True, slots=True)
class AiSummary:
    """A context's AI progress as its owner sees it: ``state`` is ``failed`` if
    any stage is ``FAILED`` (the first in stage order gives ``stage`` and ``reason``; a row
    failed before reasons were stored reads ``unknown``), ``completed`` if every stage is,
    ``processing`` if any stage is, else ``pending``. ``stage`` and ``reason`` are ``None``
    unless failed."""

    state: str
    stage: str | None = None
    reason: str | None = None


def summarize(statuses: AiStatuses) -> AiSummary:
    """The owner's ``ai`` object of one context from its stored statuses."""
    for stage in STAGE_ORDER:
        if statuses.status(stage) is Status.FAILED:
            reason = statuses.failure(stage) or FailureReason.UNKNOWN.value
            return AiSummary("failed", stage.label, reason)
    if all(statuses.status(stage) is Status.COMPLETED for stage in STAGE_ORDER):
        return AiSummary("completed")
    if any(statuses.status(stage) is Status.PROCESSING for stage in STAGE_ORDER):
        return AiSummary("processing")
    return AiSummary("pending")


class RecordReader:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def get(self, *, viewer_id: int, record_id: int) -> RecordView:
        """The viewer's own active record (the owner's view). Raises ``UnauthenticatedError``
        (401: the viewer is not an active member), ``NotFoundError`` (404) when missing,
        deleted or another member's: one statement and one answer for all three, so a record
        id reveals nothing of other members (§9 Deviation "another member's view by public
        id")."""
        async with client_autocommit(self._engine) as conn:
            try:
                view = await record_view.load_own(conn, viewer_id=viewer_id, record_id=record_id)
            except record_view.ViewerInactive:
                raise UnauthenticatedError() from None
        if view is None:
            raise NotFoundError("record")
        return view

    async def get_public(self, *, viewer_id: int, public_id: str) -> PublicRecordView:
        """The public view of the active record ``public_id`` (22 characters, base64url),
        whoever owns it. Raises ``UnauthenticatedError`` (401), ``NotFoundError`` (404:
        missing or deleted)."""
        async with client_autocommit(self._engine) as conn:
            try:
                view = await record_view.load_public(conn, viewer_id=viewer_id, public_id=public_id)
            except record_view.ViewerInactive:
                raise UnauthenticatedError() from None
        if view is None:
            raise NotFoundError("record")
        return view
