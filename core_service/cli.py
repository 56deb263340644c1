"""The ``pinlog-core`` command: ``db upgrade``, ``serve`` and ``rescan --once`` here; the
operator commands (``token``, ``status``, ``inspect``, ``pause``, ``resume``, ``retry-failed``,
``reprocess keywords``, ``reembed start | status | cutover | rollback | finish``) each in its
module of ``core_service/operations/``, registered below."""

from __future__ import annotations

import sys

import typer

from core_service.command_startup import (
    NOT_READY_STATES,
    PROGRAM,
    load,
    run_operation,
    run_with_database,
)
from core_service.operations import (
    inspect,
    keyword_reprocess,
    pause,
    reembed,
    retry_failed,
    search_reindex,
    status,
    tokens,
)
from core_service.settings import ENV_PREFIX
from pinlog_platform.cli import exit_codes, numbers, serve_options, startup
from pinlog_platform.cli.version import add_version_option

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None)
db_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Database schema (every migration)."
)
app.add_typer(db_app, name="db")
app.add_typer(tokens.commands)
app.add_typer(status.commands)
app.add_typer(pause.commands)
app.add_typer(retry_failed.commands)
app.add_typer(inspect.commands)
app.add_typer(keyword_reprocess.commands, name="reprocess")
app.add_typer(reembed.commands, name="reembed")
app.add_typer(search_reindex.commands, name="reindex")

