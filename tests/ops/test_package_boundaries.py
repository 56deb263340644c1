"""The two services share only the database, HTTP and ``pinlog_platform`` (§0,
docs/architecture.md): ``app`` never imports ``core_service`` nor the reverse, and a shared
package imports neither. ``demo`` (development only, ``make run``) composes both and is exempt.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {"app", "core_service"}
SHARED = ("pinlog_platform",)


def _imported_top_levels(package: str) -> dict[str, set[str]]:
    """``{module path: top-level names it imports}`` for every module of ``package``."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("app", {"core_service"}),
        ("core_service", {"app"}),
        *((shared, SERVICES) for shared in SHARED),
    ],
)
def test_no_package_imports_across_the_service_boundary(package: str, forbidden: set[str]):
    crossing = {
        module: sorted(names & forbidden)
        for module, names in _imported_top_levels(package).items()
        if names & forbidden
    }
    assert crossing == {}
