"""FC-02 with a real signal: SIGTERM to a ``pinlog-ai serve`` process with judgments in flight."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys

import httpx

from tests.worker.harness import SECRET, running_worker, worker_settings
from tests.worker.support import arrived, backdate, count_rows, fetch_state, make_state, release

NOTES = {
    1: "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음.",
    2: "친구들이랑 수다 떨기 좋은 넓은 술집. 단체석 있음.",
    3: "아이와 함께 가기 좋은 넓은 공원. 놀이터 있음.",
}
GRACE_SECONDS = 1.0


def _worker_environment(settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINLOG_")}
    for name in (
        "database_url",
        "embedding_base_url",
        "judge_base_url",
        "judge_model",
        "provider_max_retries",
        "keyword_similarity_floor",
        "shutdown_grace_seconds",
    ):
        env[f"PINLOG_{name.upper()}"] = str(getattr(settings, name))
    env["PINLOG_INTERNAL_SECRET"] = SECRET
    env["PINLOG_EMBEDDING_API_KEY"] = settings.embedding_api_key.get_secret_value()
    env["PINLOG_JUDGE_API_KEY"] = settings.judge_api_key.get_secret_value()
    return env


async def test_fc02_sigterm_exits_within_grace_lists_abandoned_ids_and_work_recovers(
    engine, migrated_database, fake_openai, presets, hold
):
    held = [hold() for _ in NOTES]
    fake_openai.script_judge(*held)
    for context_id in NOTES:
        await make_state(engine, context_id=context_id)
    settings = worker_settings(migrated_database, fake_openai, shutdown_grace_seconds=GRACE_SECONDS)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", "serve", "--port", str(port),
        env=_worker_environment(settings),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            await _wait_ready(client)
            for context_id, note in NOTES.items():
                body = {"contextId": context_id, "userId": 1, "recordId": 1, "text": note}
                response = await client.post(
                    "/internal/v1/context/process", json=body, headers={"X-Internal-Secret": SECRET}
                )
                assert response.status_code == 202
        for scripted in held:
            await arrived(scripted)

        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=GRACE_SECONDS + 5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        for scripted in held:
            release(scripted)

    log = stderr.decode()
    abandoned = [line for line in log.splitlines() if "shutdown abandoned" in line]
    assert len(abandoned) == 1, log[-2000:]
    assert "context_ids=[1, 2, 3]" in abandoned[0]
    for context_id in NOTES:
        assert await fetch_state(engine, context_id) == ("COMPLETED", "PROCESSING")
        assert await count_rows(engine, "ai.context_keyword", context_id) == 0
        assert await count_rows(engine, "ai.context_keyword_analysis", context_id) == 0

    # After the expiry the rescan's request reclaims each stage: one result set each.
    async with running_worker(settings) as fresh:
        for context_id, note in NOTES.items():
            await backdate(engine, context_id, seconds=700)
            await fresh.process(context_id, note)
    for context_id in NOTES:
        assert await fetch_state(engine, context_id) == ("COMPLETED", "COMPLETED")
        assert await count_rows(engine, "ai.context_keyword_analysis", context_id) == 1


async def _wait_ready(client: httpx.AsyncClient) -> None:
    async with asyncio.timeout(30):
        while True:
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.1)
