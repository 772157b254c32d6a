"""`logit_bias` and `allowed_token_ids` on SmolLM2 (CPU), greedy against HF transformers
with the same bias added to its logits: +100 forces a token, -100 bans the greedy one for
the runner-up, an allowed set restricts the output; requests without them come out
unchanged beside requests with them; bad values are an `InvalidRequest`."""

from __future__ import annotations

import re

import pytest
import torch

import frontend as sl
from runtime import Engine, InvalidRequest, SamplingParams
from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.scheduler.loop import build_scheduler
from runtime.wire.scheduler_input import GenerateReq
from runtime.worker.worker import Worker
from tests.e2e.hf_reference import HFReference, assert_matches, shared_reference
from tests.worker.in_process import run_to_end

PROMPT = "The capital of France is"
WORDS = [" Paris", " London", " the", " a", ".", " city"]  # an allowed set, one token each


@pytest.fixture(scope="module")
def eng():
    with Engine(model="smollm2", chunk_size=128, torch_threads=2) as engine:
        yield engine


@pytest.fixture(scope="module")
def hf():
    return shared_reference()


def token(hf: HFReference, text: str) -> int:
    (tid,) = hf.tokenizer.encode(text)
    return tid


@torch.inference_mode()
def hf_greedy(hf: HFReference, prompt: str, n: int, bias: dict[int, float],
              allowed: list[int] | None = None) -> tuple[list[int], list[float]]:
    """HF's greedy continuation with `bias` added to the logits and -inf outside
    `allowed`, and the top-2 gap of the biased logits at each step."""
    from transformers import LogitsProcessorList

    add = torch.zeros(hf.model.config.vocab_size)  # [V]
    if allowed is not None:
        add.fill_(float("-inf"))
        add[allowed] = 0.0
    for tid, b in bias.items():
        add[tid] += b
    ids = torch.tensor([hf.tokenizer.encode(prompt)])  # [1, T]
    out = hf.model.generate(
        ids, max_new_tokens=n, do_sample=False, pad_token_id=2, output_scores=True,
        return_dict_in_generate=True,
        logits_processor=LogitsProcessorList([lambda _, scores: scores + add]))
    gaps = [float(torch.diff(s[0].float().topk(2).values).neg()) for s in out.scores]
    return out.sequences[0, ids.shape[1]:].tolist(), gaps


@torch.inference_mode()
def hf_next_logits(hf: HFReference, prompt: str) -> torch.Tensor:
    """HF's logits for the token after `prompt`: [V] float32."""
    return hf.model(torch.tensor([hf.tokenizer.encode(prompt)])).logits[0, -1].float()


def greedy(n: int, **fields) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, **fields)


def test_plus_100_forces_the_token_greedy_and_sampled(eng, hf):
    banana = token(hf, " banana")
    for params in (greedy(5, logit_bias={banana: 100.0}),
                   SamplingParams(max_tokens=5, temperature=1.0, seed=3, ignore_eos=True,
                                  logit_bias={banana: 100.0})):
        assert eng.generate(PROMPT, params)[0].token_ids == [banana] * 5


def test_minus_100_bans_the_greedy_token_for_the_runner_up(eng, hf):
    plain = eng.generate(PROMPT, greedy(8))[0].token_ids
    first = plain[0]
    raw = hf_next_logits(hf, PROMPT)
    assert raw.topk(2).indices[0] == first
    out = eng.generate(PROMPT, greedy(8, logit_bias={first: -100.0}))[0]
    ref, gaps = hf_greedy(hf, PROMPT, 8, {first: -100.0})
    assert_matches(out.token_ids, ref, gaps, "banned greedy token")
    assert out.token_ids[0] == raw.topk(2).indices[1] and first not in out.token_ids
    # logprobs are those of the raw distribution
    lp = eng.generate(PROMPT, greedy(1, logit_bias={first: -100.0}, logprobs=True))[0]
    assert lp.logprobs[0] == pytest.approx(float(torch.log_softmax(raw, -1)[out.token_ids[0]]),
                                           abs=1e-4)


