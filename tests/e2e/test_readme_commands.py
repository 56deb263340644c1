"""Every ``curl`` command of the README runs, as a reader would run it, against a real
``pinlog-ai demo`` (what ``make run`` starts) on an empty test database, and answers what the
README shows after it (a ``# -> <status> <body>`` line): the status, and every value of the
body but ids, times and cursors (``"..."``; ``...`` ending a list admits more items; numbers
compared to the decimals shown). Ids must correspond: an id the README shows twice is one id
of the run.

The placeholders the README asks the reader to fill come from what the demo printed: the
``TOKEN='Bearer ...'`` line of member 1 and the ``SECRET='...'`` line are pasted as printed, the
ports 8766 (core) and 8765 (worker) become the ones it served on, and an id shown in an earlier
answer (``records/25``, "the recordId above") becomes the id that answer really carried. Each
command runs in ``bash`` with real ``curl``, only ``--max-time`` added. A read that does not
match yet is read again for a few seconds (the note of the create is being judged). The demo's
printed ``pinlog-core token`` line is run too and its token used, and the demo is stopped with
two Ctrl-C (SIGINT) in a row, which must end it without a traceback. ``make run`` and ``make
test`` themselves are not run here: CI runs ``make test``, and ``make run`` is this demo behind
a virtual environment. No fixture of the suite starts the demo as a process
(``test_offline_demo.py`` runs its parts in-process), so this one does, once.
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
REREAD_SECONDS = 15.0  # how long a read is repeated while the note is being judged
STATUS_OPTION = "-w '\\n%{http_code}\\n'"  # the README's commands print their status


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


@dataclass
class Demo:
    """What a running demo printed, as a reader sees it, and the process."""

    core_port: str
    worker_port: str
    printed: dict[str, str]  # placeholder name -> the line to paste
    token_command: str  # the printed `pinlog-core token` line
    process: asyncio.subprocess.Process
    log: Path

    async def interrupt_twice(self) -> str:
        """Ctrl-C, and Ctrl-C again once it says it is stopping; all it printed."""
        self.process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + DEMO_STOP_SECONDS
        while "stopping ..." not in self.log.read_text(encoding="utf-8", errors="replace"):
            assert time.monotonic() < deadline and self.process.returncode is None
            await asyncio.sleep(0.05)  # polling another process's output
        self.process.send_signal(signal.SIGINT)
        await asyncio.wait_for(self.process.wait(), DEMO_STOP_SECONDS)
        return self.log.read_text(encoding="utf-8", errors="replace")


@pytest.fixture
async def demo(engine, migrated_database, tmp_path) -> AsyncIterator[Demo]:
    """``pinlog-ai demo --port 0 --core-port 0`` on the (emptied) test database, until it
    prints ``serving until Ctrl-C``; killed afterwards if the test did not stop it."""
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
        yield _parse_demo_output(text, process, log)
    finally:
        if process.returncode is None:
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


def _parse_demo_output(text: str, process: asyncio.subprocess.Process, log: Path) -> Demo:
    urls = re.search(
        r"core service on http://127\.0\.0\.1:(\d+), worker on http://127\.0\.0\.1:(\d+)", text
    )
    token = re.search(r"^(TOKEN='Bearer [^']+')  # member 1$", text, flags=re.M)
    secret = re.search(r"^(SECRET='[^']+')", text, flags=re.M)
    command = re.search(r"^(PINLOG_CORE_DATABASE_URL=.*/pinlog-core token --member \d+)$",
                        text, flags=re.M)  # fmt: skip
    assert urls and token and secret and command, text[-3000:]
    for member_id in (1, 2, 3, 4):  # every member of the samples
        assert re.search(rf"^TOKEN='Bearer [^']+'  # member {member_id}$", text, flags=re.M)
    placeholders = {"TOKEN": token[1], "SECRET": secret[1]}
    return Demo(urls[1], urls[2], placeholders, command[1], process, log)


MORE = "\u2026more"  # a list shown ending with `...`: more items may follow
IDS = {"recordId": "records", "contextId": "contexts", "publicId": "public-records"}


def _shown(body: str) -> object:
    """The README's answer as JSON, ``...`` ending a list turned into the ``MORE`` marker."""
    return json.loads(body.replace("[...]", f'["{MORE}"]').replace(",...]", f',"{MORE}"]'))


