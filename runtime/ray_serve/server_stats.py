"""The load figures of a server's /metrics that the autoscaling policy reads."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

WAITING = "waiting"  # requests waiting for admission
RUNNING = "running"  # requests in the running batch
GPU_UTILIZATION = "gpu_utilization"  # mean over the server's GPUs, 0..1 (absent on the CPU)

_GAUGES = {"sluice_num_requests_waiting": WAITING, "sluice_num_requests_running": RUNNING}
_GPU_UTILIZATION = "sluice_gpu_utilization_ratio"


def load_stats(metrics_text: str) -> dict[str, float]:
    """{WAITING, RUNNING[, GPU_UTILIZATION]} from a Prometheus text exposition."""
    stats = {WAITING: 0.0, RUNNING: 0.0}
    gpus = []
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in _GAUGES:
                stats[_GAUGES[sample.name]] += sample.value
            elif sample.name == _GPU_UTILIZATION:
                gpus.append(sample.value)
    if gpus:
        stats[GPU_UTILIZATION] = sum(gpus) / len(gpus)
    return stats
