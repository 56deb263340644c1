"""``pinlog-ai demo --operations``, part 2: switching the embedding profile as docs/operations.md
"Switching the embedding profile" describes it, from the offline encoder's profile to the
hashing encoder's (``OFFLINE_PROFILE``), on the demo's notes.

The second worker (hashing embedder and similarity judge, both offline) has served beside the
first since the start, listed after it in the core's ``PINLOG_CORE_WORKER_BASE_URL``. Each step
is what a ``pinlog-core reembed`` command runs, here in this process: the presets loaded under
the new profile, ``start``, ``status`` until ready (the core service's own backfill loop does
the embedding), a search through the core's client API, ``cut_over`` and the keywords judged
again under the new profile (the path of ``reprocess keywords``), the same search, then the old
worker stops and ``finish`` removes the old profile's vectors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import httpx
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from app.service.preset_loader import PresetFile
from app.settings import OFFLINE_EMBEDDING_MODEL, OFFLINE_PROFILE, Settings
from core_service.operations import reembed
from core_service.repository.db import create_engine as create_core_engine
from core_service.service.profile_in_use import PROPAGATION_SECONDS
from core_service.service.switch_status import ReembedStatus
from core_service.service.worker_readiness import ReadinessReader
from demo.feed import ContextLine, member_tokens
from demo.preset_reclassification import judge_again
from demo.run import RunningServices, Say, embed_presets, offline_settings
from demo.table import shorten

# The second worker's providers: the hashing encoder and the similarity judge, with the
# thresholds of bench/keyword_quality.py's hashing+similarity pair.
HASHING_WORKER: dict[str, object] = {
    "embedding_provider": "hashing",
    "embedding_model": OFFLINE_EMBEDDING_MODEL,
    "embedding_dimension": 1536,
    "embedding_profile": OFFLINE_PROFILE,
    "judge_provider": "similarity",
    "keyword_top_k": 10,
    "keyword_similarity_floor": 0.12,
    "judge_similarity_threshold": 0.15,
}
RATE = 50  # contexts embedded a second by the backfill
BACKFILL_WAIT_SECONDS = 120.0
STATUS_POLL_SECONDS = 1.0
SEARCH_MEMBER = 1
# The hashing encoder compares characters, and the core's cuts for a profile without measured
# ones are the production cuts (floor 0.30): a query sharing words with a note finds it.
SEARCH_QUERY = "혼자 와인 한 잔"
NOTE_WIDTH = 24
SHOWN_CHANGES = 3  # notes whose keywords are shown before and after the re-judging
# Keyword F1 on the frozen test notes (docs/offline-encoder.md, README "Offline and production
# providers"): the hashing + similarity pair, and the offline encoder with the learned judge.
HASHING_F1, OFFLINE_F1 = 0.480, 0.743


def hashing_worker_settings(settings: Settings) -> Settings:
    """The second worker: ``settings``' database, secret and preset refresh, the hashing
    encoder's profile and the similarity judge."""
    return offline_settings(
        settings.database_url,
        settings.internal_secret.get_secret_value(),
        presets_refresh_seconds=settings.presets_refresh_seconds,
        **HASHING_WORKER,
    )


