"""A small dedicated PostgreSQL cluster with streaming replicas, for the replica and failover
tests (docs/deployment.md "Replicas and failover").

Built with the binaries the embedded server ships (``pgserver``): ``initdb`` makes the primary,
the schema is migrated into its ``pinlog`` database, ``pg_basebackup -R`` copies it into a
standby that streams from it, and ``pg_ctl`` stops, starts and promotes either one. Both listen
on loopback TCP ports, so a URL can name them both (``failover_url``). Run as root (the
development containers), the servers run as pgserver's own system user, as the embedded one
does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text

from app.repository.db import create_engine
from pinlog_platform.contract import schema as migrations
from tests.e2e.processes import free_port

DATABASE = "pinlog"
# A test cluster: nothing here must survive a machine crash, only a server's.
SERVER_SETTINGS = """
fsync = off
full_page_writes = off
shared_buffers = 16MB
max_connections = 80
wal_level = replica
max_wal_senders = 4
hot_standby = on
wal_receiver_status_interval = 1s
hot_standby_feedback = on
"""
COMMAND_TIMEOUT_SECONDS = 60.0


def _bin(name: str) -> str:
    from pgserver._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


def _system_user() -> str | None:
    """The user the servers run as: pgserver's own when this process is root."""
    if os.geteuid() != 0:
        return None
    from pgserver.utils import ensure_user_exists

    ensure_user_exists("pgserver")
    return "pgserver"


async def _run(*args: str, user: str | None) -> str:
    process = await asyncio.create_subprocess_exec(
        *args, user=user, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT_SECONDS)
    if process.returncode != 0:
        raise RuntimeError(f"{Path(args[0]).name} failed ({process.returncode}):\n{out.decode()}")
    return out.decode()


