"""The ``pinlog-core`` command: ``db upgrade``, ``serve``, ``rescan --once``, ``token``,
``status``, ``pause``, ``resume``, ``retry-failed``, ``reprocess keywords``, ``reembed start |
status | cutover | rollback | finish``."""

from __future__ import annotations

import json
import sys
from collections import Counter

import typer

from core_service.settings import ENV_PREFIX
from pinlog_platform.cli import exit_codes, serve_options, startup
from pinlog_platform.cli.version import add_version_option

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None)
db_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Database schema (every migration)."
)
app.add_typer(db_app, name="db")
reprocess_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Judge finished work again after an operational change (docs/operations.md).",
)
app.add_typer(reprocess_app, name="reprocess")
reembed_app = typer.Typer(
    no_args_is_help=True,
    help="Switch the embedding profile side by side (docs/operations.md)",
)
app.add_typer(reembed_app, name="reembed")
reindex_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help='Rebuild derived indexes (docs/operations.md "Search index").',
)
app.add_typer(reindex_app, name="reindex")

PROGRAM = "pinlog-core"
add_version_option(app, PROGRAM, help_text="PinLog core service.")


def _load(settings_class):
    """Read the command's settings and the logging settings (``PINLOG_CORE_LOG_FORMAT``,
    ``PINLOG_CORE_LOG_LEVEL``), then configure logging; or exit 2 with one line per problem of
    either, all at once (never a value, never a trace)."""
    from core_service.settings import ENV_PREFIX, LoggingSettings

    return startup.load_settings(
        PROGRAM, settings_class, prefix=ENV_PREFIX, logging_class=LoggingSettings
    )


def _classify(exc: BaseException) -> startup.StartupProblem | None:
    """A database that cannot be reached is exit 3 with one line; one reached but not usable
    by this role (no schema, a missing privilege, a refused login) is exit 4 (3 for the
    login); anything else is a bug."""
    from core_service.errors import DatabaseFault, UnavailableError
    from pinlog_platform.db.sqlstates import is_transient, sqlstate
    from pinlog_platform.schema import MigrationPrivilegeError

    if isinstance(exc, MigrationPrivilegeError):
        return startup.StartupProblem(exit_codes.DATABASE_NOT_READY, f"migration error: {exc}")
    cause = exc.__cause__ if isinstance(exc, UnavailableError) else exc
    state = sqlstate(cause) if cause is not None else None
    if state is None and isinstance(exc, DatabaseFault):
        state = str(exc).removeprefix("database error ").split(" ")[0]
    if state is not None and state.startswith("28"):
        return startup.StartupProblem(
            exit_codes.DATABASE_UNREACHABLE,
            "database error: the database refused the login (PINLOG_CORE_DATABASE_URL)",
        )
    if state in _NOT_READY_STATES:
        return startup.StartupProblem(exit_codes.DATABASE_NOT_READY, _NOT_READY_STATES[state])
    if isinstance(exc, UnavailableError):
        return startup.StartupProblem(
            exit_codes.DATABASE_UNREACHABLE, "database error: database unavailable"
        )
    if isinstance(exc, OSError) or is_transient(exc):
        return startup.StartupProblem(
            exit_codes.DATABASE_UNREACHABLE,
            f"database error: cannot reach the database ({type(exc).__name__})",
        )
    if isinstance(exc, DatabaseFault):
        return startup.StartupProblem(exit_codes.DATABASE_NOT_READY, f"database error: {exc}")
    return None


_NO_SCHEMA = "database error: the schema is missing: run `pinlog-core db upgrade`"
_NOT_READY_STATES = {
    "42P01": _NO_SCHEMA,
    "3F000": _NO_SCHEMA,
    "3D000": "database error: the database named in PINLOG_CORE_DATABASE_URL does not exist",
    "42501": (
        "database error: the database role lacks privileges on schema core "
        "(run the core as the schema owner or its own role, docs/deployment.md)"
    ),
}


