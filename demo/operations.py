"""``pinlog-ai demo --operations`` (``make run-operations``): after the demo's table, the two
operations of docs/operations.md on its notes, offline: a preset reclassification
(``demo.preset_reclassification``), then a switch of the embedding profile to the hashing
encoder's (``demo.profile_switch``).

What the flag changes before that: the run uses a database of its own on the embedded server
(``OPERATIONS_DATABASE``, made afresh each run, since a finished switch leaves the hashing
profile in use there; a ``PINLOG_DATABASE_URL`` is used as given, unless an earlier switch left
another profile in use there: ``refusal``), both workers reload their presets every
``PRESETS_REFRESH_SECONDS``, and a second worker (the hashing encoder's profile, its presets
loaded first) serves beside the first from the start, listed in the core's
``PINLOG_CORE_WORKER_BASE_URL``.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import text

from app.repository.db import create_engine
from app.service.preset_loader import read_preset_file
from app.settings import Settings
from core_service.repository.db import create_engine as create_core_engine
from core_service.service import profile_in_use, switch_status
from demo.feed import ContextLine
from demo.preset_reclassification import reclassify, write_new_list
from demo.profile_switch import hashing_worker_settings, switch_profile
from demo.run import RunningServices, Say, embed_presets

OPERATIONS_DATABASE = "pinlog_operations"
# The workers pick up a new preset list within this (the setting's default is 30 s).
PRESETS_REFRESH_SECONDS = 1.0
WORKER_OVERRIDES: dict[str, Any] = {"presets_refresh_seconds": PRESETS_REFRESH_SECONDS}


# The operations' database, dropped with its sessions, then made again empty.
DROP_DATABASE = text(f'DROP DATABASE IF EXISTS "{OPERATIONS_DATABASE}" WITH (FORCE)')
CREATE_DATABASE = text(f'CREATE DATABASE "{OPERATIONS_DATABASE}"')


async def fresh_database(server_url: str) -> str:
    """The URL of ``OPERATIONS_DATABASE`` on the server of ``server_url``, made afresh."""
    admin = create_engine(server_url, pool_size=1, with_vector_codec=False)
    try:
        async with admin.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(DROP_DATABASE)
            await conn.execute(CREATE_DATABASE)
    finally:
        await admin.dispose()
    return urlsplit(server_url)._replace(path=f"/{OPERATIONS_DATABASE}").geturl()


async def refusal(settings: Settings) -> str | None:
    """Why the operations cannot run on this database (a profile switch under way, or one
    that left another profile in use), or ``None``."""
    engine = create_core_engine(settings.database_url, pool_size=1)
    try:
        now = await switch_status.read_switch_status(engine, configured=settings.embedding_profile)
    finally:
        await engine.dispose()
    if now.state == "idle" and now.profile_in_use == settings.embedding_profile:
        return None
    return (
        f"operations: this database's embedding profile in use is {now.profile_in_use} "
        f"(switch {now.state}); run --operations on a fresh database"
    )


async def prepare_second_worker(settings: Settings, *, say: Say) -> Settings:
    """The second worker's settings, with the bundled presets loaded under its profile (a
    worker starts only with presets usable under its profile)."""
    second = hashing_worker_settings(settings)
    report = await embed_presets(second, read_preset_file())
    state = "embedded and stored" if report.changed else "already stored"
    say(f"presets: {report.presets} {state} under {second.embedding_profile} too, for the "
        "second worker")  # fmt: skip
    return second


async def run_operations(
    services: RunningServices,
    settings: Settings,
    second: Settings,
    lines: list[ContextLine],
    *,
    jwt_secret: str,
    say: Say,
) -> bool:
    """Both operations on the live ``lines``; whether each ended as it should."""
    # The switch says when the profile in use changes; the core's own warning would repeat it.
    logging.getLogger(profile_in_use.__name__).setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="pinlog-demo-") as directory:
        path = write_new_list(Path(directory))
        reclassified = await reclassify(
            [settings, second], services.core_settings, lines, path=path, say=say
        )
        switched = await switch_profile(
            services, second, read_preset_file(path), lines, jwt_secret=jwt_secret, say=say
        )
    return reclassified and switched
