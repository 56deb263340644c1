"""Real ``pinlog-ai serve`` / ``pinlog-core serve`` processes and ``pinlog-core`` commands for
the end-to-end tests: the two services meet only through the database and HTTP (§0).

Each service runs as ``python -m <package>.cli serve`` with its settings in the environment,
its output in a log file (a pipe could fill and stall the process), and is ready once
``GET /readyz`` answers 200. A process keeps its port across restarts, so the core's
``WORKER_BASE_URL`` stays valid when a test stops, kills or replaces the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.core.harness import JWT_SECRET
from tests.fake_openai import FakeOpenAI
from tests.worker.harness import PROFILE, SECRET

READY_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 15.0
COMMAND_TIMEOUT_SECONDS = 60.0
# Short clocks for fast tests (§2, §9): a provider call (2 s x 1 attempt) stays below the
# PROCESSING expiry (3 s) that both services share, as the worker's settings require.
PROVIDER_TIMEOUT_SECONDS = 2
PROCESSING_EXPIRY_SECONDS = 3
PENDING_EXPIRY_SECONDS = 1
DISPATCH_BACKOFF_MAX_SECONDS = 2


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _base_environment() -> dict[str, str]:
    """This interpreter's environment without any ``PINLOG_*`` setting of the caller."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PINLOG_")}


def worker_environment(database_url: str, fake: FakeOpenAI, **overrides: object) -> dict[str, str]:
    """``PINLOG_*`` settings of a worker using the fake OpenAI server (overrides by name)."""
    values: dict[str, object] = {
        "database_url": database_url,
        "internal_secret": SECRET,
        "embedding_provider": "openai",
        "embedding_base_url": fake.base_url,
        "embedding_api_key": "sk-test-embedding-key",
        "embedding_profile": PROFILE,
        "judge_provider": "openai",
        "judge_base_url": fake.base_url,
        "judge_api_key": "sk-test-judge-key",
        "judge_model": "fake-chat",
        "provider_timeout_seconds": PROVIDER_TIMEOUT_SECONDS,
        "provider_max_retries": 0,
        "processing_expiry_seconds": PROCESSING_EXPIRY_SECONDS,
        "keyword_similarity_floor": 0.05,
        "breaker_threshold": 1000,
        "worker_concurrency": 4,
        "shutdown_grace_seconds": 1,
        "database_pool_size": 4,
    }
    values.update(overrides)
    return _base_environment() | {f"PINLOG_{k.upper()}": str(v) for k, v in values.items()}


def core_environment(
    database_url: str, worker_base_url: str, **overrides: object
) -> dict[str, str]:
    """``PINLOG_CORE_*`` settings of a core service or command (overrides by name)."""
    values: dict[str, object] = {
        "database_url": database_url,
        "worker_base_url": worker_base_url,
        "internal_secret": SECRET,
        "jwt_secret": JWT_SECRET,
        "embedding_profile": PROFILE,
        "pending_expiry_seconds": PENDING_EXPIRY_SECONDS,
        "processing_expiry_seconds": PROCESSING_EXPIRY_SECONDS,
        "database_pool_size": 4,
        # Held dispatches are tried again at least every 2 s (not 30 s) once a worker is back.
        "dispatch_backoff_max_seconds": DISPATCH_BACKOFF_MAX_SECONDS,
        "member_writes_per_minute": 0,
        "member_searches_per_minute": 0,
    }
    values.update(overrides)
    return _base_environment() | {f"PINLOG_CORE_{k.upper()}": str(v) for k, v in values.items()}


@dataclass
class ServiceProcess:
    """One service process on a fixed loopback port; ``start`` can be called again after
    ``stop`` or ``kill`` (a restart on the same port)."""

    package: str  # "app" or "core_service"
    env: dict[str, str]
    log_path: Path
    port: int = field(default_factory=free_port)
    # The core's operations listener (/metrics, detailed /readyz).
    ops_port: int = field(default_factory=free_port)
    extra_args: tuple[str, ...] = ()
    process: asyncio.subprocess.Process | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ops_base_url(self) -> str:
        """Where ``/metrics`` is: the core's operations listener, the worker's own port."""
        if self.package == "core_service":
            return f"http://127.0.0.1:{self.ops_port}"
        return self.base_url

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        """Spawn the process and wait until ``/readyz`` answers 200 (at most 60 s)."""
        assert not self.running, "already running"
        with self.log_path.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", f"{self.package}.cli", "serve",
                "--host", "127.0.0.1", "--port", str(self.port), *self._ops_args(),
                *self.extra_args,
                env=self.env, stdout=log, stderr=log,
            )  # fmt: skip
        async with httpx.AsyncClient(base_url=self.base_url, timeout=2) as client:
            async with asyncio.timeout(READY_TIMEOUT_SECONDS):
                while True:
                    if self.process.returncode is not None:
                        raise RuntimeError(f"{self.package} exited early:\n{self.log_tail()}")
                    with contextlib.suppress(httpx.TransportError):
                        if (await client.get("/readyz")).status_code == 200:
                            return
                    await asyncio.sleep(0.1)

    def _ops_args(self) -> tuple[str, ...]:
        return ("--ops-port", str(self.ops_port)) if self.package == "core_service" else ()

    async def stop(self) -> None:
        """SIGTERM (graceful shutdown) and wait; SIGKILL if it outlives 15 s."""
        await self._signal(signal.SIGTERM)

    async def kill(self) -> None:
        """SIGKILL: the process dies at once, mid-work, as in a crash (§10 #8)."""
        await self._signal(signal.SIGKILL)

    async def _signal(self, signum: int) -> None:
        if not self.running:
            return
        assert self.process is not None
        self.process.send_signal(signum)
        try:
            await asyncio.wait_for(self.process.wait(), STOP_TIMEOUT_SECONDS)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()

    def log_tail(self, characters: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-characters:]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass(frozen=True, slots=True)
class RescanCounts:
    """The counts ``pinlog-core rescan --once`` prints (rows, not stages)."""

    blocked_closed: int
    finalized: int
    claimed: int
    dispatched: int
    dispatch_failed: int
    skipped_deleted: int
    skipped_missing: int


_RESCAN_LINE = re.compile(
    r"closed (\d+) blocked keyword stage\(s\), finalized (\d+), claimed (\d+), "
    r"dispatched (\d+), dispatch failed (\d+), skipped deleted (\d+), skipped missing (\d+)"
)


async def run_command(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """Run ``python -m <args>``; (exit code, stdout, stderr). At most 60 s."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT_SECONDS)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def rescan_once(env: dict[str, str]) -> RescanCounts:
    """``pinlog-core rescan --once`` as its own process; its printed counts."""
    code, out, err = await run_command("core_service.cli", "rescan", "--once", env=env)
    match = _RESCAN_LINE.search(out)
    assert code == 0 and match, f"rescan failed ({code}):\n{out}\n{err[-3000:]}"
    return RescanCounts(*(int(group) for group in match.groups()))


async def member_token(env: dict[str, str], member_id: int) -> str:
    """``pinlog-core token --member N``: the member is created if new; one line, the token."""
    code, out, err = await run_command(
        "core_service.cli", "token", "--member", str(member_id), env=env
    )
    assert code == 0, err[-2000:]
    lines = out.splitlines()
    assert len(lines) == 1, "the token command prints exactly one line"
    return lines[0]
