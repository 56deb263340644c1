"""The ``serve`` options both CLIs share, built per settings prefix.

Each limit option defaults to ``None``: not given, the setting of the same name applies
(``pinlog_platform.settings_rules.http_serving``); ``pinlog_platform.http.server.
uvicorn_options`` resolves the pair.
"""

from __future__ import annotations

from typing import Any

import typer

from pinlog_platform.cli import numbers


def limit_concurrency(prefix: str) -> Any:
    return typer.Option(
        None,
        "--limit-concurrency",
        parser=numbers.whole(1, 1_000_000),
        metavar="N",
        help="Open connections and running requests at once; beyond, 503 at once "
        f"(default: {prefix}LIMIT_CONCURRENCY, 900)",
    )


def max_header_bytes(prefix: str) -> Any:
    return typer.Option(
        None,
        "--max-header-bytes",
        parser=numbers.whole(1024, 1_048_576),
        metavar="BYTES",
        help=f"Largest request head; larger answers 431 (default: {prefix}MAX_HEADER_BYTES, 16384)",
    )


def head_timeout(prefix: str) -> Any:
    return typer.Option(
        None,
        "--head-timeout",
        parser=numbers.decimal_seconds(0.1, 3600),
        metavar="SECONDS",
        help="Seconds a client has to send a request head; then 408 and closed "
        f"(default: {prefix}HEAD_TIMEOUT, 10)",
    )


def timeout_keep_alive(prefix: str) -> Any:
    return typer.Option(
        None,
        "--timeout-keep-alive",
        parser=numbers.whole(1, 86400),
        metavar="SECONDS",
        help="Seconds an idle keep-alive connection stays open; keep it above every client's "
        "idle expiry (a load balancer's idle timeout included) "
        f"(default: {prefix}TIMEOUT_KEEP_ALIVE, 30)",
    )


def proxy_headers() -> Any:
    return typer.Option(
        False,
        "--proxy-headers/--no-proxy-headers",
        help="Trust X-Forwarded-For/-Proto from --forwarded-allow-ips (behind a proxy)",
    )


def forwarded_allow_ips() -> Any:
    return typer.Option(
        None,
        metavar="ADDRESSES",
        help="Comma-separated proxy addresses trusted for proxy headers ('*' for any)",
    )


def access_log() -> Any:
    return typer.Option(
        False,
        "--access-log/--no-access-log",
        help="One INFO line per HTTP request (uvicorn.access); off by default: GET /metrics "
        "counts requests by route and status",
    )
