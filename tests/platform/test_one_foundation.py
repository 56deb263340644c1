"""Each piece of infrastructure both services need exists once, in ``pinlog_platform``, and
neither service defines its own copy (they had drifted apart: the core accepted a bare
``postgresql+asyncpg://`` URL the worker refused, and timed requests on a slower path)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("app", "core_service")

# (job, where it lives now, names a service must not define, messages it must not hold)
TWINS = (
    (
        "settings error lines",
        "pinlog_platform.settings_rules:describe_errors",
        {"describe_errors"},
        set(),
    ),
    (
        "logging settings",
        "pinlog_platform.settings_rules:logging_settings",
        {"LoggingSettingsBase"},
        {"One JSON object per line, or readable text"},
    ),
    (
        "white-space rule",
        "pinlog_platform.settings_rules:refuse_empty_or_padded",
        {"_without_surrounding_space", "refuse_empty_or_padded"},
        {
            "is set but empty; give a value or unset it",
            "has surrounding white space (a trailing newline from a file?)",
            "has leading or trailing whitespace (a newline from a file?); remove it",
        },
    ),
    (
        "database URL rule",
        "pinlog_platform.settings_rules:check_database_url",
        {"check_database_url", "_asyncpg_url"},
        {"must be a postgresql+asyncpg:// URL"},
    ),
    (
        "422 handler",
        "pinlog_platform.http.validation:validation_error",
        {"_validation_error", "validation_error"},
        set(),
    ),
    (
        "transient SQLSTATE classes",
        "pinlog_platform.db.sqlstates:TRANSIENT_SQLSTATE_PREFIXES",
        {"TRANSIENT_SQLSTATE_PREFIXES", "_RETRYABLE_SQLSTATES"},
        {"40P01", "57P0"},
    ),
    (
        "is transient",
        "pinlog_platform.db.sqlstates:is_transient",
        {"is_transient", "is_retryable", "is_transient_database_error"},
        set(),
    ),
    (
        "transaction / autocommit helpers",
        "pinlog_platform.db.transactions:transaction",
        {"read_only", "_translated"},
        set(),
    ),
    (
        "HTTP request timing",
        "pinlog_platform.http.request_timing:RequestTimingMiddleware",
        {"RequestTimingMiddleware", "time_requests"},
        set(),
    ),
)


def _service_modules():
    for service in SERVICES:
        for path in sorted((ROOT / service).rglob("*.py")):
            yield path.relative_to(ROOT), ast.parse(path.read_text(encoding="utf-8"))


def _defined_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


def _string_literals(tree: ast.AST) -> set[str]:
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


@pytest.mark.parametrize(("job", "home", "names", "literals"), TWINS, ids=[t[0] for t in TWINS])
def test_each_twin_lives_once_in_the_platform(job, home, names, literals):
    module_name, attribute = home.split(":")
    assert hasattr(importlib.import_module(module_name), attribute), job
    copies = []
    for path, tree in _service_modules():
        defined = _defined_names(tree) & names
        quoted = literals & _string_literals(tree)
        if defined or quoted:
            copies.append((str(path), sorted(defined | quoted)))
    assert copies == [], f"{job}: defined again in a service"


def test_neither_service_defines_its_own_transaction_helpers():
    """The helpers are the platform's with a service's translator bound (``partial``)."""
    helpers = {"transaction", "autocommit", "read_only_snapshot"}
    defined = {
        (str(path), node.name)
        for path, tree in _service_modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in helpers
    }
    assert defined == set()


def test_neither_service_times_requests_with_base_http_middleware():
    decorated = [
        str(path)
        for path, tree in _service_modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for decorator in node.decorator_list
        if isinstance(decorator, ast.Call)
        and isinstance(decorator.func, ast.Attribute)
        and decorator.func.attr == "middleware"
    ]
    assert decorated == []
