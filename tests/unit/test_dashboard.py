"""packaging/grafana-dashboard.json: valid JSON Grafana imports (a datasource
input, panels with PromQL targets), every expression over metric names
camg/metrics.py defines, parsed by Prometheus' own promtool, and every
defined series on some panel."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase

from camg import metrics

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "packaging" / "grafana-dashboard.json"
# Grafana's variables, as Grafana substitutes them before asking Prometheus
GRAFANA_VARIABLES = {"$environment": ".*", "$__rate_interval": "1m"}
SUFFIXES = {"counter": ("_total",), "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count")}


def defined_series() -> dict[str, str]:
    """Every name a scrape can show -> the metric it belongs to."""
    out = {}
    for registry_owner in (metrics.Metrics("x"), metrics.HelperMetrics()):
        for metric in vars(registry_owner).values():
            if isinstance(metric, MetricWrapperBase) and not metric._labelvalues:
                for suffix in SUFFIXES[metric._type]:
                    out[metric._name + suffix] = metric._name
    return out


def expressions(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def substitute(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_a_dashboard_grafana_imports(dashboard):
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    assert [i["pluginId"] for i in dashboard["__inputs"]] == ["prometheus"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["environment"]["query"]["query"].startswith("label_values(camg_")
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
        box = panel["gridPos"]
        assert 0 <= box["x"] and box["x"] + box["w"] <= 24 and box["h"] > 0, panel["title"]


def test_expressions_name_only_defined_metrics_and_cover_them_all(dashboard):
    series = defined_series()
    used = set()
    for expr in expressions(dashboard) + [
            v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]:
        for name in re.findall(r"\bcamg_\w+", expr):
            assert name in series, f"{name} (in {expr}) is not a series camg/metrics.py defines"
            used.add(series[name])
    assert used == set(series.values()), f"not on the dashboard: {set(series.values()) - used}"


def test_the_check_can_fail():
    # A misspelt series is caught by the check above.
    assert "camg_episodes_endd_total" not in defined_series()
    assert "camg_step_seconds_bucket" in defined_series()
    assert "camg_step_seconds_total" not in defined_series()


def test_promtool_parses_every_expression(dashboard, tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool comes with Debian's prometheus (packaging/apt/metrics.txt)"
    rules = {"groups": [{"name": "camg-dashboard", "rules": [
        {"record": f"camg_dashboard:expr{i}", "expr": substitute(e)}
        for i, e in enumerate(expressions(dashboard))]}]}
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # and it does refuse a broken expression
    path.write_text(json.dumps({"groups": [{"name": "x", "rules": [
        {"record": "x:y", "expr": "sum by (le (rate(camg_step_seconds_bucket[1m]))"}]}]}))
    assert subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          timeout=60).returncode != 0
