"""Sluice on Ray Serve, on a local Ray cluster (CPU, `dummy:tiny`), with the policy's
delays shortened: a load ramp scales 2 -> 3 replicas and back to 2 with no failed or cut
request and every request's tokens equal to a single server's; a replica killed mid-stream
ends its stream with an error event while new requests go elsewhere and Serve replaces it;
a replica whose server never becomes healthy fails the deployment with the server's error.

One cluster and application for the module; each test leaves it at 2 running replicas.
Slow: a replica's server starts in 20-100 s on a busy 2-core machine, and the ramp waits
for one start.
"""

from __future__ import annotations

import queue
import random
import threading
import time

import pytest

from tests.e2e.server import wait_for
from tests.ray_serve.serve_load import Load, stream_generate

ray = pytest.importorskip("ray", reason="needs Ray Serve (pip install 'sluice[ray]')")
serve = pytest.importorskip("ray.serve")

from runtime.ray_serve.app import build_app  # noqa: E402 - needs ray
from runtime.ray_serve.cli import parse  # noqa: E402
from tests.ray_serve.cluster import (  # noqa: E402
    MARKS,
    Background,
    FirstStop,
    replica_states,
    serving,
    single_server_outputs,
)

pytestmark = MARKS

POLICY_FLAGS = ["--min-replicas", "2", "--max-replicas", "3", "--target-ongoing-requests", "2",
                "--upscale-delay-s", "1", "--downscale-delay-s", "8", "--look-back-s", "4",
                "--prefix-imbalance", "1", "--health-check-period-s", "1",
                "--drain-timeout-s", "60"]
MAX_TOKENS = 32
PROMPTS = [[random.Random(i).randrange(3, 1000) for _ in range(48)] for i in range(8)]
# concurrent streams: 10 / target 2 asks for 5 replicas (max 3); 4 ask for 2
HIGH, LOW = 10, 4
LONG = 128  # tokens: 4x a short stream


def _running() -> int:
    return replica_states().get("RUNNING", 0)


@pytest.fixture(scope="module")
def reference():
    """The single-server outputs, computed while the cluster starts."""
    job = Background(single_server_outputs, PROMPTS, MAX_TOKENS)
    yield job.result


@pytest.fixture(scope="module")
def url(reference):
    with serving(POLICY_FLAGS) as address:
        yield address


def _cycled(n: int) -> tuple[int, list[int]]:
    return n % len(PROMPTS), PROMPTS[n % len(PROMPTS)]


def _fresh(n: int) -> tuple[int, list[int]]:
    """A prompt no replica has seen: routed to the least busy replica."""
    return -1, [random.Random(1000 + n).randrange(3, 1000) for _ in range(48)]


@pytest.mark.timeout(900)
def test_a_load_ramp_scales_out_and_back_in_losing_nothing(url, reference):
    """10 short streams at a time scale 2 -> 3; once they ended, 4 long ones scale 3 -> 2,
    and no stream is cut. (Which replica carries a long stream when Serve stops one is up
    to the router's stale load view: that the removed replica drains its streams is
    asserted by test_scale_in_under_load, where every replica carries ~33.)"""
    assert replica_states() == {"RUNNING": 2}
    burst = Load(url, _cycled, MAX_TOKENS)
    start = time.monotonic()
    burst.set_concurrency(HIGH)
    assert wait_for(lambda: _running() == 3, 420, poll=0.5), replica_states()
    scaled_out = time.monotonic() - start
    # the new replica takes requests (its load is the lowest)
    assert wait_for(lambda: len(burst.replicas()) == 3, 120, poll=0.2)
    short = burst.stop()
    calm = Load(url, _fresh, LONG)
    calm_start = time.monotonic()
    calm.set_concurrency(LOW)
    stop = FirstStop()
    assert wait_for(lambda: stop.at is not None, 120, poll=0.2), replica_states()
    assert wait_for(lambda: replica_states() == {"RUNNING": 2}, 120, poll=0.5), replica_states()
    scaled_in = time.monotonic() - calm_start
    served = len(calm.outcomes)
    assert wait_for(lambda: len(calm.outcomes) >= served + LOW, 120, poll=0.2)
    long = calm.stop()

    broken = [o for o in short + long if not o.whole]
    assert not broken, broken[:3]
    expected = reference()
    wrong = [o for o in short if o.output_ids != expected[o.prompt]]
    assert not wrong, (len(wrong), wrong[:2])
    assert all(len(o.output_ids) == LONG for o in long)
    print(f"\n{len(short)} short and {len(long)} long streams; 2 -> 3 replicas after "
          f"{scaled_out:.1f} s of load, 3 -> 2 after {scaled_in:.1f} s of calm, "
          f"{len(calm.open_at(stop.at))} long stream(s) open when one began to stop")


def test_a_replica_killed_mid_stream(url, reference):
    """Its stream ends with an error event and `[DONE]`; new requests go to the other
    replica; Serve replaces the dead one."""
    assert wait_for(lambda: replica_states() == {"RUNNING": 2}, 120, poll=0.5), replica_states()
    heads: queue.Queue[str] = queue.Queue()
    result = {}
    long = 1800  # tokens: the stream outlives the kill by far

    def client():
        result["out"] = stream_generate(url, PROMPTS[0], long, on_head=heads.put)

    thread = threading.Thread(target=client)
    thread.start()
    victim = heads.get(timeout=120)  # the replica streaming it
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    thread.join(120)
    out = result["out"]
    assert out.status == 200 and out.done and "replica failed" in out.error, out
    assert len(out.output_ids) < long

    expected = reference()
    for i in range(4):
        other = stream_generate(url, PROMPTS[i], MAX_TOKENS, i)
        assert other.whole and other.replica != victim, other
        assert other.output_ids == expected[i]
    assert wait_for(lambda: replica_states() == {"RUNNING": 2}, 240, poll=0.5), replica_states()


def test_a_replica_that_never_becomes_healthy(url, tmp_path):
    """A server that cannot start: the deployment fails with the server's error, and the
    application already serving is unaffected."""
    missing = str(tmp_path / "no-such-model")
    cfg, opts = parse(["--model", missing, "--device", "cpu", "--min-replicas", "1",
                       "--max-replicas", "1", "--max-start-attempts", "1"])
    with pytest.raises(RuntimeError):
        serve.run(build_app(cfg, opts, cluster_gpus=0), name="broken", route_prefix="/broken")
    try:
        message = serve.status().applications["broken"].deployments["SluiceReplica"].message
        assert "the server exited with code 2" in message and missing in message, message
        assert stream_generate(url, PROMPTS[1], MAX_TOKENS).whole
    finally:
        serve.delete("broken")