async def switch_profile(
    services: RunningServices,
    new_worker: Settings,
    preset_file: PresetFile,
    lines: Sequence[ContextLine],
    *,
    jwt_secret: str,
    say: Say,
) -> bool:
    """The whole switch (module docstring), one line per step; whether the search moved to
    the new profile's worker and every note was judged again under it."""
    assert services.second_worker is not None
    old, new = services.core_settings.embedding_profile, new_worker.embedding_profile
    say(f"switch: from {old} (in use) to {new} (the second worker's)")
    say("switch: the second profile is a TEST encoder (character hashing and the similarity "
        f"judge: keyword F1 {HASHING_F1} against {OFFLINE_F1} for the one in use, "
        "docs/offline-encoder.md); it shows the mechanics of a switch, and many notes get "
        "worse keywords under it")  # fmt: skip
    report = await embed_presets(new_worker, preset_file)
    state = "embedded and stored" if report.changed else "already stored"
    say(f"switch: presets load under the new profile: {state} (list version {report.version})")
    engine = create_core_engine(services.core_settings.database_url, pool_size=2)
    reader = ReadinessReader(services.core_settings.worker_base_urls)
    new_app = services.second_worker.app
    sides = {services.worker.app: "old", new_app: "new"}
    try:
        started, calls = time.monotonic(), _embedding_calls(new_app)
        await reembed.start(engine, await reader.read_all(), configured=old, target=new, rate=RATE)
        say(f"switch: reembed start --rate {RATE}: the core's backfill loop embeds every note "
            "under the new profile")  # fmt: skip
        status = await _until_ready(engine, old, say)
        backfill_seconds = time.monotonic() - started
        calls = _embedding_calls(new_app) - calls
        side, found = await _search(services, sides, lines, jwt_secret=jwt_secret)
        say(f'switch: search "{SEARCH_QUERY}" as member {SEARCH_MEMBER} through the core: '
            f"{found}, from the worker of the {side} profile")  # fmt: skip
        await reembed.cut_over(engine, await reader.read_all(), configured=old, force=False)
        say("switch: reembed cutover: the new profile is in use; the old one is kept complete "
            "until finish")  # fmt: skip
        await asyncio.sleep(PROPAGATION_SECONDS)  # as the command: every core process on it
        run = await judge_again(services.core_settings, lines)
        say(f"switch: keywords judged again under the new profile: {run.report.reset} notes in "
            f"{run.seconds:.1f} s (after {PROPAGATION_SECONDS:g} s for every core process to "
            f"see the cutover); {len(run.changed())} of {len(run.after)} show other keywords"
            + (", for example:" if run.changed() else ""))  # fmt: skip
        for before, after in run.changed()[:SHOWN_CHANGES]:
            say(f"  context {after.context_id} ({shorten(after.note, NOTE_WIDTH)}): "
                f"[{', '.join(before.keywords)}] -> [{', '.join(after.keywords)}]")  # fmt: skip
        answered, found = await _search(services, sides, lines, jwt_secret=jwt_secret)
        say(f"switch: the same search: {found}, from the worker of the {answered} profile")
        # The old worker goes before its preset vectors do: left running, it would warn at
        # every preset refresh that none is usable under its profile.
        await services.worker.stop()
        _, removed = await reembed.finish(engine, keep_old=False)
        say(f"switch: the old profile's worker stopped; reembed finish: {removed} rows of the "
            "old profile removed (note vectors, backfill rows, preset vectors)")  # fmt: skip
        say(f"switch: {status.done} notes embedded under the new profile in {calls} provider "
            f"call(s); backfill {backfill_seconds:.1f} s, {time.monotonic() - started:.1f} s "
            "from reembed start to finish")  # fmt: skip
    finally:
        await reader.aclose()
        await engine.dispose()
    return answered == "new" and run.complete


async def _until_ready(engine: AsyncEngine, configured: str, say: Say) -> ReembedStatus:
    """``reembed status`` every second until the backfill is complete, a line whenever the
    count of embedded notes changed."""
    said = -1
    async with asyncio.timeout(BACKFILL_WAIT_SECONDS):
        while True:
            status = await reembed.status(engine, configured=configured)
            if status.done != said or status.state == "ready":
                failed = f", {status.failed_total} failed" if status.failed_total else ""
                say(f"switch: reembed status: {status.state}, {status.done}/{status.total} "
                    f"embedded{failed}")  # fmt: skip
                said = status.done
            if status.state == "ready":
                return status
            await asyncio.sleep(STATUS_POLL_SECONDS)


async def _search(
    services: RunningServices,
    sides: dict[FastAPI, str],
    lines: Sequence[ContextLine],
    *,
    jwt_secret: str,
) -> tuple[str, str]:
    """A member's search through the core's client API: which of ``sides``' worker apps
    answered it (its count of answered searches moved) and a summary of the results."""
    before = {app: _searches(app) for app in sides}
    tokens = await member_tokens(services.core_settings.database_url, jwt_secret, {SEARCH_MEMBER})
    async with httpx.AsyncClient(base_url=services.core_url, timeout=10) as http:
        response = await http.post(
            "/api/v1/search",
            json={"query": SEARCH_QUERY, "limit": 5},
            headers={"Authorization": tokens[SEARCH_MEMBER]},
        )
    response.raise_for_status()
    results = response.json()["results"]
    answered = [side for app, side in sides.items() if _searches(app) > before[app]]
    summary = f"{len(results)} result" + ("" if len(results) == 1 else "s")
    if results:
        top = results[0]
        note = {line.context_id: line.text for line in lines}.get(top["contextId"], "?")
        summary += (f", best context {top['contextId']} ({shorten(note, NOTE_WIDTH)}, "
                    f"similarity {top['similarity']:.2f})")  # fmt: skip
    return " and ".join(answered) or "unknown", summary


def _embedding_calls(app: FastAPI) -> int:
    """Embedding provider calls the worker ``app`` made so far (answered ones)."""
    registry = app.state.metrics.registry
    labels = {"provider": "embedding", "outcome": "ok"}
    return int(registry.get_sample_value("pinlog_provider_call_seconds_count", labels) or 0)


def _searches(app: FastAPI) -> int:
    """Searches the worker ``app`` answered (200)."""
    registry = app.state.metrics.registry
    return int(registry.get_sample_value("pinlog_search_seconds_count", {"outcome": "ok"}) or 0)
