"""``pinlog-ai demo --operations``, part 1: a preset reclassification as docs/operations.md
"Reclassifying presets" describes it, on the demo's notes.

A new list (the bundled one, every preset kept, ``ADDED`` appended) is written to a file and
loaded as ``pinlog-ai presets load`` would, under each profile a worker serves; the workers
pick it up by their background refresh; then ``pinlog-core reprocess keywords`` runs in this
process (``judge_again``: the command's own service, ``KeywordReprocess``, and dispatcher) and
the demo waits until the worker has judged every reset note again. ``judge_again`` serves the
profile switch's re-judging too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from app.service.preset_loader import DEFAULT_PRESET_FILE, read_preset_file
from app.settings import Settings
from core_service.composition import build_dispatcher, build_worker_endpoints
from core_service.metrics import CoreMetrics
from core_service.operations.keyword_reprocess import KeywordReprocess, ReprocessReport
from core_service.repository.db import create_engine as create_core_engine
from core_service.service.profile_in_use import read_profile_in_use
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


@dataclass(frozen=True, slots=True)
class Rejudging:
    """A ``reprocess keywords`` run under ``profile`` and its outcome: ``waited`` seconds
    until every worker of the profile reported the list version, ``seconds`` from then until
    the worker had judged every reset note again, ``before`` and ``after`` the results of the
    demo's live notes."""

    profile: str
    report: ReprocessReport
    waited: float
    seconds: float
    before: list[ContextResult]
    after: list[ContextResult]

    @property
    def complete(self) -> bool:
        """Every stale judgment was reset, and every note is judged again."""
        return self.report.reset == self.report.total and all(
            r.keyword_status == "COMPLETED" for r in self.after
        )

    def changed(self) -> list[tuple[ContextResult, ContextResult]]:
        """The notes whose keywords differ now: (before, after)."""
        pairs = zip(self.before, self.after, strict=True)
        return [(old, new) for old, new in pairs if old.keywords != new.keywords]


async def judge_again(core_settings: CoreSettings, lines: Sequence[ContextLine]) -> Rejudging:
    """``pinlog-core reprocess keywords --rate 50`` in this process, under the profile in use:
    wait until every worker of that profile reports the current list version, reset the
    older judgments and dispatch them (``KeywordReprocess``), then wait until the worker has
    judged them all again (module docstring)."""
    engine = create_core_engine(core_settings.database_url, pool_size=2)
    reader = ReadinessReader(core_settings.worker_base_urls)
    try:
        before = await load_results(engine, list(lines))
        started = time.monotonic()
        profile = await read_profile_in_use(engine, configured=core_settings.embedding_profile)
        reprocess = KeywordReprocess(engine, profile=profile)
        version = await reprocess.wait_for_workers(reader, timeout_seconds=WORKER_WAIT_SECONDS)
        waited = time.monotonic() - started
        plan = await reprocess.plan(version)
        endpoints = build_worker_endpoints(core_settings)
        # Route by each worker's profile, as ProfileRouting.refresh_once does (which leaves
        # its own client open unless its loop runs and ends).
        for endpoint, reading in zip(endpoints.all, await reader.read_all(), strict=True):
            endpoint.profile = reading.profile
        dispatcher = build_dispatcher(core_settings, engine, endpoints, CoreMetrics())
        dispatcher.start()
        try:
            report = await reprocess.run(plan, dispatcher, rate=RATE)
        finally:
            await dispatcher.close(2.0)
            await endpoints.aclose()
        await wait_until_finished(
            engine, report.reset_ids, limit_seconds=JUDGE_WAIT_SECONDS, say=lambda _: None
        )
        after = await load_results(engine, list(lines))
        seconds = time.monotonic() - started - waited
        return Rejudging(profile, report, waited, seconds, before, after)
    finally:
        await reader.aclose()
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
    stale judgment was made again."""
    names = ", ".join(preset["display_name"] for preset in ADDED)
    say(f"reclassify: new preset list {path}: the bundled presets and {len(ADDED)} added "
        f"({names})")  # fmt: skip
    new_list = read_preset_file(path)
    for settings in worker_settings:  # once per profile a worker serves (operations.md)
        report = await embed_presets(settings, new_list)
        say(f"reclassify: presets load under {settings.embedding_profile}: list version "
            f"{report.version}, {report.presets} presets")  # fmt: skip
    run = await judge_again(core_settings, lines)
    say(f"reclassify: reprocess keywords --rate {RATE}: the worker reported list version "
        f"{run.report.version} after {run.waited:.1f} s (its background refresh); "
        f"{run.report.reset} notes reset and judged again in {run.seconds:.1f} s")  # fmt: skip
    changed = run.changed()
    say(f"reclassify: {len(changed)} of {len(run.after)} notes show other keywords"
        + (", for example:" if changed else ""))  # fmt: skip
    for old, new in changed[:SHOWN_CHANGES]:
        say(f"  context {new.context_id} ({shorten(new.note, NOTE_WIDTH)}): "
            f"[{', '.join(old.keywords)}] -> [{', '.join(new.keywords)}]")  # fmt: skip
    return run.complete
