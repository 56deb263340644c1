"""An embedded PostgreSQL 16 with pgvector (the ``pgserver`` package) for development and tests.

Used when ``PINLOG_DATABASE_URL`` is unset (``make run``) or ``PINLOG_TEST_DATABASE_URL`` is
unset (tests). Starts in about a second; needs no Docker and no network. ``pgserver`` is in the
``local`` extra only: the production image does not carry it.

Lifetime: pgserver records every process using a data directory in ``.handle_pids.json`` and
stops the server when the last of them exits. A process killed without running its exit
handlers (SIGKILL, the OOM killer) stays recorded forever, so no later process would ever be
"the last" and every later run would leave the server running. ``start`` therefore drops the
entries of processes that no longer exist before joining the list.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from pathlib import Path
from urllib.parse import parse_qs, urlparse

logger = logging.getLogger(__name__)

# pgserver's record of the processes using a data directory (one JSON list of pids).
HANDLE_PIDS_FILE = ".handle_pids.json"

MISSING_EXTRA = (
    "the embedded PostgreSQL needs the development extra: pip install 'pinlog-ai[local]' "
    "(or set PINLOG_DATABASE_URL)"
)


class EmbeddedPostgresUnavailable(RuntimeError):
    """``pgserver`` is not installed (a production install without the ``local`` extra)."""


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


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by another user
    return True


def prune_dead_handles(data_dir: Path) -> list[int]:
    """Remove recorded pids whose process no longer exists; return the removed pids.

    Call under pgserver's inter-process lock (``start`` does). A pid reused by an unrelated
    process since the kill is kept: the server then outlives this run once, as before.
    """
    path = data_dir / HANDLE_PIDS_FILE
    try:
        recorded = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return []
    alive = [pid for pid in recorded if _process_exists(pid)]
    dead = [pid for pid in recorded if pid not in alive]
    if dead:
        path.write_text(json.dumps(alive))
    return dead


def start(data_dir: Path, *, delete_on_exit: bool = False) -> str:
    """Start (or reuse) a server whose data lives in ``data_dir``; return its asyncpg URL.

    The server stops when the last process using it exits; with ``delete_on_exit`` its data
    goes too. Raises ``EmbeddedPostgresUnavailable`` without the ``local`` extra.
    """
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback directory is fine.
        warnings.simplefilter("ignore")
        try:
            import pgserver  # imported lazily: production deployments never start one
        except ImportError as exc:
            raise EmbeddedPostgresUnavailable(MISSING_EXTRA) from exc

    data_dir.mkdir(parents=True, exist_ok=True)
    # The same lock pgserver takes around its own handle list, so a concurrent start or exit
    # in another process cannot interleave with the pruning.
    with pgserver.PostgresServer._lock:
        dead = prune_dead_handles(data_dir)
    if dead:
        logger.warning(
            "embedded PostgreSQL in %s: forgot %d process(es) that exited uncleanly",
            data_dir,
            len(dead),
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = pgserver.get_server(data_dir, cleanup_mode="delete" if delete_on_exit else "stop")
    return asyncpg_url(server.get_uri())
