"""One JSON POST to an OpenAI-compatible endpoint, with the §6 retries of one call (FC-07).

A thin client on ``aiohttp`` in place of the ``openai`` SDK: the worker reads raw JSON bodies
and validates them itself (``openai_wire``), so the SDK's request transforms and response
models were pure per-call cost (most of the worker's CPU after the database).

Retries within one call follow the policy the SDK applied before (``failure_policy``):
connection errors, timeouts and 408/409/429/5xx are retried up to ``max_retries`` times
(``x-should-retry: true|false`` from the server wins), except answers ``failure_policy``
classes as input or provider-wide (a ``429 insufficient_quota`` is not a rate limit: the same
request would get it again); a ``Retry-After`` of at most
``RETRY_AFTER_CAP_SECONDS`` is honoured, a longer one ends the call at once; otherwise the
wait is an exponential backoff with jitter. ``timeout_seconds`` bounds each attempt.

Every request that goes on the wire, each retry and each redirect followed included, first
takes the client's rate budget (``use_budget``: one request and the call's estimated tokens,
``app.providers.rate_budget``), so retries are never free. An attempt that failed settles its
tokens to its answer's ``usage`` when the error body carries one and keeps the estimate
otherwise (a timeout, a refused connection: the provider may have counted the tokens); the
successful attempt's grant is returned with the body for the caller to settle. The tokens an
error answer reports are billed by the provider: they also go to ``on_billed_error`` (the usage
ledger and the daily token cap, ``openai_compatible``), since the caller only sees the call's
last outcome and a retried call's failed attempts would be counted nowhere else.

Errors: ``TransientError`` ("<layer> upstream timeout" / "unreachable", or a transient status),
the ``failure_policy.status_error`` class of an HTTP error answer (read from its ``error.code``,
``error.type`` and ``error.param``), ``ProviderProtocolError`` for a 2xx body that is not JSON.
Messages never quote the upstream body, the URL or the key.

What the client trusts: a 307/308 to the same origin (scheme, host, port) is
followed with the same body, at most ``MAX_REDIRECTS`` times; any redirect to another origin,
and any 301/302/303 (which would turn the POST into a GET), is ``ProviderUnavailableError``
with reason ``protocol`` (provider-wide: the endpoint is misconfigured, every call
would meet it). An answer larger
than ``max_answer_bytes`` after decompression (declared by ``Content-Length`` or counted while
it streams, so a gzip answer never inflates past the cap in memory) is
``ProviderProtocolError``; the caps are derived from the settings (``embedding_answer_cap``,
``judge_answer_cap``). Error answers are read up to ``ERROR_BODY_BYTES`` only.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from yarl import URL

from app import failure_policy
from app.errors import ProviderProtocolError, ProviderUnavailableError, TransientError
from app.providers import openai_wire
from app.providers.rate_budget import Grant, RateBudget
from pinlog_platform import tracing

MAX_REDIRECTS = 3
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
ERROR_BODY_BYTES = 65536
# Bytes one JSON float takes at most in an embeddings answer ("-0.012345678901234567, "), and
# room for the envelope (model, usage, object names).
JSON_FLOAT_BYTES = 24
ENVELOPE_BYTES = 16384
DEFAULT_MAX_ANSWER_BYTES = 4 * 1024 * 1024
# Idle pooled connections are closed by us after this many seconds (aiohttp's default is 15),
# before a server with a short keep-alive (uvicorn's default, common behind OpenAI-compatible
# gateways, is 5 s) closes them under a request: such a call fails as "unreachable" without
# the provider having seen it, and with no retries configured it costs the stage an attempt.
KEEPALIVE_SECONDS = 4.0


def embedding_answer_cap(batch_size: int, dimension: int) -> int:
    """The largest embeddings answer accepted: batch size x dimension x 24 bytes per JSON
    float, twice over (indentation, per-item fields), plus the envelope."""
    return batch_size * dimension * JSON_FLOAT_BYTES * 2 + ENVELOPE_BYTES


def judge_answer_cap(top_k: int) -> int:
    """The largest judge answer accepted: 1 MiB for the chat envelope and a verbose answer
    (reasoning text, escapes; hostile shapes must still reach the parser and be classified
    there), plus 16 KiB per candidate."""
    return 2**20 + top_k * 16384


@dataclass(frozen=True, slots=True)
class Answer:
    """A 2xx answer's parsed JSON ``body`` and the budget ``grant`` of the request that got it
    (``None`` without a budget): settle it with the answer's tokens."""

    body: Any
    grant: Grant | None


