"""The Prometheus rules of ``deploy/prometheus/pinlog-rules.yml`` pass their unit tests
(``deploy/prometheus/tests/*.yml``, run by ``promtool test rules``), and every alert has a
test with series that fire it and one with series that must not.

``promtool`` is Debian's ``prometheus`` package (``.ci/run`` installs it). Where it is missing
the promtool tests skip, except under ``CI=true``, where they fail: CI must run them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.promtool import promtool, run_promtool

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "pinlog-rules.yml"
RULE_TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.yml"))


def _alerts() -> list[str]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule]


def test_the_rules_file_is_valid() -> None:
    result = run_promtool("check", "rules", RULES.name, cwd=RULES.parent)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("rule_test", RULE_TESTS, ids=[path.stem for path in RULE_TESTS])
def test_the_rules_pass_their_unit_test(rule_test: Path) -> None:
    result = run_promtool("test", "rules", rule_test.name, cwd=rule_test.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_series_that_fire_it_and_series_that_must_not() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for path in RULE_TESTS:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert document["rule_files"] == ["../pinlog-rules.yml"], path.name
        for case in document["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    alerts = _alerts()
    assert len(alerts) == len(set(alerts))
    assert [a for a in alerts if a not in firing] == []
    assert [a for a in alerts if a not in silent] == []


def test_a_missing_promtool_fails_under_ci_and_skips_elsewhere(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a directory without promtool
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="promtool is not installed"):
        promtool()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="promtool is not installed"):
        promtool()


def test_every_recording_rule_has_its_value_tested() -> None:
    tested: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text(encoding="utf-8"))["tests"]:
            for check in case.get("promql_expr_test", []):
                tested.update(re.findall(r"pinlog:[\w:]+", check["expr"]))
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    recorded = [rule["record"] for group in groups for rule in group["rules"] if "record" in rule]

    assert recorded
    assert [name for name in recorded if name not in tested] == []
