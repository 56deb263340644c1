"""A real ``pinlog-ai serve`` logs one JSON object per line with the context id and stage of
the work it is doing, and never the note (§6)."""

from __future__ import annotations

import json

import httpx

from app.repository import keyword_preset
from tests.e2e.observe import wait_until
from tests.e2e.processes import ServiceProcess, worker_environment
from tests.fake_openai import Scripted
from tests.worker.harness import SECRET
from tests.worker.support import make_state

NOTE = "로그에 나오면 안 되는 비밀 메모"


async def test_worker_logs_json_lines_with_context_and_stage_and_no_note(
    engine, migrated_database, bundled_preset_rows, fake_openai, tmp_path
):
    async with engine.begin() as conn:
        await keyword_preset.upsert_all(conn, bundled_preset_rows)
    await make_state(engine, context_id=77)
    fake_openai.script_embeddings(Scripted(status=503, json={"error": {"message": "busy"}}))
    worker = ServiceProcess(
        "app",
        worker_environment(migrated_database, fake_openai, log_format="json"),
        tmp_path / "worker.log",
    )
    await worker.start()
    try:
        async with httpx.AsyncClient(base_url=worker.base_url, timeout=10) as client:
            response = await client.post(
                "/internal/v1/context/process",
                json={"contextId": 77, "userId": 1, "recordId": 1, "text": NOTE},
                headers={"X-Internal-Secret": SECRET},
            )
        assert response.status_code == 202

        async def warned() -> bool:
            return '"stage": "embedding"' in worker.log()

        await wait_until(warned, within=15, what="the stage's WARNING line")
    finally:
        await worker.stop()

    records = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
    assert records and all({"timestamp", "level", "logger", "message"} <= r.keys() for r in records)
    staged = [r for r in records if r.get("stage") == "embedding"]
    assert staged and all(r["context_id"] == 77 for r in staged)
    assert any(r["level"] == "WARNING" and r["logger"].startswith("app.") for r in staged)
    assert NOTE not in worker.log()
