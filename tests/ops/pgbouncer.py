"""A real PgBouncer in ``pool_mode = transaction`` in front of the test database.

Started by the tests when the ``pgbouncer`` binary is installed (``.ci/run`` installs it from
the OS packages). The embedded test server listens on a unix socket: PgBouncer reaches it
there (``host=/socket/dir``) and listens on a loopback TCP port itself. Few server
connections (``default_pool_size``) so that clients really share them, which is what breaks
prepared statements and startup parameters.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url

BINARY_NAMES = ("pgbouncer", "/usr/sbin/pgbouncer")
SERVER_CONNECTIONS = 4


def find_binary() -> str | None:
    for name in BINARY_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _config(database_url: str, port: int, workdir: Path) -> str:
    url = make_url(database_url)
    host = url.query.get("host") or url.host or "127.0.0.1"
    target = [f"host={host}", f"port={url.port or 5432}", f"dbname={url.database}"]
    target.append(f"user={url.username}")
    if url.password:
        target.append(f"password={url.password}")
    (workdir / "users.txt").write_text(f'"{url.username}" ""\n')
    return "\n".join(
        [
            "[databases]",
            f"{url.database} = {' '.join(target)}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {workdir / 'users.txt'}",
            "pool_mode = transaction",
            f"default_pool_size = {SERVER_CONNECTIONS}",
            "max_client_conn = 500",
            f"logfile = {workdir / 'pgbouncer.log'}",
            f"pidfile = {workdir / 'pgbouncer.pid'}",
            "",
        ]
    )


def _run_as(socket_dir: str) -> list[str]:
    """PgBouncer refuses to run as root: run it as the owner of the server's socket dir."""
    if os.geteuid() != 0:
        return []
    owner = Path(socket_dir).stat().st_uid if socket_dir.startswith("/") else 0
    name = pwd.getpwuid(owner).pw_name if owner != 0 else "nobody"
    return ["-u", name]


@contextmanager
def running_pgbouncer(binary: str, database_url: str, workdir: Path):
    """Yield the asyncpg URL of a PgBouncer (transaction pooling) in front of ``database_url``."""
    port = _free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o777)  # the unprivileged pgbouncer user writes its log and pid here
    config = workdir / "pgbouncer.ini"
    config.write_text(_config(database_url, port, workdir))
    url = make_url(database_url)
    socket_dir = url.query.get("host") or ""
    process = subprocess.Popen(  # noqa: S603 (a fixed binary and our own config)
        [binary, *_run_as(socket_dir), str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log = workdir / "pgbouncer.log"
                    detail = log.read_text() if log.exists() else process.stderr.read().decode()
                    raise RuntimeError(f"pgbouncer did not start: {detail[-2000:]}") from None
                time.sleep(0.05)
        bouncer = url.set(host="127.0.0.1", port=port, query={})
        yield bouncer.render_as_string(hide_password=False)
    finally:
        process.terminate()
        process.wait(timeout=10)