class JsonEndpointClient:
    """POSTs JSON to ``{base_url}/<path>`` with a bearer key; one connection pool per client."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout_seconds: float,
        retries: int,
        *,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
        send_traceparent: bool = False,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        # Off by default: a provider learns nothing of our traces unless the operator says so.
        self._send_traceparent = send_traceparent
        self._max_answer_bytes = max_answer_bytes
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._retries = retries
        self._session: aiohttp.ClientSession | None = None
        # Taken before every wire request; told every answer's status, headers and error.
        self.budget: RateBudget | None = None
        # Told the tokens each error answer reports (``layer``, tokens): billed, not answered.
        self.on_billed_error: Callable[[str, int], None] | None = None

    @property
    def counts_tokens(self) -> bool:
        """Whether the budget limits tokens (callers estimate them only then)."""
        return self.budget is not None and self.budget.token_limit is not None

    async def post(
        self,
        layer: str,
        path: str,
        payload: dict[str, Any],
        *,
        tokens: int = 0,
        max_answer_bytes: int | None = None,
    ) -> Answer:
        """The parsed JSON body of a 2xx answer to ``payload`` with its request's grant;
        raises as the module says. ``tokens``: the estimate each attempt takes from the budget.
        ``max_answer_bytes`` overrides the client's cap for this call (an embeddings batch)."""
        cap = self._max_answer_bytes if max_answer_bytes is None else max_answer_bytes
        # orjson: UTF-8 without escapes, like json.dumps(ensure_ascii=False), at a tenth of the
        # CPU (the judge request carries ten candidates with their examples).
        body = orjson.dumps(payload)
        url = URL(f"{self._base_url}/{path}")
        # The span names the layer and path only: never the URL, key, body or answer.
        with tracing.span(f"provider {layer}", kind="client", path=path):
            return await self._post(layer, url, body, tokens, cap)

    async def _post(self, layer: str, url: URL, body: bytes, tokens: int, cap: int) -> Answer:
        sent_headers = tracing.outgoing_headers() if self._send_traceparent else None
        redirects = 0
        attempt = 0
        while True:
            last = attempt >= self._retries
            grant = await self.budget.acquire(tokens) if self.budget is not None else None
            try:
                async with self._client().post(
                    url,
                    data=body,
                    headers=sent_headers,
                    timeout=self._timeout,
                    allow_redirects=False,
                ) as answer:
                    status, headers = answer.status, answer.headers
                    if status in REDIRECT_STATUSES:
                        url = _same_origin_redirect(layer, url, status, headers)
                        redirects += 1
                        if redirects > MAX_REDIRECTS:
                            raise _redirect_error(layer, status, "redirects too often")
                        continue
                    raw = await read_capped(
                        layer,
                        answer,
                        cap if status < 400 else ERROR_BODY_BYTES,
                        truncate=status >= 400,
                    )
            except (TimeoutError, aiohttp.ServerTimeoutError):
                if last:
                    raise TransientError(f"{layer} upstream timeout") from None
                await asyncio.sleep(_backoff(attempt))
                attempt += 1
                continue
            except aiohttp.ClientError:
                if last:
                    raise TransientError(f"{layer} upstream unreachable") from None
                await asyncio.sleep(_backoff(attempt))
                attempt += 1
                continue
            if status < 400:
                if self.budget is not None:
                    self.budget.observe(status, headers, None)
                return Answer(_json(layer, raw), grant)
            retry_after = _retry_after(headers)
            code, error_type, param = error_fields(raw)
            error = failure_policy.status_error(
                layer,
                status,
                code=code,
                error_type=error_type,
                param=param,
                retry_after=retry_after,
            )
            if self.budget is not None:
                self.budget.observe(status, headers, error)
            used = error_usage(raw)
            if used is not None:
                if grant is not None:
                    grant.settle(used)
                if self.on_billed_error is not None:
                    self.on_billed_error(layer, used)
            if last or not _should_retry(error, headers, retry_after):
                raise error
            await asyncio.sleep(_wait(attempt, retry_after))
            attempt += 1

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        # Created on first use, inside the running loop that will use it.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=100, keepalive_timeout=KEEPALIVE_SECONDS),
            )
        return self._session


