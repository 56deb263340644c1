"""A record as a member sees it (§9 "Keyword read rules"): the owner sees bodies,
``PUBLIC`` + ``PRIVATE_ONLY`` keywords and each context's AI state (``summarize``);
another member sees neither bodies, private keywords nor AI states. A record without finished
AI reads fine with ``keywords: []`` (scenario 21)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import NotFoundError, UnauthenticatedError
from core_service.repository import record_view
from core_service.repository.db import client_autocommit
from core_service.repository.record_view import AiStatuses, RecordView
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
        """One active record. Raises ``UnauthenticatedError`` (401: the viewer is not an active
        member), ``NotFoundError`` (404) when missing or deleted."""
        views = await self.get_many(viewer_id=viewer_id, record_ids=[record_id])
        if not views:
            raise NotFoundError("record")
        return views[0]

    async def get_many(self, *, viewer_id: int, record_ids: Sequence[int]) -> list[RecordView]:
        """The active records among ``record_ids`` in one query, ordered by id. Raises
        ``UnauthenticatedError`` (401) when the viewer is not an active member."""
        async with client_autocommit(self._engine) as conn:
            views = await record_view.load(conn, viewer_id=viewer_id, record_ids=record_ids)
        if views is None:
            raise UnauthenticatedError()
        return views
