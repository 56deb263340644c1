"""``pinlog-ai demo`` (the README's ``make run``; ``make run-operations`` with ``--operations``),
registered into the worker's CLI from here (the ``pinlog_ai.commands`` entry point of
pyproject.toml), so the product's ``app/cli.py`` never imports the demo.

``run_demo`` runs the parts of ``demo.run`` in order. With ``--operations``
(``demo.operations``) the run happens in a database of its own, a second worker of the
hashing profile serves beside the first from the start, and after the table the two operations
of docs/operations.md follow: a preset reclassification and an embedding-profile switch to the
hashing profile.

Development only: needs a source checkout installed with the local extra (``make run``); the
command exits 2 without (``app/cli.py`` answers for it where this package is not installed).
Heavy modules are imported inside the command: every ``pinlog-ai`` command loads this module.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from pathlib import Path

import typer

from pinlog_platform.cli import numbers


def register(cli: typer.Typer) -> None:
    """Add ``demo`` to ``cli`` (the ``pinlog_ai.commands`` entry point)."""
    cli.command(name="demo")(demo)


def demo(
    port: int = typer.Option(
        8765,
        metavar="PORT",
        help="Worker's preferred port; a free one if taken",
        parser=numbers.whole(0, 65535),
    ),
    core_port: int = typer.Option(
        8766,
        metavar="PORT",
        help="Core service's preferred port; a free one if taken",
        parser=numbers.whole(0, 65535),
    ),
    serve_after: bool = typer.Option(True, "--serve/--no-serve", help="Keep serving"),
    data_dir: Path = typer.Option(
        Path(".pgdata"), metavar="DIR", help="Embedded PostgreSQL data directory"
    ),
    operations: bool = typer.Option(
        False,
        "--operations",
        help="After the table, reclassify the presets and switch the embedding profile to the "
        "hashing encoder (docs/operations.md), in a database of its own",
    ),
) -> None:
    """Offline end-to-end run of both services on sample notes (see README).

    Development only: needs a source checkout installed with the local extra (make run);
    exits 2 without."""
    from app.embedded_postgres import EmbeddedPostgresUnavailable
    from pinlog_platform import logging as log_output

    # Readable text at WARNING, so the demo's table stays legible.
    log_output.configure("text", "WARNING")
    try:
        code = asyncio.run(
            run_demo(
                port=port,
                core_port=core_port,
                serve=serve_after,
                data_dir=data_dir.resolve(),
                operations=operations,
            )
        )
    except (KeyboardInterrupt, asyncio.CancelledError):
        code = 0
    except EmbeddedPostgresUnavailable as exc:
        typer.echo(f"demo unavailable: {exc}", err=True)
        code = 2
    raise typer.Exit(code)


async def run_demo(
    *, port: int, core_port: int, serve: bool, data_dir: Path, operations: bool = False
) -> int:
    """Run the demo; returns a process exit code (0 when every live context completed, and
    with ``operations`` both operations ended as they should)."""
    from app import embedded_postgres
    from app.settings import DatabaseSettings
    from demo import operations as ops
    from demo.feed import load_samples, member_tokens
    from demo.report import render_results
    from demo.run import (
        both_services,
        feed_and_report,
        offline_settings,
        prepare_database,
        say_now,
    )

    started = time.monotonic()
    _stop_on_first_interrupt()
    given = DatabaseSettings()
    database_url = given.database_url
    if database_url is None:
        say_now(f"database: starting embedded PostgreSQL in {data_dir} ...")
        database_url = embedded_postgres.start(data_dir)
        say_now(f"database: ready ({time.monotonic() - started:.1f} s)")
        if operations:
            database_url = await ops.fresh_database(database_url)
            say_now(f"database: {ops.OPERATIONS_DATABASE}, made afresh for --operations")
    else:
        say_now("database: PINLOG_DATABASE_URL")
    secret = given.internal_secret.get_secret_value() if given.internal_secret else None
    settings = offline_settings(
        database_url, secret, **(ops.WORKER_OVERRIDES if operations else {})
    )
    await prepare_database(settings, say=say_now)
    second = None
    if operations:
        if problem := await ops.refusal(settings):
            print(problem)
            return 2
        second = await ops.prepare_second_worker(settings, say=say_now)

    jwt_secret = secrets.token_urlsafe(32)
    async with both_services(
        settings,
        worker_port=port,
        core_port=core_port,
        jwt_secret=jwt_secret,
        second_worker=second,
        second_worker_port=port + 2 if port else 0,
    ) as services:
        workers = f"worker on {services.worker_url}"
        if services.second_worker is not None:
            workers = f"workers on {services.worker_url} and {services.second_worker.url}"
        say_now(f"services: {workers}, core service on {services.core_url}")
        outcome, results, views = await feed_and_report(services, say=say_now)
        print()
        print(render_results(results))
        print()
        for line in (*outcome.events, *views):
            print(line)
        live = [r for r in results if r.fate == "live"]
        completed = sum(r.embedding_status == r.keyword_status == "COMPLETED" for r in live)
        cancelled = sum(
            r.embedding_status == r.keyword_status == "CANCELLED" for r in results if r not in live
        )
        print(
            f"\n{len(results)} contexts: {len(live)} live ({completed} COMPLETED in both "
            f"stages, {sum(bool(r.keywords) for r in live)} with at least one keyword), "
            f"{len(results) - len(live)} replaced or deleted ({cancelled} CANCELLED); "
            f"{time.monotonic() - started:.1f} s from start to this table."
        )
        operated = True
        if second is not None:
            print()
            operated = await ops.run_operations(
                services, settings, second, [line for line in outcome.lines if line.live],
                jwt_secret=jwt_secret, say=say_now,
            )  # fmt: skip
        if serve:
            members = {sample.user_id for sample in load_samples()}
            tokens = await member_tokens(database_url, jwt_secret, members)
            worker = services.worker
            if worker.stopped and services.second_worker is not None:
                worker = services.second_worker  # the profile in use after the switch
            print(f"\ncore service on {services.core_url}, worker on {worker.url}")
            print(f"database: {database_url}")
            for member_id in sorted(members):
                # Valid for this run only: its signing key is a throwaway secret.
                print(f"TOKEN='{tokens[member_id]}'  # member {member_id}")
            # The run's signing key, so that `pinlog-core token` makes tokens it accepts.
            print(
                f"PINLOG_CORE_DATABASE_URL='{database_url}' "
                f"PINLOG_CORE_JWT_SECRET='{jwt_secret}' .venv/bin/pinlog-core token --member 5"
            )
            if secret is None:
                # A throwaway development secret, so the worker's API can be tried by hand.
                secret_value = settings.internal_secret.get_secret_value()
                print(f"SECRET='{secret_value}'  # the worker's X-Internal-Secret")
            print("serving until Ctrl-C", flush=True)
            await services.closed()
    return 0 if completed == len(live) and operated else 1


def _stop_on_first_interrupt() -> None:
    """Ctrl-C (or SIGTERM) stops the demo once: the first cancels the run (its servers stop
    gracefully and the database as at the end), later ones are ignored while that happens, so
    no traceback of a half-finished shutdown is printed. Replaces asyncio's own handler, whose
    second Ctrl-C raises ``KeyboardInterrupt`` wherever the shutdown happens to be; the demo's
    servers capture no signal (``demo.run``)."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None

    def interrupted() -> None:
        for received in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(received)
            signal.signal(received, signal.SIG_IGN)
        print("\nstopping ...", flush=True)
        main.cancel()

    for received in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(received, interrupted)
