"""TP 2 on the CPU (gloo) beyond greedy token mode, with `dummy:tiny` (8 query heads, 2 KV
heads): paged KV, seeded sampling, an abort mid-decode, and a rank that dies mid-request.
Every rank samples from its copy of the gathered logits, and with overlap each feeds its
own sampled tokens into the next batch (planned before they are known): ranks that drew
different tokens would attend over different inputs, and the outputs would show it.

TP 2 adds the row-parallel partial sums in another order than TP 1's whole matmuls, so
logprobs differ by float32 rounding (measured: under 1e-6); a token could differ only
where two candidates were that close, which none of these requests has, so the tokens
are TP 1's exactly.
"""

from __future__ import annotations

import pytest
import torch

from runtime import Engine, SamplingParams
from tests.e2e.server import ServerProcess, kill_mid_stream
from tests.e2e.test_engine_api import wait_idle

OPTIONS = dict(model="dummy:tiny", device="cpu", dtype="float32", kv="paged", overlap=True,
               torch_threads=1, chunk_size=64, log_level="warning")
ROUNDING = 1e-5  # logprob difference TP 2's summation order may make (measured < 1e-6)


def requests() -> tuple[list[list[int]], list[SamplingParams]]:
    """Eight prompts (4..89 tokens: several 16-slot blocks, chunked); odd ones greedy,
    even ones seeded top-p sampling; logprobs to compare."""
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 1024, (int(k),), generator=gen).tolist()
               for k in torch.randint(4, 90, (8,), generator=gen)]
    params = [SamplingParams(max_tokens=24, ignore_eos=True, logprobs=True,
                             **(dict(temperature=0.0) if i % 2 else
                                dict(temperature=0.8, top_p=0.9, seed=50 + i)))
              for i in range(8)]
    return prompts, params


@pytest.fixture(scope="module")
def tp1():
    with Engine(tp=1, **OPTIONS) as eng:
        yield eng.generate(*requests())


@pytest.fixture(scope="module")
def tp2():
    with Engine(tp=2, **OPTIONS) as eng:
        yield eng


def test_paged_greedy_and_seeded_sampling_equal_tp1(tp2, tp1):
    outs = tp2.generate(*requests())
    assert [o.token_ids for o in outs] == [o.token_ids for o in tp1]
    for ours, ref in zip(outs, tp1):
        assert ours.logprobs == pytest.approx(ref.logprobs, abs=ROUNDING)
    stats = wait_idle(tp2)
    assert stats.invariant_error is None and stats.kv_used == 0


def test_abort_mid_decode_under_tp(tp2, tp1):
    """Every rank runs the plans after the abort; the next request is TP 1's."""
    prompts, params = requests()
    before = wait_idle(tp2).num_steps
    stream = tp2.stream(prompts[0], SamplingParams(max_tokens=1500, ignore_eos=True),
                        text=False)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    acked = wait_idle(tp2)
    assert acked.running == acked.kv_used == 0 and acked.invariant_error is None
    assert acked.num_steps - before < 1500  # it did not run to its end
    again = tp2.generate(prompts[1], params[1])[0]
    assert again.token_ids == tp1[1].token_ids
    assert wait_idle(tp2).num_steps - acked.num_steps == params[1].max_tokens


def test_a_dying_rank_fails_the_request_in_flight_and_the_server_exits():
    """SIGKILL of TP rank 1 mid-decode: the client gets an error, not a hang, and every
    process of the server goes."""
    srv = ServerProcess("--model", "dummy:tiny", "--device", "cpu", "--dtype", "float32",
                        "--tp", "2", "--torch-threads", "1")
    try:
        kill_mid_stream(srv, "worker1", [5, 6, 7, 8], 60)
    finally:
        srv.stop()
