"""Where the tests find ``promtool`` (Debian's ``prometheus`` package; ``.ci/run`` installs
it). Missing, a test that needs it skips, except under ``CI=true``, where it fails: CI must run
the rules' unit tests, never pass without them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

# promtool evaluates a few hours of series at most; far more means it hangs.
PROMTOOL_TIMEOUT_SECONDS = 60


def promtool() -> str:
    """The path of ``promtool``; skips the test where it is missing, fails it under CI."""
    found = shutil.which("promtool")
    if found is None:
        missing = "promtool is not installed (apt-get install -y prometheus; .ci/run does)"
        if os.environ.get("CI") == "true":
            pytest.fail(missing)
        pytest.skip(missing)
    return found


def run_promtool(*arguments: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``promtool ARGUMENTS`` in ``cwd``, its output captured; never raises for its status."""
    return subprocess.run(  # noqa: S603 (the installed promtool and our own files)
        [promtool(), *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_SECONDS,
        check=False,
    )