@dataclass
class Node:
    """One server: its data directory and loopback port."""

    name: str
    data_dir: Path
    socket_dir: Path
    port: int
    user: str | None

    def url(self, database: str = DATABASE) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    async def start(self) -> None:
        await _run(
            _bin("pg_ctl"), "-D", str(self.data_dir), "-w", "-t", "30",
            "-l", str(self.data_dir.parent / f"{self.name}.log"),
            "-o", f"-p {self.port} -h 127.0.0.1 -k {self.socket_dir}", "start",
            user=self.user,
        )  # fmt: skip

    async def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m fast`` (WAL shipped on shutdown) or ``immediate`` (a crash)."""
        await _run(
            _bin("pg_ctl"), "-D", str(self.data_dir), "-w", "-t", "30", "-m", mode, "stop",
            user=self.user,
        )  # fmt: skip

    async def promote(self) -> None:
        await _run(_bin("pg_ctl"), "-D", str(self.data_dir), "-w", "promote", user=self.user)

    def log(self) -> str:
        path = self.data_dir.parent / f"{self.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


class ReplicatedCluster:
    """A primary and streaming standbys (``create``); ``close`` stops them all and deletes
    their files. ``primary`` and ``replica`` (the first standby) are the nodes as created;
    after a failover the caller knows which one is primary now."""

    def __init__(self, root: Path, nodes: list[Node]) -> None:
        self.root = root
        self.nodes = nodes
        self.primary = nodes[0]
        self.replica = nodes[1]

    @classmethod
    async def create(cls, *, standbys: int = 1, synchronous: bool = False) -> ReplicatedCluster:
        """A migrated primary and ``standbys`` standbys streaming from it. ``synchronous``:
        the primary waits for a standby's flush before a commit returns (``set_synchronous``;
        on the primary only, so a promoted standby does not wait for a standby it lacks)."""
        user = _system_user()
        root = Path(tempfile.mkdtemp(prefix="pinlog-replica-"))
        if user is not None:
            shutil.chown(root, user)
        # The servers run as another user when this is root: they must reach their files.
        os.chmod(root, 0o755)  # noqa: S103
        names = ["primary", "replica", *(f"replica{i}" for i in range(2, standbys + 1))]
        nodes = [Node(name, root / name, root, free_port(), user) for name in names]
        cluster = cls(root, nodes)
        primary = nodes[0]
        try:
            await _run(
                _bin("initdb"), "-D", str(primary.data_dir), "-U", "postgres",
                "--auth=trust", "--encoding=utf8", "--no-sync", user=user,
            )  # fmt: skip
            with (primary.data_dir / "postgresql.conf").open("a") as conf:
                conf.write(SERVER_SETTINGS)
            await primary.start()
            await _admin(primary.url("postgres"), f'CREATE DATABASE "{DATABASE}"')
            engine = create_engine(primary.url(), with_vector_codec=False)
            try:
                await migrations.upgrade(engine)
            finally:
                await engine.dispose()
            for standby in nodes[1:]:
                await _run(
                    _bin("pg_basebackup"), "-D", str(standby.data_dir), "-h", "127.0.0.1",
                    "-p", str(primary.port), "-U", "postgres", "-X", "stream", "-R",
                    "--checkpoint=fast", "--no-sync", user=user,
                )  # fmt: skip
                await standby.start()
            if synchronous:
                await cluster.set_synchronous(primary)
            await cluster.wait_streaming(primary, standbys=standbys)
        except BaseException:
            await cluster.close()
            raise
        return cluster

    def failover_url(self) -> str:
        """Every server in the accepted multi-host form, writes on whichever accepts them."""
        hosts = "&".join(f"host=127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgresql+asyncpg://postgres@/{DATABASE}?{hosts}&target_session_attrs=read-write"

    async def set_synchronous(self, primary: Node) -> None:
        """``synchronous_standby_names = '*'`` on ``primary``: a commit returns once a standby
        has flushed it."""
        await _admin(
            primary.url("postgres"),
            "ALTER SYSTEM SET synchronous_standby_names = '*'",
            "SELECT pg_reload_conf()",
        )

    async def follow(self, standby: Node, primary: Node) -> None:
        """Point ``standby`` at ``primary`` (a promoted standby): its WAL receiver reconnects
        there and follows the new timeline (``recovery_target_timeline = latest``)."""
        conninfo = f"host=127.0.0.1 port={primary.port} user=postgres"
        auto = standby.data_dir / "postgresql.auto.conf"
        lines = [
            line
            for line in auto.read_text().splitlines()
            if not line.startswith("primary_conninfo")
        ]
        auto.write_text("\n".join([*lines, f"primary_conninfo = '{conninfo}'", ""]))
        await _admin(standby.url("postgres"), "SELECT pg_reload_conf()")

    async def wait_streaming(
        self, primary: Node | None = None, *, standbys: int = 1, within: float = 20.0
    ) -> None:
        """Until ``primary`` (the first node by default) sees ``standbys`` standbys streaming
        (and, when it has synchronous_standby_names, one of them as sync)."""
        engine = create_engine((primary or self.primary).url("postgres"), with_vector_codec=False)
        try:
            async with asyncio.timeout(within):
                while True:
                    async with engine.connect() as conn:
                        rows = (
                            await conn.execute(
                                text(
                                    "SELECT state, sync_state, current_setting("
                                    "'synchronous_standby_names') AS names "
                                    "FROM pg_stat_replication"
                                )
                            )
                        ).all()
                    streaming = [row for row in rows if row.state == "streaming"]
                    synchronous = (
                        not streaming
                        or not streaming[0].names
                        or any(row.sync_state == "sync" for row in streaming)
                    )
                    if len(streaming) >= standbys and synchronous:
                        return
                    await asyncio.sleep(0.05)
        finally:
            await engine.dispose()

    async def close(self) -> None:
        for node in reversed(self.nodes):
            if (node.data_dir / "postmaster.pid").exists():
                with contextlib.suppress(RuntimeError):
                    await node.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


async def _admin(url: str, *statements: str) -> None:
    engine = create_engine(url, with_vector_codec=False)
    try:
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            for statement in statements:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


# WAL positions as byte offsets (numeric), comparable across the two servers.
WRITTEN_LSN = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')"
REPLAYED_AT_LEAST = (
    "SELECT coalesce(pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0') >= :lsn, false)"
)


async def wait_replayed(primary_url: str, replica_url: str, within: float = 20.0) -> None:
    """Until the standby has replayed everything the primary has written so far."""
    primary = create_engine(primary_url, with_vector_codec=False)
    replica = create_engine(replica_url, with_vector_codec=False)
    try:
        async with primary.connect() as conn:
            lsn = (await conn.execute(text(WRITTEN_LSN))).scalar_one()
        async with asyncio.timeout(within):
            while True:
                async with replica.connect() as conn:
                    done = (await conn.execute(text(REPLAYED_AT_LEAST), {"lsn": lsn})).scalar_one()
                if done:
                    return
                await asyncio.sleep(0.02)
    finally:
        await primary.dispose()
        await replica.dispose()
