"""A record as a member sees it (§9 "Keyword read rules"): the owner sees bodies and
``PUBLIC`` + ``PRIVATE_ONLY`` keywords; another member sees neither bodies nor private
keywords. A record without finished AI reads fine with ``keywords: []`` (scenario 21)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import NotFoundError
from core_service.repository import record_view
from core_service.repository.db import autocommit
from core_service.repository.record_view import RecordView


class RecordReader:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def get(self, *, viewer_id: int, record_id: int) -> RecordView:
        """One active record. Raises ``NotFoundError`` (404) when missing or deleted."""
        views = await self.get_many(viewer_id=viewer_id, record_ids=[record_id])
        if not views:
            raise NotFoundError("record")
        return views[0]

    async def get_many(self, *, viewer_id: int, record_ids: Sequence[int]) -> list[RecordView]:
        """The active records among ``record_ids`` in one query, ordered by id."""
        async with autocommit(self._engine) as conn:
            return await record_view.load(conn, viewer_id=viewer_id, record_ids=record_ids)
