"""deploy/k8s/base: every manifest is valid (the Kubernetes client's models, which refuse
unknown fields; KEDA's and the Prometheus Operator's kinds against their fields), the
objects fit together (selectors, ports, the router's discovery, the drain time), the
server's flags are ones `sluice serve` takes, and the autoscaler queries only metrics a
live server exports."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes.client as k8s
import promql_parser
import pytest
import yaml

from runtime.config.server import ServerConfig
from runtime.launch.cli import build_parser, config_from_args
from runtime.launch.process_group import STOP_TIMEOUT_S
from tests.deploy.metric_names import query_names

BASE = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "base"
KUSTOMIZATION = yaml.safe_load((BASE / "kustomization.yaml").read_text())
OBJECTS = [doc for name in KUSTOMIZATION["resources"]
           for doc in yaml.safe_load_all((BASE / name).read_text()) if doc]
CORE_GROUPS = {"v1", "apps/v1", "policy/v1", "rbac.authorization.k8s.io/v1"}
# the fields of the custom kinds these manifests may use (KEDA 2.x, Prometheus Operator)
SCALED_OBJECT_SPEC = {"scaleTargetRef", "pollingInterval", "cooldownPeriod",
                      "initialCooldownPeriod", "idleReplicaCount", "minReplicaCount",
                      "maxReplicaCount", "fallback", "advanced", "triggers"}
TRIGGER = {"type", "name", "metadata", "metricType", "useCachedMetrics", "authenticationRef"}
PROMETHEUS_TRIGGER = {"serverAddress", "query", "threshold", "activationThreshold",
                      "namespace", "ignoreNullValues", "unsafeSsl", "customHeaders",
                      "queryParameters", "authModes"}
POD_MONITOR_SPEC = {"jobLabel", "podTargetLabels", "selector", "namespaceSelector",
                    "podMetricsEndpoints", "sampleLimit", "targetLimit"}
POD_METRICS_ENDPOINT = {"port", "path", "interval", "scrapeTimeout", "scheme",
                        "authorization", "relabelings", "metricRelabelings", "honorLabels"}


def one(kind: str, name: str | None = None) -> dict:
    found = [o for o in OBJECTS if o["kind"] == kind
             and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name}: {len(found)} objects"
    return found[0]


def selects(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


SERVER = one("Deployment", "sluice-default")
ROUTER = one("Deployment", "sluice-router")
SERVER_POD = SERVER["spec"]["template"]
CONTAINER = SERVER_POD["spec"]["containers"][0]
SCALED = one("ScaledObject")


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_the_kustomization_lists_every_manifest_of_the_base():
    listed = set(KUSTOMIZATION["resources"])
    assert listed == {p.name for p in BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert KUSTOMIZATION["kind"] == "Kustomization"
    assert {i["name"] for i in KUSTOMIZATION["images"]} == {
        c["image"] for d in (SERVER, ROUTER) for c in d["spec"]["template"]["spec"]["containers"]}


@pytest.mark.parametrize("obj", [o for o in OBJECTS if o["apiVersion"] in CORE_GROUPS],
                         ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_core_objects_validate_against_the_kubernetes_models(obj):
    model = getattr(k8s, "V1" + obj["kind"])
    model.model_validate(obj)  # raises on a missing required field, a wrong type, a typo


def test_the_server_takes_its_flags_and_a_gpu_per_tp_rank(tmp_path):
    assert CONTAINER["command"] == ["sluice", "serve"]
    args = build_parser().parse_args(["serve", *CONTAINER["args"]])
    cfg: ServerConfig = config_from_args(args, ipc_dir=str(tmp_path))  # validated
    assert cfg.host == "0.0.0.0"
    assert [p["containerPort"] for p in CONTAINER["ports"] if p["name"] == "http"] == [cfg.port]
    res = CONTAINER["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == str(cfg.tp)


def test_probes_readiness_on_health_liveness_and_a_start_up_allowance(tmp_path):
    ready = CONTAINER["readinessProbe"]["httpGet"]
    assert ready == {"path": "/health", "port": "http"}
    assert CONTAINER["livenessProbe"]["tcpSocket"] == {"port": "http"}
    start = CONTAINER["startupProbe"]
    cfg = config_from_args(build_parser().parse_args(["serve", *CONTAINER["args"]]),
                           ipc_dir=str(tmp_path))
    assert start["httpGet"]["path"] == "/health"
    assert start["periodSeconds"] * start["failureThreshold"] >= cfg.ready_timeout


def test_termination_grace_covers_the_drain_of_shutdown_grace(tmp_path):
    cfg = config_from_args(build_parser().parse_args(["serve", *CONTAINER["args"]]),
                           ipc_dir=str(tmp_path))
    pre_stop = CONTAINER["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # the pod's SIGTERM comes after preStop; the api then drains for shutdown_grace and
    # gets STOP_TIMEOUT_S more, the other processes STOP_TIMEOUT_S after it
    needed = int(pre_stop[1]) + cfg.shutdown_grace + 2 * STOP_TIMEOUT_S
    grace = SERVER_POD["spec"]["terminationGracePeriodSeconds"]
    assert needed <= grace <= needed + 10


def test_selectors_find_the_pods_they_mean():
    labels = SERVER_POD["metadata"]["labels"]
    assert SERVER["spec"]["selector"]["matchLabels"] == labels
    router_pod = ROUTER["spec"]["template"]["metadata"]["labels"]
    assert ROUTER["spec"]["selector"]["matchLabels"] == router_pod
    assert selects(one("Service", "sluice")["spec"]["selector"], router_pod)
    servers = one("Service", "sluice-servers")["spec"]
    assert selects(servers["selector"], labels) and servers["clusterIP"] == "None"
    assert not selects(servers["selector"], router_pod)
    pdb = one("PodDisruptionBudget")["spec"]
    assert pdb["minAvailable"] == 2 and pdb["selector"]["matchLabels"] == labels


def test_the_router_discovers_the_server_pods_of_its_namespace():
    router_args = pytest.importorskip(
        "sglang_router.launch_router", reason="needs sglang-router (sluice[router])")
    container = ROUTER["spec"]["template"]["spec"]["containers"][0]
    args = router_args.parse_router_args(container["args"])
    assert args.service_discovery and selects(args.selector, SERVER_POD["metadata"]["labels"])
    assert not selects(args.selector, ROUTER["spec"]["template"]["metadata"]["labels"])
    assert args.service_discovery_port == CONTAINER["ports"][0]["containerPort"]
    assert args.health_check_endpoint == "/health" and args.policy == "cache_aware"
    env = {e["name"]: e for e in container["env"]}
    assert args.service_discovery_namespace == "$(POD_NAMESPACE)"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    account = ROUTER["spec"]["template"]["spec"]["serviceAccountName"]
    binding = one("RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    rule = one("Role", binding["roleRef"]["name"])["rules"][0]
    assert rule["resources"] == ["pods"] and {"list", "watch"} <= set(rule["verbs"])


def test_prometheus_scrapes_the_servers_as_job_sluice_with_their_group():
    mon = one("PodMonitor")
    assert mon["apiVersion"] == "monitoring.coreos.com/v1"
    spec = mon["spec"]
    assert set(spec) <= POD_MONITOR_SPEC
    labels = SERVER_POD["metadata"]["labels"]
    k8s.V1LabelSelector.model_validate(spec["selector"])
    assert selects(spec["selector"]["matchLabels"], labels)
    assert labels[spec["jobLabel"]] == "sluice"  # the job the alert rules name
    assert all(label in labels for label in spec["podTargetLabels"])
    for endpoint in spec["podMetricsEndpoints"]:
        assert set(endpoint) <= POD_METRICS_ENDPOINT
        assert endpoint["path"] == "/metrics"
        assert endpoint["port"] in {p["name"] for p in CONTAINER["ports"]}


def test_the_scaled_object_states_the_policy():
    assert SCALED["apiVersion"] == "keda.sh/v1alpha1"
    spec = SCALED["spec"]
    assert set(spec) <= SCALED_OBJECT_SPEC
    assert spec["scaleTargetRef"] == {"name": SERVER["metadata"]["name"]}
    assert spec["minReplicaCount"] == 2 <= spec["maxReplicaCount"]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    k8s.V2HorizontalPodAutoscalerBehavior.model_validate(behavior)
    [trigger] = spec["triggers"]
    assert set(trigger) <= TRIGGER and trigger["type"] == "prometheus"
    assert trigger["metricType"] == "Value" and trigger["metadata"]["threshold"] == "1"
    assert set(trigger["metadata"]) <= PROMETHEUS_TRIGGER
    assert trigger["metadata"]["ignoreNullValues"] == "false"
    query = " ".join(trigger["metadata"]["query"].split())
    promql_parser.parse(query)
    # out: util > 0.8 through 3 minutes, or more than 50 waiting; in: < 0.4 through 15
    assert re.search(r"min_over_time\(avg\(sluice_gpu_utilization_ratio\{[^}]*\}\)\[3m:\w+\]\)"
                     r" > bool 0\.8\)", query)
    assert re.search(r"sum\(sluice_num_requests_waiting\{[^}]*\}\) > bool 50\)", query)
    assert re.search(r"max_over_time\(avg\(sluice_gpu_utilization_ratio\{[^}]*\}\)\[15m:\w+\]\)"
                     r" < bool 0\.4\)", query)


def test_the_scaled_object_reads_its_own_group():
    group = SERVER_POD["metadata"]["labels"]["sluice-instance-group"]
    query = SCALED["spec"]["triggers"][0]["metadata"]["query"]
    selectors = re.findall(r"\{([^}]*)\}", query)
    assert selectors and all(f'sluice_instance_group="{group}"' in s and 'job="sluice"' in s
                             for s in selectors)


def test_the_autoscaler_queries_only_exported_metrics(live_names):
    query = SCALED["spec"]["triggers"][0]["metadata"]["query"]
    names = query_names(query)
    assert names == {"sluice_gpu_utilization_ratio", "sluice_num_requests_waiting"}
    assert names <= live_names
