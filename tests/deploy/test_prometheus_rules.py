"""The alert rules load and fire as their unit tests say (promtool check/test rules)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROM = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not found: install Debian's `prometheus` package"
)


@needs_promtool
def test_rules_check() -> None:
    out = subprocess.run(
        [str(PROMTOOL), "check", "rules", str(PROM / "llmgw-rules.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 11 rules found" in out.stdout + out.stderr


@needs_promtool
@pytest.mark.parametrize("case", sorted((PROM / "tests").glob("*.yml")), ids=lambda p: p.name)
def test_rules_unit_tests(case: Path) -> None:
    out = subprocess.run(
        [str(PROMTOOL), "test", "rules", case.name],
        cwd=case.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_is_tested_and_says_what_to_run() -> None:
    import yaml

    rules = yaml.safe_load((PROM / "llmgw-rules.yml").read_text())["groups"][0]["rules"]
    tested = {
        t["alertname"]
        for case in (PROM / "tests").glob("*.yml")
        for group in yaml.safe_load(case.read_text())["tests"]
        for t in group.get("alert_rule_test", [])
        if t.get("exp_alerts")
    }
    assert {r["alert"] for r in rules} == tested
    for r in rules:
        assert r["annotations"]["summary"]
        assert "llmgw ctl" in r["annotations"]["description"], r["alert"]
