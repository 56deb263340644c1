"""Numbers on the command line of both CLIs, parsed strictly: a usage error (exit 2, naming the
option) for anything else, before any database or provider is contacted.

``click``'s own ``INT`` and ``FLOAT`` use Python's ``int()`` and ``float()``: they accept
``1_0``, `` 1``, ``+1``, ``01``, ``nan`` and ``inf``, and a ``min`` without a ``max`` lets
``9223372036854775808`` through to PostgreSQL, which then fails the command as a database
problem. Each parser here is given to ``typer.Option(parser=...)`` and enforces the range
itself; defaults (already numbers) are range-checked the same way.

- ``whole(lo, hi)``: ASCII decimal without sign, spaces, underscores or leading zeros.
- ``decimal_seconds(lo, hi)``: ASCII decimal with an optional fraction (``0.5``), finite.
- ``duration_seconds(hi)``: ``90s``, ``30m``, ``24h``, ``7d``; positive, at most ``hi``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import typer

from pinlog_platform.bigint import BIGINT_MAX

_WHOLE = re.compile(r"0|[1-9][0-9]*")
_DECIMAL = re.compile(r"(0|[1-9][0-9]*)(\.[0-9]+)?")
_DURATION = re.compile(r"([1-9][0-9]*)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The longest look-back a duration option takes: 100 years (PostgreSQL's timestamps hold far
# more, but nothing older exists).
MAX_DURATION_SECONDS = 100 * 365 * 86400
# The longest a command waits (--wait): a day.
MAX_WAIT_SECONDS = 86400.0

__all__ = [
    "BIGINT_MAX",
    "MAX_DURATION_SECONDS",
    "MAX_WAIT_SECONDS",
    "decimal_seconds",
    "duration_seconds",
    "whole",
]


def whole(minimum: int, maximum: int = BIGINT_MAX) -> Callable[[object], int]:
    """A parser of a whole number in ``minimum..maximum`` (ids: ``1..BIGINT_MAX``)."""

    def parse(value: object) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str) and _WHOLE.fullmatch(value) and len(value) <= 20:
            number = int(value)
        else:
            raise typer.BadParameter(f"a whole number from {minimum} to {maximum}, digits only")
        if not minimum <= number <= maximum:
            raise typer.BadParameter(f"a whole number from {minimum} to {maximum}")
        return number

    return parse


def decimal_seconds(minimum: float, maximum: float) -> Callable[[object], float]:
    """A parser of seconds in ``minimum..maximum``, such as ``120`` or ``0.5``."""

    def parse(value: object) -> float:
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        spelled = isinstance(value, str) and bool(_DECIMAL.fullmatch(value)) and len(value) <= 32
        if numeric or spelled:
            number = float(value)  # type: ignore[arg-type]
        else:
            raise typer.BadParameter(f"seconds from {minimum:g} to {maximum:g}, e.g. 120 or 0.5")
        if not minimum <= number <= maximum:  # also False for nan
            raise typer.BadParameter(f"seconds from {minimum:g} to {maximum:g}")
        return number

    return parse


def duration_seconds(maximum: int = MAX_DURATION_SECONDS) -> Callable[[object], float | None]:
    """A parser of ``<n>s|m|h|d`` (``30m``, ``24h``, ``7d``) into seconds, positive and at
    most ``maximum``; ``None`` stays ``None`` (an option not given)."""

    def parse(value: object) -> float | None:
        if value is None:
            return None
        found = _DURATION.fullmatch(value) if isinstance(value, str) else None
        if found is None or len(found.group(1)) > 12:
            raise typer.BadParameter("a positive whole number and s, m, h or d, e.g. 24h")
        seconds = int(found.group(1)) * _UNIT_SECONDS[found.group(2)]
        if seconds > maximum:
            raise typer.BadParameter(f"at most {maximum // 86400}d")
        return float(seconds)

    return parse
