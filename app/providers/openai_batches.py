"""The provider's Batch API, OpenAI's wire format (docs/operations.md "Backfill via the Batch
API"): ``POST /v1/files`` (purpose ``batch``), ``POST /v1/batches``, ``GET /v1/batches/{id}``,
``GET /v1/files/{id}/content``, ``POST /v1/batches/{id}/cancel``, ``DELETE /v1/files/{id}``.

Batch requests take no per-minute rate budget (the provider's batch pool is separate) and are
not retried here: every caller polls again later. Each request has ``timeout_seconds`` as its
deadline. Errors: ``TransientError`` (timeout, connection, 408/409/429/5xx), otherwise the
``failure_policy.status_error`` class of the answer (``layer`` ``embedding``), and
``ProviderProtocolError`` for a 2xx that is not the JSON object expected. Messages never quote
the upstream body, the URL or the key.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from app import failure_policy
from app.errors import ProviderProtocolError, TransientError
from app.providers.openai_http import ERROR_BODY_BYTES, error_fields, read_capped

# The largest output or error file read (bytes): a batch of 256 embeddings of 3,072 floats
# in JSON is about 20 MB.
MAX_FILE_BYTES = 256 * 1024 * 1024
# Batch statuses after which nothing changes any more (OpenAI's).
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


class BatchClient:
    """The Batch API of one provider (``base_url`` ending in ``/v1``, as the sync client's)."""

    def __init__(self, base_url: str, api_key: str, timeout_seconds: float, layer: str) -> None:
        self._base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._layer = layer
        self._session: aiohttp.ClientSession | None = None

    async def upload(self, content: bytes, filename: str) -> str:
        """Upload a JSONL batch input file; its file id."""
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", content, filename=filename, content_type="application/jsonl")
        body = await self._request("POST", "files", data=form)
        return _string(body, "id", self._layer)

    async def create(self, input_file_id: str, endpoint: str, metadata: dict[str, str]) -> dict:
        """Create a batch of ``endpoint`` (``/v1/embeddings``) over an uploaded file; the
        batch object (``id``, ``status``, ...)."""
        payload = {
            "input_file_id": input_file_id,
            "endpoint": endpoint,
            "completion_window": "24h",
            "metadata": metadata,
        }
        body = await self._request("POST", "batches", json=payload)
        _string(body, "id", self._layer)
        return body

    async def retrieve(self, batch_id: str) -> dict:
        """The batch object as it stands (``status``, ``output_file_id``, ``error_file_id``)."""
        body = await self._request("GET", f"batches/{batch_id}")
        _string(body, "status", self._layer)
        return body

    async def cancel(self, batch_id: str) -> dict:
        """Ask the provider to cancel the batch; the batch object."""
        return await self._request("POST", f"batches/{batch_id}/cancel")

    async def delete_file(self, file_id: str) -> None:
        """Delete a file at the provider (input, output or error file of a settled batch)."""
        await self._request("DELETE", f"files/{file_id}")

    async def lines(self, file_id: str | None) -> list[dict[str, Any]]:
        """The JSON lines of an output or error file (none for ``None``); a line that is not
        a JSON object is skipped (its row goes back to the synchronous path)."""
        if file_id is None:
            return []
        raw = await self._request("GET", f"files/{file_id}/content", raw=True)
        lines = []
        for line in raw.splitlines():
            try:
                item = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(item, dict):
                lines.append(item)
        return lines

    async def _request(self, method: str, path: str, *, raw: bool = False, **options: Any) -> Any:
        url = f"{self._base_url}/{path}"
        try:
            async with self._client().request(
                method, url, timeout=self._timeout, allow_redirects=False, **options
            ) as answer:
                status = answer.status
                # An error body is cut to its first bytes; an output file over the cap is a
                # protocol fault (ProviderProtocolError).
                content = await read_capped(
                    self._layer,
                    answer,
                    MAX_FILE_BYTES if status < 300 else ERROR_BODY_BYTES,
                    truncate=status >= 300,
                )
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise TransientError(f"{self._layer} batch upstream timeout") from None
        except aiohttp.ClientError:
            raise TransientError(f"{self._layer} batch upstream unreachable") from None
        if status >= 300:
            code, error_type, param = error_fields(content[:ERROR_BODY_BYTES])
            raise failure_policy.status_error(
                self._layer, status, code=code, error_type=error_type, param=param
            )
        if raw:
            return content
        try:
            body = orjson.loads(content)
        except orjson.JSONDecodeError:
            raise ProviderProtocolError(
                f"{self._layer} batch answer is not JSON", layer=self._layer
            ) from None
        if not isinstance(body, dict):
            raise ProviderProtocolError(
                f"{self._layer} batch answer is not an object", layer=self._layer
            )
        return body

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _string(body: dict, key: str, layer: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise ProviderProtocolError(f"{layer} batch answer without {key}", layer=layer)
    return value
