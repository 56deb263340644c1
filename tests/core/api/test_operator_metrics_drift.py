"""The alert rules (``deploy/prometheus/pinlog-rules.yml``) and the Grafana dashboard
(``deploy/grafana/pinlog.json``) read only metrics, labels and label values the services
declare, so neither drifts from the code.

Declared names and label names: every ``Counter``/``Gauge``/``Histogram`` of
``prometheus_client`` in ``app/``, ``core_service/`` and ``pinlog_platform/``, read from the
source (a counter exposes ``_total``, a histogram ``_bucket`` with ``le``, ``_sum`` and
``_count``), plus the recording rules' own names with the labels they keep; ``job`` and
``instance`` are Prometheus's target labels. Label values, where a rule or panel names one:
the series a fresh worker registry pre-creates, what a running core exports after its loops'
first turn, the gate reasons, the dispatch results and origins, the failure reason codes and
the routes of both apps.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import json
import re
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.api.routes import router as worker_router
from app.metrics import PROVIDER_KINDS, WorkerMetrics
from app.service.health import GATE_REASONS
from core_service.api.routes import router as core_router
from core_service.service.process_requests import DispatchResult
from core_service.service.reembed_backfill import SWITCH_CONTEXT_KINDS, SWITCH_STATES
from core_service.service.status import REPROCESS_STATES
from pinlog_platform.contract.states.failure_reasons import FailureReason
from tests.promtool import run_promtool

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "deploy" / "prometheus" / "pinlog-rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "pinlog.json"
SOURCES = ("app", "core_service", "pinlog_platform")
TARGET_LABELS = frozenset({"job", "instance"})
METRIC_CLASSES = frozenset({"Counter", "Gauge", "Histogram"})
# Gauges the core's loops set on their first turn (status, routing).
LOOP_GAUGES = (
    "pinlog_core_live_stages",
    "pinlog_core_reprocess_contexts",
    "pinlog_core_workers_ready",
)
LOOPS_TIMEOUT_SECONDS = 10
# Grafana's interval variables, as Prometheus would see them.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}

KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
     "bool", "offset", "inf", "nan"}
)  # fmt: skip
LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
SELECTOR = re.compile(r"([a-zA-Z_:][\w:]*)?\s*\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
IDENTIFIER = re.compile(r"(?<![\w:$.])([a-zA-Z_:][\w:]*)(?![\w:])(\s*\()?")


@functools.cache
def _declared_in_code() -> dict[str, frozenset[str]]:
    """Exposed sample name -> label names, from every metric constructor call in the code."""
    declared: dict[str, frozenset[str]] = {}
    for source in SOURCES:
        for path in sorted((ROOT / source).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                    continue
                if node.func.id not in METRIC_CLASSES or not node.args:
                    continue
                name = node.args[0]
                if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                    continue
                labels_node = node.args[2] if len(node.args) > 2 else None
                for keyword in node.keywords:
                    if keyword.arg == "labelnames":
                        labels_node = keyword.value
                labels = frozenset(ast.literal_eval(labels_node)) if labels_node else frozenset()
                for exposed, extra in _exposed(node.func.id, name.value):
                    assert exposed not in declared, f"{exposed} declared twice ({path})"
                    declared[exposed] = labels | extra
    return declared


def _exposed(kind: str, name: str) -> list[tuple[str, frozenset[str]]]:
    if kind == "Counter":
        return [(name.removesuffix("_total") + "_total", frozenset())]
    if kind == "Histogram":
        return [
            (f"{name}_bucket", frozenset({"le"})),
            (f"{name}_sum", frozenset()),
            (f"{name}_count", frozenset()),
        ]
    return [(name, frozenset())]


def _rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _panel_expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found.append((panel["title"], target["expr"]))
    return found


def _without_strings(expr: str) -> str:
    return re.sub(r'"[^"]*"', '""', expr)


def _parse(expr: str) -> tuple[set[str], list[tuple[str | None, str, str, str]], set[str]]:
    """(metric names, matchers as (metric or None, label, operator, value), label names of
    by/on/... lists) of one PromQL expression."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    matchers = []
    for metric, body in SELECTOR.findall(expr):
        for label, operator, value in MATCHER.findall(body):
            matchers.append((metric or None, label, operator, value))
    bare = SELECTOR.sub(lambda m: m.group(1) or "", _without_strings(expr))
    lists: set[str] = set()
    for _, names in LABEL_LIST.findall(bare):
        lists.update(name.strip() for name in names.split(",") if name.strip())
    bare = LABEL_LIST.sub(" ", bare)
    bare = re.sub(r"\[[^\]]*\]", " ", bare)  # ranges and subqueries
    metrics = {
        name
        for name, call in IDENTIFIER.findall(bare)
        if not call and name not in KEYWORDS and not re.fullmatch(r"\d\w*", name)
    }
    return metrics, matchers, lists


