"""The one owner of the §6 retry and failure policy (with its deviation, docs/contract.md);
providers, the provider gates and the stages ask it.

Every provider answer falls in one class (docs/failures.md, "Provider answers"):

- *input* (this note only): ``InvalidInputError`` with a ``FailureReason``; that stage ends
  ``FAILED``; the gate is untouched (the provider accepted key, model and parameters);
- *provider-wide*: ``ProviderUnavailableError`` with a reason label; the stage is left
  ``PROCESSING`` (transient) and the provider's gate counts it;
- *transient*: ``TransientError``; the stage is left ``PROCESSING``; the gate is untouched.

It also owns how often one call is retried (``PROVIDER_MAX_RETRIES``, honouring
``Retry-After`` up to ``RETRY_AFTER_CAP_SECONDS``), how often an invalid judgment is re-asked
(``JUDGE_REASKS``) and the hard deadline of one stage (``stage_deadline_seconds``).

Leaf module: imports only ``app.errors`` and the shared reason codes. Messages name the layer,
the status and at most our own reason label; never upstream text (§6).
"""

from __future__ import annotations

from app.errors import (
    DimensionMismatchError,
    InvalidInputError,
    ProviderUnavailableError,
    TransientError,
    WorkerError,
)
from pinlog_platform.contract.states.failure_reasons import FailureReason

# The upstream may answer differently next time (RFC 9110 408, 409 as the openai SDK retries
# it, 429 rate limits; any 5xx).
TRANSIENT_STATUSES = frozenset({408, 409, 429})

# --- input: this note only (each code wins over ``error.param``) --------------------------
# OpenAI error codes for an input beyond the model's window (chat and embeddings).
INPUT_TOO_LONG_CODES = frozenset({"context_length_exceeded", "string_above_max_length"})
# A content-policy refusal of this input: OpenAI ``content_policy_violation`` and
# ``invalid_prompt`` (a prompt flagged by its usage policy), Azure OpenAI ``content_filter``.
CONTENT_POLICY_CODES = frozenset({"content_policy_violation", "content_filter", "invalid_prompt"})
# ``error.param`` naming the note itself, by layer: the embeddings ``input``, the chat
# ``messages`` (or a legacy ``prompt``); indexed forms such as ``input[0]`` or
# ``messages[1].content`` too. Any other param is a request parameter (provider-wide).
INPUT_PARAMS = {"embedding": ("input",), "judge": ("messages", "prompt")}

# --- provider-wide: every note would get it ------------------------------------------------
# OpenAI ``insufficient_quota`` (a 429 with that type and code: the plan's quota or billing),
# ``billing_hard_limit_reached`` / ``billing_not_active`` (the account's billing limit).
QUOTA_CODES = frozenset({"insufficient_quota", "billing_hard_limit_reached", "billing_not_active"})
# OpenAI ``invalid_api_key`` (401), Anthropic-style and gateway ``authentication_error`` types.
AUTHENTICATION_CODES = frozenset(
    {"invalid_api_key", "authentication_error", "invalid_authentication"}
)
# OpenAI ``permission_error`` type (403), ``unsupported_country_region_territory``.
PERMISSION_CODES = frozenset({"permission_error", "unsupported_country_region_territory"})
# OpenAI ``model_not_found`` (404, or 400 behind some gateways).
UNKNOWN_MODEL_CODES = frozenset({"model_not_found"})
# OpenAI ``unsupported_value`` (e.g. ``temperature: 0`` on reasoning models) and
# ``unsupported_parameter``; ``invalid_response_format`` / ``json_schema`` refusals of servers
# without structured output name ``param: response_format`` and are caught by the param rule.
UNSUPPORTED_CODES = frozenset({"unsupported_value", "unsupported_parameter"})

# The labels ``ProviderUnavailableError.reason`` takes (``/readyz`` names them).
PROVIDER_WIDE_REASONS = frozenset(
    {
        "authentication",
        "permission",
        "quota",
        "unknown_model",
        "unsupported_parameter",
        "not_found",
        "unrecognised",
        "protocol",
        "dimension_mismatch",
        "local_model",  # an offline model that fails for every input
    }
)

