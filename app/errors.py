"""The worker's error classes (CONTRACT §6 with its deviation, docs/contract.md);
``service/stage_failure.py`` acts on them and ``failure_policy`` decides which one a provider
answer is.

Leaf module: imports nothing from the app but the shared reason codes. Messages are fixed short
strings that name the layer; they never carry upstream bodies, user text, keys or endpoints
(§6).
"""

from __future__ import annotations

from pinlog_platform.contract.states.failure_reasons import FailureReason


class WorkerError(Exception):
    """Base of errors the worker raises on purpose."""


class TransientError(WorkerError):
    """Retrying later may succeed (timeout, 429, 5xx, connection loss, lock timeout).

    The stage is left ``PROCESSING``; the core side's rescan re-requests it after the expiry.
    HTTP request paths map it to 503.
    """


class DatabaseUnavailable(TransientError):
    """The database cannot be reached or lost the connection (refused, DNS, timeout, pool
    exhausted, server shutting down, serialization failure): transient."""


class DatabaseLockTimeout(TransientError):
    """A row lock held elsewhere outlasted ``lock_timeout`` (SQLSTATE 55P03): the database is
    up, another session is busy with the row. Transient; never reported as "unavailable"."""


class StageDeadlineExceeded(TransientError):
    """A stage ran past its hard deadline (claim to save, ``failure_policy``): abandoned and
    left ``PROCESSING`` before the expiry could let another request reclaim it (§2)."""


class ProviderUnavailableError(TransientError):
    """A provider-wide fault: the answer says something about the key, the account's quota,
    the model, a request parameter, the endpoint or the protocol, not about the note
    (**Deviation** from §6: not permanent). Every note would get it, so it is no verdict on one:
    the stage is left ``PROCESSING``, the provider's gate counts it, one ERROR line names the
    fields below. HTTP request paths map it to 503.

    ``layer``: ``"embedding"`` or ``"judge"``; ``reason``: a short fixed label
    (``failure_policy.PROVIDER_WIDE_REASONS``); ``status``: the HTTP status (``None`` for a
    2xx body that breaks the protocol); ``code`` / ``error_type`` / ``param``: the error
    body's machine-readable fields, already reduced to identifiers (never message text).
    """

    def __init__(
        self,
        message: str,
        *,
        layer: str,
        reason: str,
        status: int | None = None,
        code: str | None = None,
        error_type: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.layer = layer
        self.reason = reason
        self.status = status
        self.code = code
        self.error_type = error_type
        self.param = param


class ProviderProtocolError(ProviderUnavailableError):
    """A provider answered 2xx with a body that breaks its wire protocol (FC-01, FC-05 b/c):
    provider-wide (reason ``protocol``), left ``PROCESSING``, logged at ERROR."""

    def __init__(self, message: str, *, layer: str) -> None:
        super().__init__(message, layer=layer, reason="protocol")


class ProviderGateClosed(TransientError):
    """The provider's gate is closed (its circuit is open): no call was made. Transient; the
    gate probes on its own timer and ``retry_after_seconds`` says when it probes next."""

    def __init__(self, message: str, *, retry_after_seconds: int) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class PermanentError(WorkerError):
    """Retrying cannot change the outcome for this note (its input, its judgment, a vector of
    the wrong dimension, a profile mismatch).

    The stage moves ``PROCESSING -> FAILED`` (guarded) with ``reason`` (a ``FailureReason``)
    stored beside it. HTTP request paths map it to 502.
    """

    reason: FailureReason = FailureReason.UNKNOWN

    def __init__(self, message: str, *, reason: FailureReason | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class DimensionMismatchError(PermanentError):
    """A provider vector whose length differs from the configured dimension (§5, FC-05 a):
    ``FAILED`` with ``dimension_mismatch``, and it counts for the provider's gate (a model of
    another size answers every note alike)."""

    reason = FailureReason.DIMENSION_MISMATCH


class InvalidOutputError(PermanentError):
    """The judge's answer has no usable structure (not JSON, not the §4 object) even after the
    bounded re-ask: permanent for that stage, says nothing about the provider as a whole."""

    reason = FailureReason.JUDGE_OUTPUT_INVALID


class JudgeRefusedError(PermanentError):
    """The judge refused this note (``message.refusal`` or ``finish_reason: content_filter``,
    FC-08 b)."""

    reason = FailureReason.JUDGE_REFUSED


class JudgeTruncatedError(PermanentError):
    """The judge's answer was cut at the length limit, even if it parses (FC-08 a, c)."""

    reason = FailureReason.JUDGE_TRUNCATED


class ProfileMismatchError(PermanentError):
    """The context vector and the presets (or a search request) use different profiles (§5).

    HTTP request paths map it to 422.
    """

    reason = FailureReason.PROFILE_MISMATCH


class InvalidInputError(PermanentError):
    """The context text cannot be used: blank (``input_blank``), too long (``input_too_long``),
    not encodable or refused by the provider as invalid or against its content policy
    (``input_rejected``, the default)."""

    reason = FailureReason.INPUT_REJECTED


class DatabaseStatementError(Exception):
    """A statement failed for a reason retrying will not fix: a bug of ours (HTTP 500, the
    stage is left ``PROCESSING``). The message names the SQLSTATE and the driver's error class
    only: driver messages can quote parameters, which carry vectors and model output."""


class ConfigurationError(Exception):
    """Startup must stop: settings contradict each other or the database (§4, §5)."""
