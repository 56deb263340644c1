"""Neither service serves interactive docs or its OpenAPI schema (issue 8 item 8): internal
endpoints publish no map of themselves, and the docs pages would load assets from a CDN."""

from __future__ import annotations

import pytest

DOC_PATHS = ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect")


@pytest.mark.parametrize("path", DOC_PATHS)
async def test_worker_serves_no_docs(worker, path):
    response = await worker.client.get(path)
    assert response.status_code in (401, 404)


@pytest.mark.parametrize("path", DOC_PATHS)
async def test_core_serves_no_docs(core_with_fake_worker, path):
    response = await core_with_fake_worker.client.get(path)
    assert response.status_code == 404