def _run_with_database(step):
    """Run the async ``step``; a database that cannot be reached exits 3 with one line."""
    return startup.run_step(PROGRAM, step, _classify)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply every pending migration (core and ai) to PINLOG_CORE_DATABASE_URL."""
    from core_service.repository.db import create_engine
    from core_service.settings import CoreDatabaseSettings
    from pinlog_platform import schema as migrations

    database = _load(CoreDatabaseSettings)

    async def run() -> list[str]:
        engine = create_engine(
            database.database_url,
            transaction_pooling=database.database_transaction_pooling,
            command_timeout_seconds=None,
        )
        try:
            return await migrations.upgrade(engine, scope=migrations.Scope.ALL)
        finally:
            await engine.dispose()

    try:
        applied = _run_with_database(run)
    except migrations.MigrationError as exc:
        startup.fail(PROGRAM, exit_codes.CONFIGURATION, [f"migration error: {exc}"])
    typer.echo(
        f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else "")
    )


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", metavar="HOST", help="Interface to bind"),
    port: int = typer.Option(8080, metavar="PORT", help="TCP port"),
    no_rescan: bool = typer.Option(False, "--no-rescan", help="Do not run the rescan loop"),
    ops_port: int | None = typer.Option(
        None,
        min=0,
        max=65535,
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
    from core_service.ops import bind_ops_socket
    from core_service.settings import CoreSettings

    settings = _load(CoreSettings)
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
    problem = _run_with_database(lambda: _schema_problem(settings))
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
    ``None``. Driver errors propagate (exit 3 or 4 through ``_classify``)."""
    from sqlalchemy import text

    from core_service.repository.db import autocommit, create_engine

    engine = create_engine(
        settings.database_url,
        pool_size=1,
        transaction_pooling=settings.database_transaction_pooling,
    )
    try:
        async with autocommit(engine) as conn:
            facts = (await conn.execute(text(SCHEMA_FACTS))).one()
    finally:
        await engine.dispose()
    if facts.schemas and not facts.usage:
        return _NOT_READY_STATES["42501"].removeprefix("database error: ")
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
def rescan(once: bool = typer.Option(False, "--once", help="One finalize + rescan pass")) -> None:
    """One finalize + rescan pass; prints its counts."""
    from core_service.composition import (
        build_dispatcher,
        build_scheduler,
        build_worker_endpoints,
    )
    from core_service.metrics import CoreMetrics
    from core_service.repository.db import create_engine
    from core_service.settings import RescanSettings

    if not once:
        raise typer.BadParameter(
            "only --once is supported; `serve` runs the loop", param_hint="--once"
        )
    settings = _load(RescanSettings)

    async def run():
        engine = create_engine(
            settings.database_url,
            pool_size=2,
            transaction_pooling=settings.database_transaction_pooling,
        )
        endpoints = build_worker_endpoints(settings)
        try:
            metrics = CoreMetrics()
            dispatcher = build_dispatcher(settings, engine, endpoints, metrics)
            return await build_scheduler(settings, engine, dispatcher, metrics).run_once()
        finally:
            await endpoints.aclose()
            await engine.dispose()

    report = _run_with_database(run)
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


@app.command()
def token(
    member: int = typer.Option(..., "--member", min=1, metavar="N", help="Member id"),
) -> None:
    """Print a bearer token for member N (created if it does not exist), on one line."""
    from core_service.repository import member as member_repository
    from core_service.repository.db import create_engine, transaction
    from core_service.repository.member import MemberState
    from core_service.service.member_tokens import issue_token
    from core_service.settings import TokenSettings

    settings = _load(TokenSettings)

    async def run() -> MemberState:
        engine = create_engine(
            settings.database_url,
            pool_size=1,
            transaction_pooling=settings.database_transaction_pooling,
        )
        try:
            async with transaction(engine) as conn:
                return await member_repository.ensure(conn, member)
        finally:
            await engine.dispose()

    if _run_with_database(run) is not MemberState.ACTIVE:
        startup.fail(PROGRAM, 1, [f"member {member} has withdrawn; no token issued"])
    typer.echo(
        issue_token(
            member,
            secret=settings.jwt_secret.get_secret_value(),
            ttl_seconds=settings.token_ttl_seconds,
        )
    )


