"""DeepSeek-V4 under speculative decoding gives plain decoding's greedy tokens (a tiny
random checkpoint, fp32 on the CPU: window 8, CSA entries every 4 tokens, HCA every 8).

A verify step computes its last token and k drafts, closing the windows the drafts end
and writing their compressor inputs into the request row's rings; the scheduler then cuts
the KV back past the kept ones, and the next step computes the rejected positions again.
Prompts of 15 to 33 tokens and 40 new ones cross the sliding window and many CSA and HCA
blocks, so rejected drafts close windows and pass block ends. Drafters: every draft kept
(oracle), none (contrarian), each wrong at random (mixed: every accepted length from 0 to
k) and prompt lookup (ngram); a pool too small for the batch adds retraction, whose
re-admission hits the request's own prefix (aligned, its last CSA window computed again).
V4's verify steps run as extends (the model attends by itself: `max_decode_rows` 0).
"""

from __future__ import annotations

import pytest
import torch

from bench.speculative.oracle import OracleDrafter, oracle_speculation
from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.scheduler.scheduler import Scheduler
from runtime.scheduler.speculative.speculation import Speculation
from runtime.wire.sampling import SamplingParams
from runtime.worker.model_check import UnsupportedModel
from runtime.worker.worker import Worker
from tests.speculative.serve import refused_at_start_up, serve
from tests.speculative.test_chained import run as run_chained
from tests.speculative.test_exact import K
from tests.worker.dsv4_checkpoints import tiny_v4

NEW_TOKENS = 40
VOCAB = 256  # the tiny checkpoint's


@pytest.fixture(scope="module")
def cfg(tmp_path_factory) -> ServerConfig:
    folder = tmp_path_factory.mktemp("dsv4")
    tiny_v4(folder)
    return ServerConfig(model=str(folder), device="cpu", dtype="float32", kv_slots=1023,
                        max_running=4, chunk_size=64, torch_threads=1, log_level="warning",
                        speculative_num_draft_tokens=K, speculative_off_window=0)


def repeated_prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    """Random prompts of the tiny vocabulary, each said three times (for prompt lookup)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() * 3 for n in lengths]


def wrong_drafts(reference: dict[str, list[int]], share: float) -> Speculation:
    """Drafts the plain run's tokens, a `share` of them (at random) one off in the tiny
    vocabulary: 1 rejects every draft, 1/3 keeps any number of a step's drafts."""
    gen = torch.Generator().manual_seed(0)
    oracle = oracle_speculation(reference, K)

    def some_wrong(req) -> OracleDrafter:
        right = oracle.new_drafter(req)
        off = (torch.rand(len(right.continuation), generator=gen) < share).tolist()
        return OracleDrafter(right.prompt_len,
                             [(t + o) % VOCAB for t, o in zip(right.continuation, off)])
    return Speculation(K, some_wrong)


def check_all_drafters(cfg: ServerConfig, prompts: list[list[int]],
                       params: list[SamplingParams]) -> list[Scheduler]:
    """Every drafter gives `cfg`'s plain decoding outputs and gives every slot back: the
    schedulers that served them."""
    ref, _, worker = serve(cfg, prompts, params)
    assert worker.runner.max_decode_rows == 0  # verify steps are extends
    by_rid = {f"r{i}": o for i, o in enumerate(ref)}
    served = []
    drafters = {"ngram": None, "oracle": oracle_speculation(by_rid, K),
                "contrarian": wrong_drafts(by_rid, 1.0), "mixed": wrong_drafts(by_rid, 1 / 3)}
    for name, spec in drafters.items():
        outs, sched, _ = serve(cfg.replace(speculative_algorithm="ngram"), prompts, params,
                               spec)
        assert outs == ref, name
        assert sched.kv.stats().used == 0, name  # rejected drafts' slots came back
        s = sched.spec
        assert s.drafted > 0, name
        kept = {"oracle": s.drafted, "contrarian": 0}.get(name)
        if kept is not None:
            assert s.accepted == kept, name
        else:  # some drafts kept, some rejected
            assert 0 < s.accepted < s.drafted, name
        served.append(sched)
    return served


@pytest.mark.parametrize("kv", [dict(kv="token"), dict(kv="paged", block_size="4")])
@pytest.mark.parametrize("overlap", [True, False])
def test_greedy_outputs_are_plain_decodings(cfg, kv, overlap):
    prompts = repeated_prompts(2, (7, 11, 5))  # 21, 33, 15 tokens
    params = [SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)] * len(prompts)
    check_all_drafters(cfg.replace(overlap=overlap, **kv), prompts, params)


@pytest.mark.parametrize("kv", [dict(kv="token"), dict(kv="paged", block_size="4")])
@pytest.mark.parametrize("overlap", [True, False])
def test_fp8_pool_greedy_outputs_are_plain_decodings(cfg, kv, overlap):
    """`--kv-dtype fp8` (e4m3 rows and entries, a float32 scale a row): every drafter gives
    the fp8 pool's plain decoding, a rejected draft's row, entry and scale written again
    by the step that computes its position again. Prompts (seed 7) whose outputs repeat
    some of their lookups on this pool, so n-gram drafts are kept too."""
    prompts = repeated_prompts(7, (7, 11, 5))
    params = [SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)] * len(prompts)
    check_all_drafters(cfg.replace(overlap=overlap, kv_dtype="fp8", **kv), prompts, params)


def test_greedy_outputs_survive_retraction(cfg):
    """Requests retracted mid-speculation are re-admitted on a prefix hit of their own."""
    prompts = repeated_prompts(1, (9, 7, 10, 8, 11, 6))
    params = [SamplingParams(max_tokens=24, temperature=0.0)] * len(prompts)
    small = cfg.replace(kv_slots=150, schedule_conservativeness=0.0, max_running=6)
    served = check_all_drafters(small, prompts, params)
    assert all(sched.num_retractions > 0 for sched in served)


@pytest.mark.parametrize("kv", [dict(kv="token"), dict(kv="paged", block_size="4"),
                                dict(kv="paged", block_size="4", kv_dtype="fp8")])
@pytest.mark.parametrize("every", [1, 3])
def test_chained_steps_give_plain_decodings(cfg, kv, every):
    """A drafter on the device with overlap chains each verify step behind the one in
    flight, moved back on the device by the drafts that one rejects (every `every`-th
    drafted wrong); on an fp8 pool too."""
    prompts = repeated_prompts(2, (7, 11, 5))
    params = [SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)] * len(prompts)
    cfg = cfg.replace(overlap=True, **kv)
    ref, _, _ = serve(cfg, prompts, params)
    worker = Worker(cfg.replace(speculative_algorithm="ngram"), resolve_model(cfg.model))
    seqs = [p + [(t + 1) % VOCAB if i % every == 0 else t for i, t in enumerate(o)]
            for p, o in zip(prompts, ref)]
    outs, sched, chained, _ = run_chained(worker, cfg, params, seqs, prompts=prompts)
    assert outs == ref
    assert chained > 0 and sched.spec.accepted < sched.spec.drafted
    assert sched.kv.stats().used == 0


def test_a_deepseek_v4_draft_model_is_refused_at_start_up(cfg):
    """A draft model keeps its KV in token slots only: V4's rings per request row have no
    place there."""
    draft = cfg.replace(speculative_algorithm="draft", speculative_draft_model=cfg.model)
    refused_at_start_up(draft, UnsupportedModel, "speculative_draft_model of model_type")
