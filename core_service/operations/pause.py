"""``pinlog-core pause`` / ``resume``: stop and restart dispatching for maintenance
(docs/operations.md "Pause").

The state is one row of ``core.dispatch_control``; every core process reads it through the
``PauseSwitch`` of ``service/pause.py``, at most ``CACHE_SECONDS`` old, so ``change`` returns
once that bound (plus a margin for the read itself) has passed: when ``pinlog-core pause``
returns, no core process decides to send anything any more.
"""

from __future__ import annotations

import asyncio

import typer
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.command_startup import load, run_operation
from core_service.repository import dispatch_control
from core_service.repository.db import transaction
from core_service.service.pause import CACHE_SECONDS

# What ``change`` waits after the write: the cache bound plus a margin for the read itself.
PROPAGATION_SECONDS = CACHE_SECONDS + 0.5

commands = typer.Typer(rich_markup_mode=None)


async def change(engine: AsyncEngine, *, paused: bool) -> bool:
    """Write the pause state (idempotent) and wait until every core process acts on it; the
    state as stored."""
    async with transaction(engine) as conn:
        stored = await dispatch_control.set_paused(conn, paused=paused)
    await asyncio.sleep(PROPAGATION_SECONDS)
    return stored


def _set_pause(paused: bool) -> None:
    from core_service.settings import CoreDatabaseSettings

    stored = run_operation(
        load(CoreDatabaseSettings), lambda ops: change(ops.engine, paused=paused)
    )
    typer.echo("dispatch paused" if stored else "dispatch running")


@commands.command()
def pause() -> None:
    """Stop sending work to the workers (creates and edits still commit); returns once every
    core process acts on it (at most 1.5 s)."""
    _set_pause(True)


@commands.command()
def resume() -> None:
    """Send work to the workers again; the backlog drains."""
    _set_pause(False)