def test_allowed_token_ids_restrict_greedy_and_sampled_outputs(eng, hf):
    allowed = [token(hf, w) for w in WORDS]
    bias = {allowed[1]: 2.0}
    out = eng.generate(PROMPT, greedy(6, allowed_token_ids=allowed, logit_bias=bias))[0]
    ref, gaps = hf_greedy(hf, PROMPT, 6, bias, allowed)
    assert_matches(out.token_ids, ref, gaps, "allowed tokens")
    sampled = eng.generate([PROMPT] * 4, SamplingParams(
        max_tokens=12, temperature=1.5, ignore_eos=True, allowed_token_ids=allowed))
    seen = {t for s in sampled for t in s.token_ids}
    assert seen <= set(allowed) and len(seen) > 1


def test_a_dsl_gen_passes_both_fields(eng, hf):
    allowed = [token(hf, w) for w in WORDS]

    @sl.function
    def program(s):
        s += PROMPT
        s += sl.gen("forced", max_tokens=3, temperature=0, logit_bias={allowed[4]: 100})
        s += sl.gen("picked", max_tokens=4, temperature=0.8, allowed_token_ids=allowed)

    state = program.run(backend=sl.EngineBackend(eng))
    assert state["forced"] == "..."
    assert re.fullmatch("(?:" + "|".join(map(re.escape, WORDS)) + ")+", state["picked"])


@pytest.mark.parametrize("fields, needle", [
    ({"logit_bias": {5: 100.5}}, "logit_bias values must be in"),
    ({"logit_bias": {5: float("nan")}}, "logit_bias values must be in"),
    ({"logit_bias": {49152: 1.0}}, "logit_bias token id 49152 is outside the vocabulary"),
    ({"logit_bias": {-2: 1.0}}, "logit_bias keys must be token ids"),
    ({"allowed_token_ids": []}, "allowed_token_ids must be a non-empty list"),
    ({"allowed_token_ids": [1, 10**6]}, "allowed_token_ids token id 1000000 is outside"),
    ({"allowed_token_ids": [1], "json_schema": "{}"}, "allowed_token_ids cannot be combined"),
])
def test_bad_values_raise_invalid_request(eng, fields, needle):
    with pytest.raises(InvalidRequest, match=needle):
        eng.generate(PROMPT, SamplingParams(max_tokens=2, **fields))
    assert eng.stats().waiting == 0


def test_rows_without_bias_are_unchanged_beside_rows_with_it(hf):
    """Scheduler and worker in this process, so all four requests share every step; the
    unbiased ones (greedy, seeded sampling) equal a run where no request has a bias."""
    cfg = ServerConfig(model="smollm2", device="cpu", dtype="float32", kv_slots=1024,
                       overlap=False, torch_threads=2, log_level="warning")
    spec = resolve_model("smollm2")
    worker = Worker(cfg, spec)
    prompts = [hf.tokenizer.encode(p) for p in (
        PROMPT, "Once upon a time", "1, 2, 3, 4,", "List three fruits:", "Water boils at")]
    sampled = SamplingParams(max_tokens=10, temperature=0.8, seed=11, ignore_eos=True)
    plain = [greedy(10), sampled, greedy(10), greedy(10), greedy(10)]
    even = {t: -100.0 for t in range(0, spec.hf_config().vocab_size, 2)}
    allowed = [token(hf, w) for w in WORDS]
    mixed = [plain[0], plain[1], greedy(10, logit_bias=even), plain[3],
             greedy(10, allowed_token_ids=allowed)]

    def run(params: list[SamplingParams]) -> list[list[int]]:
        sched = build_scheduler(cfg, worker.ready_message(), spec.max_context)
        for i, (ids, p) in enumerate(zip(prompts, params)):
            sched.add(GenerateReq(f"r{i}", ids, p))
        outs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
        run_to_end(sched, worker, outs)
        return [outs[f"r{i}"] for i in range(len(prompts))]

    without, beside = run(plain), run(mixed)
    assert [beside[i] for i in (0, 1, 3)] == [without[i] for i in (0, 1, 3)]
    assert all(t % 2 == 1 for t in beside[2]) and any(t % 2 == 0 for t in without[2])
    assert set(beside[4]) <= set(allowed) and beside[4] != without[4]
