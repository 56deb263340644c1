"""The README's example search, "조용히 작업하기 좋은 곳", over member 1's demo notes
(demo/sample_contexts.yaml) through the core and a real worker (fake OpenAI provider): the
member's note about working in a quiet cafe comes first, found by its words."""

from __future__ import annotations

import asyncio
from pathlib import Path

import yaml

from tests.core import support as facts
from tests.core.harness import bearer

DEMO = Path(__file__).parents[3] / "demo" / "sample_contexts.yaml"
QUIET_WORK_CAFE = 101  # 연남동 작은 카페: "조용. 콘센트 있음.", "... 창가 자리에서 작업했어요."


async def test_the_readme_query_finds_member_1s_quiet_place_to_work(core, engine):
    notes = [c for c in yaml.safe_load(DEMO.read_text(encoding="utf-8"))["contexts"]
             if c["user_id"] == 1]  # fmt: skip
    records: dict[int, int] = {}  # demo record -> core record
    context_ids = []
    for note in notes:
        response = await core.create(1, note["text"], place=f"demo-{note['record_id']}")
        assert response.status_code in (200, 201), response.text
        records[note["record_id"]] = response.json()["recordId"]
        context_ids.append(response.json()["contextId"])
    async with asyncio.timeout(30):
        for context_id in context_ids:
            while (await facts.state(engine, context_id)).statuses != (  # noqa: ASYNC110
                "COMPLETED",
                "COMPLETED",
            ):
                await asyncio.sleep(0.05)  # polls the database: no event to wait on

    response = await core.client.post(
        "/api/v1/search",
        json={"query": "조용히 작업하기 좋은 곳", "limit": 5},
        headers=bearer(1),
    )

    assert response.status_code == 200
    results = response.json()["results"]
    assert results[0]["recordId"] == records[QUIET_WORK_CAFE]
    assert "lexical" in results[0]["matchedBy"]
    assert len(results) <= 5
