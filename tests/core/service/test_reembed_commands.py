"""``pinlog-core reembed rollback | cutover`` as processes
(``core_service/operations/reembed.py``): a command that stops short of what it promised exits
1 with what is left (docs/operations.md "Switching the embedding profile"). The workers are real
local HTTP servers; no core process runs, so no backfill loop fills anything unless a test
does."""

from __future__ import annotations

from core_service.operations import pause as dispatch_pause
from core_service.operations import reembed
from tests.core.harness import profile_workers
from tests.core.service.test_reembed import _switched, readings
from tests.core.support import TARGET, add_vector, set_backfill_completed, switch_row
from tests.e2e.processes import core_environment, run_command
from tests.worker.harness import PROFILE
from tests.worker.support import make_preset_vector


async def _cut_over(engine, core, workers) -> list[int]:
    """Two judged notes with vectors of both profiles, presets usable under both, the switch
    cut over to TARGET; the ids."""
    ids = await _switched(core, engine, workers[1:], count=2)
    for context_id in ids:
        await add_vector(engine, context_id, TARGET)
        await set_backfill_completed(engine, TARGET, context_id)
    async with engine.begin() as conn:
        await make_preset_vector(conn, preset_id=1, profile=PROFILE)
    await reembed.cut_over(engine, await readings(*workers), configured=PROFILE, force=False)
    return ids


async def _reembed(migrated_database, workers, *args: str) -> tuple[int, str, str]:
    env = core_environment(migrated_database, ",".join(w.base_url for w in workers))
    return await run_command("core_service.cli", "reembed", *args, env=env)


async def test_rollback_that_does_not_reach_idle_within_wait_exits_1_saying_what_is_left(
    engine, migrated_database, core_with_fake_worker
):
    """Issue 28, row 1: no backfill loop runs, so the switch stays rolling_back: the command
    exits 1 (not 0) and says what is left. Run again, it says a rollback is under way and
    exits 0."""
    async with profile_workers(PROFILE, TARGET) as workers:
        await _cut_over(engine, core_with_fake_worker, workers)
        code, out, err = await _reembed(
            migrated_database, workers, "rollback", "--wait", "0", "--rejudge-rate", "5"
        )
        again = await _reembed(migrated_database, workers, "rollback")

    assert code == 1, (out, err)
    assert "not done within --wait 0 s" in err
    assert "switch rolling_back" in err
    assert (await switch_row(engine)).state == "rolling_back"
    assert again[0] == 0 and "already rolling back" in again[1], again


async def test_cutover_while_dispatching_is_paused_exits_1_saying_so_at_its_rejudge_rate(
    engine, migrated_database, core_with_fake_worker
):
    async with profile_workers(PROFILE, TARGET) as workers:
        await _switched(core_with_fake_worker, engine, workers[1:], count=2)
        await dispatch_pause.change(engine, paused=True)
        code, out, err = await _reembed(
            migrated_database, workers, "cutover", "--force", "--wait", "600",
            "--rejudge-rate", "7",
        )  # fmt: skip

    assert code == 1, (out, err)
    assert "dispatching is paused" in err and "left:" in err
    # The re-judging's own pace, not the backfill's (50 a second here).
    assert "7 a second at most" in out
    assert (await switch_row(engine)).state == "cut_over"
