"""Ids as text, parsed strictly: canonical ASCII decimal only.

Python's ``int()`` and pydantic's lax integers accept ``1_0``, ``01``, ``+1``, `` 1``, ``1.0``,
Arabic-Indic and fullwidth digits, so several spellings would name one row. An id in a URL path
or a token's ``sub`` is accepted only as ``[1-9][0-9]*`` within BIGINT; anything else names
nothing (404 for a path, 401 for a token).
"""

from __future__ import annotations

import re

from pinlog_platform.bigint import BIGINT_MAX

# ASCII digits spelled out: \d would also match other scripts' digits.
_CANONICAL = re.compile(r"[1-9][0-9]{0,18}")


def parse_canonical_id(value: object) -> int | None:
    """The id ``value`` spells canonically (a ``str``), within ``1..BIGINT_MAX``; else ``None``."""
    if not isinstance(value, str) or _CANONICAL.fullmatch(value) is None:
        return None
    number = int(value)
    return number if number <= BIGINT_MAX else None
