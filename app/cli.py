"""The ``pinlog-ai`` command: ``db upgrade``, ``presets load``, ``serve``, ``smoke``, ``doctor``,
and the commands other packages register (``demo``: ``COMMAND_PLUGINS``).

Startup problems end with one line on stderr and an exit code of
``pinlog_platform.cli.exit_codes`` (2 settings, 3 database unreachable, 4 database not ready, 5
provider), never with a traceback. Heavy modules are imported inside the commands, so a
configuration error is reported fast.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import NoReturn, TypeVar

import typer

from app.settings import ENV_PREFIX
from pinlog_platform.cli import exit_codes, numbers, serve_options, startup
from pinlog_platform.cli.version import add_version_option

T = TypeVar("T")
PROGRAM = "pinlog-ai"
# Entry point group of commands registered from other packages: ``name = "module:register"``,
# ``register(cli)`` adds the command (pyproject.toml).
COMMAND_PLUGINS = "pinlog_ai.commands"

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None)
add_version_option(app, PROGRAM, help_text="PinLog AI worker.")
db_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Database schema (the ai migrations)."
)
presets_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Keyword presets.")
app.add_typer(db_app, name="db")
app.add_typer(presets_app, name="presets")


def _exit(code: int, lines: list[str]) -> NoReturn:
    startup.fail(PROGRAM, code, lines)


def _settings(settings_class=None):
    """Read ``Settings`` (or ``settings_class``) and the logging settings
    (``PINLOG_LOG_FORMAT``, ``PINLOG_LOG_LEVEL``), then configure logging; or exit 2 with one
    line per problem of either, every problem at once (never a value, never a trace)."""
    from app.settings import ENV_PREFIX, LoggingSettings, Settings, TracingSettings

    return startup.load_settings(
        PROGRAM,
        settings_class or Settings,
        prefix=ENV_PREFIX,
        logging_class=LoggingSettings,
        tracing_class=TracingSettings,
    )


def _run(step: Callable[[], Awaitable[T]]) -> T:
    """Run one async startup step; a known startup problem exits with its one line."""
    from app import preflight

    return startup.run_step(PROGRAM, step, preflight.classify)


async def _check_database(url: str, *, transaction_pooling: bool = False) -> None:
    """Reachable, and migrated (without the vector codec, which needs the extension)."""
    from app import preflight
    from app.repository.db import create_engine

    engine = create_engine(
        url, pool_size=1, with_vector_codec=False, transaction_pooling=transaction_pooling
    )
    try:
        await preflight.check_database(engine, schema=True)
    finally:
        await engine.dispose()


@db_app.command("upgrade")
def db_upgrade(
    migrations_dir: Path | None = typer.Option(
        None, metavar="DIR", help="Directory of ordered *.sql files"
    ),
) -> None:
    """Apply pending ai migrations to PINLOG_DATABASE_URL; a second run applies nothing.

    The core files are the core service's (pinlog-core db upgrade); the worker's role needs
    privileges on the ai schema only (§8). An applied file that changed exits 2. Run as the
    worker's restricted role it checks what exists first: exit 0 when nothing is pending,
    otherwise exit 4 with one line naming the missing privilege.
    """
    from app.settings import MigrationSettings

    database = _settings(MigrationSettings)

    from app.repository.db import MIGRATION_COMMAND_TIMEOUT_SECONDS, create_engine
    from pinlog_platform.contract import schema as migrations

    async def run() -> list[str]:
        engine = create_engine(
            database.database_url,
            with_vector_codec=False,
            transaction_pooling=database.database_transaction_pooling,
            command_timeout_seconds=MIGRATION_COMMAND_TIMEOUT_SECONDS,
        )
        try:
            return await migrations.upgrade(
                engine, scope=migrations.Scope.AI, directory=migrations_dir
            )
        except migrations.MigrationError as exc:
            _exit(exit_codes.CONFIGURATION, [f"migration error: {exc}"])
        except migrations.MigrationPrivilegeError as exc:
            _exit(exit_codes.DATABASE_NOT_READY, [f"migration error: {exc}"])
        finally:
            await engine.dispose()

    applied = _run(run)
    typer.echo(
        f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else "")
    )


@presets_app.command("load")
def presets_load(
    file: Path | None = typer.Option(
        None, "--file", metavar="FILE", help="Preset YAML (default: bundled list)"
    ),
) -> None:
    """Embed the preset list with the current profile and upsert it."""
    from app.settings import ToolSettings

    settings = _settings(ToolSettings)

    from app.metrics import WorkerMetrics
    from app.providers.factory import build_budgets, build_embedding_provider
    from app.providers.usage import StageTagged, attach_budget, attach_usage
    from app.repository.db import create_engine
    from app.service.preset_loader import (
        DEFAULT_PRESET_FILE,
        PRESETS_STAGE,
        PresetFileError,
        PresetListChangedError,
        load_presets,
        read_preset_file,
    )
    from app.service.usage_ledger import UsageLedger

    try:
        preset_file = read_preset_file(file or DEFAULT_PRESET_FILE)
    except PresetFileError as exc:
        _exit(exit_codes.CONFIGURATION, [f"preset file error: {exc}"])

    async def run():
        # The database first: its problems must not be blamed on the provider.
        await _check_database(
            settings.database_url, transaction_pooling=settings.database_transaction_pooling
        )
        engine = create_engine(
            settings.database_url, transaction_pooling=settings.database_transaction_pooling
        )
        embedder = build_embedding_provider(settings)
        # The preset embeddings are paid calls too: in the ledger under stage "presets",
        # written once when the command ends.
        ledger = UsageLedger(
            engine, WorkerMetrics(), settings.prices, flush_seconds=settings.usage_flush_seconds
        )
        attach_usage(embedder, ledger)
        # One process's share of the embedding budget, as a worker's: each wire request,
        # retries included, takes it, and the list is cut by its token budget.
        attach_budget(embedder, build_budgets(settings)["embedding"])
        try:
            return await load_presets(
                engine, StageTagged(embedder, PRESETS_STAGE), preset_file,
                settings.embedding_profile,
            )  # fmt: skip
        finally:
            await ledger.aclose()
            await embedder.aclose()
            await engine.dispose()

    try:
        report = _run(run)
    except PresetListChangedError as exc:
        typer.echo(f"{PROGRAM}: {exc}", err=True)
        raise typer.Exit(1) from None
    state = "updated" if report.changed else "unchanged"
    typer.echo(
        f"presets {state}: {report.presets} presets, list version {report.version}, "
        f"{report.retired} retired"
    )


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", metavar="HOST", help="Interface to bind"),
    port: int = typer.Option(8000, metavar="PORT", help="TCP port", parser=numbers.whole(0, 65535)),
    limit_concurrency: int | None = serve_options.limit_concurrency(ENV_PREFIX),
    max_header_bytes: int | None = serve_options.max_header_bytes(ENV_PREFIX),
    head_timeout: float | None = serve_options.head_timeout(ENV_PREFIX),
    timeout_keep_alive: int | None = serve_options.timeout_keep_alive(ENV_PREFIX),
    proxy_headers: bool = serve_options.proxy_headers(),
    forwarded_allow_ips: str | None = serve_options.forwarded_allow_ips(),
    timeout_graceful_shutdown: int | None = typer.Option(
        None,
        parser=numbers.whole(0, 86400),
        metavar="SECONDS",
        help="Seconds open HTTP connections get to finish on SIGTERM before the worker pool's "
        "own PINLOG_SHUTDOWN_GRACE_SECONDS starts (default: wait for them)",
    ),
    access_log: bool = serve_options.access_log(),
) -> None:
    """Serve the worker in one process (settings from PINLOG_* environment variables).

    Scale with replicas, not with uvicorn workers: each process owns its queue and pool.
    """
    settings = _settings()
    pooling = settings.database_transaction_pooling

    async def check() -> None:
        # What the lifespan needs, checked first so that a problem is one line and an exit
        # code instead of uvicorn's startup traceback.
        from app.repository.db import create_engine
        from app.service.presets import PresetCache

        await _check_database(settings.database_url, transaction_pooling=pooling)
        engine = create_engine(settings.database_url, pool_size=1, transaction_pooling=pooling)
        try:
            await PresetCache(engine, settings.embedding_profile).reload()
        finally:
            await engine.dispose()

    _run(check)

    import uvicorn

    from app.main import create_app
    from pinlog_platform.http.server import uvicorn_options

    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_config=None,
        **uvicorn_options(
            settings,
            limit_concurrency=limit_concurrency,
            max_header_bytes=max_header_bytes,
            head_timeout=head_timeout,
            timeout_keep_alive=timeout_keep_alive,
        ),
        proxy_headers=proxy_headers,
        forwarded_allow_ips=forwarded_allow_ips,
        timeout_graceful_shutdown=timeout_graceful_shutdown,
        access_log=access_log,
    )


DEFAULT_SMOKE_LATENCY_SECONDS = 10.0


@app.command()
def smoke(
    max_latency_seconds: float = typer.Option(
        DEFAULT_SMOKE_LATENCY_SECONDS,
        parser=numbers.decimal_seconds(0, 3600),
        metavar="SECONDS",
        help="Longest acceptable time of each provider call",
    ),
) -> None:
    """One real embedding call and one real judge call against the configured providers
    (a deploy's release step): one line per check; exit 0 when all pass, 5 when a provider
    check fails, 2 for settings. Nothing is written; the database is not contacted."""
    from app.settings import SmokeSettings

    settings = _settings(SmokeSettings)

    from app.metrics import WorkerMetrics
    from app.providers.factory import build_budgets, build_embedding_provider, build_judge
    from app.providers.usage import CollectingSink, attach_budget
    from app.service.smoke import run_smoke

    async def run():
        sink = CollectingSink()
        embedder = build_embedding_provider(settings)
        judge = build_judge(settings, WorkerMetrics())
        for provider in (embedder, getattr(embedder, "inner", None), judge):
            if hasattr(provider, "usage"):
                provider.usage = sink
        # One process's share of each budget, as a worker's: retries take it too.
        budgets = build_budgets(settings)
        attach_budget(embedder, budgets["embedding"])
        attach_budget(judge, budgets["judge"])
        try:
            return await run_smoke(
                embedder,
                judge,
                sink,
                model=settings.embedding_model,
                dimension=settings.embedding_dimension,
                vector_dimension=settings.vector_dimension,
                max_latency_seconds=max_latency_seconds,
            )
        finally:
            await embedder.aclose()
            await judge.aclose()

    report = _run(run)
    for check in report.checks:
        typer.echo(check.line)
    typer.echo(f"smoke: {'passed' if report.passed else 'FAILED'}")
    raise typer.Exit(0 if report.passed else exit_codes.PROVIDER)


@app.command()
def doctor() -> None:
    """Report contract invariant violations in the ai schema, read-only (exit 1 if any).

    Each check prints its count and up to 5 example ids; "info" lines are legal states
    that do not change the exit code. Reads PINLOG_DATABASE_URL, PINLOG_EMBEDDING_PROFILE (or
    PINLOG_OFFLINE), PINLOG_VECTOR_DIMENSION and PINLOG_PROCESSING_EXPIRY_SECONDS; no provider
    keys, no secret.
    """
    from app.repository.db import create_engine
    from app.service.doctor import examine
    from app.settings import DoctorSettings

    settings = _settings(DoctorSettings)

    async def run():
        # Reachable and migrated first: an unmigrated database is told to migrate.
        await _check_database(
            settings.database_url, transaction_pooling=settings.database_transaction_pooling
        )
        engine = create_engine(
            settings.database_url,
            pool_size=1,
            transaction_pooling=settings.database_transaction_pooling,
        )
        try:
            return await examine(
                engine,
                dimension=settings.vector_dimension,
                profile=settings.embedding_profile,
                processing_expiry_seconds=settings.processing_expiry_seconds,
            )
        finally:
            await engine.dispose()

    report = _run(run)
    for warning in report.warnings:
        typer.echo(f"WARNING   {warning}")
    for finding in report.findings:
        examples = f" (e.g. {', '.join(finding.examples)})" if finding.examples else ""
        typer.echo(
            f"{finding.label:<9} {finding.check.name}: {finding.total}{examples}"
            f" - {finding.check.description}"
        )
    typer.echo(f"doctor: {report.violations} violation(s)")
    raise typer.Exit(1 if report.violations else 0)


def _add_plugin_commands(cli: typer.Typer) -> None:
    """Commands other packages register into ``pinlog-ai`` (entry point group
    ``COMMAND_PLUGINS``; ``demo`` from the development-only ``demo`` package). A command whose
    package is not installed (the production image carries no ``demo``) still answers: one
    line and exit 2."""
    for entry in entry_points(group=COMMAND_PLUGINS):
        try:
            register = entry.load()
        except ImportError:
            _add_unavailable(cli, entry.name)
        else:
            register(cli)


def _add_unavailable(cli: typer.Typer, name: str) -> None:
    @cli.command(
        name=name,
        help="Unavailable here: needs a source checkout installed with the local extra.",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    def unavailable() -> None:
        from app.embedded_postgres import MISSING_EXTRA

        typer.echo(f"{name} unavailable: {MISSING_EXTRA}, from a source checkout", err=True)
        raise typer.Exit(2)


_add_plugin_commands(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
