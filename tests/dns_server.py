"""A real DNS server for the tests (``dnslib``), answering A records from a table the test
changes while it runs: a Kubernetes headless Service as its pods come and go.

It listens on a free loopback UDP port in a thread of its own; ``answers`` maps a name to its
addresses (a name not in it does not exist: NXDOMAIN); ``queries`` counts the questions asked,
so a test can wait for the next resolution instead of sleeping.
"""

from __future__ import annotations

import socket
import threading

from dnslib import QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer


class TableResolver(BaseResolver):
    def __init__(self) -> None:
        self.answers: dict[str, list[str]] = {}
        self.queries: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._asked = threading.Condition(self._lock)

    def resolve(self, request, handler):
        reply = request.reply()
        name = str(request.q.qname).rstrip(".").lower()
        kind = QTYPE[request.q.qtype]
        with self._lock:
            self.queries.append((name, kind))
            addresses = self.answers.get(name)
            self._asked.notify_all()
        if addresses is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif kind == "A":
            for address in addresses:
                reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(address), ttl=1))
        return reply

    def asked(self, name: str) -> int:
        with self._lock:
            return sum(1 for asked, _ in self.queries if asked == name)


class LocalDnsServer:
    """``with LocalDnsServer() as dns``: ``dns.address`` is ``127.0.0.1:PORT``."""

    def __init__(self) -> None:
        self.resolver = TableResolver()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._server = DNSServer(
            self.resolver,
            address="127.0.0.1",
            port=self.port,
            logger=DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data"),
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> LocalDnsServer:
        self._server.start_thread()
        return self

    def __exit__(self, *_exc) -> None:
        self._server.stop()
        self._server.server.server_close()
