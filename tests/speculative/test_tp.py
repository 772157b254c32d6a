"""The worker's drafters under `--tp 2` on the CPU (two gloo ranks): a draft model, EAGLE
and EAGLE-3 heads (replicated on every rank) and a DeepSeek-V3 MTP layer (cut over the
ranks as the target's layers are). Every rank drafts on its own; ranks that drafted
different tokens would feed different inputs to their halves of the target, and the
outputs would show it. So greedy outputs and seeded samples are plain decoding's at
`--tp 1` (which `--tp 2` gives too, as `tests/e2e/test_tp2_cpu.py` shows; a server start
costs seconds, so plain `--tp 2` runs are not repeated here), while drafts are accepted
(fewer steps than plain decoding's least), and every slot of both pools comes back.
"""

from __future__ import annotations

import pytest
import torch

from runtime import Engine
from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.wire.sampling import SamplingParams
from runtime.worker.speculative.mtp_head import MtpHead
from runtime.worker.tp import TPGroup
from tests.e2e.test_engine_api import wait_idle
from tests.speculative.eagle_heads import target_checkpoint, write_copy_head, write_head
from tests.speculative.mtp_layers import MtpReference
from tests.speculative.serve import serve

OPTIONS = dict(device="cpu", dtype="float32", kv_slots=511, max_running=4, chunk_size=16,
               torch_threads=1, log_level="warning")
SPEC = dict(speculative_num_draft_tokens=3, speculative_off_window=0)
SHARED = [17, 90, 4, 55, 201, 33, 8, 140, 62, 9, 77, 230]  # two prompts start with it
PROMPTS = [[7] * 6 + [11] * 6, [3, 4] * 5, SHARED, SHARED + [5, 6]]
PARAMS = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in (20, 16, 12)] + [
    SamplingParams(max_tokens=12, temperature=0.8, top_k=4, seed=5, ignore_eos=True)]


@pytest.fixture(scope="module", name="cases")
def cases_fixture(tmp_path_factory) -> dict[str, tuple[str, dict]]:
    """name: (the target, the drafter's options). The draft model is the target itself and
    the EAGLE and MTP drafters copy the target's previous prediction, so greedy drafts are
    accepted (the DeepSeek target seldom repeats: few MTP drafts are); the EAGLE-3 head
    is random (drafts rejected)."""
    llama, heads, mtp = (tmp_path_factory.mktemp(n) for n in ("llama", "heads", "mtp"))
    target_checkpoint(llama)
    write_copy_head(heads / "copy")
    write_head(heads / "eagle3", True)
    MtpReference(mtp, copy=True)
    return {
        "draft": ("dummy:tiny", dict(speculative_algorithm="draft",
                                     speculative_draft_model="dummy:tiny")),
        "eagle": (str(llama), dict(speculative_algorithm="eagle",
                                   speculative_draft_model=str(heads / "copy"))),
        "eagle3": (str(llama), dict(speculative_algorithm="eagle",
                                    speculative_draft_model=str(heads / "eagle3"))),
        "mtp": (str(mtp), dict(speculative_algorithm="mtp")),
    }


def tp2(model: str, **options) -> tuple[list[list[int]], int]:
    """(each request's tokens, the steps taken) from a --tp 2 server; every slot back."""
    with Engine(model=model, tp=2, **OPTIONS, **options) as eng:
        outs = [o.token_ids for o in eng.generate(PROMPTS, PARAMS)]
        stats = wait_idle(eng)
    assert stats.kv_used == 0 and stats.invariant_error is None
    return outs, stats.num_steps


@pytest.mark.parametrize("name", ["draft", "eagle", "eagle3", "mtp"])
def test_outputs_are_plain_decodings(cases, name):
    model, drafter = cases[name]
    ref, _, _ = serve(ServerConfig(model=model, **OPTIONS), PROMPTS, PARAMS)  # --tp 1
    outs, steps = tp2(model, **drafter, **SPEC)
    assert outs == ref
    if name in ("draft", "eagle"):  # drafts kept: fewer steps than plain decoding's least
        assert steps < max(p.max_tokens for p in PARAMS)


def test_the_mtp_layer_is_cut_as_the_targets_layers(cases):
    """Each rank holds its half of the layer's heads and of every expert's width (and
    the parts around the decoder layer whole), so it computes its share of every step."""
    spec, cpu = resolve_model(cases["mtp"][0]), torch.device("cpu")
    whole = dict(MtpHead.load(spec, cpu, torch.float32).named_parameters())
    cut = {"self_attn.q_b_proj.weight": 0, "self_attn.kv_b_proj.weight": 0,
           "self_attn.o_proj.weight": 1, "mlp.experts.w2": 1, "eh_proj.weight": None,
           "shared_head.norm.weight": None, "mlp.gate.weight": None}
    for rank in range(2):
        head = MtpHead.load(spec, cpu, torch.float32, tp=TPGroup(rank, 2))
        assert head.self_attn.num_heads == head.mla.num_heads == 2  # of 4
        part = dict(head.named_parameters())
        for name, dim in cut.items():
            want = whole[name] if dim is None else whole[name].chunk(2, dim)[rank]
            assert torch.equal(part[name], want), (name, rank)
