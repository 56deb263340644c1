"""Load time and memory of the Korean analyser and of the learned judge's artifact.

    .venv/bin/python -m bench.analyser_cost

Each measurement runs in a fresh interpreter: wall-clock seconds to import and load, the
resident-set growth (MiB, ``VmRSS`` before and after loading and analysing the notes of
``bench/keyword_eval/dev.yaml``) and the mean milliseconds per note analysed. Rows: Kiwi with
its default options, Kiwi as ``pinlog_platform.korean_lemmas`` loads it (without the multi-word
dictionary), and the judge artifact alone (``load_model``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys, time
from pathlib import Path
import yaml

def rss_mib():
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024

part = Path("bench/keyword_eval/dev.yaml").read_text(encoding="utf-8")
notes = [n["text"] for n in yaml.safe_load(part)["notes"]]
kind = sys.argv[1]
before = rss_mib()
started = time.perf_counter()
if kind == "artifact":
    from app.providers.learned_judge import load_model
    load_model()
    analyse = None
elif kind == "kiwi-default":
    from kiwipiepy import Kiwi
    kiwi = Kiwi()
    analyse = kiwi.tokenize
else:
    from pinlog_platform.korean_lemmas import KoreanLemmatizer
    analyser = KoreanLemmatizer()
    analyser.load()
    analyse = analyser.analyse
load_seconds = time.perf_counter() - started
per_note_ms = None
if analyse is not None:
    started = time.perf_counter()
    for text in notes:
        analyse(text)
    per_note_ms = (time.perf_counter() - started) * 1000 / len(notes)
print(json.dumps({"load_seconds": round(load_seconds, 2), "rss_mib": round(rss_mib() - before),
                  "ms_per_note": per_note_ms and round(per_note_ms, 2)}))
"""


def measure(kind: str) -> dict:
    done = subprocess.run(  # noqa: S603 - our own interpreter and probe
        [sys.executable, "-c", PROBE, kind],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    print("| what | load (s) | RSS growth (MiB) | ms per note |")
    print("|---|---|---|---|")
    for kind, label in (
        ("kiwi-default", "Kiwi, default options"),
        ("kiwi-chosen", "Kiwi as korean_lemmas loads it (load_multi_dict=False)"),
        ("artifact", "learned judge artifact (load_model)"),
    ):
        row = measure(kind)
        ms = "-" if row["ms_per_note"] is None else f"{row['ms_per_note']:.2f}"
        print(f"| {label} | {row['load_seconds']:.2f} | {row['rss_mib']} | {ms} |")


if __name__ == "__main__":
    main()
