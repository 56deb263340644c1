"""Placeholder and weak secrets are refused: both real CLIs, started with the
values of a copied ``.env.example``, exit 2 with one line per setting; weak generated secrets
are refused the same way; provider keys refuse only the shipped placeholder."""

from __future__ import annotations

import asyncio
import base64
import os
import re
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import SecretStr

from pinlog_platform.cli import exit_codes
from pinlog_platform.db.connection import driver_target
from pinlog_platform.settings_rules import (
    SEVERAL_HOSTS_FORM,
    SHIPPED_PLACEHOLDERS,
    check_database_url,
    check_generated_secret,
    refuse_placeholder,
    refuse_placeholder_password,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = dict(
    line.split("=", 1)
    for line in (ROOT / ".env.example").read_text(encoding="utf-8").splitlines()
    if re.match(r"^[A-Z_]+=", line)
)
SECRET_VARIABLES = (
    "POSTGRES_PASSWORD",
    "PINLOG_CORE_DB_PASSWORD",
    "PINLOG_AI_DB_PASSWORD",
    "PINLOG_INTERNAL_SECRET",
    "PINLOG_CORE_JWT_SECRET",
    "PINLOG_EMBEDDING_API_KEY",
    "PINLOG_JUDGE_API_KEY",
)


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stderr: str


async def run(module: str, env: dict[str, str]) -> Outcome:
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("PINLOG_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, "serve", "--port", "0",
        env={**base, **env},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return Outcome(process.returncode, stderr.decode())


def test_every_secret_of_env_example_is_a_refused_placeholder():
    for name in SECRET_VARIABLES:
        assert EXAMPLE[name] in SHIPPED_PLACEHOLDERS, name


async def test_both_services_started_from_a_copied_env_example_exit_2_naming_each_secret():
    core_env = {
        "PINLOG_CORE_DATABASE_URL": (
            f"postgresql+asyncpg://pinlog_core:{EXAMPLE['PINLOG_CORE_DB_PASSWORD']}@db/pinlog"
        ),
        "PINLOG_CORE_WORKER_BASE_URL": "http://worker-1:8000",
        "PINLOG_CORE_INTERNAL_SECRET": EXAMPLE["PINLOG_INTERNAL_SECRET"],
        "PINLOG_CORE_JWT_SECRET": EXAMPLE["PINLOG_CORE_JWT_SECRET"],
        "PINLOG_CORE_EMBEDDING_PROFILE": EXAMPLE["PINLOG_EMBEDDING_PROFILE"],
    }
    worker_env = {
        "PINLOG_DATABASE_URL": (
            f"postgresql+asyncpg://pinlog_ai:{EXAMPLE['PINLOG_AI_DB_PASSWORD']}@db/pinlog"
        ),
        "PINLOG_INTERNAL_SECRET": EXAMPLE["PINLOG_INTERNAL_SECRET"],
        "PINLOG_EMBEDDING_API_KEY": EXAMPLE["PINLOG_EMBEDDING_API_KEY"],
        "PINLOG_JUDGE_API_KEY": EXAMPLE["PINLOG_JUDGE_API_KEY"],
        "PINLOG_EMBEDDING_PROFILE": EXAMPLE["PINLOG_EMBEDDING_PROFILE"],
    }
    core, worker = await asyncio.gather(
        run("core_service.cli", core_env), run("app.cli", worker_env)
    )

    for outcome, names in (
        (
            core,
            [
                "PINLOG_CORE_DATABASE_URL",
                "PINLOG_CORE_INTERNAL_SECRET",
                "PINLOG_CORE_JWT_SECRET",
            ],
        ),
        (
            worker,
            [
                "PINLOG_DATABASE_URL",
                "PINLOG_INTERNAL_SECRET",
                "PINLOG_EMBEDDING_API_KEY",
                "PINLOG_JUDGE_API_KEY",
            ],
        ),
    ):
        assert outcome.returncode == exit_codes.CONFIGURATION, outcome.stderr
        lines = [line for line in outcome.stderr.splitlines() if "placeholder" in line]
        assert sorted(name for line in lines for name in names if f"{name}:" in line) == sorted(
            names
        ), outcome.stderr
        assert "Traceback" not in outcome.stderr
        for value in SHIPPED_PLACEHOLDERS:
            assert f": {value}" not in outcome.stderr


@pytest.mark.parametrize(
    "weak",
    [
        "a" * 64,  # long but one character
        "abcabcabcabcabcabcabcabcabcabcabcabc",  # 3 distinct
        "0123456789abcdefghij0123456789a",  # 31 characters
        "change-me-to-32-or-more-characters-long",
    ],
)
def test_weak_generated_secrets_are_refused(weak):
    with pytest.raises(ValueError, match=r"placeholder|too weak"):
        check_generated_secret(SecretStr(weak))


def test_generated_secrets_pass():
    # What `openssl rand -hex 32` and `openssl rand -base64 48` print.
    hex32 = secrets.token_hex(32)
    b64 = base64.b64encode(secrets.token_bytes(48)).decode()
    for value in (hex32, b64):
        assert check_generated_secret(SecretStr(value))


def test_a_provider_key_refuses_only_the_placeholder():
    assert refuse_placeholder(SecretStr("EMPTY"))
    with pytest.raises(ValueError, match="placeholder"):
        refuse_placeholder(SecretStr("sk-..."))


async def test_a_weak_jwt_secret_and_previous_secret_exit_2_naming_them():
    env = {
        "PINLOG_CORE_DATABASE_URL": "postgresql+asyncpg://u@127.0.0.1:9/pinlog",
        "PINLOG_CORE_WORKER_BASE_URL": "http://worker-1:8000",
        "PINLOG_CORE_INTERNAL_SECRET": "x" * 40,
        "PINLOG_CORE_JWT_SECRET": "0123456789abcdef0123456789abcdef-ok",
        "PINLOG_CORE_JWT_PREVIOUS_SECRETS": "0123456789abcdef0123456789abcdef-ok,short",
        "PINLOG_CORE_EMBEDDING_PROFILE": "p",
    }
    outcome = await run("core_service.cli", env)
    assert outcome.returncode == exit_codes.CONFIGURATION
    weak = [line for line in outcome.stderr.splitlines() if "too weak" in line]
    assert sorted(re.search(r"(PINLOG_\w+):", line).group(1) for line in weak) == [
        "PINLOG_CORE_INTERNAL_SECRET",
        "PINLOG_CORE_JWT_PREVIOUS_SECRETS",
    ], outcome.stderr


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("postgresql+asyncpg://pinlog:change-me@db/pinlog", "placeholder"),
        ("postgresql+asyncpg://pinlog:change-me@localhost/pinlog", "placeholder"),
        ("postgresql+asyncpg://pinlog:pinlog@db:5432/pinlog", "weak password"),
        ("postgresql+asyncpg://pinlog:pinlog@localhost:5432/pinlog", None),
        ("postgresql+asyncpg://pinlog@db/pinlog", None),
        (f"postgresql+asyncpg://pinlog:{secrets.token_hex(32)}@db/pinlog", None),
        # Several hosts (docs/deployment.md "Replicas and failover"): the rule holds for each.
        ("postgresql+asyncpg://pinlog:pinlog@/pinlog?host=127.0.0.1:5432&host=db2:5432", "weak"),
        ("postgresql+asyncpg://pinlog:pinlog@/pinlog?host=db1:5432&host=localhost:5432", "weak"),
        ("postgresql+asyncpg://pinlog:pinlog@/pinlog?host=127.0.0.1:5432&host=[::1]:5433", None),
        (
            "postgresql+asyncpg://pinlog:change-me@/pinlog?host=localhost:1&host=::1:2",
            "placeholder",
        ),
        ("postgresql+asyncpg://pinlog:pinlog@/pinlog?host=/run/postgresql", None),
    ],
)
def test_database_passwords_refuse_placeholders_and_weak_values_off_loopback(url, refused):
    if refused is None:
        assert refuse_placeholder_password(url) == url
    else:
        with pytest.raises(ValueError, match=refused):
            refuse_placeholder_password(url)


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("postgresql+asyncpg://u@db1:5432,db2:5432/pinlog", "unsupported form"),
        ("postgresql+asyncpg://u@/pinlog?host=db1,db2", "unsupported form"),
        ("postgresql+asyncpg://u@db1/pinlog?host=db2:5432&host=db3:5432", "unsupported form"),
        ("postgresql+asyncpg://u@/pinlog?host=db1:5432&host=db2", "each needs its port"),
        ("postgresql+asyncpg://u@/pinlog?host=db1:5432&host=db2:5432", None),
        ("postgresql+asyncpg://u@db1:5432/pinlog", None),
    ],
)
def test_several_database_hosts_are_accepted_in_one_form_only(url, refused):
    """The one multi-host syntax both services accept (SEVERAL_HOSTS_FORM); the message names
    it and never echoes the URL."""
    if refused is None:
        assert check_database_url(url) == url
    else:
        with pytest.raises(ValueError, match=refused) as raised:
            check_database_url(url)
        assert "db1" not in str(raised.value)
        assert SEVERAL_HOSTS_FORM in str(raised.value)


def test_a_multi_host_url_reaches_the_stage_pool_as_the_engines_read_it():
    """The worker's asyncpg stage pool gets the hosts, ports and target_session_attrs
    SQLAlchemy's engines connect with (driver_target)."""
    url = (
        "postgresql+asyncpg://u:pw@/pinlog?host=10.0.0.1:5432&host=10.0.0.2:5433"
        "&target_session_attrs=read-write"
    )
    assert driver_target(url) == {
        "user": "u",
        "password": "pw",
        "database": "pinlog",
        "host": ["10.0.0.1", "10.0.0.2"],
        "port": [5432, 5433],
        "target_session_attrs": "read-write",
    }
