"""A re-embedding backfill of N notes via the provider's Batch API against the fake provider
(docs/operations.md "Backfill via the Batch API"): submitted, completed, saved, wall time.

    .venv/bin/python -m bench.batch_backfill [--contexts 10000] [--poll-seconds 0.2]

Fills N live notes (one member, a record each, both stages ``COMPLETED`` with a vector of the
old profile), loads the bundled presets under the new profile, runs a real worker (uvicorn, the
real app) whose embedding provider is ``tests/fake_openai.py`` with its Batch API, starts the
switch with ``reembed.start(via="batch")`` and sends the marked rows as the command does
(``ReembedBackfill.send_by_batch``: 256 notes a request, one provider batch each), then waits
until every batch is settled. The fake moves a batch one status per poll (validating,
in_progress, finalizing, completed), so the wall time is the workers' and the database's, not
a provider's 24 hours. Prints figures; asserts nothing.

Uses ``PINLOG_DATABASE_URL`` (an empty database) when set, else an embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from app import embedded_postgres
from app.repository.db import create_engine
from core_service.metrics import CoreMetrics
from core_service.operations import reembed
from core_service.repository import embedding_switch, provider_batches
from core_service.repository.db import autocommit
from core_service.service.pause import PauseSwitch
from core_service.service.reembed_backfill import ReembedBackfill
from core_service.service.worker_endpoints import WorkerEndpoints
from core_service.service.worker_readiness import ReadinessReader
from core_service.service.worker_routing import ProfileRouting
from pinlog_platform.contract.schema import runner
from tests.fake_openai import FakeOpenAI
from tests.worker.harness import (
    PROFILE,
    SECRET,
    embed_bundled_presets,
    running_worker,
    worker_settings,
)

OLD_PROFILE = "local-use-multilingual-v3-512-cosine-v1"
DIMENSION = 1536

FILL_MEMBER = text("INSERT INTO core.member (id) VALUES (1) ON CONFLICT DO NOTHING")
FILL_PLACES = text(
    """
    INSERT INTO core.place (external_place_id, name)
    SELECT 'bench-' || g, 'place ' || g FROM generate_series(1, CAST(:n AS int)) AS g
    """
)
FILL_RECORDS = text("INSERT INTO core.record (member_id, place_id) SELECT 1, id FROM core.place")
FILL_CONTEXTS = text(
    """
    INSERT INTO core.context (record_id, member_id, body)
    SELECT id, 1, '창가 자리가 조용한 카페, 노트북 작업하기 좋음 ' || id FROM core.record
    """
)
FILL_STATES = text(
    """
    INSERT INTO ai.context_ai_state (context_id, embedding_status, keyword_status, user_id,
                                     record_id, text_sha256, text_sha256_from_core)
    SELECT id, 'COMPLETED', 'COMPLETED', member_id, record_id,
           sha256(convert_to(normalize(body, NFC), 'UTF8')), true
    FROM core.context
    """
)
FILL_VECTORS = text(
    """
    INSERT INTO ai.context_embedding (context_id, user_id, record_id, embedding,
                                      embedding_profile)
    SELECT id, member_id, record_id, CAST('[1' || repeat(',0', 511) || ']' AS vector),
           :profile
    FROM core.context
    """
)
SAVED = text(
    """
    SELECT count(*) FILTER (WHERE status = 'COMPLETED') AS completed,
           count(*) FILTER (WHERE status = 'FAILED') AS failed,
           count(*) FILTER (WHERE status IN ('PENDING', 'PROCESSING')) AS open
    FROM ai.context_embedding_backfill WHERE embedding_profile = :profile
    """
)
VECTORS = text("SELECT count(*) FROM ai.context_embedding WHERE embedding_profile = :profile")


async def run(contexts: int, poll_seconds: float) -> None:
    database_url = os.environ.get("PINLOG_DATABASE_URL") or embedded_postgres.start(
        Path(tempfile.mkdtemp(prefix="pinlog-bench-batch-")) / "pg", delete_on_exit=True
    )
    # The schema first (the vector type comes with it), then an engine with the vector codec.
    admin = create_engine(database_url, pool_size=1, with_vector_codec=False)
    await runner.upgrade(admin)
    await admin.dispose()
    engine = create_engine(database_url, pool_size=4)
    started = time.perf_counter()
    async with engine.begin() as conn:
        for statement in (FILL_MEMBER, FILL_PLACES, FILL_RECORDS, FILL_CONTEXTS, FILL_STATES):
            await conn.execute(statement, {"n": contexts})
        await conn.execute(FILL_VECTORS, {"profile": OLD_PROFILE})
    print(f"filled {contexts} notes in {time.perf_counter() - started:.1f} s")

    with FakeOpenAI(dimension=DIMENSION) as fake:
        settings = worker_settings(
            database_url, fake, embedding_batch_api=True, batch_poll_seconds=poll_seconds
        )
        await embed_bundled_presets(engine, settings, fake)
        async with running_worker(settings) as worker:
            base_url = str(worker.client.base_url)
            reader = ReadinessReader([base_url])
            readings = await reader.read_all()
            await reader.aclose()
            began = time.perf_counter()
            await reembed.start(
                engine, readings, configured=OLD_PROFILE, target=PROFILE, rate=50, via="batch"
            )
            marked = time.perf_counter()
            endpoints = WorkerEndpoints.connect(
                [base_url], internal_secret=SECRET, connect_timeout_seconds=5.0,
                read_timeout_seconds=60.0,
            )  # fmt: skip
            routing = ProfileRouting(endpoints)
            await routing.refresh_once()
            loop = ReembedBackfill(
                engine, endpoints, PauseSwitch(engine), CoreMetrics(),
                configured_profile=OLD_PROFILE, resend_seconds=600, expiry_seconds=600,
            )  # fmt: skip
            while await loop.send_by_batch():
                pass
            submitted = time.perf_counter()
            while True:
                async with autocommit(engine) as conn:
                    counts = await provider_batches.counts(conn, profile=PROFILE)
                    open_rows = await embedding_switch.open_via_batch(conn, profile=PROFILE)
                if counts.in_progress == 0 and open_rows == 0:
                    break
                await asyncio.sleep(0.1)
            done = time.perf_counter()
            stop = asyncio.Event()
            stop.set()
            await routing.run_forever(stop)
            await endpoints.aclose()
            polls = fake.batches.polls
    async with engine.connect() as conn:
        saved = (await conn.execute(SAVED, {"profile": PROFILE})).one()
        vectors = (await conn.execute(VECTORS, {"profile": PROFILE})).scalar_one()
    await engine.dispose()
    print(f"marked (reembed start --via batch): {marked - began:.2f} s")
    print(f"submitted: {counts.submitted} batch(es) of up to 256 notes in "
          f"{submitted - marked:.2f} s")  # fmt: skip
    print(f"completed: {counts.completed} batch(es), failed {counts.failed}; "
          f"provider polls {polls}")  # fmt: skip
    print(f"saved: {saved.completed} of {contexts} notes COMPLETED ({vectors} vectors of "
          f"{PROFILE}), {saved.failed} failed, {saved.open} open")  # fmt: skip
    print(f"wall time: {done - began:.2f} s from start to every note saved, "
          f"{done - submitted:.2f} s of it after the last submission "
          f"(poll interval {poll_seconds:g} s)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, default=10_000)
    parser.add_argument("--poll-seconds", type=float, default=0.2)
    args = parser.parse_args()
    asyncio.run(run(args.contexts, args.poll_seconds))


if __name__ == "__main__":
    main()
