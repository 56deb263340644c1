"""``pinlog-ai smoke`` as a real subprocess against the fake provider.

One line per check on stdout; exit 0 when every check passes, 5 when a provider check fails, 2
for settings. No database setting is given: the command never connects, so it cannot write
anything.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass

from pinlog_platform.cli import exit_codes
from tests.e2e.test_cli_startup_problems import KEY
from tests.fake_openai import Scripted, embedding_body, judge_body

CHECKS = (
    "embedding call", "embedding dimension", "embedding profile", "embedding latency",
    "judge call", "judge output", "judge latency",
)  # fmt: skip


@dataclass(frozen=True)
class Run:
    code: int
    out: list[str]
    err: list[str]

    def line(self, check: str) -> str:
        (line,) = [line for line in self.out if line[5:].startswith(f"{check}:")]
        return line


async def _smoke(fake, *args: str, **env: str) -> Run:
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("PINLOG_")}
    settings = {
        "PINLOG_EMBEDDING_API_KEY": KEY,
        "PINLOG_JUDGE_API_KEY": KEY,
        "PINLOG_EMBEDDING_BASE_URL": fake.base_url,
        "PINLOG_JUDGE_BASE_URL": fake.base_url,
        **env,
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", "smoke", *args,
        env={**base, **settings},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    run = Run(process.returncode, out.decode().splitlines(), err.decode().splitlines())
    assert "Traceback" not in "\n".join(run.err)
    assert KEY not in "\n".join(run.out + run.err)
    return run


async def test_smoke_passes_against_the_fake_with_one_line_per_check(fake_openai):
    run = await _smoke(fake_openai)

    assert run.code == 0, run
    assert [line[5:].split(":")[0] for line in run.out[:-1]] == list(CHECKS)
    assert all(line.startswith("ok ") for line in run.out[:-1]), run.out
    assert run.out[-1] == "smoke: passed"
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (1, 1)


async def test_a_refusing_embedding_provider_fails_the_call_check_with_exit_5(fake_openai):
    fake_openai.set_fault("embeddings", Scripted(status=401))

    run = await _smoke(fake_openai)

    assert run.code == exit_codes.PROVIDER
    assert run.line("embedding call").startswith("FAIL embedding call: embedding upstream 401")
    assert run.line("embedding dimension").startswith("skip")
    assert run.line("judge output").startswith("ok"), "the judge is still checked"


async def test_a_wrong_dimension_fails_the_dimension_check(fake_openai):
    fake_openai.set_embedding_dimension(8)

    run = await _smoke(fake_openai)

    assert run.code == exit_codes.PROVIDER
    assert run.line("embedding dimension") == (
        "FAIL embedding dimension: embedding dimension mismatch: expected 1536, got 8"
    )


async def test_another_model_answering_fails_the_profile_check(fake_openai):
    fake_openai.script_embeddings(Scripted(json=embedding_body([[1.0] * 1536], model="other")))

    run = await _smoke(fake_openai)

    assert run.code == exit_codes.PROVIDER
    assert run.line("embedding profile") == (
        "FAIL embedding profile: the profile names text-embedding-3-small, other answered"
    )


async def test_a_slow_provider_fails_the_latency_check(fake_openai):
    fake_openai.script_judge(Scripted(delay_seconds=0.6))

    run = await _smoke(fake_openai, "--max-latency-seconds", "0.5")

    assert run.code == exit_codes.PROVIDER
    assert run.line("judge latency").startswith("FAIL judge latency: ")
    assert run.line("embedding latency").startswith("ok")


async def test_an_answer_outside_the_structured_output_contract_fails_the_output_check(
    fake_openai,
):
    fake_openai.set_judge_selection(lambda ids: [(999, 0.9)])
    unknown_id = await _smoke(fake_openai)
    fake_openai.reset()
    fake_openai.set_fault("judge", Scripted(json=judge_body([], raw_content="not json")))
    not_json = await _smoke(fake_openai)
    fake_openai.reset()
    fake_openai.set_fault("judge", Scripted(status=503))
    down = await _smoke(fake_openai, **{"PINLOG_PROVIDER_MAX_RETRIES": "0"})

    assert unknown_id.code == not_json.code == down.code == exit_codes.PROVIDER
    assert unknown_id.line("judge output") == (
        "FAIL judge output: selections outside the contract: unknown_id x1"
    )
    assert not_json.line("judge output") == "FAIL judge output: judge output invalid"
    assert down.line("judge call").startswith("FAIL judge call: judge upstream 503")


async def test_settings_problems_exit_2(fake_openai):
    run = await _smoke(fake_openai, PINLOG_JUDGE_API_KEY="")

    assert run.code == exit_codes.CONFIGURATION
    assert any("PINLOG_JUDGE_API_KEY" in line for line in run.err)
    assert fake_openai.embedding_calls == fake_openai.judge_calls == 0