# Retries inside one provider call (app/providers/openai_http.py; the openai SDK's policy,
# kept when the SDK was replaced): a server-directed Retry-After is honoured up to the cap and
# a longer one ends the call at once (FC-07); otherwise exponential backoff with jitter. Input
# and provider-wide answers are never retried inside the call: the same request gets the same
# answer.
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
    layer: str,
    status: int,
    *,
    code: str | None = None,
    error_type: str | None = None,
    param: str | None = None,
    retry_after: float | None = None,
) -> WorkerError:
    """The class of an HTTP error answer from ``layer`` (``"embedding"`` / ``"judge"``).

    ``code``, ``error_type`` and ``param`` are the error body's ``error.code``, ``error.type``
    and ``error.param`` (identifiers, compared and logged, never the message); they are read
    on every status, 429 included. ``retry_after`` (seconds) is a number we parsed and may be
    named in the message (FC-07). The rows, in order:

    1. a quota or billing code or type, on any status -> provider-wide ``quota``;
    2. an authentication code or type, on any status -> ``authentication``;
    3. ``model_not_found``, on any status -> ``unknown_model``;
    4. 408, 409, 429 and 5xx -> transient;
    5. a 4xx with an input code -> input (``input_too_long`` / ``input_rejected``);
    6. 401 -> ``authentication``, 403 -> ``permission``, 404 -> ``not_found``;
    7. a 4xx with an unsupported-parameter code -> ``unsupported_parameter``;
    8. a 4xx whose ``param`` names the note (``INPUT_PARAMS``) -> input ``input_rejected``;
       any other ``param`` -> ``unsupported_parameter``;
    9. any other status (a 4xx with no code and no param) -> provider-wide ``unrecognised``:
       a misconfigured gateway must not fail every note; a truly bad input is still bounded
       by the core's retry budget and ends ``retries_exhausted``.
    """
    message = f"{layer} upstream {status}"
    if retry_after is not None:
        message += f" (retry-after {retry_after:g} s)"
    identifiers = {code, error_type}

    def provider_wide(reason: str) -> ProviderUnavailableError:
        return ProviderUnavailableError(
            f"{message}: provider-wide ({reason})",
            layer=layer,
            reason=reason,
            status=status,
            code=code,
            error_type=error_type,
            param=param,
        )

    if identifiers & QUOTA_CODES:
        return provider_wide("quota")
    if identifiers & AUTHENTICATION_CODES:
        return provider_wide("authentication")
    if code in UNKNOWN_MODEL_CODES:
        return provider_wide("unknown_model")
    if status in TRANSIENT_STATUSES or status >= 500:
        return TransientError(message)
    if code in INPUT_TOO_LONG_CODES:
        return InvalidInputError(
            f"{message}: text is longer than the model accepts",
            reason=FailureReason.INPUT_TOO_LONG,
        )
    if code in CONTENT_POLICY_CODES:
        return InvalidInputError(f"{message}: input refused by the provider's policy")
    if status == 401:
        return provider_wide("authentication")
    if status == 403 or identifiers & PERMISSION_CODES:
        return provider_wide("permission")
    if status == 404:
        return provider_wide("not_found")
    if code in UNSUPPORTED_CODES:
        return provider_wide("unsupported_parameter")
    if param is not None:
        if _names_the_input(layer, param):
            return InvalidInputError(f"{message}: input refused as invalid by the provider")
        return provider_wide("unsupported_parameter")
    return provider_wide("unrecognised")


def _names_the_input(layer: str, param: str) -> bool:
    for name in INPUT_PARAMS.get(layer, ()):
        if param == name or param.startswith((f"{name}[", f"{name}.")):
            return True
    return False


def retried_within_call(error: WorkerError) -> bool:
    """True when one call may try again after ``error``: transient answers only (a 429 rate
    limit, a 5xx), never an input or provider-wide one."""
    return isinstance(error, TransientError) and not isinstance(error, ProviderUnavailableError)


def counts_against_provider(exc: BaseException) -> bool:
    """True for errors that say the provider refuses every call alike (the gate counts them):
    provider-wide faults, protocol faults included, and a vector of the wrong dimension."""
    return isinstance(exc, ProviderUnavailableError | DimensionMismatchError)


def gate_reason(exc: BaseException) -> str:
    """The ``reason`` label a counted error gives the gate (``PROVIDER_WIDE_REASONS``)."""
    if isinstance(exc, ProviderUnavailableError):
        return exc.reason
    return "dimension_mismatch"


def stage_deadline_seconds(processing_expiry_seconds: float) -> float:
    """Seconds from a stage's claim to its save, after which the stage is abandoned
    (left ``PROCESSING``, transient) so that no reclaim can meet a live attempt (§2, §10 #9)."""
    return processing_expiry_seconds * STAGE_DEADLINE_FRACTION
