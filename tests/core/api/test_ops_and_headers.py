"""Operational endpoints off the public port and response headers for
private data (item 8), over real HTTP."""

from __future__ import annotations

import asyncio
import os
import socket
import sys

from tests.core.harness import bearer

PUBLIC_PATHS = ("/api/v1/records/1", "/api/v1/records/999", "/api/v1/search")


async def test_metrics_are_absent_on_the_public_listener_and_served_on_the_ops_one(
    make_core, fake_worker
):
    async with make_core(fake_worker.base_url, ops_port=None) as default:
        assert default.app.state.ops_base_url is None and default.ops is None
        assert (await default.client.get("/metrics")).status_code == 404
        ready = await default.client.get("/readyz")
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        assert (await default.client.get("/healthz")).status_code == 200

    async with make_core(fake_worker.base_url) as with_ops:
        assert (await with_ops.client.get("/metrics")).status_code == 404
        assert with_ops.app.state.ops_base_url.startswith("http://127.0.0.1:")
        metrics = await with_ops.ops.get("/metrics")
        assert metrics.status_code == 200 and "pinlog_core_http_request_seconds" in metrics.text
        # The detailed readiness says whether dispatching is paused (docs/operations.md).
        ready = (await with_ops.ops.get("/readyz")).json()
        assert ready == {"status": "ready", "dispatch": "running"}
        assert (await with_ops.ops.get("/api/v1/records/1")).status_code == 404


async def test_public_readiness_says_only_ready_or_not(make_core, fake_worker, engine):
    async with make_core(fake_worker.base_url) as core:
        await core.app.state.probe_engine.dispose()
        # A probe engine pointed nowhere: the public answer carries no reason.
        from sqlalchemy.ext.asyncio import create_async_engine

        core.app.state.probe_engine = create_async_engine(
            "postgresql+asyncpg://nobody@127.0.0.1:9/none"
        )
        try:
            public = await core.client.get("/readyz")
            ops = await core.ops.get("/readyz")
        finally:
            await core.app.state.probe_engine.dispose()
        assert (public.status_code, public.json()) == (503, {"status": "unavailable"})
        assert (ops.status_code, ops.json()["problems"]) == (503, ["database"])


async def test_every_authenticated_answer_is_no_store_and_nosniff(core_with_fake_worker):
    core = core_with_fake_worker
    created = await core.create(1, "메모")
    answers = [
        created,
        await core.client.get(f"/api/v1/records/{created.json()['recordId']}", headers=bearer(1)),
        await core.client.get("/api/v1/records/999999", headers=bearer(1)),
        await core.client.get("/api/v1/records/1"),  # 401
        await core.client.post("/api/v1/search", json={"query": 1}, headers=bearer(1)),  # 422
    ]
    for response in answers:
        assert response.headers["Cache-Control"] == "no-store", response.status_code
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    health = await core.client.get("/healthz")
    assert health.headers["X-Content-Type-Options"] == "nosniff"


async def test_no_redirect_reflects_the_host_header(core_with_fake_worker):
    client = core_with_fake_worker.client
    for path in ("/api/v1/records/", "/healthz/", "/api/v1/search/"):
        response = await client.get(
            path, headers={"Host": "evil.example", **bearer(1)}, follow_redirects=False
        )
        assert response.status_code not in (301, 302, 307, 308), path
        assert "evil.example" not in response.headers.get("Location", "")


async def _serve(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("PINLOG_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "core_service.cli", "serve", *args,
        env={**base, **env}, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, stderr.decode()


async def test_an_ops_port_that_cannot_be_bound_exits_2_naming_it(migrated_database):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    env = {
        "PINLOG_CORE_DATABASE_URL": migrated_database,
        "PINLOG_CORE_WORKER_BASE_URL": "http://127.0.0.1:9",
        "PINLOG_CORE_INTERNAL_SECRET": "ops-test-internal-secret-0123456789abcdef",
        "PINLOG_CORE_JWT_SECRET": "ops-test-jwt-secret-0123456789abcdefghijkl",
        "PINLOG_CORE_EMBEDDING_PROFILE": "p",
    }
    try:
        code, stderr = await _serve(["--port", "0", "--ops-port", str(port)], env)
        env_code, env_stderr = await _serve(
            ["--port", "0"], {**env, "PINLOG_CORE_OPS_PORT": str(port)}
        )
    finally:
        taken.close()
    for exit_code, text in ((code, stderr), (env_code, env_stderr)):
        assert exit_code == 2, text
        assert "PINLOG_CORE_OPS_PORT" in text and f"127.0.0.1:{port}" in text
        assert "Traceback" not in text
