"""The Batch API of the fake OpenAI server (``tests/fake_openai.py``), in OpenAI's wire shapes.

- ``POST /v1/files`` (multipart form: ``purpose``, ``file``), ``GET /v1/files/{id}``,
  ``GET /v1/files/{id}/content``, ``DELETE /v1/files/{id}``: files kept in memory.
- ``POST /v1/batches`` (``input_file_id``, ``endpoint`` ``/v1/chat/completions`` or
  ``/v1/embeddings``, ``completion_window`` ``24h``, optional ``metadata``), ``GET
  /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``.

A batch moves one status per poll (``GET /v1/batches/{id}``), as a provider's would over time:
``validating`` → ``in_progress`` (or ``failed``, with ``errors``, when a line is not a request
of the batch's endpoint with a unique ``custom_id``) → ``finalizing`` → ``completed``. Its
lines are answered when it finalizes, each by the server's default answer of its endpoint
(``usage`` included): a 2xx answer is a line of the output file, any other a line of the error
file (``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}``).
Controls (every one under one lock, as the server's): ``hold_batches`` keeps batches
``in_progress`` (a worker killed and restarted mid-batch); ``fail_custom_ids`` answers chosen
lines with a status and body (per-item errors); ``expire_batch`` ends a batch ``expired`` with
its first ``completed`` lines answered and the rest in the error file (``batch_expired``);
``cancel`` makes it ``cancelling`` and, at the next poll, ``cancelled`` with nothing answered.
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings")
COMPLETION_WINDOW_SECONDS = 24 * 3600
OPEN = ("validating", "in_progress", "finalizing", "cancelling")

# (endpoint, request body) -> (HTTP status, answer body): the server's default answer.
Answerer = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]


@dataclass
class _File:
    id: str
    purpose: str
    filename: str
    content: bytes
    created_at: int

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
        }


@dataclass
class _Batch:
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, Any] | None
    created_at: int
    status: str = "validating"
    errors: dict[str, Any] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    times: dict[str, int | None] = field(default_factory=dict)
    counts: dict[str, int] = field(
        default_factory=lambda: {"total": 0, "completed": 0, "failed": 0}
    )
    lines: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        stamps = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
                  "cancelling_at", "cancelled_at")  # fmt: skip
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": self.errors,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "expires_at": self.created_at + COMPLETION_WINDOW_SECONDS,
            **{stamp: self.times.get(stamp) for stamp in stamps},
            "request_counts": dict(self.counts),
            "metadata": self.metadata,
        }


def _json(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body, ensure_ascii=False), status, media_type="application/json")


def _error(status: int, message: str, param: str | None = None) -> Response:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    return _json({"error": error}, status)


class FakeBatches:
    """The files and batches of one fake server; ``answer`` gives a line its default answer."""

    def __init__(self, answer: Answerer) -> None:
        self._answer = answer
        self._lock = threading.Lock()
        self.reset()

    def routes(self) -> list[Route]:
        return [
            Route("/v1/files", self._upload, methods=["POST"]),
            Route("/v1/files/{file_id}", self._file, methods=["GET", "DELETE"]),
            Route("/v1/files/{file_id}/content", self._content, methods=["GET"]),
            Route("/v1/batches", self._create, methods=["POST"]),
            Route("/v1/batches/{batch_id}", self._poll, methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", self._cancel, methods=["POST"]),
        ]

    def reset(self) -> None:
        with self._lock:
            self._files: dict[str, _File] = {}
            self._batches: dict[str, _Batch] = {}
            self._ids = itertools.count(1)
            self._held = False
            self._line_faults: dict[str, tuple[int, dict[str, Any]]] = {}
            self.polls = 0

    # --- controls -------------------------------------------------------------------------

    def hold_batches(self, held: bool) -> None:
        """``True``: batches stay ``in_progress`` however often they are polled."""
        with self._lock:
            self._held = held

    def fail_custom_ids(self, faults: dict[str, tuple[int, dict[str, Any]]]) -> None:
        """Answer the lines of these ``custom_id`` with ``(status, body)`` instead of the
        default (a non-2xx status puts the line in the error file)."""
        with self._lock:
            self._line_faults.update(faults)

    def expire_batch(self, batch_id: str, *, completed: int = 0) -> None:
        """End an open batch ``expired``: its first ``completed`` lines answered, the rest in
        the error file with ``error.code`` ``batch_expired``."""
        with self._lock:
            batch = self._batches[batch_id]
            if batch.status not in OPEN:
                raise ValueError(f"batch {batch_id} is {batch.status}")
            self._finish(batch, "expired", answered=completed)

    def batch(self, batch_id: str) -> dict[str, Any]:
        with self._lock:
            return self._batches[batch_id].as_json()

    @property
    def batch_ids(self) -> list[str]:
        with self._lock:
            return list(self._batches)

    # --- files ----------------------------------------------------------------------------

    async def _upload(self, request: Request) -> Response:
        form = _multipart(request.headers.get("content-type", ""), await request.body())
        if form is None:
            return _error(400, "expected a multipart/form-data body")
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose is None or upload is None:
            return _error(400, "purpose and file are required", "purpose" if upload else "file")
        if purpose[1].decode() != "batch":
            return _error(400, "this fake stores batch files only", "purpose")
        with self._lock:
            file = _File(
                f"file-{next(self._ids)}", "batch", upload[0] or "upload.jsonl", upload[1],
                int(time.time()),
            )  # fmt: skip
            self._files[file.id] = file
        return _json(file.as_json())

    async def _file(self, request: Request) -> Response:
        file_id = request.path_params["file_id"]
        with self._lock:
            file = self._files.get(file_id)
            if file is not None and request.method == "DELETE":
                del self._files[file_id]
        if file is None:
            return _error(404, "no such file", "file_id")
        if request.method == "DELETE":
            return _json({"id": file_id, "object": "file", "deleted": True})
        return _json(file.as_json())

    async def _content(self, request: Request) -> Response:
        with self._lock:
            file = self._files.get(request.path_params["file_id"])
        if file is None:
            return _error(404, "no such file", "file_id")
        return Response(file.content, media_type="application/octet-stream")

    # --- batches --------------------------------------------------------------------------

    async def _create(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "body is not an object")
        if body.get("endpoint") not in ENDPOINTS:
            return _error(400, "unsupported endpoint", "endpoint")
        if body.get("completion_window") != "24h":
            return _error(400, "completion_window must be 24h", "completion_window")
        with self._lock:
            file = self._files.get(body.get("input_file_id"))
            if file is None:
                return _error(400, "no such input file", "input_file_id")
            batch = _Batch(
                f"batch_{next(self._ids)}", body["endpoint"], file.id, "24h",
                body.get("metadata"), int(time.time()),
            )  # fmt: skip
            self._batches[batch.id] = batch
            return _json(batch.as_json())

    async def _poll(self, request: Request) -> Response:
        with self._lock:
            self.polls += 1
            batch = self._batches.get(request.path_params["batch_id"])
            if batch is None:
                return _error(404, "no such batch", "batch_id")
            self._advance(batch)
            return _json(batch.as_json())

    async def _cancel(self, request: Request) -> Response:
        with self._lock:
            batch = self._batches.get(request.path_params["batch_id"])
            if batch is None:
                return _error(404, "no such batch", "batch_id")
            if batch.status not in ("validating", "in_progress", "finalizing"):
                return _error(409, f"cannot cancel a batch that is {batch.status}")
            batch.status = "cancelling"
            batch.times["cancelling_at"] = int(time.time())
            return _json(batch.as_json())

    def _advance(self, batch: _Batch) -> None:
        """One status step (under the lock)."""
        now = int(time.time())
        if batch.status == "validating":
            lines, errors = _validated(self._files[batch.input_file_id].content, batch.endpoint)
            if errors:
                batch.status, batch.errors = "failed", {"object": "list", "data": errors}
                batch.times["failed_at"] = now
                return
            batch.lines = lines
            batch.counts["total"] = len(lines)
            batch.status = "in_progress"
            batch.times["in_progress_at"] = now
        elif batch.status == "in_progress" and not self._held:
            batch.status = "finalizing"
            batch.times["finalizing_at"] = now
        elif batch.status == "finalizing":
            self._finish(batch, "completed", answered=len(batch.lines))
        elif batch.status == "cancelling":
            self._finish(batch, "cancelled", answered=0)

    def _finish(self, batch: _Batch, status: str, *, answered: int) -> None:
        """Answer the first ``answered`` lines, write the output and error files, and end the
        batch ``status`` (under the lock)."""
        output, failed = [], []
        for index, line in enumerate(batch.lines):
            custom_id = line["custom_id"]
            request_id = f"req_{batch.id}_{index}"
            if index >= answered:
                if status == "expired":
                    failed.append({
                        "id": f"batch_req_{index}", "custom_id": custom_id, "response": None,
                        "error": {"code": "batch_expired",
                                  "message": "This request could not be executed before the "
                                  "completion window expired."},
                    })  # fmt: skip
                continue
            fault = self._line_faults.get(custom_id)
            code, answer = fault if fault else self._answer(batch.endpoint, line["body"])
            item = {
                "id": f"batch_req_{index}",
                "custom_id": custom_id,
                "response": {"status_code": code, "request_id": request_id, "body": answer},
                "error": None,
            }
            (output if 200 <= code < 300 else failed).append(item)
        batch.output_file_id = self._store(batch, output, "output")
        batch.error_file_id = self._store(batch, failed, "error")
        batch.counts.update(completed=len(output), failed=len(failed))
        batch.status = status
        batch.times[f"{status}_at"] = int(time.time())

    def _store(self, batch: _Batch, items: list[dict[str, Any]], kind: str) -> str | None:
        if not items:
            return None
        content = "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items)
        file = _File(
            f"file-{next(self._ids)}", f"batch_{kind}", f"{batch.id}_{kind}.jsonl",
            content.encode(), int(time.time()),
        )  # fmt: skip
        self._files[file.id] = file
        return file.id


def _validated(content: bytes, endpoint: str) -> tuple[list[dict[str, Any]], list[dict]]:
    """The request lines of a batch input file, or the errors of its bad lines (OpenAI's
    ``{"code", "message", "param", "line"}``, lines counted from 1)."""
    lines: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.decode("utf-8", "replace").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            line = None
        problem = None
        if not isinstance(line, dict) or not isinstance(line.get("body"), dict):
            problem = ("invalid_json_line", "not a JSON request object")
        elif not isinstance(line.get("custom_id"), str) or line["custom_id"] in seen:
            problem = ("duplicate_custom_id", "custom_id missing or not unique")
        elif line.get("method") != "POST" or line.get("url") != endpoint:
            problem = ("mismatched_endpoint", f"url must be {endpoint} with method POST")
        if problem is not None:
            errors.append({"code": problem[0], "message": problem[1], "param": None,
                           "line": number})  # fmt: skip
            continue
        seen.add(line["custom_id"])
        lines.append(line)
    if not lines and not errors:
        errors.append({"code": "empty_file", "message": "no request lines", "param": None,
                       "line": None})  # fmt: skip
    return lines, errors


def _multipart(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]] | None:
    """The fields of a multipart/form-data body as ``name: (filename, bytes)``, by the
    standard library's MIME parser; ``None`` when it is not one."""
    if not content_type.startswith("multipart/form-data"):
        return None
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        return None
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            payload = part.get_payload(decode=True)
            fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields
