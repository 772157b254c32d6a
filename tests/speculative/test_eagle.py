"""EAGLE heads (`--speculative-algorithm eagle`) on a tiny random Llama target: each verify
step's drafts are a plain-torch reference of the head's forward over transformers' hidden
states of the target; greedy outputs are plain decoding's on token and paged KV, overlap
on and off, through prefix hits; a head that does not fit the target is refused at
start-up, naming the field or tensor."""

from __future__ import annotations

import pytest
import torch

from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.wire.sampling import SamplingParams
from runtime.worker.model_check import prepare_model
from runtime.worker.speculative.eagle_layout import EagleHeadMismatch
from runtime.worker.worker import Worker
from tests.speculative.eagle_heads import (
    reference_drafts,
    target_checkpoint,
    target_features,
    write_copy_head,
    write_head,
)
from tests.speculative.serve import refused_at_start_up, serve, step_drafts

K = 3
HEADS = {  # name: (EAGLE-3, write_head options)
    "eagle": (False, {}),
    "eagle-no-input-norm-no-bias": (False, {"input_norm": False, "fc_bias": False}),
    "eagle3": (True, {}),
}


@pytest.fixture(scope="module", name="target")
def target_fixture(tmp_path_factory):
    folder = tmp_path_factory.mktemp("target")
    return folder, target_checkpoint(folder)


@pytest.fixture(scope="module", name="heads")
def heads_fixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    return {name: (root / name, eagle3, write_head(root / name, eagle3, **opts))
            for name, (eagle3, opts) in HEADS.items()}


def config(target, head=None, **changes) -> ServerConfig:
    cfg = ServerConfig(**{"model": str(target[0]), "device": "cpu", "dtype": "float32",
                          "kv_slots": 511, "max_running": 4, "chunk_size": 16,
                          "log_level": "warning", "torch_threads": 1, **changes})
    if head is None:
        return cfg
    return cfg.replace(speculative_algorithm="eagle", speculative_draft_model=str(head),
                       speculative_num_draft_tokens=K, speculative_off_window=0)


def prompts_and_params() -> tuple[list[list[int]], list[SamplingParams]]:
    """Two requests sharing a 20-token prompt (one of them twice: a prefix hit when it
    runs after the first), and two others; prompts of 1 to 25 tokens."""
    gen = torch.Generator().manual_seed(3)
    shared = torch.randint(3, 256, (20,), generator=gen).tolist()
    prompts = [shared, torch.randint(3, 256, (7,), generator=gen).tolist(), [5], shared,
               shared[:12] + [9, 9, 9]]
    return prompts, [SamplingParams(max_tokens=m, temperature=0.0) for m in (14, 9, 11, 14, 6)]


@pytest.mark.parametrize("name", list(HEADS))
def test_drafts_are_the_heads_reference_forward(target, heads, name):
    """Every verify step's drafts equal the reference head's greedy drafts given the
    target's hidden states (transformers) of the request's tokens so far."""
    folder, eagle3, weights = heads[name]
    cfg = config(target, folder, max_running=2)
    prompts, params = prompts_and_params()
    worker = Worker(cfg, resolve_model(cfg.model))
    checked = 0
    for tokens, got in step_drafts(cfg, worker, prompts[:3], params[:3]):
        features = target_features(target[1], tokens[:-1], eagle3)  # [P, w]
        assert got == reference_drafts(weights, eagle3, target[1], tokens, features, len(got))
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("kv", ["token", "paged"])
@pytest.mark.parametrize("overlap", [True, False])
def test_greedy_outputs_are_plain_decodings(target, heads, kv, overlap):
    prompts, params = prompts_and_params()
    base = config(target, kv=kv, overlap=overlap, max_running=2)
    ref, _, _ = serve(base, prompts, params)
    for name, (folder, _, _) in heads.items():
        outs, sched, worker = serve(config(target, folder, kv=kv, overlap=overlap,
                                           max_running=2), prompts, params)
        assert outs == ref, name
        assert sched.spec.verify_steps > 0, name
        assert sched.kv.stats().used == 0, name  # every slot back, the head's included
        assert sched.kv.stats().prefix_hit_tokens > 0, name
        assert worker.drafter.pool.num_slots == worker.runner.kv_pool.num_slots


