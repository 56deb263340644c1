"""``pinlog-core inspect`` as a real command on a note a real worker (fake OpenAI) processed:
both stages, the last dispatch, the judgment with the candidates the worker's keyword save
stored beside it (§4 Addition "candidates kept"), the vectors by profile; no note text unless
``--show-text``; exit 1 for a context that does not exist (docs/operations.md "Looking at one
note")."""

from __future__ import annotations

import json

from tests.core import support as facts
from tests.e2e.observe import wait_until
from tests.e2e.processes import core_environment, run_command

NOTE = "창가 자리가 조용해서 노트북 작업하기 좋은 카페"


async def test_inspect_shows_a_processed_note_with_its_candidates_and_no_text(
    core, worker, engine, migrated_database
):
    context_id = (await core.create(1, NOTE)).json()["contextId"]

    async def completed() -> bool:
        state = await facts.state(engine, context_id)
        return state.statuses == ("COMPLETED", "COMPLETED")

    await wait_until(completed, what="the note completed")
    env = core_environment(migrated_database, str(worker.client.base_url))

    code, out, err = await run_command("core_service.cli", "inspect", str(context_id), "--json",
                                       env=env)  # fmt: skip
    assert code == 0, err[-2000:]
    inspected = json.loads(out)
    assert inspected["live"] is True
    assert {s["status"] for s in inspected["stages"].values()} == {"COMPLETED"}
    assert inspected["lastDispatch"]["outcome"] == "accepted"
    assert inspected["lastDispatch"]["worker"] == str(worker.client.base_url).rstrip("/")
    judgment = inspected["judgment"]
    candidates = judgment["candidates"]
    assert candidates, "the worker offered the judge no candidate"
    similarities = [c["similarity"] for c in candidates]
    assert similarities == sorted(similarities, reverse=True)
    assert all(c["code"] for c in candidates)
    assert {s["code"] for s in judgment["selected"]} <= {c["code"] for c in candidates}
    assert judgment["model"] and judgment["presetVersion"] >= 1
    assert [v["profile"] for v in inspected["vectors"]] == [judgment["embeddingProfile"]]
    assert NOTE not in out and "text" not in inspected

    code, out, err = await run_command("core_service.cli", "inspect", str(context_id),
                                       "--show-text", env=env)  # fmt: skip
    assert code == 0, err[-2000:]
    assert out.splitlines()[0].startswith(f"context {context_id}: record ")
    assert any(line.startswith("    candidates: ") for line in out.splitlines())
    assert f"  text: {NOTE}" in out.splitlines()

    missing = await run_command("core_service.cli", "inspect", "999999999", env=env)
    assert (missing[0], missing[2].strip()) == (1, "pinlog-core: no context 999999999")
