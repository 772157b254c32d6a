"""A scale-in while 100 streams run: on a local Ray cluster (CPU, `dummy:tiny`) the
application starts with 3 replicas, 100 clients each keep one stream open (short greedy
requests back to back), and the policy (100 in flight, 60 per replica wanted: 2 replicas)
removes one replica while they run. The replica removed finishes the streams it carried
before it stops; no stream is cut, and every output equals one plain server's.

Slow: three replica servers start, and 100 streams share a 2-core machine with them.
"""

from __future__ import annotations

import random
import time

import pytest

from tests.e2e.server import wait_for
from tests.ray_serve.serve_load import Load

pytest.importorskip("ray.serve", reason="needs Ray Serve (pip install 'sluice[ray]')")

from tests.ray_serve import cluster  # noqa: E402 - needs ray

pytestmark = cluster.MARKS

STREAMS = 100
MAX_TOKENS = 16
PROMPTS = [[random.Random(500 + i).randrange(3, 1000) for _ in range(32)] for i in range(20)]
# 100 in flight / 60 per replica asks for 2 replicas from the start: the first scale-in
# comes `--downscale-delay-s` after the deployment, once every client has a stream open
# (they open within ~3 s of it)
POLICY_FLAGS = ["--min-replicas", "2", "--max-replicas", "3", "--initial-replicas", "3",
                "--target-ongoing-requests", "60", "--upscale-delay-s", "1",
                "--downscale-delay-s", "10", "--look-back-s", "4",
                "--health-check-period-s", "1", "--drain-timeout-s", "120"]


def _cycled(n: int) -> tuple[int, list[int]]:
    return n % len(PROMPTS), PROMPTS[n % len(PROMPTS)]


@pytest.mark.timeout(900)
def test_a_scale_in_while_100_streams_run_cuts_none():
    reference = cluster.Background(cluster.single_server_outputs, PROMPTS, MAX_TOKENS)
    with cluster.serving(POLICY_FLAGS) as url:
        assert cluster.replica_states() == {"RUNNING": 3}
        load = Load(url, _cycled, MAX_TOKENS)
        stop = cluster.FirstStop()
        load.set_concurrency(STREAMS)
        try:
            assert wait_for(lambda: stop.at is not None, 180, poll=0.2), cluster.replica_states()
            assert wait_for(lambda: cluster.replica_states() == {"RUNNING": 2}, 180, poll=0.5), \
                cluster.replica_states()
            done = time.monotonic()
            # every client finishes one more request, all on the two replicas left
            assert wait_for(lambda: sum(o.started > done for o in load.outcomes) >= STREAMS,
                            300, poll=0.5)
        finally:
            outcomes = load.stop()
        open_at_stop = load.open_at(stop.at)

    broken = [o for o in outcomes if not o.whole]
    assert not broken, (len(broken), broken[:3])
    expected = reference.result()
    wrong = [o for o in outcomes if o.output_ids != expected[o.prompt]]
    assert not wrong, (len(wrong), wrong[:2])
    survivors = {o.replica for o in outcomes if o.started > done}
    removed = {o.replica for o in outcomes} - survivors
    assert len(survivors) == 2 and len(removed) == 1, (survivors, removed)
    drained = [o for o in open_at_stop if o.replica in removed]
    assert drained, "the replica removed carried no stream when it began to stop"
    assert len(open_at_stop) >= 0.9 * STREAMS, len(open_at_stop)
    print(f"\n{len(outcomes)} streams, {len(open_at_stop)} open when the replica began to "
          f"stop; it drained {len(drained)}")
