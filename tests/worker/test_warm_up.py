"""The worker's start-up warm-up runs the real step path and leaves nothing behind."""

from __future__ import annotations

import pytest

from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.wire.sampling import SamplingParams
from runtime.wire.worker_channel import BatchPlan, RowInit
from runtime.worker.worker import Worker


def first_token(worker: Worker) -> int:
    pages = list(range(1, 6))[:-(-5 // worker.page_size)]  # from page 1, as the warm-up's
    plan = BatchPlan(batch_id=0, rows=[0], prefix_lens=[0], extend_lens=[5],
                     input_ids=[11, 12, 13, 14, 15], new_pages=pages,
                     sample=[True],
                     inits=[RowInit(row=0, params=SamplingParams(temperature=0.0))])
    return worker.launch(plan).result().next_ids[0]


@pytest.mark.parametrize("kv", ["token", "paged"])
def test_warm_up_then_serving_matches_a_cold_worker(kv):
    cfg = ServerConfig(model="dummy:tiny", device="cpu", kv_slots=256, max_running=4, kv=kv)
    spec = resolve_model(cfg.model)
    cold = first_token(Worker(cfg, spec))
    warm = Worker(cfg, spec)
    warm.warm_up()  # uses row 0 and the same slots the request below then reuses
    assert first_token(warm) == cold
