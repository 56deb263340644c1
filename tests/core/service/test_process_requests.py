"""How one process request is classified, against a raw TCP server that misbehaves on cue
(``core_service/service/process_requests.py``): a timeout after the whole request was sent is
``timed_out`` (the worker may have it), a connection that breaks before an answer or an answer
that is not HTTP is ``unreachable``; the causes are the same words whatever the HTTP library.
Calls reuse one keep-alive connection."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import orjson

from core_service.service.process_requests import DispatchResult, ProcessRequestSender
from core_service.service.worker_endpoints import WorkerEndpoints
from tests.core.harness import DISPATCH_REQUEST as REQUEST

ACCEPTED = b"HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n"
ACCEPTED_BODY = b'{"contextId":7}'

Handler = Callable[["_Wire", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _request_body(reader: asyncio.StreamReader) -> bytes:
    """One whole HTTP/1.1 request off the connection; its body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return await reader.readexactly(length)


class _Wire:
    """A loopback server running ``handler`` per connection; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.bodies: list[bytes] = []
        self.release = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await self.handler(self, reader, writer)
        writer.close()


@contextlib.asynccontextmanager
async def _wire(handler) -> AsyncIterator[tuple[_Wire, str]]:
    wire = _Wire(handler)
    server = await asyncio.start_server(wire._serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield wire, f"http://127.0.0.1:{port}"
    finally:
        wire.release.set()
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def _sender(*base_urls: str, read_timeout: float = 2.0, deadline: float = 5.0):
    endpoints = WorkerEndpoints.connect(
        base_urls,
        internal_secret="s",
        connect_timeout_seconds=1.0,
        read_timeout_seconds=read_timeout,
    )
    try:
        yield ProcessRequestSender(endpoints, attempt_deadline_seconds=deadline)
    finally:
        await endpoints.aclose()


async def _accept(wire: _Wire, reader, writer) -> None:
    while True:
        wire.bodies.append(await _request_body(reader))
        writer.write(ACCEPTED + ACCEPTED_BODY)
        await writer.drain()


async def _close_after_reading(wire: _Wire, reader, writer) -> None:
    wire.bodies.append(await _request_body(reader))


async def _never_answer(wire: _Wire, reader, writer) -> None:
    wire.bodies.append(await _request_body(reader))
    await wire.release.wait()


async def _drip(wire: _Wire, reader, writer) -> None:
    """An answer whose bytes keep coming, each well within the read timeout."""
    wire.bodies.append(await _request_body(reader))
    writer.write(b"HTTP/1.1 202 Accepted\r\n")
    while not wire.release.is_set():
        writer.write(b"X-Slow: 1\r\n")
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wire.release.wait(), 0.05)


async def _not_http(wire: _Wire, reader, writer) -> None:
    wire.bodies.append(await _request_body(reader))
    writer.write(b"SPEAKING SOMETHING ELSE\r\n\r\n")
    await writer.drain()


def _refuse_with(retry_after: bytes) -> Handler:
    async def refuse(wire: _Wire, reader, writer) -> None:
        wire.bodies.append(await _request_body(reader))
        writer.write(
            b"HTTP/1.1 503 Service Unavailable\r\nretry-after: " + retry_after + b"\r\n"
            b"Content-Length: 0\r\n\r\n"
        )
        await writer.drain()

    return refuse


def _unused_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


async def test_an_accepted_request_carries_the_json_and_the_secret_and_reuses_its_connection():
    headers: list[bytes] = []

    async def accept_and_keep_headers(wire: _Wire, reader, writer) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            headers.append(head.lower())
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            wire.bodies.append(await reader.readexactly(length))
            writer.write(ACCEPTED + ACCEPTED_BODY)
            await writer.drain()

    async with _wire(accept_and_keep_headers) as (wire, url), _sender(url + "/") as sender:
        first = await sender.send(REQUEST)
        second = await sender.send(REQUEST)

    assert (first.result, first.causes) == (DispatchResult.ACCEPTED, ("HTTP 202",))
    assert second.result is DispatchResult.ACCEPTED
    assert wire.connections == 1
    assert orjson.loads(wire.bodies[0]) == REQUEST.as_json()
    assert headers[0].startswith(b"post /internal/v1/context/process http/1.1\r\n")
    assert b"\r\nx-internal-secret: s\r\n" in headers[0]
    assert b"\r\ncontent-type: application/json\r\n" in headers[0]


async def test_nothing_listening_is_unreachable_as_connect_error():
    async with _sender(_unused_url()) as sender:
        outcome = await sender.send(REQUEST)

    assert (outcome.result, outcome.causes) == (DispatchResult.UNREACHABLE, ("ConnectError",))


async def test_a_connection_closed_after_the_request_is_unreachable_as_connection_lost():
    async with _wire(_close_after_reading) as (wire, url), _sender(url) as sender:
        outcome = await sender.send(REQUEST)

    assert len(wire.bodies) == 1
    assert (outcome.result, outcome.causes) == (DispatchResult.UNREACHABLE, ("ConnectionLost",))


async def test_no_answer_after_the_whole_request_is_timed_out_as_read_timeout():
    async with _wire(_never_answer) as (wire, url), _sender(url, read_timeout=0.3) as sender:
        started = time.monotonic()
        outcome = await sender.send(REQUEST)
        elapsed = time.monotonic() - started

    assert elapsed < 2.0  # the read timeout ended it, not the 5 s attempt deadline
    assert len(wire.bodies) == 1
    assert (outcome.result, outcome.causes) == (DispatchResult.TIMED_OUT, ("ReadTimeout",))


async def test_an_answer_dripping_past_the_attempt_deadline_is_timed_out():
    """Each header line comes within the read timeout; the deadline ends the attempt."""
    async with (
        _wire(_drip) as (wire, url),
        _sender(url, read_timeout=1.0, deadline=0.5) as sender,
    ):
        outcome = await sender.send(REQUEST)

    assert len(wire.bodies) == 1
    assert (outcome.result, outcome.causes) == (DispatchResult.TIMED_OUT, ("ReadTimeout",))


async def test_an_answer_that_is_not_http_is_unreachable_as_a_protocol_error():
    async with _wire(_not_http) as (wire, url), _sender(url) as sender:
        outcome = await sender.send(REQUEST)

    assert len(wire.bodies) == 1
    assert outcome.result is DispatchResult.UNREACHABLE
    assert outcome.causes == ("RemoteProtocolError",)


async def test_refusals_give_the_shortest_retry_after_and_the_next_instance_is_tried():
    async with (
        _wire(_refuse_with(b"30")) as (_first, slow),
        _wire(_refuse_with(b" 4 ")) as (_second, soon),
        _sender(slow, _unused_url(), soon) as sender,
    ):
        outcome = await sender.send(REQUEST)

    assert outcome.result is DispatchResult.REFUSED
    assert outcome.retry_after_seconds == 4.0
    assert sorted(outcome.causes) == ["ConnectError", "HTTP 503", "HTTP 503"]


async def test_a_dead_instance_is_skipped_for_the_next_one():
    async with _wire(_accept) as (wire, url), _sender(_unused_url(), url) as sender:
        outcomes = [await sender.send(REQUEST) for _ in range(2)]

    assert [o.result for o in outcomes] == [DispatchResult.ACCEPTED] * 2
    assert sorted(o.causes for o in outcomes) == [("ConnectError", "HTTP 202"), ("HTTP 202",)]
    assert len(wire.bodies) == 2


async def test_nothing_is_sent_once_the_endpoints_are_closed():
    async with _wire(_accept) as (wire, url):
        endpoints = WorkerEndpoints.connect(
            [url], internal_secret="s", connect_timeout_seconds=1.0, read_timeout_seconds=1.0
        )
        sender = ProcessRequestSender(endpoints, attempt_deadline_seconds=3.0)
        assert (await sender.send(REQUEST)).result is DispatchResult.ACCEPTED
        await endpoints.aclose()
        outcome = await sender.send(REQUEST)

    assert (outcome.result, outcome.causes) == (DispatchResult.UNREACHABLE, ("ConnectError",))
    assert len(wire.bodies) == 1
