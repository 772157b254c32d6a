"""deploy/prometheus/alerts.yml and deploy/grafana/sluice.json: well formed, and every
metric they query is one a live server's /metrics exports."""

from __future__ import annotations

import json
from pathlib import Path

import promql_parser
import pytest
import yaml

from tests.deploy.metric_names import (
    PROMETHEUS_OWN,
    UncheckableQuery,
    dashboard_queries,
    exported_names,
    grafana_to_promql,
    query_names,
    rule_queries,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
DASHBOARD = json.loads((DEPLOY / "grafana" / "sluice.json").read_text())
ARTICLE_RULES = {"SluiceGpuMemoryHigh", "SluiceP99LatencyHigh", "SluiceRequestRateLow",
                 "SluiceRequestRateHigh", "SluicePrefixHitRateLow",
                 "SluiceSchedulerMayBeBlocked"}
OWN_RULES = {"SluiceStalled", "SluiceDown", "SluiceRestarted", "SluiceKvPressure",
             "SluiceHostTierThrash"}


def unexported(queries, live: set[str]) -> dict[str, set[str]]:
    return {where: missing for where, q in queries
            if (missing := query_names(q) - live - PROMETHEUS_OWN)}


def test_every_alert_queries_only_exported_metrics(live_names):
    assert unexported(rule_queries(RULES), live_names) == {}


def test_every_dashboard_query_reads_only_exported_metrics(live_names):
    assert unexported(dashboard_queries(DASHBOARD), live_names) == {}


def test_the_live_server_declares_the_gpu_families_without_a_gpu(live_names):
    # declared and empty on the CPU: the GPU panels and rules name real families
    assert {"sluice_gpu_utilization_ratio", "sluice_gpu_memory_used_bytes",
            "sluice_gpu_memory_total_bytes"} <= live_names


def test_rules_are_well_formed_and_cover_the_policy():
    names = []
    for group in RULES["groups"]:
        assert set(group) == {"name", "rules"}
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            names.append(rule["alert"])
            if "for" in rule:
                promql_parser.parse_duration(rule["for"])
            assert rule["labels"]["severity"] in ("info", "warning", "critical")
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    assert len(names) == len(set(names))
    assert set(names) >= ARTICLE_RULES | OWN_RULES


def test_the_articles_thresholds_stand_in_the_rules():
    exprs = {name: " ".join(q.split()) for name, q in rule_queries(RULES)}
    assert exprs["SluiceGpuMemoryHigh"].endswith(") > 0.9")
    assert exprs["SluiceP99LatencyHigh"].startswith("histogram_quantile(0.99,")
    assert exprs["SluiceP99LatencyHigh"].endswith(") > 0.5")
    assert exprs["SluiceRequestRateLow"].endswith("< 50")
    assert exprs["SluiceRequestRateHigh"].endswith("> 1000")
    assert exprs["SluicePrefixHitRateLow"].endswith("< 0.85")
    assert "< 0.5 and" in exprs["SluiceSchedulerMayBeBlocked"]
    assert exprs["SluiceSchedulerMayBeBlocked"].endswith("> 100")
    fors = {r["alert"]: r.get("for") for g in RULES["groups"] for r in g["rules"]}
    assert fors["SluiceGpuMemoryHigh"] == "5m"


def test_dashboard_panels_cover_what_operators_watch():
    titles = {p["title"] for p in DASHBOARD["panels"] if p["type"] != "row"}
    assert {"Output tokens / s", "Time to first token", "Time per output token",
            "Requests running / waiting", "KV use per tier", "Prefix cache hit rate",
            "GPU utilization", "GPU memory"} <= titles
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for where, query in dashboard_queries(DASHBOARD):
        if where.startswith("panel"):  # per replica: every panel splits or filters by it
            assert 'instance=~".*"' in query, where


def test_exported_names_reads_declared_families_and_samples():
    text = ("# HELP a_total A\n# TYPE a_total counter\n"
            "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1.0\nh_count 1.0\nh_sum 2.0\n"
            "# TYPE g gauge\n")
    assert exported_names(text) == {"a_total", "h_bucket", "h_sum", "h_count", "g"}


def test_the_extractor_reads_names_through_functions_and_refuses_what_it_cannot_check():
    q = ('histogram_quantile(0.9, sum by (le) (rate(x_bucket{a="b"}[5m]))) / on() '
         'group_left {__name__="y"} or max_over_time(avg(z)[15m:30s])')
    assert query_names(q) == {"x_bucket", "y", "z"}
    assert grafana_to_promql("label_values(m{instance=~\"$instance\"}, gpu)") \
        == 'm{instance=~".*"}'
    with pytest.raises(UncheckableQuery):
        query_names('{__name__=~"sluice_.*"}')
    with pytest.raises(UncheckableQuery):
        grafana_to_promql("rate(x[$window])")
