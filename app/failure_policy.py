"""The one owner of the §6 retry and failure policy; providers, the breaker and stages ask it.

- Which provider HTTP answers are transient, which say the provider refuses every call alike
  (``ProviderRefusedError``: the only errors the circuit breaker counts), and which are about
  one request's input (plain ``PermanentError``: that stage fails, the breaker is untouched).
- How often one call is retried (``PROVIDER_MAX_RETRIES``, honouring ``Retry-After`` up to
  ``RETRY_AFTER_CAP_SECONDS``) and how often an invalid judgment is re-asked (``JUDGE_REASKS``).
- The hard deadline of one stage, from its claim to its save (``stage_deadline_seconds``).

Leaf module: imports only ``app.errors``. Messages name the layer and at most the status code
and a number we parsed; never upstream text (§6).
"""

from __future__ import annotations

from app.errors import (
    InvalidInputError,
    PermanentError,
    ProviderRefusedError,
    TransientError,
    WorkerError,
)

# The upstream may answer differently next time.
TRANSIENT_STATUSES = frozenset({408, 409, 429})
# Every call would get the same answer: bad key, no access, unknown model or path.
PROVIDER_WIDE_STATUSES = frozenset({401, 403, 404})
# OpenAI-compatible error codes that say the same under another status (e.g. a gateway's 400).
PROVIDER_WIDE_CODES = frozenset({"invalid_api_key", "model_not_found"})
# The model's own word that the input is too long: invalid input like our own length check
# (WARNING, FC-09; 422 on search), not a fault of ours or the provider's.
INPUT_TOO_LONG_CODES = frozenset({"context_length_exceeded", "string_above_max_length"})

# Retries inside one provider call (app/providers/openai_http.py; the openai SDK's policy,
# kept when the SDK was replaced): a server-directed Retry-After is honoured up to the cap and
# a longer one ends the call at once (FC-07); otherwise exponential backoff with jitter.
RETRY_AFTER_CAP_SECONDS = 120.0
RETRY_INITIAL_DELAY_SECONDS = 0.5
RETRY_MAX_DELAY_SECONDS = 8.0

# Re-asks of a judgment whose answer does not parse or has no usable structure (§6 "still
# invalid after retries"). Truncation and refusal are not re-asked: the same note and
# candidates at temperature 0 get the same answer again (FC-08).
JUDGE_REASKS = 1

# The stage deadline ends this share of the PROCESSING expiry after the claim. The margin
# (10 %, 60 s of the default 600 s) covers the save's commit and the gap between the
# application's clock, which runs the deadline, and the database's, which runs the expiry.
STAGE_DEADLINE_FRACTION = 0.9


def status_error(
    layer: str, status: int, *, code: str | None = None, retry_after: float | None = None
) -> WorkerError:
    """The §6 class of an HTTP error answer from ``layer`` (``"embedding"`` / ``"judge"``).

    ``code`` is the upstream's machine-readable error code, compared but never quoted;
    ``retry_after`` (seconds) is a number we parsed and may be named in the message (FC-07).
    """
    message = f"{layer} upstream {status}"
    if retry_after is not None:
        message += f" (retry-after {retry_after:g} s)"
    if status in TRANSIENT_STATUSES or status >= 500:
        return TransientError(message)
    if status in PROVIDER_WIDE_STATUSES or code in PROVIDER_WIDE_CODES:
        return ProviderRefusedError(message)
    if code in INPUT_TOO_LONG_CODES:
        return InvalidInputError(f"{message}: text is longer than the model accepts")
    return PermanentError(message)


def counts_against_provider(exc: BaseException) -> bool:
    """True for errors that say the provider refuses every call (the breaker counts them)."""
    return isinstance(exc, ProviderRefusedError)


def stage_deadline_seconds(processing_expiry_seconds: float) -> float:
    """Seconds from a stage's claim to its save, after which the stage is abandoned
    (left ``PROCESSING``, transient) so that no reclaim can meet a live attempt (§2, §10 #9)."""
    return processing_expiry_seconds * STAGE_DEADLINE_FRACTION
