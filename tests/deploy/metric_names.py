"""Which metric names the deployment files query, and which a server's /metrics exports.

Queries are parsed with `promql-parser` (the Rust PromQL parser's Python binding): a name
is a vector selector's metric name, or an exact `__name__` matcher; a regex on `__name__`
is refused (no honest check could follow it). Grafana's variables are replaced by values
of their kind first, and `label_values(QUERY, label)` is read as QUERY. The exported names
come from the `# TYPE` lines of the exposition (so a labelled family with no sample yet
still counts) and from every sample.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import promql_parser

PROMETHEUS_OWN = frozenset({"up"})  # recorded by Prometheus for each scrape target
TYPE_SUFFIXES = {"counter": ("",), "gauge": ("",), "untyped": ("",),
                 "histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}
GRAFANA_VARIABLES = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h",
                     "instance": ".*", "datasource": "prometheus"}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$", re.S)


class UncheckableQuery(ValueError):
    """A query whose metric names cannot be read off its text."""


def exported_names(exposition: str) -> set[str]:
    """Every series name a Prometheus text exposition declares or samples."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names.update(name + suffix for suffix in TYPE_SUFFIXES[kind])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def grafana_to_promql(query: str) -> str:
    """A Grafana query as plain PromQL: variables replaced, `label_values(...)` unwrapped."""
    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name not in GRAFANA_VARIABLES:
            raise UncheckableQuery(f"unknown Grafana variable ${name} in {query!r}")
        return GRAFANA_VARIABLES[name]

    text = _VARIABLE.sub(value, query)
    inner = _LABEL_VALUES.match(text)
    return inner.group(1) if inner else text


def query_names(query: str) -> set[str]:
    """The metric names a PromQL query reads (raises on a parse error)."""
    names: set[str] = set()

    def visit(node) -> None:
        if not isinstance(node, promql_parser.VectorSelector):
            return
        if node.name:
            names.add(node.name)
        for m in node.matchers.matchers:
            if m.name == "__name__":
                if m.op != promql_parser.MatchOp.Equal:
                    raise UncheckableQuery(f"a regex on __name__ in {query!r}")
                names.add(m.value)

    promql_parser.walk(promql_parser.parse(query), visit)
    return names


def dashboard_queries(dashboard: dict) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable of a Grafana dashboard."""
    def panels(items: list[dict]) -> Iterator[dict]:
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dashboard.get("panels", [])):
        for t in p.get("targets", []):
            yield f"panel {p['title']!r} {t['refId']}", grafana_to_promql(t["expr"])
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]
            yield f"variable {v['name']}", grafana_to_promql(q["query"] if isinstance(q, dict)
                                                              else q)


def rule_queries(rules: dict) -> Iterator[tuple[str, str]]:
    """(alert or record name, PromQL) of every rule of a Prometheus rule file."""
    for group in rules["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], rule["expr"]