def test_seeded_samples_and_retraction_are_plain_decodings(target, heads):
    """Seeded sampling keeps the target's own samples; a pool too small for the batch
    retracts requests mid-speculation, and their head entries are rewritten with the
    recomputed positions."""
    prompts, _ = prompts_and_params()
    params = [SamplingParams(max_tokens=16, temperature=0.8, top_k=4, seed=s)
              for s in range(len(prompts))]
    small = dict(kv_slots=63, schedule_conservativeness=0.0, max_running=5)
    ref, _, _ = serve(config(target, **small), prompts, params)
    outs, sched, _ = serve(config(target, heads["eagle3"][0], **small), prompts, params)
    assert outs == ref
    assert sched.num_retractions > 0 and sched.spec.verify_steps > 0
    assert sched.kv.stats().used == 0


def test_a_head_that_copies_the_target_gets_drafts_accepted(target, tmp_path):
    """An EAGLE head whose output is the hidden state it reads drafts the token the target
    predicted one position earlier: accepted where the target repeats a token, so the
    kept drafts' hidden states and head entries are exercised too."""
    folder = tmp_path / "copy"
    write_copy_head(folder)
    prompts = [[7] * 6 + [11] * 6, [3, 4] * 5]
    params = [SamplingParams(max_tokens=24, temperature=0.0)] * 2
    ref, _, _ = serve(config(target), prompts, params)
    outs, sched, _ = serve(config(target, folder), prompts, params)
    assert outs == ref
    assert 0 < sched.spec.accepted < sched.spec.drafted


BAD_HEADS = [  # (eagle3, write_head changes, what the error names)
    (False, {"hidden_size": 32, "intermediate_size": 64}, "hidden_size is 32"),
    (False, {"vocab_size": 300}, "vocab_size is 300"),
    (False, {"num_hidden_layers": 2}, "num_hidden_layers is 2"),
    (False, {"drop": "layers.0.mlp.down_proj.weight"}, "layers.0.mlp.down_proj.weight"),
    (False, {"config_only": {"intermediate_size": 80}},
     r"tensor layers.0.mlp.gate_proj.weight has shape \(96, 64\), the head's config needs "
     r"\(80, 64\)"),
    (True, {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 3]}},
     r"eagle_aux_hidden_state_layer_ids \[0, 1, 3\] must be 3 layer ids in 0..2"),
    (True, {"drop": "d2t"}, "tensor d2t"),
]


@pytest.mark.parametrize("eagle3, changes, named", BAD_HEADS)
def test_a_head_that_does_not_fit_is_refused_naming_the_field(target, tmp_path, eagle3,
                                                              changes, named):
    write_head(tmp_path / "head", eagle3, **changes)
    cfg = config(target, tmp_path / "head")
    refused_at_start_up(cfg, EagleHeadMismatch, named)


def test_an_eagle3_head_fc_must_read_three_hidden_states(target, tmp_path):
    write_head(tmp_path / "head", False,
               config_only={"architectures": ["LlamaForCausalLMEagle3"]})
    with pytest.raises(EagleHeadMismatch, match=r"fc.weight has shape \(64, 128\).*\(64, 192\)"):
        prepare_model(config(target, tmp_path / "head"))


def test_the_eagle_flags_go_together(tmp_path):
    with pytest.raises(ValueError, match="speculative_draft_model"):
        ServerConfig(speculative_algorithm="eagle")
    with pytest.raises(EagleHeadMismatch, match="no config.json"):
        prepare_model(ServerConfig(model="dummy:tiny", speculative_algorithm="eagle",
                                   speculative_draft_model=str(tmp_path)))