@app.command()
def status(
    as_json: bool = typer.Option(False, "--json", help="One JSON object (docs/operations.md)"),
) -> None:
    """Backlog, lag, coverage, failures and retries of live contexts, the pause state, and
    today's and this month's provider spend."""
    import json

    from core_service.repository.db import create_engine
    from core_service.service.status import read_status
    from core_service.settings import StateClockSettings
    from pinlog_platform.search.terms import ANALYSER_VERSION

    settings = _load(StateClockSettings)

    async def run():
        engine = create_engine(
            settings.database_url,
            pool_size=1,
            transaction_pooling=settings.database_transaction_pooling,
        )
        try:
            return await read_status(
                engine,
                processing_expiry_seconds=settings.processing_expiry_seconds,
                analyser_version=ANALYSER_VERSION,
            )
        finally:
            await engine.dispose()

    report = _run_with_database(run)
    typer.echo(json.dumps(report.as_json()) if as_json else report.as_text())


def _set_pause(paused: bool) -> None:
    from core_service.repository.db import create_engine
    from core_service.service import pause as dispatch_pause
    from core_service.settings import CoreDatabaseSettings

    database = _load(CoreDatabaseSettings)

    async def run() -> bool:
        engine = create_engine(
            database.database_url,
            pool_size=1,
            transaction_pooling=database.database_transaction_pooling,
        )
        try:
            return await dispatch_pause.change(engine, paused=paused)
        finally:
            await engine.dispose()

    stored = _run_with_database(run)
    typer.echo("dispatch paused" if stored else "dispatch running")


@app.command()
def pause() -> None:
    """Stop sending work to the workers (creates and edits still commit); returns once every
    core process acts on it (at most 1.5 s)."""
    _set_pause(True)


@app.command()
def resume() -> None:
    """Send work to the workers again; the backlog drains."""
    _set_pause(False)


_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration_seconds(value: str | None) -> float | None:
    """``30m``, ``24h``, ``7d`` (or ``90s``) in seconds; ``None`` stays ``None``."""
    if value is None:
        return None
    number, unit = value[:-1], value[-1:]
    if not number.isdigit() or unit not in _DURATION or int(number) == 0:
        raise typer.BadParameter("a positive whole number and s, m, h or d, e.g. 24h")
    return float(int(number) * _DURATION[unit])


