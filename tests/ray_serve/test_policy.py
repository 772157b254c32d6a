"""The autoscaling policy's decisions from Serve's request count and the servers'
/metrics, and the load figures read from a real /metrics text."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from runtime.ray_serve.server_stats import GPU_UTILIZATION, RUNNING, WAITING, load_stats

pytest.importorskip("ray.serve", reason="needs Ray Serve")

from runtime.ray_serve.options import RayServeOptions  # noqa: E402
from runtime.ray_serve.policy import SluiceAutoscalingPolicy, autoscaling_config  # noqa: E402

POLICY = SluiceAutoscalingPolicy(queue_threshold=50, upscale_utilization=0.8,
                                 downscale_utilization=0.4)


def _ctx(replicas: int, in_flight: float, target: float = 10, **per_replica_metric):
    metrics = {name: {f"r{i}": v for i, v in enumerate(values)}
               for name, values in per_replica_metric.items()}
    return SimpleNamespace(current_num_replicas=replicas, target_num_replicas=replicas,
                           total_num_requests=in_flight, aggregated_metrics=metrics,
                           config=SimpleNamespace(get_target_ongoing_requests=lambda: target))


@pytest.mark.parametrize("ctx, wanted", [
    (_ctx(2, 40), 4.0),  # requests in flight / target, as Serve's own policy
    (_ctx(2, 5), 0.5),  # few: fewer (Serve keeps min_replicas)
    (_ctx(2, 5, waiting=[60, 50]), 3),  # a long queue: one more
    # a short queue, as arrivals wait for the next step: the requests in flight decide
    (_ctx(2, 5, waiting=[3, 1]), 0.5),
    (_ctx(2, 5, gpu_utilization=[0.9, 0.85]), 3),  # busy GPUs: one more
    (_ctx(2, 5, gpu_utilization=[0.5, 0.5]), 2),  # between the thresholds: hold
    (_ctx(2, 5, gpu_utilization=[0.3, 0.2]), 0.5),  # idle GPUs: the load decides
    (_ctx(2, 60, gpu_utilization=[0.9, 0.9]), 6.0),  # the larger of both
])
def test_decisions(ctx, wanted):
    assert POLICY(ctx) == (wanted, {})


def test_the_config_carries_the_knobs():
    opts = RayServeOptions(min_replicas=3, max_replicas=7, upscale_delay_s=5,
                           downscale_delay_s=6, target_ongoing_requests=9, look_back_s=11,
                           queue_threshold=12, initial_replicas=4)
    c = autoscaling_config(opts)
    assert c.initial_replicas == 4
    assert autoscaling_config(RayServeOptions()).initial_replicas is None  # min_replicas
    assert (c.min_replicas, c.max_replicas, c.upscale_delay_s, c.downscale_delay_s,
            c.target_ongoing_requests, c.look_back_period_s) == (3, 7, 5, 6, 9, 11)
    assert c.policy.policy_kwargs["queue_threshold"] == 12
    assert isinstance(c.policy.get_policy()(**c.policy.policy_kwargs), SluiceAutoscalingPolicy)


METRICS = """\
# HELP sluice_num_requests_running Requests in the running batch
# TYPE sluice_num_requests_running gauge
sluice_num_requests_running 3.0
# HELP sluice_num_requests_waiting Requests waiting for admission
# TYPE sluice_num_requests_waiting gauge
sluice_num_requests_waiting 7.0
# TYPE sluice_gpu_utilization_ratio gauge
sluice_gpu_utilization_ratio{gpu="0"} 0.5
sluice_gpu_utilization_ratio{gpu="1"} 0.7
"""


def test_load_stats():
    assert load_stats(METRICS) == pytest.approx({RUNNING: 3, WAITING: 7, GPU_UTILIZATION: 0.6})
    no_gpu = METRICS.split("# TYPE sluice_gpu")[0]
    assert load_stats(no_gpu) == {RUNNING: 3.0, WAITING: 7.0}
