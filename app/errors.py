"""The worker's error classes (CONTRACT §6); ``service/stage_failure.py`` acts on them.

Leaf module: imports nothing from the app. Messages are fixed short strings that name the
layer; they never carry upstream bodies, user text, keys or endpoints (§6).
"""

from __future__ import annotations


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


class ProviderProtocolError(TransientError):
    """A provider answered 2xx with a body that breaks its wire protocol (FC-01, FC-05 b/c).

    Transient (the next call may be fine) but logged at ERROR: it is a fault worth a look.
    """


class PermanentError(WorkerError):
    """Retrying cannot change the outcome (4xx, wrong dimension, bad input, profile mismatch).

    The stage moves ``PROCESSING -> FAILED`` (guarded). HTTP request paths map it to 502.
    """


class ProviderRefusedError(PermanentError):
    """The provider refuses every call alike: bad key (401), no access (403), unknown model or
    path (404), wrong vector dimension. Only these count towards the circuit breaker (§6);
    every other permanent error is about one input and fails that stage alone."""


class InvalidOutputError(PermanentError):
    """The judge's answer has no usable structure (not JSON, not the §4 object) even after the
    bounded re-ask: permanent for that stage, says nothing about the provider as a whole."""


class ProfileMismatchError(PermanentError):
    """The context vector and the presets (or a search request) use different profiles (§5).

    HTTP request paths map it to 422.
    """


class InvalidInputError(PermanentError):
    """The context text cannot be embedded: blank, too long, or not encodable (FC-09)."""


class DatabaseStatementError(Exception):
    """A statement failed for a reason retrying will not fix: a bug of ours (HTTP 500, the
    stage is left ``PROCESSING``). The message names the SQLSTATE and the driver's error class
    only: driver messages can quote parameters, which carry vectors and model output."""


class ConfigurationError(Exception):
    """Startup must stop: settings contradict each other or the database (§4, §5)."""
