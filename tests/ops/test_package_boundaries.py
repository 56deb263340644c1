"""The two services share only the database, HTTP and ``pinlog_platform`` (§0,
docs/architecture.md): ``app`` never imports ``core_service`` nor the reverse, and a shared
package imports neither. ``demo`` (development only, ``make run``) composes both and is exempt,
but no product package imports it (``pinlog-ai demo`` is registered from the demo package) and
its modules form no import cycle. Inside ``pinlog_platform``, the contract between the services
(``contract/``) and the infrastructure they stand on import nothing from each other, and the
database helpers never import the HTTP layer. In the core, the operator procedures
(``core_service/operations/``) stand on the request path's layers and never the reverse. Every
import counts, a function's included.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {"app", "core_service"}
SHARED = ("pinlog_platform",)
PRODUCT = ("app", "core_service", "pinlog_platform")
# The platform's infrastructure: each of these subpackages imports nothing from ``contract``.
INFRASTRUCTURE = ("db", "http", "cli", "logging", "settings_rules")


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


def _imported_modules(path: Path) -> set[str]:
    """The dotted names ``path`` imports: ``from a.b import c`` counts as ``a.b`` and
    ``a.b.c`` (``c`` may be a module); relative imports are resolved against ``path``."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def _modules_of(package: str) -> dict[str, set[str]]:
    """``{dotted module name: dotted names it imports}`` for every module of ``package``."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = _imported_modules(path)
    return found


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


@pytest.mark.parametrize("package", PRODUCT)
def test_no_product_package_imports_the_demo(package: str):
    """Product code never reaches into development code: ``pinlog-ai demo`` comes from the
    ``pinlog_ai.commands`` entry point (``app/cli.py``), not an import."""
    importing = sorted(
        module
        for module, names in _modules_of(package).items()
        if any(_within(name, "demo") for name in names)
    )
    assert importing == []


def test_the_demo_modules_form_no_import_cycle():
    modules = _modules_of("demo")
    graph = {
        module: {other for other in modules if other != module and other in names}
        for module, names in modules.items()
    }
    cycles = []

    def visit(module: str, path: tuple[str, ...]) -> None:
        for other in sorted(graph[module]):
            if other in path:
                cycles.append((*path[path.index(other) :], other))
            elif len(path) < len(graph):
                visit(other, (*path, other))

    for module in sorted(graph):
        visit(module, (module,))
    assert cycles == []


@pytest.mark.parametrize(
    ("part", "forbidden"),
    [
        ("pinlog_platform.db", ("pinlog_platform.http",)),
        ("pinlog_platform.contract", tuple(f"pinlog_platform.{i}" for i in INFRASTRUCTURE)),
        *((f"pinlog_platform.{i}", ("pinlog_platform.contract",)) for i in INFRASTRUCTURE),
    ],
)
def test_platform_arrows(part: str, forbidden: tuple[str, ...]):
    """The contract between the services (states, schema, preset list, keyword read rule, search
    cuts, text fingerprint) and the infrastructure import nothing from each other; the database
    helpers never import the HTTP layer (the request deadline watches commits through
    ``pinlog_platform.db.commit_watch``)."""
    modules = {m: n for m, n in _modules_of("pinlog_platform").items() if _within(m, part)}
    assert modules, f"{part}: no such package"
    crossing = {
        module: sorted(n for n in names if any(_within(n, f) for f in forbidden))
        for module, names in modules.items()
        if any(_within(n, f) for n in names for f in forbidden)
    }
    assert crossing == {}


@pytest.mark.parametrize(
    "layer", ["core_service.api", "core_service.service", "core_service.repository"]
)
def test_no_core_layer_imports_the_operator_procedures(layer: str):
    """What the request path and ``serve``'s loops use (the pause reader, token verification,
    the backfill loop, the status gauges) lives where it can be imported without
    ``core_service/operations/`` (docs/extending.md "An operator command")."""
    modules = {m: n for m, n in _modules_of("core_service").items() if _within(m, layer)}
    assert modules, f"{layer}: no such package"
    importing = {
        module: sorted(n for n in names if _within(n, "core_service.operations"))
        for module, names in modules.items()
        if any(_within(n, "core_service.operations") for n in names)
    }
    assert importing == {}
