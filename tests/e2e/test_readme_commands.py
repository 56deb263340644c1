"""Every ``curl`` command of the README runs, as a reader would run it, against a real
``pinlog-ai demo`` (what ``make run`` starts) on the test database, and answers what the README
shows after it (a ``# -> <status> <body>`` line: the status, and every field the body names).

The placeholders the README asks the reader to fill come from what the demo printed: the
``TOKEN='Bearer ...'`` line of member 1 and the ``SECRET='...'`` line are pasted as printed, the
ports 8766 (core) and 8765 (worker) become the ones it served on, and an id shown in an earlier
answer (``records/65``, "the recordId above"; a ``publicId``) becomes the id that answer really
carried. Each
command runs in ``bash`` with real ``curl``, only ``-w`` (to see the status) and ``--max-time``
added. ``make run`` and ``make test`` themselves are not run here: CI runs ``make test``, and
``make run`` is this demo behind a virtual environment. No fixture of the suite starts the demo
as a process (``test_offline_demo.py`` runs its parts in-process), so this one does, once.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_PORTS = {"core": "8766", "worker": "8765"}
PLACEHOLDERS = ("TOKEN", "SECRET")
DEMO_READY_SECONDS = 180.0
DEMO_STOP_SECONDS = 15.0
CURL_SECONDS = 30


@dataclass
class ReadmeCommand:
    """One ``curl`` command of a README ``sh`` block and the answer shown after it."""

    command: str
    expected_status: int | None = None
    expected_body: str = ""
    placeholders: dict[str, str] = field(default_factory=dict)


def readme_commands() -> list[ReadmeCommand]:
    """The ``curl`` commands in README order, each with the placeholder lines of its block."""
    tokens = MarkdownIt("commonmark").parse(README.read_text(encoding="utf-8"))
    commands: list[ReadmeCommand] = []
    for token in tokens:
        if token.type != "fence" or token.info.strip() != "sh":
            continue
        placeholders: dict[str, str] = {}
        for line in token.content.replace("\\\n", " ").splitlines():
            line = line.strip()
            name = line.split("=", 1)[0]
            if name in PLACEHOLDERS:
                placeholders[name] = line
            elif line.startswith("curl "):
                commands.append(ReadmeCommand(line, placeholders=placeholders))
            elif (shown := re.match(r"# -> (\d{3})\s*(.*)$", line)) and commands:
                commands[-1].expected_status = int(shown[1])
                commands[-1].expected_body = shown[2]
    return commands


def test_the_readme_shows_an_answer_after_every_curl_command():
    commands = readme_commands()

    assert len(commands) >= 4
    assert [c.command for c in commands if c.expected_status is None] == []


@dataclass(frozen=True)
class Demo:
    """What a running demo printed, as a reader sees it."""

    core_port: str
    worker_port: str
    printed: dict[str, str]  # placeholder name -> the line to paste


@pytest.fixture
async def demo(engine, migrated_database, tmp_path) -> AsyncIterator[Demo]:
    """``pinlog-ai demo --port 0 --core-port 0`` on the (emptied) test database, until it
    prints ``serving until Ctrl-C``; stopped with SIGINT (Ctrl-C) afterwards."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINLOG_")}
    env["PINLOG_DATABASE_URL"] = migrated_database
    log = tmp_path / "demo.log"
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "app.cli", "demo", "--port", "0", "--core-port", "0"),
            env=env,
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        text = await _printed_until_serving(process, log)
        yield _parse_demo_output(text)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(process.wait(), DEMO_STOP_SECONDS)
            except TimeoutError:
                process.kill()
                await process.wait()


async def _printed_until_serving(process: asyncio.subprocess.Process, log: Path) -> str:
    deadline = time.monotonic() + DEMO_READY_SECONDS
    while True:
        text = await asyncio.to_thread(log.read_text, encoding="utf-8", errors="replace")
        if "serving until Ctrl-C" in text:
            return text
        if process.returncode is not None or time.monotonic() > deadline:
            raise AssertionError(f"the demo did not start serving:\n{text[-3000:]}")
        await asyncio.sleep(0.2)  # polling another process's output, not a race interleaving


def _parse_demo_output(text: str) -> Demo:
    urls = re.search(
        r"core service on http://127\.0\.0\.1:(\d+), worker on http://127\.0\.0\.1:(\d+)", text
    )
    token = re.search(r"^(TOKEN='Bearer [^']+')  # member 1$", text, flags=re.M)
    secret = re.search(r"^(SECRET='[^']+')", text, flags=re.M)
    assert urls and token and secret, text[-3000:]
    return Demo(urls[1], urls[2], {"TOKEN": token[1], "SECRET": secret[1]})


def _field_names(value: object) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _field_names(item)
    elif isinstance(value, list):
        for item in value:
            yield from _field_names(item)


# The path segment that takes each id field an answer shows.
ID_PATHS = {"recordId": "records", "contextId": "contexts", "publicId": "public-records"}


def _shown_ids(body: str) -> dict[str, str]:
    """The ids an answer shows at its top level, before any nested value: ``{"records": "65"}``
    for ``{"recordId":65,...``, keyed by the path segment that takes them."""
    top = re.match(r"\{[^{\[]*", body)
    found = re.findall(r'"(recordId|contextId|publicId)":"?([\w-]+)"?', top[0]) if top else []
    return {ID_PATHS[name]: value for name, value in found}


@pytest.mark.skipif(
    shutil.which("curl") is None, reason="curl is not installed: the README's commands did not run"
)
async def test_every_readme_curl_command_answers_what_the_readme_shows(demo: Demo):
    same_id: dict[tuple[str, str], str] = {}  # (records, id the README shows) -> id answered
    problems = []
    for readme in readme_commands():
        script = "\n".join(
            [*(demo.printed[name] for name in readme.placeholders), _as_run(readme, demo, same_id)]
        )
        status, body = await _run_in_bash(script)
        if status != readme.expected_status:
            problems.append(
                f"{readme.command}\n  README {readme.expected_status}: got {status} {body}"
            )
            continue
        actual = json.loads(body) if body else {}
        for kind, shown in _shown_ids(readme.expected_body).items():
            answered = str(actual[next(f for f, path in ID_PATHS.items() if path == kind)])
            if same_id.setdefault((kind, shown), answered) != answered:
                problems.append(
                    f"{readme.command}\n  {kind} {answered}, not {same_id[kind, shown]}"
                )
        missing = set(re.findall(r'"(\w+)":', readme.expected_body)) - set(_field_names(actual))
        if missing:
            problems.append(f"{readme.command}\n  no field {sorted(missing)} in {body}")

    assert problems == [], "\n".join(problems)


def _as_run(readme: ReadmeCommand, demo: Demo, same_id: dict[tuple[str, str], str]) -> str:
    """The README's command with this run's ports and ids, printing the status after the body."""
    command = readme.command
    for service, port in (("core", demo.core_port), ("worker", demo.worker_port)):
        command = command.replace(f"127.0.0.1:{README_PORTS[service]}/", f"127.0.0.1:{port}/")
    command = re.sub(
        r"/(records|contexts|public-records)/([\w-]+)",
        lambda m: f"/{m[1]}/{same_id.get((m[1], m[2]), m[2])}",
        command,
    )
    return command.replace("curl ", f"curl --max-time {CURL_SECONDS} -w '\\n%{{http_code}}' ", 1)


async def _run_in_bash(script: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        script,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), CURL_SECONDS + 10)
    assert process.returncode == 0, f"curl failed ({process.returncode}): {err.decode()}"
    body, _, status = out.decode().rpartition("\n")
    return int(status), body
