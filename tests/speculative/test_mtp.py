"""The multi-token-prediction layer of a DeepSeek-V3 checkpoint (`--speculative-algorithm
mtp`) on a tiny random target: each verify step's drafts are a plain-torch reference of
the layer's forward over transformers' hidden states of the target; greedy outputs are
plain decoding's on token and paged KV, overlap on and off, through prefix hits; a model
without a usable MTP layer is refused at start-up, naming the field or tensor."""

from __future__ import annotations

import pytest

from runtime.config.checks import ConfigError
from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.wire.sampling import SamplingParams
from runtime.worker.model_check import prepare_model
from runtime.worker.speculative.mtp_checks import MtpUnavailable
from runtime.worker.worker import Worker
from tests.speculative.mtp_layers import L, MtpReference
from tests.speculative.serve import refused_at_start_up, serve, step_drafts
from tests.speculative.test_eagle import prompts_and_params

K = 3


@pytest.fixture(scope="module", name="targets")
def targets_fixture(tmp_path_factory):
    """Targets with an MTP layer: one read through the target's LM head, one with its own
    (`shared_head.head`)."""
    return {own: (folder, MtpReference(folder, own_head=own))
            for own, folder in ((False, tmp_path_factory.mktemp("mtp")),
                                (True, tmp_path_factory.mktemp("mtp_head")))}


def config(folder, mtp: bool = True, **changes) -> ServerConfig:
    cfg = ServerConfig(**{"model": str(folder), "device": "cpu", "dtype": "float32",
                          "kv_slots": 511, "max_running": 2, "chunk_size": 16,
                          "log_level": "warning", "torch_threads": 1, **changes})
    if not mtp:
        return cfg
    return cfg.replace(speculative_algorithm="mtp", speculative_num_draft_tokens=K,
                       speculative_off_window=0)


@pytest.mark.parametrize("own_head", [False, True])
def test_drafts_are_the_layers_reference_forward(targets, own_head):
    """Every verify step's drafts equal the reference layer's greedy drafts given the
    target's final hidden states (transformers) of the request's tokens so far."""
    folder, ref = targets[own_head]
    cfg = config(folder)
    prompts, params = prompts_and_params()
    checked = 0
    for tokens, got in step_drafts(cfg, Worker(cfg, resolve_model(cfg.model)), prompts[:3],
                                   params[:3]):
        assert got == ref.drafts(tokens, len(got))
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("kv", ["token", "paged"])
@pytest.mark.parametrize("overlap", [True, False])
def test_greedy_outputs_are_plain_decodings(targets, kv, overlap):
    folder, _ = targets[False]
    prompts, params = prompts_and_params()
    ref, _, _ = serve(config(folder, mtp=False, kv=kv, overlap=overlap), prompts, params)
    outs, sched, worker = serve(config(folder, kv=kv, overlap=overlap), prompts, params)
    assert outs == ref
    assert sched.spec.verify_steps > 0
    assert sched.kv.stats().used == 0  # every slot back, the layer's included
    assert sched.kv.stats().prefix_hit_tokens > 0
    assert worker.drafter.pool.num_slots == worker.runner.kv_pool.num_slots


def test_a_layer_that_copies_the_target_gets_drafts_accepted(tmp_path):
    """A layer whose output is the hidden state it reads drafts the token the target
    predicted one position earlier: accepted where the target repeats a token, so kept
    drafts' hidden states and latent rows are exercised too."""
    MtpReference(tmp_path, copy=True)
    prompts = [[7] * 6 + [11] * 6, [3, 4] * 5]
    params = [SamplingParams(max_tokens=24, temperature=0.0)] * 2
    ref, _, _ = serve(config(tmp_path, mtp=False), prompts, params)
    outs, sched, _ = serve(config(tmp_path), prompts, params)
    assert outs == ref
    assert 0 < sched.spec.accepted < sched.spec.drafted


@pytest.mark.parametrize("changes, named", [
    ({"nextn": 0}, "num_nextn_predict_layers is 0"),
    ({"drop": "eh_proj.weight"}, f"tensor model.layers.{L}.eh_proj.weight of the MTP layer"),
    ({"drop": "mlp.experts.3.down_proj.weight"},
     f"tensor model.layers.{L}.mlp.experts.3.down_proj.weight"),
])
def test_a_checkpoint_without_the_layer_is_refused_naming_it(tmp_path, changes, named):
    MtpReference(tmp_path, **changes)
    cfg = config(tmp_path)
    refused_at_start_up(cfg, MtpUnavailable, named)


def test_other_families_and_flags_are_refused():
    with pytest.raises(MtpUnavailable, match="model_type .*'deepseek_v3'.*not 'llama'"):
        prepare_model(config("dummy:tiny"))
    with pytest.raises(MtpUnavailable, match="no weights"):  # random: no MTP layer to read
        prepare_model(config("dummy:deepseek-v4-tiny"))
    with pytest.raises(ConfigError, match="speculative_draft_model"):
        ServerConfig(speculative_algorithm="mtp", speculative_draft_model="x")
