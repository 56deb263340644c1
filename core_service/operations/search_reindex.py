"""``pinlog-core reindex search`` (docs/operations.md "Search index"): write the search terms
of every live context that has none, or terms of another analyser version, at most ``rate``
contexts a second, in id order, one short transaction per batch; then sweep the index for the
rows of contexts no longer live (deleted, replaced, on a deleted record, of a withdrawn
member), a page of documents per statement.

Safe beside running services and resumable: a context's body never changes, so its terms are
right whenever they are written, and a batch writes only contexts still live at their lock (a
delete or an edit of one waits for the batch, or committed first and the context is skipped);
creates and edits write their own terms in the statement that writes the context, and every
statement that makes a context non-live purges its rows; two runs at once serialise on each
context's document row; a context never becomes live again, so the sweep's deletes are always
right. Stopped at any point, the next run starts again from the contexts still missing and
sweeps the whole index again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import typer
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.command_startup import load, run_operation
from core_service.composition import Operations
from core_service.repository import context_search
from core_service.repository.db import autocommit, transaction
from core_service.service.search_terms import SearchAnalyser
from pinlog_platform.cli import numbers

logger = logging.getLogger(__name__)

BATCH = 100
# Documents the sweep reads per statement (primary key order; an index range scan).
SWEEP_PAGE = 1000


@dataclass(frozen=True, slots=True)
class ReindexReport:
    """``indexed`` contexts written and ``purged`` documents of non-live contexts deleted, in
    ``seconds``; ``(covered, total)`` live contexts after."""

    indexed: int
    seconds: float
    covered: int
    total: int
    purged: int = 0


async def reindex(
    engine: AsyncEngine,
    analyser: SearchAnalyser,
    *,
    rate: int,
    batch: int = BATCH,
    on_progress: Callable[[int], None] | None = None,
    sweep_page: int = SWEEP_PAGE,
) -> ReindexReport:
    """Index every live context not indexed under ``analyser.version``, ``rate`` contexts a
    second at most (> 0), then purge the rows of non-live contexts (``sweep``). Database faults
    raise as the core's errors (``UnavailableError``)."""
    started = time.monotonic()
    batch = max(1, min(batch, rate))
    after_id, indexed = 0, 0
    while True:
        batch_started = time.monotonic()
        async with autocommit(engine) as conn:
            pending = await context_search.contexts_to_index(
                conn, after_id=after_id, analyser_version=analyser.version, batch=batch
            )
        if not pending:
            break
        terms = {item.context_id: await analyser.terms(item.body) for item in pending}
        async with transaction(engine) as conn:
            indexed += await context_search.replace_terms(
                conn, terms=terms, analyser_version=analyser.version
            )
        after_id = pending[-1].context_id
        if on_progress is not None:
            on_progress(indexed)
        # The pace: this batch's share of a second at `rate`, less the time it took.
        await asyncio.sleep(max(0.0, len(pending) / rate - (time.monotonic() - batch_started)))
    # After the writes: a document a batch inserted while a delete of its context waited for
    # the batch is out of that delete's snapshot (context_search.PURGED_SEARCH_TERMS).
    purged = await sweep(engine, page=sweep_page)
    async with autocommit(engine) as conn:
        covered, total = await context_search.index_coverage(
            conn, analyser_version=analyser.version
        )
    logger.info(
        "search index: %d context(s) indexed, %d non-live purged; %d of %d live",
        indexed,
        purged,
        covered,
        total,
    )
    return ReindexReport(indexed, time.monotonic() - started, covered, total, purged)


async def sweep(engine: AsyncEngine, *, page: int = SWEEP_PAGE) -> int:
    """Delete the index rows of every context no longer live, ``page`` documents read per
    autocommit statement, in id order; how many documents were deleted."""
    after_id, purged = 0, 0
    while True:
        async with autocommit(engine) as conn:
            last_id, removed = await context_search.purge_stale(conn, after_id=after_id, page=page)
        purged += removed
        if last_id is None:
            return purged
        after_id = last_id


commands = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help='Rebuild derived indexes (docs/operations.md "Search index").',
)


async def reindex_search(operations: Operations, *, rate: int) -> ReindexReport:
    """``reindex`` every live context not indexed under the analyser's version. The analyser's
    model (seconds of CPU) loads with the first context to index, so a run that finds nothing
    to do never loads it."""
    analyser = SearchAnalyser()
    return await reindex(
        operations.engine, analyser, rate=rate, on_progress=lambda n: typer.echo(f"indexed {n}")
    )


@commands.command("search")
def search(
    rate: int = typer.Option(
        200,
        "--rate",
        parser=numbers.whole(1, 100_000),
        metavar="N",
        help="Contexts indexed per second at most",
    ),
) -> None:
    """Write personal search's terms for every live context without terms or with terms of
    another analyser version, then purge the terms of contexts no longer live: resumable,
    safe beside running services."""
    from core_service.settings import CoreDatabaseSettings

    report = run_operation(load(CoreDatabaseSettings), lambda ops: reindex_search(ops, rate=rate))
    typer.echo(
        f"indexed {report.indexed} context(s) in {report.seconds:.1f} s; "
        f"purged {report.purged} non-live; "
        f"{report.covered} of {report.total} live context(s) indexed"
    )
