"""The streamed answer of ``GET /api/v1/members/me/export`` (docs/core-service.md "Export").

One JSON document, ``{"memberId", "exportedAt", "records": [...]}``, written page by page: the
status and the first page are sent once the service has read it (the request deadline covers
that first byte), then each further chunk, reading a page and sending it, has
``chunk_seconds``, and everything ends by the stream's ``deadline`` (the export's start plus
``EXPORT_MAX_SECONDS``). An export that misses one is cut off: the connection closes before the
document's end, so a client never takes a partial document for a whole one. A client that goes
away ends the export at once (Starlette cancels the streaming when it hears the disconnect);
the snapshot's connection is returned however it ends.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from core_service.errors import CoreError
from core_service.repository.record_view import ExportedRecord, ExportPage
from core_service.service.member_export import ExportStream
from core_service.service.record_reads import summarize

logger = logging.getLogger(__name__)


def _record(record: ExportedRecord) -> dict[str, object]:
    return {
        "recordId": record.record_id,
        "publicId": record.public_id,
        "place": {"externalPlaceId": record.external_place_id, "name": record.place_name},
        "createdAt": record.created_at,
        "keywords": [
            {"code": k.code, "displayName": k.display_name, "category": k.category}
            for k in record.keywords
        ],
        "contexts": [
            {
                "contextId": c.context_id,
                "body": c.body,
                "createdAt": c.created_at,
                "ai": None
                if c.ai is None
                else {key: value for key, value in asdict(summarize(c.ai)).items() if value},
                "keywords": [
                    {
                        "code": k.code,
                        "displayName": k.display_name,
                        "category": k.category,
                        "confidence": confidence,
                    }
                    for k, confidence in c.keywords
                ],
            }
            for c in record.contexts
        ],
    }


def _records(page: ExportPage, *, first: bool) -> bytes:
    """The page's records as the array's items (a comma first unless they open it)."""
    items = b",".join(orjson.dumps(_record(r)) for r in page.records)
    return items if first or not items else b"," + items


class ExportResponse(StreamingResponse):
    """``StreamingResponse`` over an opened ``ExportStream`` with its deadlines."""

    media_type = "application/json"

    def __init__(self, stream: ExportStream, *, member_id: int, chunk_seconds: float) -> None:
        super().__init__(content=_never(), media_type=self.media_type)
        self._stream = stream
        self._pages = stream.pages()
        self._member_id = member_id
        self._chunk_seconds = chunk_seconds
        self._cut_off: TimeoutError | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # However the answer ends (sent, cut off, the client gone before or while it streams),
        # the snapshot's connection goes back.
        try:
            await super().__call__(scope, receive, send)
        except BaseException as exc:
            await self._close(exc)
            raise
        await self._close(self._cut_off)

    async def _close(self, error: BaseException | None) -> None:
        """Return the snapshot's connection; the answer has started, so a failure to end its
        transaction (a connection the deadline left mid-statement) is only logged."""
        await self._pages.aclose()
        try:
            await self._stream.close(error)
        except CoreError as exc:
            logger.warning("export's snapshot ended with %s", type(exc).__name__)

    async def stream_response(self, send: Send) -> None:
        try:
            async with asyncio.timeout_at(self._stream.deadline):
                await self._send_all(self._pages, send)
        except TimeoutError as exc:
            logger.warning("export cut off at its deadline (member %d)", self._member_id)
            self._cut_off = exc  # the connection closes before the document's end

    async def _send_all(self, pages, send: Send) -> None:
        head = orjson.dumps(
            {"memberId": self._member_id, "exportedAt": self._stream.first.exported_at}
        )
        first = await anext(pages)
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        opening = head[:-1] + b',"records":[' + _records(first, first=True)
        await send({"type": "http.response.body", "body": opening, "more_body": True})
        wrote = bool(first.records)
        while True:
            async with asyncio.timeout(self._chunk_seconds):
                page = await anext(pages, None)
                if page is None:
                    break
                chunk = _records(page, first=not wrote)
                wrote = wrote or bool(page.records)
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"]}", "more_body": False})


async def _never():
    """A placeholder body iterator: ``stream_response`` writes the body itself."""
    return
    yield b""
