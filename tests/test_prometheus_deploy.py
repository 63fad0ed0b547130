"""``deploy/``: the Grafana dashboard and the Prometheus rules and config only use what the exporter emits,
and promtool accepts (and unit-tests) them. Running every dashboard query against a real Prometheus is
in ``test_prometheus_server.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from test_prometheus import training_sample
from vramscope.exporters import METRICS, PrometheusSink

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
DASHBOARD = DEPLOY / "grafana" / "vramscope-dashboard.json"
RULES = DEPLOY / "prometheus" / "vramscope-alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "vramscope-alerts.test.yml"
CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian: apt-get install -y prometheus)")

METRIC_NAME = re.compile(r"\b(vramscope_[a-z0-9_]+)\b")
# Series that come from elsewhere: the Pushgateway's own push time (used to ignore finished runs).
NOT_OURS = {"push_time_seconds"}


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of every panel."""
    dashboard = load_dashboard()
    panels = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    notes = [(f"annotation {a['name']}", a["expr"]) for a in dashboard["annotations"]["list"] if "expr" in a]
    return panels + notes


def emitted_names() -> set[str]:
    """Sample names in a real exposition of a full sample (what Prometheus will store)."""
    sink = PrometheusSink("127.0.0.1:0")
    try:
        sink.write(training_sample())
        sink.set_analysis(1.0, 10.0)
        text = sink.exposition().decode()
    finally:
        sink.close()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_dashboard_is_grafana_json_with_the_panels_people_need() -> None:
    dashboard = load_dashboard()
    panels = dashboard["panels"]
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert {"job", "host", "run", "rank", "gpu"} <= set(variables)
    # What the issue asks the dashboard to show, each by the metric that carries it.
    queries = " ".join(expr for _, expr in dashboard_queries())
    for needed in (
        "vramscope_gpu_memory_used_bytes",  # memory per GPU
        "vramscope_gpu_process_memory_bytes",  # per process
        "vramscope_allocator_allocated_bytes",
        "vramscope_allocator_reserved_bytes",
        "vramscope_allocator_inactive_split_bytes",  # fragmentation
        "vramscope_leak_slope_bytes_per_step",
        "vramscope_forecast_steps_to_oom",
        "max by (host, instance, run, rank) (vramscope_allocator_peak_allocated_bytes",  # per-rank peaks
    ):
        assert needed in queries, needed


def test_peaks_per_rank_never_merge_hosts_or_runs() -> None:
    """Issue 25: "Peak per rank" took the max over every host and run with the same rank number."""
    panels = {panel["title"]: panel for panel in load_dashboard()["panels"]}
    for target in panels["Peak per rank"]["targets"]:
        grouping = re.match(r"max by \(([^)]*)\)", target["expr"])
        assert grouping is not None, target["expr"]
        assert {"host", "instance", "run", "rank"} <= {g.strip() for g in grouping.group(1).split(",")}
    for target in panels["Peak imbalance across ranks"]["targets"]:
        assert "max by (job, run)" in target["expr"] and "min by (job, run)" in target["expr"]
    # Every selector can be narrowed to one job and one run.
    for where, expr in dashboard_queries():
        for selector in re.findall(r"vramscope_[a-z_]+\{([^}]*)\}", expr):
            assert 'job=~"$job"' in selector and 'run=~"$run"' in selector, (where, expr)


RATE_OF = re.compile(r"\b(?:rate|irate|increase)\(\s*(vramscope_[a-z0-9_]+)")


def test_rate_is_taken_only_of_counters() -> None:
    # rate() of a gauge reads every drop (a restarted run, a resumed step) as a counter reset: wrong values.
    yaml = pytest.importorskip("yaml", reason="needs PyYAML (pip install pyyaml) to read the rules")
    exprs = [expr for _, expr in dashboard_queries()]
    exprs += [str(r["expr"]) for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    rated = {name for expr in exprs for name in RATE_OF.findall(expr)}
    assert "vramscope_training_steps_total" in rated
    for name in rated:
        assert METRICS[name][0] == "counter", f"rate() of the gauge {name}"


def test_dashboard_draws_eval_phases_as_annotations() -> None:
    notes = [a for a in load_dashboard()["annotations"]["list"] if "expr" in a]
    assert any("vramscope_training_phase_info" in a["expr"] and 'phase!="train"' in a["expr"] for a in notes)


def test_dashboard_uses_only_metrics_the_exporter_emits() -> None:
    used = set(METRIC_NAME.findall(" ".join(expr for _, expr in dashboard_queries())))
    for variable in load_dashboard()["templating"]["list"]:
        used |= set(METRIC_NAME.findall(json.dumps(variable.get("query", ""))))
    assert used, "no vramscope metric found in the dashboard"
    assert used <= set(METRICS), f"not in METRICS: {sorted(used - set(METRICS))}"
    assert used <= emitted_names(), f"not emitted: {sorted(used - emitted_names())}"


def test_alert_rules_use_only_metrics_the_exporter_emits() -> None:
    # PyYAML comes with the hf extra (transformers, accelerate); the rules' syntax is promtool's to check.
    yaml = pytest.importorskip("yaml", reason="needs PyYAML (pip install pyyaml) to read the rules")
    groups = yaml.safe_load(RULES.read_text())["groups"]
    exprs = [str(rule["expr"]) for group in groups for rule in group["rules"]]
    assert len(exprs) == 5
    used = set(METRIC_NAME.findall(" ".join(exprs)))
    assert used <= emitted_names(), f"not emitted: {sorted(used - emitted_names())}"
    others = set(re.findall(r"\b([a-z_]+_seconds)\b", " ".join(exprs))) - used
    assert others <= NOT_OURS


@needs_promtool
def test_promtool_accepts_the_alert_rules() -> None:
    assert PROMTOOL is not None
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 5 rules found" in check.stdout


@needs_promtool
def test_alert_rules_fire_when_they_should_and_only_then() -> None:
    # The unit tests in deploy/ feed synthetic series to the rules: each alert fires for one series and
    # stays quiet for its neighbour (below threshold, stalled run, finished Pushgateway group, ...).
    assert PROMTOOL is not None
    check = subprocess.run(
        [PROMTOOL, "test", "rules", RULE_TESTS.name], capture_output=True, text=True, timeout=60, cwd=RULE_TESTS.parent
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout


@needs_promtool
def test_promtool_accepts_the_example_scrape_config() -> None:
    assert PROMTOOL is not None
    check = subprocess.run([PROMTOOL, "check", "config", str(CONFIG)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 1 rule files found" in check.stdout
