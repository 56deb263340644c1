"""The ``pinlog-ai`` command: ``db upgrade``, ``presets load``, ``serve``, ``demo``.

Startup problems end with one line on stderr and an exit code of ``app.exit_codes`` (2 settings,
3 database unreachable, 4 database not ready, 5 provider), never with a traceback. Heavy
modules are imported inside the commands, so a configuration error is reported fast.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn, TypeVar

import typer

from app import exit_codes

T = TypeVar("T")

app = typer.Typer(no_args_is_help=True, add_completion=False, help="PinLog AI worker.")
db_app = typer.Typer(no_args_is_help=True, help="Database schema (the ai migrations).")
presets_app = typer.Typer(no_args_is_help=True, help="Keyword presets.")
app.add_typer(db_app, name="db")
app.add_typer(presets_app, name="presets")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format=LOG_FORMAT)
    # Request URLs of provider calls are ours to log, not the HTTP client's.
    for name in ("httpx", "httpx2", "aiohttp"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _exit(code: int, lines: list[str]) -> NoReturn:
    for line in lines:
        typer.echo(f"pinlog-ai: {line}", err=True)
    raise typer.Exit(code)


def _settings(settings_class=None):
    """Read ``Settings`` (or ``settings_class``) or exit 2 with one line per problem, every
    problem at once (never a value, never a trace)."""
    from pydantic import ValidationError

    from app.settings import Settings, describe_errors

    try:
        return (settings_class or Settings)()
    except ValidationError as exc:
        _exit(
            exit_codes.CONFIGURATION,
            [f"configuration error: {line}" for line in describe_errors(exc)],
        )


def _run(step: Callable[[], Awaitable[T]]) -> T:
    """Run one async startup step; a known startup problem exits with its one line."""
    from app import preflight

    try:
        return asyncio.run(step())
    except Exception as exc:
        problem = preflight.classify(exc)
        if problem is None:
            raise  # a bug of ours: the traceback is the useful output
        _exit(problem.exit_code, [problem.message])


async def _check_database(url: str) -> None:
    """Reachable, and migrated (without the vector codec, which needs the extension)."""
    from app import preflight
    from app.repository.db import create_engine

    engine = create_engine(url, pool_size=1, with_vector_codec=False)
    try:
        await preflight.check_database(engine, schema=True)
    finally:
        await engine.dispose()


@db_app.command("upgrade")
def db_upgrade(
    migrations_dir: Path | None = typer.Option(None, help="Directory of ordered *.sql files"),
) -> None:
    """Apply pending ``ai`` migrations to PINLOG_DATABASE_URL; a second run applies nothing.

    The ``core`` files are the core service's (``pinlog-core db upgrade``); the worker's role
    needs privileges on ``ai`` only (§8). An applied file that changed exits 2.
    """
    from app.settings import MigrationSettings

    _configure_logging()
    url = _settings(MigrationSettings).database_url

    import pinlog_schema
    from app.repository.db import create_engine

    async def run() -> list[str]:
        engine = create_engine(url, with_vector_codec=False)
        try:
            return await pinlog_schema.upgrade(
                engine, scope=pinlog_schema.Scope.AI, directory=migrations_dir
            )
        except pinlog_schema.MigrationError as exc:
            _exit(exit_codes.CONFIGURATION, [f"migration error: {exc}"])
        finally:
            await engine.dispose()

    applied = _run(run)
    typer.echo(
        f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else "")
    )


@presets_app.command("load")
def presets_load(
    file: Path | None = typer.Option(None, "--file", help="Preset YAML (default: bundled list)"),
) -> None:
    """Embed the preset list with the current profile and upsert it."""
    _configure_logging()
    settings = _settings()

    from app.providers.factory import build_embedding_provider
    from app.repository.db import create_engine
    from app.service.preset_loader import (
        DEFAULT_PRESET_FILE,
        PresetFileError,
        load_presets,
        read_preset_file,
    )

    try:
        preset_file = read_preset_file(file or DEFAULT_PRESET_FILE)
    except PresetFileError as exc:
        _exit(exit_codes.CONFIGURATION, [f"preset file error: {exc}"])

    async def run():
        # The database first: its problems must not be blamed on the provider.
        await _check_database(settings.database_url)
        engine = create_engine(settings.database_url)
        embedder = build_embedding_provider(settings)
        try:
            return await load_presets(engine, embedder, preset_file, settings.embedding_profile)
        finally:
            await embedder.aclose()
            await engine.dispose()

    report = _run(run)
    state = "updated" if report.changed else "unchanged"
    typer.echo(
        f"presets {state}: {report.presets} presets, list version {report.version}, "
        f"{report.retired} retired"
    )


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to bind"),
    port: int = typer.Option(8000, help="TCP port"),
) -> None:
    """Serve the worker (settings from PINLOG_* environment variables)."""
    _configure_logging()
    settings = _settings()

    async def check() -> None:
        # What the lifespan needs, checked first so that a problem is one line and an exit
        # code instead of uvicorn's startup traceback.
        from app.repository.db import create_engine
        from app.service.presets import PresetCache

        await _check_database(settings.database_url)
        engine = create_engine(settings.database_url, pool_size=1)
        try:
            await PresetCache(engine, settings.embedding_profile).reload()
        finally:
            await engine.dispose()

    _run(check)

    import uvicorn

    from app.main import create_app

    uvicorn.run(create_app(settings), host=host, port=port, log_config=None)


@app.command()
def demo(
    port: int = typer.Option(8765, help="Worker's preferred port; a free one if taken"),
    core_port: int = typer.Option(8766, help="Core service's preferred port; a free one if taken"),
    serve_after: bool = typer.Option(True, "--serve/--no-serve", help="Keep serving"),
    data_dir: Path = typer.Option(Path(".pgdata"), help="Embedded PostgreSQL data directory"),
) -> None:
    """Offline end-to-end run of both services on sample notes (see README)."""
    from demo.run import run_demo

    _configure_logging("WARNING")
    try:
        code = asyncio.run(
            run_demo(port=port, core_port=core_port, serve=serve_after, data_dir=data_dir.resolve())
        )
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
