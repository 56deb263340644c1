"""The ``pinlog-ai`` command: ``db upgrade``, ``presets load``, ``serve``, ``doctor``, ``demo``."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="PinLog AI worker.")
db_app = typer.Typer(no_args_is_help=True, help="Database schema (the ai migrations).")
presets_app = typer.Typer(no_args_is_help=True, help="Keyword presets.")
app.add_typer(db_app, name="db")
app.add_typer(presets_app, name="presets")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level, format=LOG_FORMAT)
    # Request URLs of provider calls are ours to log, not the HTTP client's.
    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _settings():
    """Read ``Settings`` or exit 2 with one line per problem (never a value, never a trace)."""
    from pydantic import ValidationError

    from app.settings import Settings, describe_errors

    try:
        return Settings()
    except ValidationError as exc:
        for line in describe_errors(exc):
            typer.echo(f"configuration error: {line}", err=True)
        raise typer.Exit(2) from None


@db_app.command("upgrade")
def db_upgrade(
    migrations_dir: Path | None = typer.Option(None, help="Directory of ordered *.sql files"),
) -> None:
    """Apply pending ``ai`` migrations to PINLOG_DATABASE_URL; a second run applies nothing.

    The ``core`` files are the core service's (``pinlog-core db upgrade``); the worker's role
    needs privileges on ``ai`` only (§8).
    """
    import pinlog_schema
    from app.repository.db import create_engine
    from app.settings import DatabaseSettings

    _configure_logging()
    database = DatabaseSettings()
    url = database.database_url
    if not url:
        raise typer.BadParameter("PINLOG_DATABASE_URL is not set")

    async def run() -> list[str]:
        engine = create_engine(
            url,
            with_vector_codec=False,
            transaction_pooling=database.database_transaction_pooling,
        )
        try:
            return await pinlog_schema.upgrade(
                engine, scope=pinlog_schema.Scope.AI, directory=migrations_dir
            )
        finally:
            await engine.dispose()

    try:
        applied = asyncio.run(run())
    except pinlog_schema.MigrationError as exc:
        typer.echo(f"migration error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(
        f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else "")
    )


@presets_app.command("load")
def presets_load(
    file: Path | None = typer.Option(None, "--file", help="Preset YAML (default: bundled list)"),
) -> None:
    """Embed the preset list with the current profile and upsert it."""
    from app.providers.factory import build_embedding_provider
    from app.repository.db import create_engine
    from app.service.preset_loader import (
        DEFAULT_PRESET_FILE,
        PresetFileError,
        load_presets,
        read_preset_file,
    )

    _configure_logging()
    settings = _settings()
    try:
        preset_file = read_preset_file(file or DEFAULT_PRESET_FILE)
    except PresetFileError as exc:
        typer.echo(f"preset file error: {exc}", err=True)
        raise typer.Exit(2) from None

    async def run():
        engine = create_engine(
            settings.database_url, transaction_pooling=settings.database_transaction_pooling
        )
        embedder = build_embedding_provider(settings)
        try:
            return await load_presets(engine, embedder, preset_file, settings.embedding_profile)
        finally:
            await embedder.aclose()
            await engine.dispose()

    from app.errors import ConfigurationError

    try:
        report = asyncio.run(run())
    except ConfigurationError as exc:
        typer.echo(f"configuration error: {exc}", err=True)
        raise typer.Exit(2) from None
    state = "updated" if report.changed else "unchanged"
    typer.echo(
        f"presets {state}: {report.presets} presets, list version {report.version}, "
        f"{report.retired} retired"
    )


# Longer than any pooled client's idle expiry (the core service drops idle connections after
# 2 s): the server must never be the side that closes a keep-alive connection a client is
# about to reuse, or that client sees a reset (uvicorn's own default is 5 s).
DEFAULT_KEEP_ALIVE_SECONDS = 30


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to bind"),
    port: int = typer.Option(8000, help="TCP port"),
    timeout_keep_alive: int = typer.Option(
        DEFAULT_KEEP_ALIVE_SECONDS,
        min=1,
        help="Seconds an idle keep-alive connection stays open; keep it above every client's "
        "idle expiry (a load balancer's idle timeout included)",
    ),
    proxy_headers: bool = typer.Option(
        False,
        "--proxy-headers/--no-proxy-headers",
        help="Trust X-Forwarded-For/-Proto from --forwarded-allow-ips (behind a proxy)",
    ),
    forwarded_allow_ips: str | None = typer.Option(
        None, help="Comma-separated proxy addresses trusted for proxy headers ('*' for any)"
    ),
    timeout_graceful_shutdown: int | None = typer.Option(
        None,
        min=0,
        help="Seconds open HTTP connections get to finish on SIGTERM before the worker pool's "
        "own PINLOG_SHUTDOWN_GRACE_SECONDS starts (default: wait for them)",
    ),
) -> None:
    """Serve the worker in one process (settings from PINLOG_* environment variables).

    Scale with replicas, not with uvicorn workers: each process owns its queue and pool.
    """
    import uvicorn

    from app.main import create_app

    _configure_logging()
    uvicorn.run(
        create_app(_settings()),
        host=host,
        port=port,
        log_config=None,
        timeout_keep_alive=timeout_keep_alive,
        proxy_headers=proxy_headers,
        forwarded_allow_ips=forwarded_allow_ips,
        timeout_graceful_shutdown=timeout_graceful_shutdown,
    )


@app.command()
def doctor() -> None:
    """Report contract invariant violations in the ai schema, read-only (exit 1 if any).

    Each check prints its count and up to 5 example ids; "info" lines are legal states
    that do not change the exit code. Settings as for ``serve`` (PINLOG_*).
    """
    from app.errors import ConfigurationError
    from app.repository.db import create_engine
    from app.service.doctor import examine

    settings = _settings()

    async def run():
        engine = create_engine(
            settings.database_url,
            pool_size=1,
            transaction_pooling=settings.database_transaction_pooling,
        )
        try:
            return await examine(
                engine,
                dimension=settings.embedding_dimension,
                profile=settings.embedding_profile,
                processing_expiry_seconds=settings.processing_expiry_seconds,
            )
        finally:
            await engine.dispose()

    try:
        report = asyncio.run(run())
    except ConfigurationError as exc:
        typer.echo(f"configuration error: {exc}", err=True)
        raise typer.Exit(2) from None
    for finding in report.findings:
        examples = f" (e.g. {', '.join(finding.examples)})" if finding.examples else ""
        typer.echo(
            f"{finding.label:<9} {finding.check.name}: {finding.total}{examples}"
            f" - {finding.check.description}"
        )
    typer.echo(f"doctor: {report.violations} violation(s)")
    raise typer.Exit(1 if report.violations else 0)


@app.command()
def demo(
    port: int = typer.Option(8765, help="Preferred port; a free one is used if taken"),
    serve_after: bool = typer.Option(True, "--serve/--no-serve", help="Keep serving"),
    data_dir: Path = typer.Option(Path(".pgdata"), help="Embedded PostgreSQL data directory"),
) -> None:
    """Offline end-to-end run on sample notes (see README). Development only: needs a source
    checkout installed with the ``local`` extra (``make run``); exits 2 without it."""
    from app.embedded_postgres import MISSING_EXTRA, EmbeddedPostgresUnavailable

    try:
        from demo.run import run_demo
    except ImportError:
        # The production image carries neither the demo package nor pgserver.
        typer.echo(f"demo unavailable: {MISSING_EXTRA}, from a source checkout", err=True)
        raise typer.Exit(2) from None

    _configure_logging("WARNING")
    try:
        code = asyncio.run(run_demo(port=port, serve=serve_after, data_dir=data_dir.resolve()))
    except KeyboardInterrupt:
        code = 0
    except EmbeddedPostgresUnavailable as exc:
        typer.echo(f"demo unavailable: {exc}", err=True)
        code = 2
    raise typer.Exit(code)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
