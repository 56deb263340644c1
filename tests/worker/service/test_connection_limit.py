"""Issue 28 #10: a worker whose database role allows fewer connections than it needs. A stage
claimed before the limit bit cannot save (no connection to be had) and is left
``PROCESSING``, a fault not the note's own. Once the limit clears, the next re-request (the
rescan asks every few seconds) takes the stage over at once, fenced by its attempt, instead
of leaving the note ``PROCESSING`` for the processing expiry (``app.service.abandoned_claims``).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.worker.harness import running_worker, worker_settings
from tests.worker.support import arrived, fetch_state, make_state, release

LOGIN = "pinlog_ai_limited_login"
WORKER_ROLE = "pinlog_ai_worker"
NOTE = "조용한 카페, 콘센트 많음"


async def _connection_limit(engine, limit: int) -> None:
    """``ALTER ROLE ... CONNECTION LIMIT`` of the worker's login role (-1: none); with 0 its
    open sessions are ended too, so the next statement must connect anew."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = "
                f"'{LOGIN}') THEN CREATE ROLE {LOGIN} LOGIN IN ROLE {WORKER_ROLE}; END IF; END $$"
            )
        )
        await conn.execute(text(f"ALTER ROLE {LOGIN} CONNECTION LIMIT {int(limit)}"))
        if limit == 0:
            await conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :u"),
                {"u": LOGIN},
            )


async def test_a_stage_left_processing_by_the_limit_is_taken_over_once_it_clears(
    engine, migrated_database, fake_openai, presets, hold
):
    await make_state(engine, context_id=1, user_id=7, record_id=70, core_text=NOTE)
    await _connection_limit(engine, -1)
    url = make_url(migrated_database).set(username=LOGIN).render_as_string(hide_password=False)
    body = {"contextId": 1, "userId": 7, "recordId": 70, "text": NOTE}
    held = hold()
    fake_openai.script_embeddings(held)
    try:
        async with running_worker(worker_settings(url, fake_openai)) as worker:
            assert (await worker.post(body)).status_code == 202
            await arrived(held)  # claimed; the provider call in flight
            await _connection_limit(engine, 0)
            release(held)  # its save finds no connection
            await worker.drain()
            left = await fetch_state(engine, 1)
            await _connection_limit(engine, -1)

            assert (await worker.post(body)).status_code == 202  # the rescan asks again
            await worker.drain()
    finally:
        await _connection_limit(engine, -1)

    assert left == ("PROCESSING", "PENDING")
    # Taken over at once (the expiry is 600 s): embedded and judged.
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