def _differences(
    shown: object, actual: object, same_id: dict[tuple[str, str], str], where: str = ""
) -> Iterator[str]:
    """Where ``actual`` differs from the README's ``shown`` value (module docstring)."""
    if shown == "...":
        return
    if isinstance(shown, dict):
        if not isinstance(actual, dict) or set(shown) != set(actual):
            yield f"{where}: fields {sorted(actual) if isinstance(actual, dict) else actual}"
            return
        for key, value in shown.items():
            if key in IDS:
                answered = str(actual[key])
                if same_id.setdefault((IDS[key], str(value)), answered) != answered:
                    yield f"{where}.{key}: {answered}, not the id answered before"
            elif not key.endswith(("Id", "Ids")):
                yield from _differences(value, actual[key], same_id, f"{where}.{key}")
        return
    if isinstance(shown, list):
        more = bool(shown) and shown[-1] == MORE
        items = shown[:-1] if more else shown
        if (
            not isinstance(actual, list)
            or len(actual) < len(items)
            or (not more and len(actual) != len(items))
        ):
            yield f"{where}: {_json(actual)}"
            return
        for index, item in enumerate(items):
            yield from _differences(item, actual[index], same_id, f"{where}[{index}]")
        return
    if isinstance(shown, float) and isinstance(actual, (int, float)):
        decimals = len(repr(shown).split(".")[1])
        if round(actual, decimals) != shown:
            yield f"{where}: {actual}, not {shown}"
        return
    if shown != actual:
        yield f"{where}: {_json(actual)}, not {_json(shown)}"


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def test_a_readme_answer_differs_where_a_value_differs_and_not_where_an_id_does():
    shown = _shown(
        '{"recordId":25,"keywords":[{"code":"QUIET"}],"createdAt":"...","similarity":0.56,'
        '"results":[{"contextId":67},...],"matchedKeywordIds":[...]}'
    )
    same = {"recordId": 7, "keywords": [{"code": "QUIET"}], "createdAt": "2026-12-07T00:00:00Z",
            "similarity": 0.5588, "results": [{"contextId": 9}, {"contextId": 10}],
            "matchedKeywordIds": [3]}  # fmt: skip
    assert list(_differences(shown, same, {})) == []
    for changed in ({"keywords": [{"code": "STUDY_WORK"}]}, {"similarity": 0.5449},
                    {"results": []}, {"createdAt": "...", "extra": 1}):  # fmt: skip
        assert list(_differences(shown, {**same, **changed}, {})), changed
    assert list(_differences(shown, {**same, "recordId": 8}, {("records", "25"): "7"}))


@pytest.mark.skipif(
    shutil.which("curl") is None, reason="curl is not installed: the README's commands did not run"
)
async def test_every_readme_command_answers_what_the_readme_shows_then_two_ctrl_c_stop_quietly(
    demo: Demo,
):
    same_id: dict[tuple[str, str], str] = {}  # (records, id the README shows) -> id answered
    problems = []
    for readme in readme_commands():
        script = "\n".join(
            [*(demo.printed[name] for name in readme.placeholders), _as_run(readme, demo, same_id)]
        )
        rereads = time.monotonic() + REREAD_SECONDS if _is_read(readme.command) else 0
        while True:
            status, body = await _run_in_bash(script)
            trial = dict(same_id)
            found = _answer_problems(readme, status, body, trial)
            if not found or time.monotonic() > rereads:
                break
            await asyncio.sleep(0.5)  # the note is still being judged: read again
        same_id.update(trial)
        problems += found

    # The printed `pinlog-core token` line makes a token the demo accepts (a new member's).
    status, token = await _run_in_bash(demo.token_command, with_status=False)
    assert status == 0, token
    status, body = await _run_in_bash(
        f"curl -s --max-time {CURL_SECONDS} -w '\\n%{{http_code}}\\n' "
        f"http://127.0.0.1:{demo.core_port}/api/v1/records -H 'Authorization: Bearer {token}'"
    )
    assert (status, json.loads(body)) == (200, {"records": [], "nextCursor": None})
    assert problems == [], "\n".join(problems)

    printed = await demo.interrupt_twice()
    assert demo.process.returncode == 0, printed[-3000:]
    assert "Traceback" not in printed and "KeyboardInterrupt" not in printed, printed[-3000:]


def _is_read(command: str) -> bool:
    """A command that changes nothing, so it may be run again: a GET or a search."""
    return " -d " not in command or "/search " in command


def _answer_problems(
    readme: ReadmeCommand, status: int, body: str, same_id: dict[tuple[str, str], str]
) -> list[str]:
    if status != readme.expected_status:
        return [f"{readme.command}\n  README {readme.expected_status}: got {status} {body}"]
    differences = list(_differences(_shown(readme.expected_body), json.loads(body), same_id))
    return [f"{readme.command}\n  {d}" for d in differences]


def _as_run(readme: ReadmeCommand, demo: Demo, same_id: dict[tuple[str, str], str]) -> str:
    """The README's command with this run's ports and ids; it prints the status itself."""
    command = readme.command
    assert command.startswith(f"curl -s {STATUS_OPTION} "), command
    for service, port in (("core", demo.core_port), ("worker", demo.worker_port)):
        command = command.replace(f"127.0.0.1:{README_PORTS[service]}/", f"127.0.0.1:{port}/")
    command = re.sub(
        r"/(records|contexts|public-records)/([\w-]+)",
        lambda m: f"/{m[1]}/{same_id.get((m[1], m[2]), m[2])}",
        command,
    )
    return command.replace("curl ", f"curl --max-time {CURL_SECONDS} ", 1)


async def _run_in_bash(script: str, *, with_status: bool = True) -> tuple[int, str]:
    """``(HTTP status, body)`` of a curl script; ``(exit code, output)`` without
    ``with_status``."""
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        script,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), CURL_SECONDS + 10)
    if not with_status:
        return process.returncode, (out or err).decode().strip()
    assert process.returncode == 0, f"curl failed ({process.returncode}): {err.decode()}"
    body, _, status = out.decode().rstrip("\n").rpartition("\n")
    return int(status), body
