"""Neither service serves interactive docs or its OpenAPI schema by default: internal
endpoints publish no map of themselves, and the docs pages would load assets from a CDN. The
core serves its client API's document at /api/v1/openapi.json when asked
(``PINLOG_CORE_SERVE_OPENAPI``): the committed one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

COMMITTED_DOCUMENT = json.loads(
    (Path(__file__).resolve().parents[3] / "docs/openapi/core-client.json").read_text("utf-8")
)
DOC_PATHS = ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect")


@pytest.mark.parametrize("path", DOC_PATHS)
async def test_worker_serves_no_docs(worker, path):
    response = await worker.client.get(path)
    assert response.status_code in (401, 404)


@pytest.mark.parametrize("path", DOC_PATHS)
async def test_core_serves_no_docs(core_with_fake_worker, path):
    response = await core_with_fake_worker.client.get(path)
    assert response.status_code == 404


async def test_core_serves_no_openapi_document_by_default(core_with_fake_worker):
    response = await core_with_fake_worker.client.get("/api/v1/openapi.json")
    assert response.status_code == 404


async def test_core_serves_the_committed_openapi_document_when_asked(make_core, fake_worker):
    async with make_core(fake_worker.base_url, serve_openapi=True) as core:
        served = await core.client.get("/api/v1/openapi.json")
        docs = await core.client.get("/docs")
    assert served.status_code == 200
    assert served.json() == COMMITTED_DOCUMENT
    assert docs.status_code == 404
