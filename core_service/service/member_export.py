"""A member's own data as one document (``GET /api/v1/members/me/export``): every active
record with its live notes, their keywords and AI state, read page by page from one read-only
``REPEATABLE READ`` snapshot (``record_view.EXPORT_PAGE``), so the document is consistent
however long it streams.

Deadlines (docs/core-service.md "Export"): the first page is read before the answer starts, so
the request deadline covers the first byte; after it each chunk (reading a page and sending
it) has ``chunk_seconds``, and the whole export ends within ``EXPORT_MAX_SECONDS`` of its
start. The snapshot's transaction is idle while a chunk is sent; its connection is held for
the export and returned however the export ends (``ExportStream.close``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import UnauthenticatedError
from core_service.repository import record_view
from core_service.repository.db import client_read_only_snapshot
from core_service.repository.record_view import ExportPage

# Records read per statement (and sent per chunk).
EXPORT_PAGE_RECORDS = 100
# The longest an export may take from its start, whatever the chunks' own deadlines.
EXPORT_MAX_SECONDS = 300.0


class ExportStream:
    """An opened export: its first page, read; ``pages()`` yields it and the rest."""

    def __init__(
        self,
        stack: AsyncExitStack,
        conn,
        *,
        member_id: int,
        first: ExportPage,
        page_records: int,
        deadline: float,
    ) -> None:
        self._stack = stack
        self._conn = conn
        self._member_id = member_id
        self.first = first
        self._page_records = page_records
        self.deadline = deadline  # event-loop time by which the export ends

    async def pages(self) -> AsyncIterator[ExportPage]:
        """The first page, then each next one (a statement each) until a short page."""
        page = self.first
        yield page
        while len(page.records) == self._page_records:
            last = page.records[-1]
            page = await record_view.export_page(
                self._conn,
                viewer_id=self._member_id,
                after=(last.created_at, last.record_id),
                limit=self._page_records,
            )
            yield page

    async def close(self, error: BaseException | None = None) -> None:
        """End the snapshot's transaction and return its connection; ``error``: what ended
        the export early (the transaction is rolled back, a driver error translated)."""
        if error is None:
            await self._stack.aclose()
        else:
            await self._stack.__aexit__(type(error), error, error.__traceback__)


class MemberExport:
    """``chunk_seconds``: each chunk's deadline after the first (the request deadline,
    ``PINLOG_CORE_REQUEST_TIMEOUT_SECONDS``)."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        chunk_seconds: float,
        page_records: int = EXPORT_PAGE_RECORDS,
    ) -> None:
        self._engine = engine
        self.chunk_seconds = chunk_seconds
        self._page_records = page_records

    async def open(self, *, member_id: int) -> ExportStream:
        """Begin the member's export: the snapshot and its first page (one statement that also
        checks the member). Raises ``UnauthenticatedError`` (401: not an active member),
        ``UnavailableError`` (503). The caller must ``close()`` what it returns."""
        deadline = asyncio.get_running_loop().time() + EXPORT_MAX_SECONDS
        try:
            async with AsyncExitStack() as stack:
                conn = await stack.enter_async_context(client_read_only_snapshot(self._engine))
                first = await record_view.export_page(
                    conn, viewer_id=member_id, after=None, limit=self._page_records
                )
                held = stack.pop_all()  # the stream owns the snapshot from here
        except record_view.ViewerInactive:
            raise UnauthenticatedError() from None
        return ExportStream(
            held,
            conn,
            member_id=member_id,
            first=first,
            page_records=self._page_records,
            deadline=deadline,
        )
