"""The operator procedures of ``pinlog-core``, one module each (docs/extending.md "An operator
command"): the procedure and its command group, run on the one ``Operations`` value of
``core_service/composition.py``. Nothing on the request path or in ``serve``'s loops imports
this package (``tests/ops/test_package_boundaries.py``)."""

from __future__ import annotations

from collections.abc import Mapping


def counts(by_key: Mapping[str, int]) -> str:
    """``key=n`` pairs in key order, or ``none`` (a command's report line)."""
    return " ".join(f"{key}={n}" for key, n in sorted(by_key.items())) or "none"
