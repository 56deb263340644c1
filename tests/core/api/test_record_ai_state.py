"""The owner's record read shows each context's AI state: ``{"state"}`` plus
``stage`` and ``reason`` when failed; other members never see it."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from core_service.repository.record_view import AiStatuses
from core_service.service.record_reads import AiSummary, summarize
from pinlog_platform.contract.states import Stage, Status
from tests.core.harness import bearer
from tests.worker.support import set_statuses

NOTE = "창가 자리 조용하고 콘센트 많음"
P, R, C, F, X = (Status(s) for s in ("PENDING", "PROCESSING", "COMPLETED", "FAILED", "CANCELLED"))


def _ai(embedding, keyword, embedding_failure=None, keyword_failure=None) -> AiStatuses:
    return AiStatuses(
        statuses={Stage.EMBEDDING: embedding, Stage.KEYWORD: keyword},
        failures={Stage.EMBEDDING: embedding_failure, Stage.KEYWORD: keyword_failure},
    )


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (_ai(P, P), AiSummary("pending")),
        (_ai(R, P), AiSummary("processing")),
        (_ai(C, R), AiSummary("processing")),
        (_ai(C, P), AiSummary("pending")),
        (_ai(C, C), AiSummary("completed")),
        (_ai(C, F, None, "judge_refused"), AiSummary("failed", "keyword", "judge_refused")),
        (
            _ai(F, F, "input_blank", "embedding_failed"),
            AiSummary("failed", "embedding", "input_blank"),
        ),
        (_ai(F, P), AiSummary("failed", "embedding", "unknown")),
        (_ai(X, X), AiSummary("pending")),
    ],
)
def test_summary_rules(statuses, expected):
    assert summarize(statuses) == expected


async def test_owner_sees_state_stage_and_reason_other_members_see_no_ai(
    core_with_fake_worker, engine
):
    core = core_with_fake_worker
    created = (await core.create(1, NOTE, place="place-1")).json()
    context_id, record_id = created["contextId"], created["recordId"]
    url = f"/api/v1/records/{record_id}"

    pending = (await core.client.get(url, headers=bearer(1))).json()
    await set_statuses(
        engine, context_id=context_id, embedding_status="COMPLETED", keyword_status="FAILED"
    )
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE ai.context_ai_state SET keyword_failure = 'judge_truncated' "
                 "WHERE context_id = :id"),
            {"id": context_id},
        )  # fmt: skip
    failed = (await core.client.get(url, headers=bearer(1))).json()
    public_url = f"/api/v1/public-records/{created['publicId']}"
    other = (await core.client.get(public_url, headers=bearer(2))).json()

    assert pending["contexts"][0]["ai"] == {"state": "pending"}
    assert failed["contexts"][0]["ai"] == {
        "state": "failed",
        "stage": "keyword",
        "reason": "judge_truncated",
    }
    assert "ai" not in other["contexts"][0]
    assert "judge_truncated" not in str(other)