def _same_origin_redirect(layer: str, url: URL, status: int, headers: Any) -> URL:
    """Where a 307/308 to the same origin points; anything else is provider-wide (module
    docstring). The message names the status, never the location."""
    location = headers.get("Location")
    if status not in (307, 308) or not location:
        raise _redirect_error(layer, status, f"answered redirect {status}")
    target = url.join(URL(location))
    if (target.scheme, target.host, target.port) != (url.scheme, url.host, url.port):
        raise _redirect_error(layer, status, f"redirected {status} to another origin")
    return target


def _redirect_error(layer: str, status: int, what: str) -> ProviderUnavailableError:
    return ProviderUnavailableError(
        f"{layer} upstream {what}", layer=layer, reason="protocol", status=status
    )


async def read_capped(
    layer: str, answer: aiohttp.ClientResponse, cap: int, *, truncate: bool
) -> bytes:
    """The (decompressed) body, at most ``cap`` bytes: beyond, the rest is dropped when
    ``truncate``, else ``ProviderProtocolError``."""
    declared = answer.content_length
    if declared is not None and declared > cap and not truncate:
        raise ProviderProtocolError(f"{layer} upstream answer larger than {cap} bytes", layer=layer)
    chunks: list[bytes] = []
    size = 0
    async for chunk in answer.content.iter_chunked(65536):
        size += len(chunk)
        if size > cap:
            if truncate:
                chunks.append(chunk[: len(chunk) - (size - cap)])
                break
            raise ProviderProtocolError(
                f"{layer} upstream answer larger than {cap} bytes", layer=layer
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _json(layer: str, raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:  # what orjson refuses but the json module reads (NaN literals): judged by openai_wire
        return json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        raise openai_wire.malformed(layer, "not JSON") from None


def _should_retry(error: Exception, headers: Any, retry_after: float | None) -> bool:
    if not failure_policy.retried_within_call(error):
        return False
    if retry_after is not None and retry_after > failure_policy.RETRY_AFTER_CAP_SECONDS:
        return False
    return headers.get("x-should-retry") != "false"


def _wait(attempt: int, retry_after: float | None) -> float:
    if retry_after is not None and 0 < retry_after <= failure_policy.RETRY_AFTER_CAP_SECONDS:
        return retry_after
    return _backoff(attempt)


def _backoff(attempt: int) -> float:
    delay = min(
        failure_policy.RETRY_INITIAL_DELAY_SECONDS * 2.0**attempt,
        failure_policy.RETRY_MAX_DELAY_SECONDS,
    )
    return delay * (1 - 0.25 * random.random())


def _retry_after(headers: Any) -> float | None:
    """The upstream's ``Retry-After`` (or ``retry-after-ms``) in seconds, when a number."""
    try:
        milliseconds = headers.get("retry-after-ms")
        value = float(milliseconds) / 1000 if milliseconds else float(headers.get("retry-after"))
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and 0 <= value < 1e9 else None


def error_usage(raw: bytes) -> int | None:
    """``usage.total_tokens`` of an error body, when it carries a count (some gateways bill
    and report failed calls); ``None`` otherwise."""
    try:
        usage = orjson.loads(raw).get("usage")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    return total if type(total) is int and total >= 0 else None


# What an error field may look like to be compared and logged: an identifier, never prose.
_IDENTIFIER = re.compile(r"[A-Za-z0-9_.\-\[\]]{1,64}")


def error_fields(raw: bytes) -> tuple[str | None, str | None, str | None]:
    """``(error.code, error.type, error.param)`` of an error body (OpenAI's shape), each
    ``None`` unless an identifier (``_IDENTIFIER``): compared and logged, never quoted prose,
    and never the ``message`` (§6)."""
    try:
        error = orjson.loads(raw).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None, None, None
    if not isinstance(error, dict):
        return None, None, None
    return tuple(_identifier(error.get(key)) for key in ("code", "type", "param"))  # type: ignore[return-value]


def _identifier(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)  # some servers put the HTTP status in ``code``
    if isinstance(value, str) and _IDENTIFIER.fullmatch(value):
        return value
    return None
