"""Top logprobs from SmolLM2's worker and the scheduler in one process, against HF.

The reference is log_softmax + topk over HF's logits for the same sequence (prompt and
our greedy output), so the alternatives of every output token and, from
`logprob_start_len`, of every prompt token must match it; requests asking different
numbers of alternatives share steps with each other and with one asking none.
"""

from __future__ import annotations

from collections import deque

import pytest
import torch

from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.scheduler.loop import build_scheduler
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from runtime.worker.worker import Worker
from tests.e2e.hf_reference import HFReference, shared_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ATOL = 2e-3


@pytest.fixture(scope="module")
def served():
    """Outputs (ReqOut fields joined per request) of three greedy requests run together."""
    cfg = ServerConfig(model="smollm2", device=DEVICE, dtype="float32", kv_slots=2048,
                       max_running=8, chunk_size=16, log_level="warning")
    spec = resolve_model(cfg.model)
    worker = Worker(cfg, spec)
    sched = build_scheduler(cfg, worker.ready_message(), spec.max_context)
    hf = shared_reference()
    prompts = {
        "five": hf.tokenizer.encode("The capital of France is Paris. The capital of Italy is"),
        "two": hf.tokenizer.encode("1, 2, 3, 4,"),
        "none": hf.tokenizer.encode("Once upon a time"),
    }
    asks = {"five": dict(top_logprobs=5, logprob_start_len=0), "two": dict(top_logprobs=2),
            "none": {}}
    for rid, prompt in prompts.items():
        params = SamplingParams(max_tokens=6, temperature=0.0, **asks[rid])
        params.validate()
        sched.add(GenerateReq(rid, prompt, params))
    fields = ("token_ids", "logprobs", "top_ids", "top_logprobs", "input_logprobs",
              "input_top_ids", "input_top_logprobs")
    outs = {rid: {f: [] for f in fields} for rid in prompts}
    launched: deque = deque()
    while sched.has_work or launched:
        while sched.can_plan() and (plan := sched.plan()) is not None:
            launched.append(worker.launch(plan))
        sched.on_result(launched.popleft().result())
        for out in sched.take_outputs():
            assert out.error is None, out.error
            for f in fields:
                outs[out.rid][f] += getattr(out, f)
    return prompts, outs, hf


def reference(hf: HFReference, seq: list[int], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's top-(k + 1) ids and logprobs [len(seq), k + 1] after each position of `seq`
    (one more than asked, to tell a near-tie at the last place)."""
    with torch.inference_mode():
        logits = hf.model(torch.tensor([seq])).logits[0].float()  # [T, V]
    values, ids = torch.log_softmax(logits, dim=-1).topk(k + 1, dim=-1)  # [T, k + 1] x2
    return ids, values


def check(ids: list[int], lps: list[float], ref_ids: torch.Tensor, ref_lps: torch.Tensor):
    """Our flat top-k equals HF's [n, k + 1] (but for the extra place): the logprobs within
    ATOL, the tokens in the same order except where neighbours nearly tie."""
    k = ref_ids.shape[1] - 1
    got_ids = torch.tensor(ids).view(-1, k)  # [n, k]
    got_lps = torch.tensor(lps).view(-1, k)  # [n, k]
    assert got_ids.shape == ref_ids[:, :k].shape
    assert torch.allclose(got_lps, ref_lps[:, :k], atol=ATOL), (got_lps - ref_lps[:, :k])
    near = (ref_lps[:, :-1] - ref_lps[:, 1:]) < ATOL  # [n, k]: place j ties with j + 1
    tie = near.clone()
    tie[:, 1:] |= near[:, :-1]  # ... or with j - 1
    assert torch.all((got_ids == ref_ids[:, :k]) | tie)


@pytest.mark.parametrize("rid,k", [("five", 5), ("two", 2)])
def test_output_alternatives_match_hf_and_lead_with_the_greedy_token(served, rid, k):
    prompts, outs, hf = served
    out, prompt = outs[rid], prompts[rid]
    n = len(out["token_ids"])
    assert n == 6 and len(out["top_ids"]) == len(out["top_logprobs"]) == n * k
    ref_ids, ref_lps = reference(hf, prompt + out["token_ids"], k)
    check(out["top_ids"], out["top_logprobs"], ref_ids[len(prompt) - 1:-1],
          ref_lps[len(prompt) - 1:-1])
    for i, (tok, lp) in enumerate(zip(out["token_ids"], out["logprobs"])):
        # greedy: the sampled token is the most likely one, with the same logprob
        assert out["top_ids"][i * k] == tok
        assert out["top_logprobs"][i * k] == pytest.approx(lp, abs=1e-5)


def test_prompt_alternatives_match_hf_from_the_second_token(served):
    prompts, outs, hf = served
    out, prompt = outs["five"], prompts["five"]
    assert len(out["input_logprobs"]) == len(prompt) - 1  # the first token has no logprob
    ref_ids, ref_lps = reference(hf, prompt, 5)
    check(out["input_top_ids"], out["input_top_logprobs"], ref_ids[:-1], ref_lps[:-1])
    with torch.inference_mode():
        logits = hf.model(torch.tensor([prompt])).logits[0].float()  # [T, V]
    chosen = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(prompt[1:])[:, None])
    assert torch.allclose(torch.tensor(out["input_logprobs"]), chosen[:, 0], atol=ATOL)


def test_a_request_that_asks_for_no_alternatives_gets_none(served):
    _, outs, _ = served
    out = outs["none"]
    assert len(out["token_ids"]) == 6
    assert out["top_ids"] == out["top_logprobs"] == out["logprobs"] == []
