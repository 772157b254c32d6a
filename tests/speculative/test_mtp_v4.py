"""The multi-token-prediction layer of a DeepSeek-V4 checkpoint (`--speculative-algorithm
mtp`, `mtp.0.*` as released) on a tiny random target (fp32 on the CPU, sliding window of
8): each draft step's logits are a reference built from transformers' own V4 decoder layer
and hyper-connection head over transformers' streams of the target; greedy outputs are
plain decoding's on token and paged KV, overlap on and off, and a layer that copies the
target gets drafts accepted; a checkpoint without a usable MTP layer is refused at
start-up, naming the file and field or tensor."""

from __future__ import annotations

import pytest
import torch

from runtime.config.server import ServerConfig
from runtime.model_config import resolve_model
from runtime.wire.sampling import SamplingParams
from runtime.worker.quant.block_fp8_linear import BlockFp8Linear
from runtime.worker.speculative.mtp_checks import MtpUnavailable
from runtime.worker.worker import Worker
from tests.speculative.mtp_v4_layers import L, V4MtpReference, released_fp8_with_mtp
from tests.speculative.serve import refused_at_start_up, serve, step_drafts
from tests.worker.dsv4_checkpoints import tiny_v4

K = 3
WINDOW = 8  # the tiny target's sliding window


@pytest.fixture(scope="module", name="targets")
def targets_fixture(tmp_path_factory):
    """Targets with an MTP layer: one read through the target's LM head, one with its own
    (`mtp.0.head`)."""
    return {own: (folder, V4MtpReference(folder, own_head=own))
            for own, folder in ((False, tmp_path_factory.mktemp("v4mtp")),
                                (True, tmp_path_factory.mktemp("v4mtp_head")))}


def config(folder, mtp: bool = True, **changes) -> ServerConfig:
    cfg = ServerConfig(**{"model": str(folder), "device": "cpu", "dtype": "float32",
                          "kv_slots": 1023, "max_running": 2, "chunk_size": 64,
                          "log_level": "warning", "torch_threads": 1, **changes})
    if not mtp:
        return cfg
    return cfg.replace(speculative_algorithm="mtp", speculative_num_draft_tokens=K,
                       speculative_off_window=0)