def _recorded(declared: dict[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    """The recording rules' names -> the labels they keep (their aggregations' ``by``)."""
    recorded: dict[str, frozenset[str]] = {}
    for rule in _rules():
        if "record" in rule:
            _, _, lists = _parse(rule["expr"])
            recorded[rule["record"]] = frozenset(lists) - {"le"}
    return recorded


def _every_use() -> list[tuple[str, str]]:
    uses = [(f"rule {r.get('alert') or r.get('record')}", r["expr"]) for r in _rules()]
    return uses + [(f"panel {title!r}", expr) for title, expr in _panel_expressions()]


def _name_problems(declared: dict[str, frozenset[str]]) -> list[str]:
    known = {**declared, **_recorded(declared)}
    problems = []
    for where, expr in _every_use():
        metrics, matchers, lists = _parse(expr)
        if not metrics:
            problems.append(f"{where}: reads no metric: {expr}")
        for metric in sorted(metrics - known.keys()):
            problems.append(f"{where}: {metric} is not declared")
        for metric, label, _, _ in matchers:
            if metric is None:
                problems.append(f"{where}: a selector without a metric name")
            elif metric in known and label not in known[metric] | TARGET_LABELS:
                problems.append(f"{where}: {metric} has no label {label}")
        available = set(TARGET_LABELS).union(*(known.get(m, frozenset()) for m in metrics))
        for label in sorted(lists - available):
            problems.append(f"{where}: no metric it reads has the label {label}")
    return problems


def _samples(exposition: str) -> list[tuple[str, dict[str, str]]]:
    return [
        (sample.name, sample.labels)
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    ]


def _code_constants_passed_as(keyword: str) -> set[str]:
    """String constants passed as ``keyword=`` anywhere in the core, or bound to a module
    constant so passed (``origin=ORIGIN``)."""
    found: set[str] = set()
    for path in sorted((ROOT / "core_service").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = {
            target.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == keyword:
                if isinstance(node.value, ast.Constant):
                    found.add(node.value.value)
                elif isinstance(node.value, ast.Name) and node.value.id in constants:
                    found.add(constants[node.value.id])
            # dispatches.labels("retry", ...): the origin as the first label value
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "labels"
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "dispatches"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                found.add(node.args[0].value)
    return found


def _route_paths(router, prefix: str = "") -> set[str]:
    return {prefix + route.path for route in router.routes}


async def _known_values(core) -> dict[tuple[str, str], set[str]]:
    """(metric, label) -> every value it can take, where the code fixes the set."""
    values: dict[tuple[str, str], set[str]] = defaultdict(set)

    def add(exposition: str) -> None:
        for name, labels in _samples(exposition):
            for label, value in labels.items():
                values[(name, label)].add(value)

    # The worker pre-creates every series of its fixed label sets.
    add(generate_latest(WorkerMetrics().registry).decode())
    # The core after its loops' first turn: status and switch gauges, every value set.
    async with asyncio.timeout(LOOPS_TIMEOUT_SECONDS):
        while True:
            scrape = (await core.ops.get("/metrics")).text
            if all(f"{gauge}{{" in scrape for gauge in LOOP_GAUGES):
                break
            await asyncio.sleep(0.05)
    add(scrape)
    for provider in PROVIDER_KINDS:
        for name in (
            "pinlog_provider_unavailable", "pinlog_provider_spend_capped",
            "pinlog_provider_daily_token_cap", "pinlog_provider_tokens_today",
        ):  # fmt: skip
            values[(name, "provider")].add(provider)
    values[("pinlog_provider_unavailable", "reason")] |= GATE_REASONS
    # The switch's gauges, set by the backfill loop (not run by the test's core).
    values[("pinlog_core_reembed_state", "state")] |= set(SWITCH_STATES)
    values[("pinlog_core_reembed_contexts", "kind")] |= set(SWITCH_CONTEXT_KINDS)
    values[("pinlog_core_reprocess_contexts", "state")] |= set(REPROCESS_STATES)
    reasons = {reason.value for reason in FailureReason}
    for name in (
        "pinlog_core_finalized_total", "pinlog_core_failed_stages_24h",
        "pinlog_stage_failures_total", "pinlog:notes_failed:rate15m",
    ):  # fmt: skip
        values[(name, "reason")] |= reasons
    values[("pinlog_core_dispatches_total", "result")] |= {r.value for r in DispatchResult}
    values[("pinlog_core_dispatches_total", "origin")] |= _code_constants_passed_as("origin")
    methods = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "other"}
    for prefix, paths in (
        ("pinlog_core_http_request_seconds", _route_paths(core_router)),
        ("pinlog_http_request_seconds", _route_paths(worker_router)),
    ):
        for suffix in ("_bucket", "_sum", "_count"):
            values[(prefix + suffix, "route")] |= paths | {"unmatched"}
            values[(prefix + suffix, "method")] |= methods
    return values


def _value_problems(values: dict[tuple[str, str], set[str]]) -> list[str]:
    problems = []
    for where, expr in _every_use():
        _, matchers, _ = _parse(expr)
        for metric, label, operator, value in matchers:
            if metric is None:
                continue  # reported by the name check
            # A negative matcher names a value too: it must exist to exclude anything.
            named = value.split("|") if operator in ("=~", "!~") else [value]
            allowed = values.get((metric, label))
            if allowed is None:
                problems.append(f"{where}: no known value set for {metric}{{{label}}}")
                continue
            for one in named:
                if one not in allowed:
                    problems.append(f"{where}: {metric}{{{label}={one!r}}} is never exported")
    return problems


def test_every_metric_and_label_a_rule_or_panel_reads_is_declared():
    declared = _declared_in_code()

    assert "pinlog_core_workers_ready" in declared, "the declarations were read"
    assert declared["pinlog_stage_seconds_bucket"] == {"stage", "le"}
    assert _name_problems(declared) == []


async def test_every_label_value_a_rule_or_panel_names_is_exported(core_with_fake_worker):
    values = await _known_values(core_with_fake_worker)

    assert _value_problems(values) == []


def test_the_checks_catch_a_renamed_metric_label_or_value():
    """The parser finds what a drift would break (the checks above cannot pass vacuously)."""
    declared = _declared_in_code()
    metrics, matchers, lists = _parse(
        'sum by (reason) (rate(pinlog_stage_failures_total{stage="keyword"}[$__rate_interval]))'
        " / on () max(pinlog:notes_failed:rate15m) > 3 * vector(1)"
    )
    assert metrics == {"pinlog_stage_failures_total", "pinlog:notes_failed:rate15m"}
    assert matchers == [("pinlog_stage_failures_total", "stage", "=", "keyword")]
    assert lists == {"reason"}
    renamed = dict(declared)
    renamed["pinlog_stage_failure_total"] = renamed.pop("pinlog_stage_failures_total")
    assert any("pinlog_stage_failures_total is not declared" in p for p in _name_problems(renamed))
    relabelled = {**declared, "pinlog_core_reembed_contexts": frozenset({"what"})}
    assert any("has no label kind" in p for p in _name_problems(relabelled))
    assert _value_problems({("pinlog_core_reembed_state", "state"): {"idle"}}) != []


@pytest.mark.processes  # runs promtool
def test_every_dashboard_query_is_valid_promql(tmp_path):
    """Every panel's query, as a recording rule, passes ``promtool check rules``."""
    rules = []
    for number, (_, expr) in enumerate(_panel_expressions()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"dashboard:panel_{number}", "expr": expr})
    checked = tmp_path / "dashboard-rules.yml"
    checked.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))

    result = run_promtool("check", "rules", checked.name, cwd=tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_is_one_grafana_document_on_its_data_source_variable():
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}

    assert len(ids) == len(set(ids))
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), panel["title"]
        assert all(target["expr"].strip() for target in panel["targets"]), panel["title"]
    # Every row the issue asks for is there.
    rows = [panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"]
    assert rows == [
        "Throughput",
        "Backlog and its age",
        "Latency",
        "Failures",
        "Providers and readiness",
        "Spend",
        "Embedding-profile switch and keyword reprocess",
    ]
