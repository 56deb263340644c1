"""Startup problems of the real ``pinlog-ai`` CLI, run as subprocesses.

Each problem ends with one line per problem on stderr, no traceback, no secret, and the exit
code of ``app.preflight``: 2 settings, 3 database unreachable, 4 database not ready,
5 provider. The commands run concurrently: each is a fresh Python process.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from dataclasses import dataclass

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from pinlog_platform.cli import exit_codes
from tests.fake_openai import Scripted, error_body
from tests.worker.harness import SECRET

KEY = "sk-cli-test-key-do-not-print"
PASSWORD = "pw-do-not-print"


@dataclass(frozen=True)
class Outcome:
    code: int
    lines: list[str]


async def _cli(args: list[str], env: dict[str, str]) -> Outcome:
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("PINLOG_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", *args,
        env={**base, **env},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return Outcome(process.returncode, stderr.decode().splitlines())


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"postgresql+asyncpg://worker:{PASSWORD}@127.0.0.1:{port}/pinlog"


def _worker_env(database_url: str, **extra: str) -> dict[str, str]:
    return {
        "PINLOG_DATABASE_URL": database_url,
        "PINLOG_INTERNAL_SECRET": SECRET,
        "PINLOG_EMBEDDING_API_KEY": KEY,
        "PINLOG_JUDGE_API_KEY": KEY,
        **extra,
    }


def _assert_one_clean_line(outcome: Outcome, code: int, *fragments: str) -> None:
    assert outcome.code == code, outcome
    lines = [line for line in outcome.lines if line.startswith("pinlog-ai: ")]
    assert len(lines) == 1, outcome.lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    _assert_clean(outcome)


def _assert_clean(outcome: Outcome) -> None:
    text = "\n".join(outcome.lines)
    assert "Traceback" not in text
    for secret in (KEY, PASSWORD, SECRET):
        assert secret not in text


async def test_configuration_problems_are_all_reported_at_once_with_exit_2():
    """A set-but-empty base URL, a secret with a trailing newline (read from a file) and no
    keys: every command that reads them says all of it in one run."""
    env = {
        "PINLOG_DATABASE_URL": _closed_port_url(),
        "PINLOG_EMBEDDING_BASE_URL": "",
        "PINLOG_INTERNAL_SECRET": SECRET + "\n",
        "PINLOG_JUDGE_API_KEY": f" {KEY}",
    }
    serve, load = await asyncio.gather(_cli(["serve"], env), _cli(["presets", "load"], env))

    for outcome in (serve, load):
        assert outcome.code == exit_codes.CONFIGURATION
        assert outcome.lines == [
            "pinlog-ai: configuration error: PINLOG_INTERNAL_SECRET: has leading or trailing "
            "whitespace (a newline from a file?); remove it",
            "pinlog-ai: configuration error: PINLOG_EMBEDDING_BASE_URL: is set but empty; "
            "give a value or unset it",
            "pinlog-ai: configuration error: PINLOG_EMBEDDING_API_KEY: is required when "
            "PINLOG_EMBEDDING_PROVIDER is openai",
            "pinlog-ai: configuration error: PINLOG_JUDGE_API_KEY: has leading or trailing "
            "whitespace (a newline from a file?); remove it",
        ]
        _assert_clean(outcome)


@pytest.mark.parametrize(
    ("database_url", "fragment"),
    [("", "is set but empty"), ("sqlite:///x", "asyncpg")],
    ids=["empty", "not-asyncpg"],
)
async def test_db_upgrade_without_a_usable_url_is_exit_2(database_url, fragment):
    env = {} if database_url is None else {"PINLOG_DATABASE_URL": database_url}

    outcome = await _cli(["db", "upgrade"], env)

    _assert_one_clean_line(outcome, exit_codes.CONFIGURATION, "PINLOG_DATABASE_URL", fragment)


async def test_an_unreachable_database_is_exit_3_for_every_command():
    url = _closed_port_url()
    outcomes = await asyncio.gather(
        _cli(["serve"], _worker_env(url)),
        _cli(["presets", "load"], _worker_env(url)),
        _cli(["db", "upgrade"], {"PINLOG_DATABASE_URL": url}),
    )

    for outcome in outcomes:
        _assert_one_clean_line(outcome, exit_codes.DATABASE_UNREACHABLE, "database unreachable")


async def test_a_database_that_does_not_exist_is_exit_3(migrated_database):
    url = make_url(migrated_database).set(database="no_such_database")

    outcome = await _cli(
        ["db", "upgrade"], {"PINLOG_DATABASE_URL": url.render_as_string(hide_password=False)}
    )

    _assert_one_clean_line(outcome, exit_codes.DATABASE_UNREACHABLE, "does not exist")


async def test_serve_without_schema_or_without_presets_is_exit_4(engine, empty_database):
    """``engine`` empties the ai tables: the migrated database has no presets; the brand-new
    one has no schema at all."""
    no_presets, no_schema = await asyncio.gather(
        _cli(["serve"], _worker_env(engine.url.render_as_string(hide_password=False))),
        _cli(["serve"], _worker_env(empty_database)),
    )

    _assert_one_clean_line(no_presets, exit_codes.DATABASE_NOT_READY, "no usable keyword presets")
    _assert_one_clean_line(no_schema, exit_codes.DATABASE_NOT_READY, "run `pinlog-ai db upgrade`")


async def test_presets_load_with_a_refusing_provider_is_exit_5(engine, fake_openai):
    fake_openai.script_embeddings(Scripted(status=401))
    env = _worker_env(
        engine.url.render_as_string(hide_password=False),
        PINLOG_EMBEDDING_BASE_URL=fake_openai.base_url,
    )

    outcome = await _cli(["presets", "load"], env)

    _assert_one_clean_line(outcome, exit_codes.PROVIDER, "embedding upstream 401")


async def test_presets_load_with_an_exhausted_quota_is_one_line_exit_5_nothing_written(
    engine, fake_openai
):
    """``429 insufficient_quota`` is not a rate limit: one call (no retries), one
    line naming the class, exit 5, no preset row written."""
    fake_openai.set_fault(
        "embeddings",
        Scripted(
            status=429,
            json=error_body(
                "You exceeded your current quota", type="insufficient_quota",
                code="insufficient_quota",
            ),
        ),
    )  # fmt: skip
    env = _worker_env(
        engine.url.render_as_string(hide_password=False),
        PINLOG_EMBEDDING_BASE_URL=fake_openai.base_url,
        PINLOG_PROVIDER_MAX_RETRIES="2",
    )

    outcome = await _cli(["presets", "load"], env)

    _assert_one_clean_line(
        outcome, exit_codes.PROVIDER, "embedding upstream 429: provider-wide (quota)"
    )
    assert all("exceeded your current quota" not in line for line in outcome.lines)
    assert fake_openai.embedding_calls == 1
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM ai.keyword_preset"))).scalar() == 0