def prompts_and_params(new: int = 12) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts of 5 to 20 tokens (two past the window), the last one the first one's prefix
    (a prefix hit when it runs after it), greedy."""
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (20, 5, 13)]
    prompts.append(prompts[0][:16])
    return prompts, [SamplingParams(max_tokens=new, temperature=0.0)] * len(prompts)


@pytest.mark.parametrize("own_head", [False, True])
def test_draft_logits_are_the_layers_reference(targets, own_head):
    """Every draft step's logits equal the reference layer's, given transformers' streams
    of the target over the request's tokens so far and the drafts before it, at positions
    before and past the window; the drafts are their greedy tokens."""
    folder, ref = targets[own_head]
    cfg = config(folder, max_running=1)  # one request a step: K logits a verify step
    worker = Worker(cfg, resolve_model(cfg.model))
    head, seen = worker.drafter.head, []
    own_logits = head.logits

    def recorded(out, target):
        seen.append(own_logits(out, target))
        return seen[-1]

    head.logits = recorded
    prompts, params = prompts_and_params()
    lengths = set()
    for tokens, drafts in step_drafts(cfg, worker, prompts[:2], params[:2]):
        want = ref.logits(tokens, drafts)
        got = [row[0] for row in seen[-len(drafts):]]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
        assert drafts == [int(w.argmax()) for w in want]
        lengths.add(len(tokens))
    assert len(lengths) >= 8 and min(lengths) < WINDOW < max(lengths) - WINDOW


@pytest.mark.parametrize("kv", [dict(kv="token"), dict(kv="paged", block_size="4")])
@pytest.mark.parametrize("overlap", [True, False])
def test_greedy_outputs_are_plain_decodings(targets, kv, overlap):
    folder, _ = targets[False]
    prompts, params = prompts_and_params()
    ref, _, _ = serve(config(folder, mtp=False, overlap=overlap, **kv), prompts, params)
    outs, sched, worker = serve(config(folder, overlap=overlap, **kv), prompts, params)
    assert outs == ref
    assert sched.spec.verify_steps > 0 and sched.spec.drafted > 0
    assert sched.kv.stats().used == 0  # every slot back, the layer's included
    assert sched.kv.stats().prefix_hit_tokens > 0
    assert worker.drafter.pool.num_slots == worker.runner.kv_pool.num_slots


@pytest.mark.parametrize("kv", [{}, dict(kv_dtype="fp8"),
                                dict(kv="paged", block_size="4", kv_dtype="fp8")])
@pytest.mark.parametrize("overlap", [True, False])
def test_a_layer_that_copies_the_target_gets_drafts_accepted(tmp_path, kv, overlap):
    """A layer whose logits are the target's at the position before drafts the token the
    target predicted there: accepted where the target repeats a token (about half of its
    steps here), so kept drafts' streams and rows are read by later steps too, and
    rejected ones are computed again. On the target's fp8 pool (token and paged; the
    layer's own pool stays in the model's dtype) the outputs are that pool's plain
    decoding."""
    V4MtpReference(tmp_path, copy=True)
    prompts = [[7] * 6 + [11] * 6, [3, 4] * 5]
    params = [SamplingParams(max_tokens=24, temperature=0.0)] * 2
    ref, _, _ = serve(config(tmp_path, mtp=False, overlap=overlap, **kv), prompts, params)
    outs, sched, worker = serve(config(tmp_path, overlap=overlap, **kv), prompts, params)
    assert outs == ref
    assert 0 < sched.spec.accepted < sched.spec.drafted
    assert worker.runner.kv_pool.scaled == ("kv_dtype" in kv)
    assert not worker.drafter.pool.scaled


def test_a_released_fp8_checkpoints_layer_drafts(tmp_path):
    """The layer as released in fp8 (`mtp.0.*`, its projections block fp8 as the target's
    are, e8m0 scales) loads as the target's layers do and drafts; outputs are plain
    decoding's."""
    ref = V4MtpReference(tmp_path / "tf", copy=True)
    folder = released_fp8_with_mtp(ref, tmp_path / "tf", tmp_path)
    prompts = [[7] * 6 + [11] * 6, [3, 4] * 5]
    params = [SamplingParams(max_tokens=16, temperature=0.0)] * 2
    plain, _, _ = serve(config(folder, mtp=False), prompts, params)
    outs, sched, worker = serve(config(folder), prompts, params)
    assert outs == plain
    head = worker.drafter.head
    assert isinstance(head.mtp.e_proj, BlockFp8Linear)
    assert isinstance(head.block.attn.wq_a, BlockFp8Linear)
    assert 0 < sched.spec.accepted < sched.spec.drafted


@pytest.mark.parametrize("changes, named", [
    ({"nextn": 0}, "num_nextn_predict_layers is 0"),
    ({"drop": "e_proj.weight"}, r"tensor mtp.e_proj.weight of the MTP layer \(mtp.0.\*\)"),
    ({"drop": "ffn.experts.3.w2.weight"}, f"tensor model.layers.{L}.ffn.experts.3.w2.weight"),
    ({"drop": "hc_head_fn"}, "tensor mtp.hc_head.hc_fn"),
    ({"ratio": 4}, rf"config.json: compress_ratios\[{L}\] is 4: the MTP block's compressed"),
    ({"ratio": None}, f"config.json: compress_ratios has no entry {L}"),
])
def test_a_checkpoint_without_a_usable_layer_is_refused_naming_it(tmp_path, changes, named):
    V4MtpReference(tmp_path, **changes)
    refused_at_start_up(config(tmp_path), MtpUnavailable, named)


def test_a_checkpoint_without_mtp_tensors_is_refused(tmp_path):
    tiny_v4(tmp_path)
    refused_at_start_up(config(tmp_path), MtpUnavailable,
                        r"no tensor mtp.0.\*: the checkpoint has no MTP layer")


@pytest.mark.gpu
def test_greedy_outputs_on_cuda_are_plain_decodings(tmp_path):
    """On a CUDA device (the target's and the layer's decode graphs, Triton kernels), with
    overlap: plain decoding's outputs, drafts accepted."""
    V4MtpReference(tmp_path, copy=True)
    prompts = [[7] * 6 + [11] * 6, [3, 4] * 5]
    params = [SamplingParams(max_tokens=24, temperature=0.0)] * 2
    cuda = dict(device="cuda", overlap=True)
    ref, _, _ = serve(config(tmp_path, mtp=False, **cuda), prompts, params)
    outs, sched, worker = serve(config(tmp_path, **cuda), prompts, params)
    assert outs == ref
    assert worker.drafter.graphs is not None
    assert 0 < sched.spec.accepted < sched.spec.drafted
