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


class ProviderProtocolError(TransientError):
    """A provider answered 2xx with a body that breaks its wire protocol (FC-01, FC-05 b/c).

    Transient (the next call may be fine) but logged at ERROR: it is a fault worth a look.
    """


class PermanentError(WorkerError):
    """Retrying cannot change the outcome (4xx, wrong dimension, bad input, profile mismatch).

    The stage moves ``PROCESSING -> FAILED`` (guarded). HTTP request paths map it to 502.
    """


class ProfileMismatchError(PermanentError):
    """The context vector and the presets (or a search request) use different profiles (§5).

    HTTP request paths map it to 422.
    """


class InvalidInputError(PermanentError):
    """The context text cannot be embedded: blank, too long, or not encodable (FC-09)."""


class ConfigurationError(Exception):
    """Startup must stop: settings contradict each other or the database (§4, §5)."""
