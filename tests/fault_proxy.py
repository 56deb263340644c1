"""A TCP proxy in front of the test PostgreSQL that passes, freezes or cuts traffic.

A real asyncio server on a loopback port; each client connection gets its own connection to
the database (its Unix socket or TCP address). ``freeze()`` stops forwarding in both
directions while every socket stays open (a silent peer: half-open TCP after a failover, a
partition, a NAT that dropped its state); ``thaw()`` delivers what was held. ``cut()`` closes
every connection and refuses new ones until ``thaw()``. ``round_trips`` counts the server's
``ReadyForQuery`` messages: one per round trip a client waited for (a simple query, an extended
query's ``Sync``, the end of the startup), read from the wire on the side; ``statements`` lists
the text of every statement the clients ran (a simple query, or the prepared statement each
``Bind`` names), in the order sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import parse_qs

from sqlalchemy.engine import make_url


class FaultProxy:
    def __init__(self, database_url: str) -> None:
        url = make_url(database_url)
        socket_dir = parse_qs(url.render_as_string(False).partition("?")[2]).get("host", [None])[0]
        self._unix_path = None
        if socket_dir and socket_dir.startswith("/"):
            self._unix_path = f"{socket_dir}/.s.PGSQL.{url.port or 5432}"
        self._target = (url.host or "127.0.0.1", url.port or 5432)
        self._url = url
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._refusing = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.base_events.Server | None = None
        self.port = 0
        self.round_trips = 0
        self.statements: list[str] = []
        self._freeze_rule = None

    @property
    def url(self) -> str:
        """The database URL through this proxy (TCP on loopback)."""
        return self._url.set(host="127.0.0.1", port=self.port, query={}).render_as_string(False)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        self._flowing.set()
        self._close_all()
        if self._server is not None:
            self._server.close()

    def freeze(self) -> None:
        self._flowing.clear()

    def freeze_on(self, rule) -> None:
        """Freeze as a client sends a statement for which ``rule(text, statements so far)``
        holds: that statement is held with everything after it, until ``thaw()``."""
        self._freeze_rule = rule

    def _statement(self, statement: str) -> None:
        self.statements.append(statement)
        if self._freeze_rule is not None and self._freeze_rule(statement, self.statements):
            self._freeze_rule = None
            self.freeze()

    def thaw(self) -> None:
        self._refusing = False
        self._flowing.set()

    def cut(self) -> None:
        self._refusing = True
        self._close_all()

    def _close_all(self) -> None:
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            writer.transport.abort()
            return
        try:
            if self._unix_path:
                up_reader, up_writer = await asyncio.open_unix_connection(self._unix_path)
            else:
                up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(
            self._pipe(reader, up_writer, ClientMessages(self._statement)),
            self._pipe(up_reader, writer, ServerMessages(self._ready_for_query)),
            return_exceptions=True,
        )
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.transport.abort()

    def _ready_for_query(self) -> None:
        self.round_trips += 1

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        messages: ServerMessages | ClientMessages | None = None,
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                if messages is not None:
                    messages.feed(data)
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        writer.transport.abort()


class ServerMessages:
    """Splits the server's side of one PostgreSQL connection into messages (a type byte and a
    length that counts itself) and calls ``on_ready`` for each ``ReadyForQuery`` (``Z``). The
    one-byte answer to an ``SSLRequest`` (``N``) may come first."""

    def __init__(self, on_ready) -> None:
        self._on_ready = on_ready
        self._buffer = bytearray()
        self._started = False

    def feed(self, data: bytes) -> None:
        self._buffer += data
        if not self._started and self._buffer:
            self._started = True
            if self._buffer[:1] == b"N":
                del self._buffer[:1]
        while len(self._buffer) >= 5:
            length = int.from_bytes(self._buffer[1:5], "big")
            if len(self._buffer) < 1 + length:
                return
            if self._buffer[:1] == b"Z":
                self._on_ready()
            del self._buffer[: 1 + length]


class ClientMessages:
    """Splits the client's side of one PostgreSQL connection into messages and calls
    ``on_statement`` with the text of each statement it runs: a simple query (``Q``), or the
    statement a ``Bind`` (``B``) names, its text from the ``Parse`` (``P``) that prepared it.
    The untyped messages before the startup's end (an ``SSLRequest``, the startup message) are
    skipped."""

    _SSL_OR_GSS_REQUEST = (80877103, 80877104)

    def __init__(self, on_statement) -> None:
        self._on_statement = on_statement
        self._buffer = bytearray()
        self._started = False
        self._prepared: dict[str, str] = {}

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while True:
            if not self._started:
                if len(self._buffer) < 8:
                    return
                length = int.from_bytes(self._buffer[:4], "big")
                if len(self._buffer) < length:
                    return
                code = int.from_bytes(self._buffer[4:8], "big")
                self._started = code not in self._SSL_OR_GSS_REQUEST
                del self._buffer[:length]
                continue
            if len(self._buffer) < 5:
                return
            length = int.from_bytes(self._buffer[1:5], "big")
            if len(self._buffer) < 1 + length:
                return
            kind, payload = bytes(self._buffer[:1]), bytes(self._buffer[5 : 1 + length])
            del self._buffer[: 1 + length]
            if kind == b"Q":
                self._on_statement(payload.split(b"\0", 1)[0].decode())
            elif kind == b"P":
                name, query = payload.split(b"\0", 2)[:2]
                self._prepared[name.decode()] = query.decode()
            elif kind == b"B":
                statement = payload.split(b"\0", 2)[1].decode()
                self._on_statement(self._prepared.get(statement, statement))


@asynccontextmanager
async def fault_proxy(database_url: str) -> AsyncIterator[FaultProxy]:
    proxy = FaultProxy(database_url)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


async def set_read_only(engine, *, read_only: bool) -> None:
    """Make the test database refuse writes in every new session (``default_transaction_
    read_only``, as a standby after a failover does), or accept them again. The change itself
    runs in a session made writable first: it may have been opened while read-only."""
    from sqlalchemy import text

    database = engine.url.database
    change = (
        f'ALTER DATABASE "{database}" SET default_transaction_read_only = on'
        if read_only
        else f'ALTER DATABASE "{database}" RESET default_transaction_read_only'
    )
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("SET default_transaction_read_only = off"))
        await conn.execute(text(change))
        await conn.execute(text("RESET default_transaction_read_only"))