@app.command("retry-failed")
def retry_failed(
    reason: str | None = typer.Option(
        None, "--reason", metavar="CODE", help="Only this failure reason"
    ),
    since: str | None = typer.Option(
        None,
        "--since",
        metavar="DURATION",
        help="Only failures this recent: 30m, 24h, 7d",
        callback=_duration_seconds,
    ),
    member: int | None = typer.Option(
        None, "--member", min=1, metavar="ID", help="Only this member's"
    ),
    limit: int | None = typer.Option(
        None, "--limit", min=1, metavar="N", help="At most N contexts"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only count; write nothing"),
) -> None:
    """Replace each live context with a FAILED stage by a new one with the same body (a
    fresh budget), dispatched at once; input failures only when --reason names them."""
    from core_service.composition import build_dispatcher, build_worker_endpoints
    from core_service.metrics import CoreMetrics
    from core_service.repository.db import create_engine
    from core_service.service.failed_replacement import FailedReplacer, Selection
    from core_service.settings import RescanSettings, StateClockSettings
    from pinlog_platform.states.failure_reasons import FailureReason

    if reason is not None and reason not in {code.value for code in FailureReason}:
        raise typer.BadParameter(
            "one of " + ", ".join(code.value for code in FailureReason), param_hint="--reason"
        )
    settings = _load(StateClockSettings if dry_run else RescanSettings)
    selection = Selection(reason=reason, member_id=member, since_seconds=since, limit=limit)

    async def run():
        engine = create_engine(
            settings.database_url,
            pool_size=2,
            transaction_pooling=settings.database_transaction_pooling,
        )
        metrics = CoreMetrics()
        if dry_run:
            try:
                return await FailedReplacer(engine, None, metrics).select(selection)
            finally:
                await engine.dispose()
        endpoints = build_worker_endpoints(settings)
        dispatcher = build_dispatcher(settings, engine, endpoints, metrics)
        dispatcher.start()
        try:
            return await FailedReplacer(engine, dispatcher, metrics).replace(selection)
        finally:
            await dispatcher.close(2.0)
            await endpoints.aclose()
            await engine.dispose()

    result = _run_with_database(run)
    if dry_run:
        reasons = Counter(failed.reason for failed in result)
        typer.echo(f"would replace {len(result)} context(s)")
        typer.echo("by reason: " + _counts(reasons))
        return
    for replacement in result.replaced:
        typer.echo(f"{replacement.old_id} -> {replacement.new_id} ({replacement.reason})")
    typer.echo(
        f"replaced {len(result.replaced)} context(s); skipped {result.skipped} changed meanwhile"
    )
    typer.echo("by reason: " + _counts(result.by_reason()))
    typer.echo(
        f"taken by a worker {result.taken}; "
        f"left PENDING for the rescan {len(result.replaced) - result.taken}"
    )


# Exit code of `reprocess keywords` when the workers did not load the current list in time.
WORKERS_NOT_READY = 1


@reprocess_app.command("keywords")
def reprocess_keywords(
    rate: int = typer.Option(
        50, "--rate", min=1, max=10_000, metavar="N", help="Contexts reset per second at most"
    ),
    wait: float = typer.Option(
        120.0,
        "--wait",
        min=0,
        metavar="SECONDS",
        help="How long to wait for every worker to load the current preset list",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only count; change nothing"),
) -> None:
    """Judge again the keywords of every live context judged with an older preset list: wait
    until every worker of PINLOG_CORE_WORKER_BASE_URL reports the current list version, then
    send their keyword stages back to PENDING, N a second, and dispatch them. Reads keep
    showing the previous keywords meanwhile."""
    from core_service.settings import ProfileInUseSettings, RescanSettings

    settings = _load(ProfileInUseSettings if dry_run else RescanSettings)
    from core_service.service.keyword_reprocess import NoUsablePresets, WorkersNotReady

    try:
        if dry_run:
            plan = _run_with_database(lambda: _reprocess_plan(settings))
            typer.echo(
                f"preset list version {plan.version} of profile {plan.profile}: would reset "
                f"{plan.stale} context(s) judged with an older list"
            )
            return
        report = _run_with_database(lambda: _reprocess(settings, rate=rate, wait=wait))
    except NoUsablePresets:
        startup.fail(
            PROGRAM,
            exit_codes.DATABASE_NOT_READY,
            [
                f"no preset is usable under profile {settings.embedding_profile}: run "
                "`pinlog-ai presets load` with that profile first"
            ],
        )
    except WorkersNotReady as exc:
        startup.fail(
            PROGRAM,
            WORKERS_NOT_READY,
            [
                f"not every worker reported preset list version {exc.version} within "
                f"{wait:g} s; nothing was reset. Their last answers:",
                *(f"  {reading.describe()}" for reading in exc.readings),
            ],
        )
    typer.echo(
        f"reset {report.reset} context(s) for preset list version {report.version} in "
        f"{report.seconds:.1f} s: taken by a worker {report.taken}, left for the rescan "
        f"{report.waiting}, skipped {report.skipped} (changed meanwhile)"
    )


async def _reprocess_plan(settings):
    from core_service.repository.db import create_engine
    from core_service.service.keyword_reprocess import KeywordReprocess
    from core_service.service.reembed import profile_in_use

    engine = create_engine(
        settings.database_url,
        pool_size=1,
        transaction_pooling=settings.database_transaction_pooling,
    )
    try:
        profile = await profile_in_use(engine, configured=settings.embedding_profile)
        return await KeywordReprocess(engine, profile=profile).plan()
    finally:
        await engine.dispose()


async def _reprocess(settings, *, rate: int, wait: float):
    """Wait for the workers, then reset and dispatch (``service.keyword_reprocess``) under
    the profile in use, printing what happens."""
    from core_service.composition import build_dispatcher, build_worker_endpoints
    from core_service.metrics import CoreMetrics
    from core_service.repository.db import create_engine
    from core_service.service.keyword_reprocess import KeywordReprocess
    from core_service.service.reembed import profile_in_use
    from core_service.service.worker_readiness import ReadinessReader
    from core_service.service.worker_routing import ProfileRouting

    engine = create_engine(
        settings.database_url,
        pool_size=2,
        transaction_pooling=settings.database_transaction_pooling,
    )
    reader = ReadinessReader(settings.worker_base_urls)
    profile = await profile_in_use(engine, configured=settings.embedding_profile)
    reprocess = KeywordReprocess(engine, profile=profile)
    shown: list[str] = []

    def waiting(version, readings) -> None:
        lines = [reading.describe() for reading in readings]
        if lines != shown:
            shown[:] = lines
            typer.echo(f"waiting for every worker to report preset list version {version}:")
            for line in lines:
                typer.echo(f"  {line}")

    def progress(report) -> None:
        typer.echo(
            f"reset {report.reset}/{report.total} (taken {report.taken}, waiting "
            f"{report.waiting}, skipped {report.skipped}) after {report.seconds:.1f} s"
        )

    try:
        version = await reprocess.wait_for_workers(reader, timeout_seconds=wait, on_wait=waiting)
        plan = await reprocess.plan(version)
        typer.echo(
            f"every worker is on preset list version {version} of profile {plan.profile}; "
            f"{plan.stale} context(s) to judge again, {rate} a second at most"
        )
        metrics = CoreMetrics()
        endpoints = build_worker_endpoints(settings)
        routing = ProfileRouting(endpoints)
        try:
            await routing.refresh_once()
        finally:
            await routing.aclose()
        dispatcher = build_dispatcher(settings, engine, endpoints, metrics)
        dispatcher.start()
        try:
            return await reprocess.run(
                plan,
                dispatcher,
                rate=rate,
                on_progress=progress,
                on_paused=lambda: typer.echo("dispatch paused: waiting for `pinlog-core resume`"),
            )
        finally:
            await dispatcher.close(2.0)
            await endpoints.aclose()
    finally:
        await reader.aclose()
        await engine.dispose()


@reindex_app.command("search")
def reindex_search(
    rate: int = typer.Option(
        200, "--rate", min=1, max=100_000, metavar="N", help="Contexts indexed per second at most"
    ),
) -> None:
    """Write personal search's terms for every live context without terms or with terms of
    another analyser version (core_service/service/search_reindex.py): resumable, safe beside
    running services."""
    from core_service.settings import CoreDatabaseSettings

    settings = _load(CoreDatabaseSettings)
    report = _run_with_database(lambda: _reindex_search(settings, rate=rate))
    typer.echo(
        f"indexed {report.indexed} context(s) in {report.seconds:.1f} s; "
        f"{report.covered} of {report.total} live context(s) indexed"
    )


async def _reindex_search(settings, *, rate: int):
    from core_service.repository.db import create_engine
    from core_service.service.search_reindex import reindex
    from core_service.service.search_terms import SearchAnalyser

    engine = create_engine(
        settings.database_url,
        pool_size=1,
        transaction_pooling=settings.database_transaction_pooling,
    )
    analyser = SearchAnalyser()
    try:
        await analyser.load()
        return await reindex(
            engine, analyser, rate=rate, on_progress=lambda n: typer.echo(f"indexed {n}")
        )
    finally:
        await engine.dispose()


# Exit code of a `reembed` operation refused in the current state.
REEMBED_REFUSED = 1


def _reembed_operation(settings, step, *, readings: bool = False):
    """Run a ``reembed`` operation (``_with_engine``); a refusal ends the command with
    ``REEMBED_REFUSED`` and its reasons on stderr."""
    from core_service.service.reembed import ReembedRefused

    try:
        return _run_with_database(lambda: _with_engine(settings, step, readings=readings))
    except ReembedRefused as exc:
        startup.fail(PROGRAM, REEMBED_REFUSED, [str(exc), *(f"  {d}" for d in exc.details)])


async def _with_engine(settings, step, *, readings: bool = False):
    """Run ``step(engine)`` (or ``step(engine, readings)``) on a small engine."""
    from core_service.repository.db import create_engine
    from core_service.service.worker_readiness import ReadinessReader

    engine = create_engine(
        settings.database_url,
        pool_size=1,
        transaction_pooling=settings.database_transaction_pooling,
    )
    try:
        if not readings:
            return await step(engine)
        reader = ReadinessReader(settings.worker_base_urls)
        try:
            return await step(engine, await reader.read_all())
        finally:
            await reader.aclose()
    finally:
        await engine.dispose()


@reembed_app.command("start")
def reembed_start(
    profile: str = typer.Option(
        ..., "--profile", metavar="PROFILE", help="The embedding profile to switch to"
    ),
    rate: int = typer.Option(
        50, "--rate", min=1, max=10_000, metavar="N", help="Contexts embedded per second at most"
    ),
) -> None:
    """Start embedding every live context under PROFILE beside the profile in use. Workers of
    PROFILE must be listed in PINLOG_CORE_WORKER_BASE_URL and its presets loaded; the core
    processes' backfill loop then runs at N contexts a second. Watch `reembed status`."""
    from core_service.service import reembed
    from core_service.settings import RescanSettings

    settings = _load(RescanSettings)
    row = _reembed_operation(
        settings,
        lambda engine, readings: reembed.start(
            engine, readings, configured=settings.embedding_profile, target=profile, rate=rate
        ),
        readings=True,
    )
    typer.echo(
        f"backfilling profile {row.other_profile} beside {row.profile_in_use} at {rate} "
        "context(s) a second; watch `pinlog-core reembed status`, then `reembed cutover`"
    )


@reembed_app.command("status")
def reembed_status(
    as_json: bool = typer.Option(False, "--json", help="One JSON object (docs/operations.md)"),
) -> None:
    """The switch: profiles, state (idle, backfilling, ready, cut_over), coverage, failures by
    reason, pace and time left; a progress bar when attached to a terminal."""
    from core_service.service import reembed
    from core_service.settings import ProfileInUseSettings

    settings = _load(ProfileInUseSettings)
    report = _run_with_database(
        lambda: _with_engine(
            settings, lambda engine: reembed.status(engine, configured=settings.embedding_profile)
        )
    )
    if as_json:
        typer.echo(json.dumps(report.as_json()))
        return
    typer.echo(f"profile in use: {report.profile_in_use}")
    typer.echo(f"state: {report.state}")
    if report.backfill_profile is not None:
        typer.echo(f"filling profile: {report.backfill_profile}")
        settled = report.done + report.failed_total
        if sys.stdout.isatty():
            typer.echo(_progress_bar(settled, report.total))
        typer.echo(f"done {report.done} of {report.total}, failed {report.failed_total}"
                   + (f" ({_counts(report.failed)})" if report.failed else ""))  # fmt: skip
        eta = "unknown" if report.eta_seconds is None else f"{report.eta_seconds:.0f} s"
        typer.echo(f"pace {report.rate_per_second:.1f}/s (set {report.configured_rate}/s), "
                   f"time left {eta}")  # fmt: skip
    if report.missing_in_use:
        typer.echo(f"live contexts without a vector of the profile in use: {report.missing_in_use}")
    for name, counts in report.vectors.items():
        typer.echo(f"vectors of {name}: {counts['live']} live, {counts['hidden']} hidden")


def _progress_bar(done: int, total: int, width: int = 40) -> str:
    share = 1.0 if total == 0 else min(done / total, 1.0)
    filled = int(share * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {share * 100:5.1f}%"


@reembed_app.command("cutover")
def reembed_cutover(
    force: bool = typer.Option(False, "--force", help="Cut over before the backfill is done"),
    wait: float = typer.Option(
        120.0,
        "--wait",
        min=0,
        metavar="SECONDS",
        help="How long to wait for the workers of the new profile before re-judging",
    ),
) -> None:
    """Make the target profile the one in use (search, judgments, new work), then judge every
    context's keywords again under its presets (reads keep the previous keywords meanwhile).
    Refused until every live context has a vector of it or a failed backfill."""
    from core_service.service import reembed
    from core_service.settings import RescanSettings

    settings = _load(RescanSettings)
    row = _reembed_operation(
        settings,
        lambda engine, readings: reembed.cut_over(
            engine, readings, configured=settings.embedding_profile, force=force
        ),
        readings=True,
    )
    typer.echo(f"profile in use: {row.profile_in_use} (was {row.other_profile}); "
               f"{row.other_profile} is kept complete until `reembed finish`")  # fmt: skip
    _rejudge_after_switch(settings, rate=row.rate_per_second, wait=wait)


@reembed_app.command("rollback")
def reembed_rollback(
    wait: float = typer.Option(
        120.0,
        "--wait",
        min=0,
        metavar="SECONDS",
        help="How long to wait for the workers of the old profile before re-judging",
    ),
) -> None:
    """Go back to the profile in use before the switch (any time before `reembed finish`);
    judgments made under the abandoned profile are made again."""
    from core_service.service import reembed
    from core_service.settings import RescanSettings

    settings = _load(RescanSettings)
    row = _reembed_operation(settings, reembed.roll_back)
    typer.echo(f"profile in use: {row.profile_in_use}; {row.other_profile} abandoned "
               "(its vectors are removed by `reembed finish`)")  # fmt: skip
    _rejudge_after_switch(settings, rate=row.rate_per_second, wait=wait)


def _rejudge_after_switch(settings, *, rate: int, wait: float) -> None:
    """Once every core process acts on the new profile, judge again every judgment made
    under another one (`reprocess keywords`' path)."""
    import time

    from core_service.service.keyword_reprocess import NoUsablePresets, WorkersNotReady
    from core_service.service.profile_in_use import PROPAGATION_SECONDS

    typer.echo(f"waiting {PROPAGATION_SECONDS:g} s for every core process to use it")
    time.sleep(PROPAGATION_SECONDS)
    deadline = time.monotonic() + wait
    try:
        while True:
            report = _run_with_database(lambda: _reprocess(settings, rate=rate, wait=wait))
            # Notes judged under the previous profile while the change spread, or waiting for
            # their vector of the new one, are judged again once they have it.
            left = _run_with_database(lambda: _judgments_left(settings))
            if left == (0, 0) or time.monotonic() >= deadline:
                break
            typer.echo(f"{left[0]} judgment(s) of another profile, {left[1]} note(s) still "
                       "without a vector of the profile in use; judging again in 5 s")  # fmt: skip
            time.sleep(5.0)
    except (NoUsablePresets, WorkersNotReady) as exc:
        startup.fail(
            PROGRAM,
            REEMBED_REFUSED,
            [
                f"keywords not judged again yet ({type(exc).__name__}); run "
                "`pinlog-core reprocess keywords` once the workers of the profile are ready"
            ],
        )
    typer.echo(f"judged again: {report.reset} context(s) reset, {report.taken} taken by a worker")


async def _judgments_left(settings) -> tuple[int, int]:
    """Stale judgments under the profile in use, and completed notes without its vector."""
    from core_service.service import reembed
    from core_service.service.keyword_reprocess import KeywordReprocess

    async def count(engine):
        status = await reembed.status(engine, configured=settings.embedding_profile)
        plan = await KeywordReprocess(engine, profile=status.profile_in_use).plan()
        return plan.stale, status.missing_in_use

    return await _with_engine(settings, count)


@reembed_app.command("finish")
def reembed_finish(
    keep_old: bool = typer.Option(
        False, "--keep-old", help="End the switch but keep the other profiles' vectors"
    ),
) -> None:
    """End the switch: remove the other profiles' context vectors, backfill rows and preset
    vectors in batches (kept with --keep-old). Refused while backfilling."""
    from core_service.service import reembed
    from core_service.settings import ProfileInUseSettings

    settings = _load(ProfileInUseSettings)

    def progress(removed: int) -> None:
        typer.echo(f"removed {removed} row(s)")

    row, removed = _reembed_operation(
        settings, lambda engine: reembed.finish(engine, keep_old=keep_old, on_progress=progress)
    )
    kept = " (other profiles' vectors kept)" if keep_old else f"; removed {removed} row(s)"
    typer.echo(f"switch finished: profile in use {row.profile_in_use}{kept}")


def _counts(counts) -> str:
    return " ".join(f"{key}={n}" for key, n in sorted(counts.items())) or "none"


def main() -> None:
    app()


if __name__ == "__main__":
    main()
