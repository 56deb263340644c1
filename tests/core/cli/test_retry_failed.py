"""``pinlog-core retry-failed`` as a real command against a real worker (fake OpenAI): failed
notes are replaced by new contexts that complete, never reset in place (docs/operations.md
"Retrying failed notes")."""

from __future__ import annotations

from sqlalchemy import text

from pinlog_platform.contract.search.terms import ANALYSER_VERSION, analyse
from tests.core import support as facts
from tests.core.harness import bearer
from tests.e2e.observe import wait_until
from tests.e2e.processes import core_environment, run_command


async def _wait_completed(engine, *context_ids: int) -> None:
    async def done() -> bool:
        states = [await facts.state(engine, context_id) for context_id in context_ids]
        return all(s.statuses == ("COMPLETED", "COMPLETED") for s in states)

    await wait_until(done, what=f"contexts {context_ids} completed")


async def _fail(engine, context_id: int, embedding: tuple[str, str], keyword: tuple[str, str]):
    """Leave the row as the worker or the finalizer would: statuses with their reasons."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET embedding_status = :es, embedding_failure = :er, "
                "keyword_status = :ks, keyword_failure = :kr, retry_count = 3, "
                "updated_at = now() WHERE context_id = :id"
            ),
            {"id": context_id, "es": embedding[0], "er": embedding[1],
             "ks": keyword[0], "kr": keyword[1]},
        )  # fmt: skip


async def _search_terms(engine, context_id: int) -> list[tuple]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT d.analyser_version, d.term_count, t.term, t.tf "
                "FROM core.context_search_doc AS d JOIN core.context_search_term AS t "
                "USING (context_id) WHERE context_id = :id ORDER BY t.term"
            ),
            {"id": context_id},
        )
        return [tuple(row) for row in rows]


async def _retry_failed(env, *args: str) -> list[str]:
    code, out, err = await run_command("core_service.cli", "retry-failed", *args, env=env)
    assert code == 0, err[-3000:]
    return out.splitlines()


async def test_failed_notes_are_replaced_by_new_contexts_that_complete(
    core, worker, engine, migrated_database
):
    created = [(await core.create(1, f"창가 자리 조용한 카페 {i}", place=p)).json()
               for i, p in enumerate(("a", "a", "b"))]  # fmt: skip
    exhausted, fine, hopeless = (c["contextId"] for c in created)
    await _wait_completed(engine, exhausted, fine, hopeless)
    await _fail(engine, exhausted, ("COMPLETED", None), ("FAILED", "retries_exhausted"))
    await _fail(engine, hopeless, ("FAILED", "input_too_long"), ("FAILED", "embedding_failed"))
    env = core_environment(migrated_database, str(worker.client.base_url))
    contexts = "SELECT count(*) FROM core.context"
    before = await facts.count(engine, contexts)

    dry = await _retry_failed(env, "--dry-run")
    assert dry == ["would replace 1 context(s)", "by reason: retries_exhausted=1"]
    listed = await _retry_failed(env, "--dry-run", "--list")
    record_id = created[0]["recordId"]
    assert listed == [f"context {exhausted} record {record_id} member 1 retries_exhausted", *dry]
    assert await facts.count(engine, contexts) == before

    first = await _retry_failed(env)
    (line,) = [entry for entry in first if "->" in entry]
    replacement = int(line.split(" -> ")[1].split()[0])
    assert line == f"{exhausted} -> {replacement} (retries_exhausted)"
    assert "replaced 1 context(s); skipped 0 changed meanwhile" in first
    named = await _retry_failed(env, "--reason", "input_too_long")
    hopeless_replacement = int(named[0].split(" -> ")[1].split()[0])
    await _wait_completed(engine, replacement, hopeless_replacement)
    again = await _retry_failed(env)
    again_named = await _retry_failed(env, "--reason", "input_too_long")

    assert "replaced 0 context(s); skipped 0 changed meanwhile" in again
    assert "replaced 0 context(s); skipped 0 changed meanwhile" in again_named
    for old, new in ((exhausted, replacement), (hopeless, hopeless_replacement)):
        assert (await facts.state(engine, old)).statuses == ("CANCELLED", "CANCELLED")
        assert (await facts.context(engine, old)).deleted
        assert (await facts.state(engine, new)).retry_count == 0
        assert (await facts.context(engine, new)).body == (await facts.context(engine, old)).body
        # The same body, the same search terms, copied; the old one's purged (docs/search.md).
        body_terms = analyse((await facts.context(engine, new)).body)
        assert await _search_terms(engine, new) == [
            (ANALYSER_VERSION, body_terms.length, term, tf)
            for term, tf in zip(body_terms.terms, body_terms.counts, strict=True)
        ]
        assert body_terms.terms and await _search_terms(engine, old) == []
    read = await core.client.get(f"/api/v1/records/{created[0]['recordId']}", headers=bearer(1))
    assert {c["contextId"] for c in read.json()["contexts"]} == {fine, replacement}
    edited = await core.client.put(
        f"/api/v1/contexts/{exhausted}", json={"body": "고쳐 쓴 메모"}, headers=bearer(1)
    )
    deleted = await core.client.delete(f"/api/v1/contexts/{exhausted}", headers=bearer(1))
    for answer in (edited, deleted):
        assert answer.status_code == 409
        assert answer.json()["replacedBy"] == replacement
