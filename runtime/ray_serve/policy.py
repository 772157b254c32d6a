"""The autoscaling policy: how many server replicas the load asks for, at each decision.

From Serve's own count of requests in flight, `in flight / target_ongoing_requests`
replicas (as Serve's default policy); and from the servers' /metrics (each replica's
`record_autoscaling_stats`, averaged over the look-back window):

- one replica more than now while the waiting requests per replica exceed
  `queue_threshold`, or the GPU utilization exceeds `upscale_utilization`;
- no fewer than now while the GPU utilization is at least `downscale_utilization` (on the
  CPU there is no utilization: the load alone decides).

Waiting requests below `queue_threshold` do not hold a scale-in back: they are in Serve's
count of requests in flight already, and under steady arrivals a few always wait for the
server's next step (admission happens once a step) however idle the batch is.

Serve applies the rest: a change happens only once the policy has asked for it without a
break for `upscale_delay_s` (more) or `downscale_delay_s` (fewer), within
min_replicas..max_replicas.
"""

from __future__ import annotations

from ray.serve.config import AutoscalingConfig, AutoscalingContext, AutoscalingPolicy

from runtime.ray_serve.options import RayServeOptions
from runtime.ray_serve.server_stats import GPU_UTILIZATION, WAITING


def _mean(per_replica: dict | None) -> float | None:
    return sum(per_replica.values()) / len(per_replica) if per_replica else None


class SluiceAutoscalingPolicy:
    def __init__(self, queue_threshold: float, upscale_utilization: float,
                 downscale_utilization: float) -> None:
        self.queue_threshold = queue_threshold
        self.upscale_utilization = upscale_utilization
        self.downscale_utilization = downscale_utilization

    def __call__(self, ctx: AutoscalingContext) -> tuple[float, dict]:
        now = ctx.current_num_replicas
        if now == 0:
            return ctx.target_num_replicas, {}
        wanted = ctx.total_num_requests / ctx.config.get_target_ongoing_requests()
        metrics = ctx.aggregated_metrics or {}
        waiting = _mean(metrics.get(WAITING))
        busy = _mean(metrics.get(GPU_UTILIZATION))
        if (waiting is not None and waiting > self.queue_threshold) or \
                (busy is not None and busy > self.upscale_utilization):
            wanted = max(wanted, now + 1)
        elif busy is not None and busy >= self.downscale_utilization:
            wanted = max(wanted, now)
        return wanted, {}


def autoscaling_config(opts: RayServeOptions) -> AutoscalingConfig:
    """Serve's autoscaling config of `opts`, with the policy above."""
    return AutoscalingConfig(
        min_replicas=opts.min_replicas, max_replicas=opts.max_replicas,
        initial_replicas=opts.initial_replicas or None,
        target_ongoing_requests=opts.target_ongoing_requests,
        upscale_delay_s=opts.upscale_delay_s, downscale_delay_s=opts.downscale_delay_s,
        look_back_period_s=opts.look_back_s,
        policy=AutoscalingPolicy(
            policy_function=SluiceAutoscalingPolicy,
            policy_kwargs={"queue_threshold": opts.queue_threshold,
                           "upscale_utilization": opts.upscale_utilization,
                           "downscale_utilization": opts.downscale_utilization}))
