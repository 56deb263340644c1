"""An embedded PostgreSQL 16 with pgvector (the ``pgserver`` package) for development and tests.

Used when ``PINLOG_DATABASE_URL`` is unset (``make run``) or ``PINLOG_TEST_DATABASE_URL`` is
unset (tests). Starts in about a second; needs no Docker and no network.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from urllib.parse import parse_qs, urlparse


def asyncpg_url(libpq_uri: str) -> str:
    """Turn pgserver's ``postgresql://user:@/db?host=/socket/dir`` into an asyncpg URL."""
    parsed = urlparse(libpq_uri)
    host = parse_qs(parsed.query).get("host", [""])[0]
    user = parsed.username or "postgres"
    database = parsed.path.lstrip("/") or "postgres"
    if host.startswith("/"):
        return f"postgresql+asyncpg://{user}@/{database}?host={host}"
    port = f":{parsed.port}" if parsed.port else ""
    return f"postgresql+asyncpg://{user}@{parsed.hostname}{port}/{database}"


def start(data_dir: Path, *, delete_on_exit: bool = False) -> str:
    """Start (or reuse) a server whose data lives in ``data_dir``; return its asyncpg URL.

    The server stops when this process exits; with ``delete_on_exit`` its data goes too.
    """
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback directory is fine.
        warnings.simplefilter("ignore")
        import pgserver  # imported lazily: production deployments never start one

    data_dir.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = pgserver.get_server(data_dir, cleanup_mode="delete" if delete_on_exit else "stop")
    return asyncpg_url(server.get_uri())
