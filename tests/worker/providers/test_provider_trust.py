"""What the provider HTTP client trusts, against real HTTP servers: a 307/308
to the same origin is followed with the same body; a redirect to another origin, and any
301/302/303, is a provider-wide error and the other origin receives nothing; an answer larger
than the cap (declared, streamed, or a small gzip answer that inflates) is a classified error
read no further than the cap."""

from __future__ import annotations

import gzip
import time

import numpy as np
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from app.errors import ProviderProtocolError, ProviderUnavailableError
from app.providers.openai_compatible import OpenAIEmbedder
from app.providers.openai_http import embedding_answer_cap
from tests.worker.harness import serving

DIMENSION = 8


def _embeddings(count: int) -> dict:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": [0.5] * DIMENSION}
            for i in range(count)
        ],
        "model": "m",
    }


class Upstream:
    def __init__(self, other_origin: str = "") -> None:
        self.other_origin = other_origin
        self.bodies: list[bytes] = []
        self.app = Starlette(routes=[Route("/{mode}/embeddings", self.answer, methods=["POST"])])

    async def answer(self, request: Request) -> Response:
        mode = request.path_params["mode"]
        self.bodies.append(await request.body())
        if mode == "same307":
            return RedirectResponse("/ok/embeddings", status_code=307)
        if mode == "same308":
            return RedirectResponse("/ok/embeddings", status_code=308)
        if mode == "other307":
            return RedirectResponse(f"{self.other_origin}/ok/embeddings", status_code=307)
        if mode == "found302":
            return RedirectResponse("/ok/embeddings", status_code=302)
        if mode == "huge":
            return StreamingResponse(_megabytes(150), media_type="application/json")
        if mode == "declared":
            return Response(b"{}", headers={"Content-Length": str(150 * 2**20)})
        if mode == "gzip":
            return Response(
                BOMB, media_type="application/json", headers={"Content-Encoding": "gzip"}
            )
        return JSONResponse(_embeddings(1))


async def _megabytes(count: int):
    chunk = b" " * 2**20
    for _ in range(count):
        yield chunk


# 64 MiB of spaces in about 64 KiB of gzip.
BOMB = gzip.compress(b" " * (64 * 2**20), compresslevel=9)


@pytest.fixture
async def upstreams():
    other = Upstream()
    async with serving(other.app) as other_url:
        main = Upstream(other_url)
        async with serving(main.app) as main_url:
            yield main, main_url, other


def _embedder(base_url: str) -> OpenAIEmbedder:
    return OpenAIEmbedder(
        base_url=base_url,
        api_key="sk-test",
        model="m",
        dimension=DIMENSION,
        timeout_seconds=10,
        max_retries=0,
        encoding="float",
    )


@pytest.mark.parametrize("mode", ["same307", "same308"])
async def test_a_same_origin_307_or_308_is_followed_with_the_same_body(upstreams, mode):
    main, url, _ = upstreams
    embedder = _embedder(f"{url}/{mode}")
    try:
        (vector,) = await embedder.embed(["note"])
    finally:
        await embedder.aclose()
    assert vector.shape == (DIMENSION,) and np.all(vector > 0)  # normalised
    assert len(main.bodies) == 2 and main.bodies[0] == main.bodies[1]


@pytest.mark.parametrize("mode", ["other307", "found302"])
async def test_a_cross_origin_or_method_changing_redirect_is_a_provider_wide_error(upstreams, mode):
    _, url, other = upstreams
    embedder = _embedder(f"{url}/{mode}")
    try:
        with pytest.raises(ProviderUnavailableError, match="redirect"):
            await embedder.embed(["note"])
    finally:
        await embedder.aclose()
    assert other.bodies == [], "the note was re-posted to another origin"


@pytest.mark.parametrize("mode", ["huge", "declared", "gzip"])
async def test_an_answer_over_the_cap_is_a_classified_error_read_no_further(upstreams, mode):
    _, url, _ = upstreams
    embedder = _embedder(f"{url}/{mode}")
    started = time.monotonic()
    try:
        with pytest.raises(ProviderProtocolError, match="larger than"):
            await embedder.embed(["note"])
    finally:
        await embedder.aclose()
    assert time.monotonic() - started < 5
    assert embedding_answer_cap(1, DIMENSION) < 2**20
