"""The Korean analyser is loaded only where it is used: a worker with the OpenAI-compatible or
the similarity judge never imports Kiwi; building the learned judge loads it at once (startup),
not on the first request. Checked in a fresh interpreter, since this test process may already
hold Kiwi from other tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import asyncio, json, sys

from app.metrics import WorkerMetrics
from app.providers.factory import build_judge
from app.settings import Settings
from tests.worker.harness import running_worker, worker_settings

database_url, base_url = sys.argv[1], sys.argv[2]


class Server:  # the test process's fake OpenAI server, by its address
    def __init__(self, base_url):
        self.base_url = base_url


async def main():
    seen = {}
    for judge in ("openai", "similarity"):
        settings = worker_settings(database_url, Server(base_url), judge_provider=judge)
        async with running_worker(settings):
            pass
        seen[judge] = "kiwipiepy" in sys.modules
    secret = "subprocess-internal-secret-0123456789"
    settings = Settings(database_url=database_url, internal_secret=secret, offline=True)
    build_judge(settings, WorkerMetrics())
    from pinlog_platform.korean_lemmas import shared_analyser

    seen["learned"] = "kiwipiepy" in sys.modules
    seen["learned_loaded"] = shared_analyser().load_seconds is not None
    print(json.dumps(seen))


asyncio.run(main())
"""


def test_only_the_learned_judge_loads_the_analyser(migrated_database, fake_openai, presets):
    done = subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-c", SCRIPT, migrated_database, fake_openai.base_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "openai": False,
        "similarity": False,
        "learned": True,
        "learned_loaded": True,
    }
