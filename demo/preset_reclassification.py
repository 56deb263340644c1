"""``pinlog-ai demo --operations``, part 1: a preset reclassification as docs/operations.md
"Reclassifying presets" describes it, on the demo's notes.

A new list (the bundled one, every preset kept, ``ADDED`` appended) is written to a file and
loaded as ``pinlog-ai presets load`` would, under each profile a worker serves; the workers
pick it up by their background refresh; then ``pinlog-core reprocess keywords`` runs in this
process (``judge_again``: the command's own service, ``KeywordReprocess``, and dispatcher) and
the demo waits until the worker has judged every reset note again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from app.repository.db import create_engine as create_ai_engine
from app.service.preset_loader import DEFAULT_PRESET_FILE, read_preset_file
from app.settings import Settings
from core_service.composition import build_dispatcher, build_worker_endpoints
from core_service.metrics import CoreMetrics
from core_service.repository.db import create_engine as create_core_engine
from core_service.service.keyword_reprocess import KeywordReprocess, ReprocessReport
from core_service.service.reembed import profile_in_use
from core_service.service.worker_readiness import ReadinessReader
from core_service.settings import CoreSettings
from demo.feed import ContextLine
from demo.report import ContextResult, load_results, wait_until_finished
from demo.run import Say, embed_presets
from demo.table import shorten

# The presets the new list adds (ids after the bundled ones; codes never change once loaded).
ADDED = (
    {
        "id": 29,
        "code": "LONG_WAIT",
        "display_name": "웨이팅",
        "category": "SITUATION",
        "description": "사람이 많아 줄을 서거나 오래 기다려야 하는 곳. "
                       "예약이나 웨이팅이 필요할 때.",
        "examples": ["웨이팅 40분", "줄 서서 먹음", "예약 필수", "주말엔 대기가 길어요",
                     "오픈런 해야 함"],
    },
    {
        "id": 30,
        "code": "HEALING",
        "display_name": "힐링",
        "category": "ATMOSPHERE",
        "description": "자연 속에서 쉬며 마음이 편안해지는 곳. "
                       "공기 좋고 한적해서 기분 전환이 될 때.",
        "examples": ["완전 힐링", "공기 좋아서 힐링됨", "쉬다 오기 좋음", "마음이 편해지는 곳",
                     "새소리 들으며 쉬었다 감"],
    },
)  # fmt: skip
RATE = 50  # contexts reset a second, the command's default
WORKER_WAIT_SECONDS = 60.0
JUDGE_WAIT_SECONDS = 120.0
SHOWN_CHANGES = 3  # notes whose keywords are shown before and after
NOTE_WIDTH = 24


def write_new_list(directory: Path) -> Path:
    """The bundled list with every preset kept and ``ADDED`` appended, its version bumped."""
    data = yaml.safe_load(DEFAULT_PRESET_FILE.read_text(encoding="utf-8"))
    data["version"] += 1
    data["presets"].extend(dict(preset, visibility="PUBLIC", is_active=True) for preset in ADDED)
    path = directory / "keyword_presets.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


async def judge_again(core_settings: CoreSettings, *, rate: int = RATE) -> ReprocessReport:
    """``pinlog-core reprocess keywords --rate N`` in this process, under the profile in use:
    wait until every worker of that profile reports the current list version, then reset the
    older judgments and dispatch them (``KeywordReprocess``); the run's report."""
    engine = create_core_engine(core_settings.database_url, pool_size=2)
    reader = ReadinessReader(core_settings.worker_base_urls)
    try:
        profile = await profile_in_use(engine, configured=core_settings.embedding_profile)
        reprocess = KeywordReprocess(engine, profile=profile)
        version = await reprocess.wait_for_workers(reader, timeout_seconds=WORKER_WAIT_SECONDS)
        plan = await reprocess.plan(version)
        endpoints = build_worker_endpoints(core_settings)
        # Route by each worker's profile, as ProfileRouting.refresh_once does (that one keeps
        # a client open until its loop ends: the command's wiring leaks it).
        for endpoint, reading in zip(endpoints.all, await reader.read_all(), strict=True):
            endpoint.profile = reading.profile
        dispatcher = build_dispatcher(core_settings, engine, endpoints, CoreMetrics())
        dispatcher.start()
        try:
            return await reprocess.run(plan, dispatcher, rate=rate)
        finally:
            await dispatcher.close(2.0)
            await endpoints.aclose()
    finally:
        await reader.aclose()
        await engine.dispose()


async def rejudged(
    core_settings: CoreSettings, lines: Sequence[ContextLine]
) -> tuple[ReprocessReport, list[ContextResult]]:
    """``judge_again``, then wait until the worker has judged every reset note; the report
    and the results of ``lines`` afterwards."""
    report = await judge_again(core_settings)
    engine = create_ai_engine(core_settings.database_url, pool_size=2)
    try:
        await wait_until_finished(
            engine, report.reset_ids, limit_seconds=JUDGE_WAIT_SECONDS, say=lambda _: None
        )
        return report, await load_results(engine, list(lines))
    finally:
        await engine.dispose()


async def reclassify(
    worker_settings: Sequence[Settings],
    core_settings: CoreSettings,
    lines: Sequence[ContextLine],
    *,
    path: Path,
    say: Say,
) -> bool:
    """The reclassification (module docstring) to the list in ``path``, on the live
    ``lines``: one line per step and a few notes' keywords before and after; whether every
    reset note was judged again."""
    names = ", ".join(preset["display_name"] for preset in ADDED)
    say(f"reclassify: new preset list {path}: the bundled presets kept, {len(ADDED)} added "
        f"({names})")  # fmt: skip
    new_list = read_preset_file(path)
    for settings in worker_settings:  # once per profile a worker serves
        report = await embed_presets(settings, new_list)
        say(f"reclassify: presets load under {settings.embedding_profile}: list version "
            f"{report.version}, {report.presets} presets")  # fmt: skip
    before = await _results(core_settings.database_url, lines)
    started = time.monotonic()
    report, after = await rejudged(core_settings, lines)
    say(f"reclassify: reprocess keywords: every worker of {worker_settings[0].embedding_profile} "
        f"on list version {report.version}; {report.reset} notes reset at {RATE} a second and "
        f"judged again in {time.monotonic() - started:.1f} s")  # fmt: skip
    changed = [(old, new) for old, new in zip(before, after, strict=True)
               if old.keywords != new.keywords]  # fmt: skip
    say(
        f"reclassify: {len(changed)} of {len(after)} notes show other keywords now"
        + (", for example:" if changed else "")
    )
    for old, new in changed[:SHOWN_CHANGES]:
        say(f"  context {new.context_id} ({shorten(new.note, NOTE_WIDTH)}): "
            f"[{', '.join(old.keywords)}] -> [{', '.join(new.keywords)}]")  # fmt: skip
    return report.reset == report.total and all(r.keyword_status == "COMPLETED" for r in after)


async def _results(database_url: str, lines: Sequence[ContextLine]) -> list[ContextResult]:
    engine = create_ai_engine(database_url, pool_size=1)
    try:
        return await load_results(engine, list(lines))
    finally:
        await engine.dispose()