add_version_option(app, PROGRAM, help_text="PinLog core service.")


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply every pending migration (core and ai) to PINLOG_CORE_DATABASE_URL."""
    from core_service.composition import command_engine
    from core_service.settings import CoreDatabaseSettings
    from pinlog_platform.contract import schema as migrations

    database = load(CoreDatabaseSettings)

    async def run() -> list[str]:
        engine = command_engine(database, command_timeout_seconds=None)
        try:
            return await migrations.upgrade(engine, scope=migrations.Scope.ALL)
        finally:
            await engine.dispose()

    try:
        applied = run_with_database(run)
    except migrations.MigrationError as exc:
        startup.fail(PROGRAM, exit_codes.CONFIGURATION, [f"migration error: {exc}"])
    typer.echo(
        f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else "")
    )


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", metavar="HOST", help="Interface to bind"),
    port: int = typer.Option(8080, metavar="PORT", help="TCP port", parser=numbers.whole(0, 65535)),
    no_rescan: bool = typer.Option(False, "--no-rescan", help="Do not run the rescan loop"),
    ops_port: int | None = typer.Option(
        None,
        parser=numbers.whole(0, 65535),
        metavar="PORT",
        help="Port of the operations listener (/metrics, detailed /readyz); overrides "
        "PINLOG_CORE_OPS_PORT; none when neither is set",
    ),
    ops_host: str | None = typer.Option(
        None,
        metavar="HOST",
        help="Interface of the operations listener (default PINLOG_CORE_OPS_HOST, loopback)",
    ),
    proxy_headers: bool = serve_options.proxy_headers(),
    forwarded_allow_ips: str | None = serve_options.forwarded_allow_ips(),
    limit_concurrency: int | None = serve_options.limit_concurrency(ENV_PREFIX),
    max_header_bytes: int | None = serve_options.max_header_bytes(ENV_PREFIX),
    head_timeout: float | None = serve_options.head_timeout(ENV_PREFIX),
    timeout_keep_alive: int | None = serve_options.timeout_keep_alive(ENV_PREFIX),
    access_log: bool = serve_options.access_log(),
) -> None:
    """Serve the client API and run the rescan loop (settings from PINLOG_CORE_*).

    Checks the database first: unreachable exits 3, reachable without the schema exits 4, each
    with one line (a database that goes away later is readiness, not an exit).
    """
    import uvicorn

    from core_service.main import create_app
    from core_service.operations_listener import bind_ops_socket
    from core_service.settings import CoreSettings

    settings = load(CoreSettings)
    overrides = {"ops_port": ops_port, "ops_host": ops_host}
    settings = settings.model_copy(update={k: v for k, v in overrides.items() if v is not None})
    ops_socket = None
    if settings.ops_port is not None:
        # Bound before anything starts, so a port in use is one line and exit 2.
        try:
            ops_socket = bind_ops_socket(settings.ops_host, settings.ops_port)
        except OSError as exc:
            startup.fail(
                PROGRAM,
                exit_codes.CONFIGURATION,
                [
                    "configuration error: PINLOG_CORE_OPS_PORT (--ops-port): cannot listen on "
                    f"{settings.ops_host}:{settings.ops_port} ({exc.strerror or exc})"
                ],
            )
    problem = run_with_database(lambda: _schema_problem(settings))
    if problem is not None:
        startup.fail(PROGRAM, exit_codes.DATABASE_NOT_READY, [f"database error: {problem}"])
    from pinlog_platform.http.server import uvicorn_options

    uvicorn.run(
        create_app(settings, run_rescan_loop=not no_rescan, ops_socket=ops_socket),
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
        access_log=access_log,
    )


async def _schema_problem(settings) -> str | None:
    """Connect once: what keeps ``serve`` from working (no schema, no privileges on it), or
    ``None``. Driver errors propagate (exit 3 or 4 through ``command_startup.classify``)."""
    from sqlalchemy import text

    from core_service.composition import command_engine
    from core_service.repository.db import autocommit

    engine = command_engine(settings, pool_size=1)
    try:
        async with autocommit(engine) as conn:
            facts = (await conn.execute(text(SCHEMA_FACTS))).one()
    finally:
        await engine.dispose()
    if facts.schemas and not facts.usage:
        return NOT_READY_STATES["42501"].removeprefix("database error: ")
    if not facts.tables:
        return "the schema is missing: run `pinlog-core db upgrade`"
    return None


# What ``serve`` needs (migrated by ``pinlog-core db upgrade``), and whether this role may use
# it (without USAGE a table lookup reads as missing).
SCHEMA_FACTS = (
    "SELECT to_regnamespace('core') IS NOT NULL AND to_regnamespace('ai') IS NOT NULL "
    "AS schemas, "
    "CASE WHEN to_regnamespace('core') IS NULL THEN false "
    "ELSE has_schema_privilege('core', 'USAGE') END AS usage, "
    "to_regclass('core.context') IS NOT NULL AND to_regclass('ai.context_ai_state') IS NOT NULL "
    "AS tables"
)


@app.command()
def rescan(
    once: bool = typer.Option(
        False, "--once", help="One finalize + rescan pass and one re-embedding backfill pass"
    ),
) -> None:
    """One finalize + rescan pass and, while a profile switch is under way, one backfill pass
    (docs/operations.md "Loops by mode"); prints their counts."""
    from core_service.composition import (
        Operations,
        build_backfill,
        build_dispatcher,
        build_scheduler,
    )
    from core_service.service.pause import PauseSwitch
    from core_service.settings import RescanSettings

    if not once:
        raise typer.BadParameter(
            "only --once is supported; `serve` runs the loop", param_hint="--once"
        )

    async def run(ops: Operations):
        # The pass's own dispatches only: no retry loop runs, so nothing outlives the pass.
        dispatcher = build_dispatcher(ops.settings, ops.engine, ops.endpoints(), ops.metrics)
        report = await build_scheduler(ops.settings, ops.engine, dispatcher, ops.metrics).run_once()
        await ops.refresh_routing()  # profiles and body limits, for the batch
        pause = PauseSwitch(ops.engine, ops.metrics)
        backfill = build_backfill(ops.settings, ops.engine, ops.endpoints(), pause, ops.metrics)
        await backfill.run_once()
        return report, backfill.results

    report, backfilled = run_operation(load(RescanSettings), run)
    if report.paused:
        typer.echo("dispatch paused (pinlog-core resume): nothing finalized or claimed")
    typer.echo(
        f"closed {report.blocked_closed} blocked keyword stage(s), finalized {report.finalized}, "
        f"claimed {report.claimed}, dispatched {report.dispatched}, "
        f"dispatch failed {report.dispatch_failed}, skipped deleted {report.skipped_deleted}, "
        f"skipped missing {report.skipped_missing}"
    )
    # What this pass itself finalized, by the reason code it wrote; totals of the
    # whole table are `status`'s.
    typer.echo(
        "finalized by reason: "
        + " ".join(f"{reason}={count}" for reason, count in report.finalized_by_reason.items())
    )
    typer.echo(
        "backfill: "
        + (" ".join(f"{result}={count}" for result, count in sorted(backfilled.items()))
           or "nothing sent")
    )  # fmt: skip


def main() -> None:
    sys.argv[1:] = keyword_reprocess.results_wait_spelling(sys.argv[1:])
    app()


if __name__ == "__main__":
    main()
