"""fp8 checkpoints (block-scaled `quant_method: fp8`, per-tensor fp8, compressed-tensors per
channel and per tensor) against the same weights dequantized into a 16-bit checkpoint: our
logits on the fp8 folder equal our logits on the dequantized one and transformers' on it, and
greedy tokens agree. CPU, float32: up to 16 rows a step the fp8 layers run weight-only, so
both products are of identical weights; longer steps quantize activations too."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    DeepseekV2Config,
    DeepseekV3Config,
    FineGrainedFP8Config,
    LlamaConfig,
    MixtralConfig,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

from runtime.model_config import resolve_model
from runtime.worker.model_runner import ModelRunner
from runtime.worker.models.dense_linear import DenseLinear
from runtime.worker.models.parallel import RowParallelLinear
from runtime.worker.quant.block_fp8_linear import BlockFp8Linear
from runtime.worker.quant.fp8_linear import Fp8Linear
from tests.worker.batching import Chunk, Driver, greedy
from tests.worker.fp8_checkpoints import (
    DYNAMIC_TOKEN,
    compressed_tensors,
    set_quantization_config,
    write_fp8_pair,
)

FP8 = torch.float8_e4m3fn
LLAMA = dict(hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=128, vocab_size=320, max_position_embeddings=256)
DEEPSEEK = dict(vocab_size=320, hidden_size=256, intermediate_size=256, moe_intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                kv_lora_rank=128, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=128,
                n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
                max_position_embeddings=256)  # kv_a_proj: 192 rows, a partial block
MODELS = {
    "llama": (LlamaConfig, LLAMA),
    "llama-partial": (LlamaConfig, dict(LLAMA, hidden_size=200)),  # partial blocks, both dims
    "qwen3": (Qwen3Config, dict(LLAMA, num_key_value_heads=2)),  # per-head q/k norms
    "qwen2": (Qwen2Config, LLAMA),  # q/k/v biases, kept 16-bit
    # a dense MLP on layer 0, experts on layer 1
    "qwen3-moe": (Qwen3MoeConfig, dict(LLAMA, num_key_value_heads=2, moe_intermediate_size=128,
                                       num_experts=4, num_experts_per_tok=2,
                                       norm_topk_prob=True, mlp_only_layers=[0])),
    "mixtral": (MixtralConfig, dict(LLAMA, num_local_experts=4, num_experts_per_tok=2,
                                    sliding_window=None)),  # experts' w1/w3/w2
    "deepseek-v2": (DeepseekV2Config, dict(DEEPSEEK, q_lora_rank=None, n_shared_experts=2,
                                           topk_method="greedy")),
    "deepseek-v3": (DeepseekV3Config, dict(DEEPSEEK, q_lora_rank=128, n_shared_experts=1,
                                           n_group=2, topk_group=1, norm_topk_prob=True,
                                           routed_scaling_factor=2.5)),
}
CASES = [("llama", "block"), ("llama-partial", "block"), ("qwen3", "block"),
         ("llama", "fp8-tensor"), ("qwen2", "ct-channel"), ("qwen3", "ct-tensor"),
         ("llama-partial", "ct-block"), ("qwen2", "block"),
         ("deepseek-v2", "block"), ("deepseek-v3", "block"), ("qwen3-moe", "block"),
         ("mixtral", "ct-channel")]


def tiny_hf(model: str, **changes) -> torch.nn.Module:
    """A random transformers model of `model`'s shape (with `changes`), float32."""
    config_cls, dims = MODELS[model]
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config_cls(**dims | changes), dtype=torch.float32)
    with torch.no_grad():  # every tensor random (HF zero-inits biases, ones norms)
        for name, t in [*hf.named_parameters(), *hf.named_buffers()]:
            if "inv_freq" not in name:
                noise = torch.randn(t.shape)
                t.copy_(1 + 0.1 * noise if "norm" in name else 0.05 * noise)
    return hf.eval()


def runner(folder, quantization: str = "none") -> ModelRunner:
    return ModelRunner(resolve_model(str(folder)), "cpu", torch.float32, kv_slots=256,
                       max_rows=4, quantization=quantization)


def prompts(lengths=(10, 7)) -> list[list[int]]:
    """Short prompts: prefilled in two chunks of at most 16 rows in all (weight-only)."""
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, 320, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("model,layout", CASES, ids=[f"{m}-{lay}" for m, lay in CASES])
def test_logits_equal_the_dequantized_checkpoint_and_transformers(model, layout, tmp_path):
    fp8_dir, deq_dir = write_fp8_pair(tiny_hf(model), layout, tmp_path)
    ours, ref = runner(fp8_dir), runner(deq_dir)
    assert (ours.quantization, ref.quantization) == ("fp8", "none")
    layer = ours.model.model.layers[1]
    attn_out = layer.self_attn.o_proj
    assert isinstance(attn_out, BlockFp8Linear if layout.endswith("block") else Fp8Linear)
    assert attn_out.weight.dtype == FP8 and ours.model.lm_head.weight.dtype == torch.float32
    tokens, want = greedy(ref, prompts(), 6)
    got_tokens, got = greedy(ours, prompts(), 6)
    assert got_tokens == tokens
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    hf = AutoModelForCausalLM.from_pretrained(deq_dir, dtype=torch.float32).eval()
    for p, (prompt, new) in enumerate(zip(prompts(), tokens)):
        with torch.no_grad():  # teacher-forced on our tokens: the positions that chose them
            logits = hf(torch.tensor([prompt + new[:-1]])).logits[0, len(prompt) - 1:]
        assert logits.argmax(-1).tolist() == new
        torch.testing.assert_close(got[p], logits, atol=1e-4, rtol=1e-4)


def test_deepseek_keeps_experts_and_kv_b_in_16_bits(tmp_path):
    """DeepSeek-V3 block fp8: the MLA projections (kv_a's 192 rows: a partial block), the
    dense MLP and the shared experts in fp8; kv_b_proj and the routed experts dequantized."""
    fp8_dir, _ = write_fp8_pair(tiny_hf("deepseek-v3"), "block", tmp_path)
    model = runner(fp8_dir).model.model
    attn, moe = model.layers[1].self_attn, model.layers[1].mlp
    for layer in (attn.q_a_proj, attn.q_b_proj, attn.kv_a_proj_with_mqa, attn.o_proj,
                  model.layers[0].mlp.gate_up_proj, moe.shared_experts.down_proj):
        assert isinstance(layer, BlockFp8Linear) and layer.weight.dtype == FP8
    assert attn.kv_a_proj_with_mqa.weight_scale_inv.shape == (2, 2)
    assert attn.kv_b_proj.weight.dtype == moe.experts.w13.dtype == torch.float32


@pytest.mark.parametrize("model,layout", [("qwen3-moe", "block"), ("mixtral", "ct-channel")])
def test_moe_families_dequantize_their_experts(model, layout, tmp_path):
    """Qwen3-MoE and Mixtral fp8 checkpoints: attention (and Qwen3-MoE's dense MLP) in fp8;
    the router and the routed experts, fp8 in the checkpoint, in the model's dtype."""
    fp8_dir, _ = write_fp8_pair(tiny_hf(model), layout, tmp_path)
    layers = runner(fp8_dir).model.model.layers
    kind = BlockFp8Linear if layout == "block" else Fp8Linear
    assert isinstance(layers[1].self_attn.qkv_proj, kind)
    assert isinstance(layers[0].mlp.gate_up_proj if model == "qwen3-moe" else
                      layers[0].self_attn.o_proj, kind)
    moe = layers[1].mlp
    assert moe.experts.w13.dtype == moe.experts.w2.dtype == moe.gate.weight.dtype == torch.float32


def test_transformers_reads_the_block_layout_as_the_reference_does(tmp_path):
    """transformers' own fp8 loader (dequantizing) on the block checkpoint gives the weights
    of the dequantized one: the test layout is the format releases ship (whole blocks: it
    infers block sizes from the scale grid, so partial blocks are outside its reach)."""
    fp8_dir, deq_dir = write_fp8_pair(tiny_hf("llama"), "block", tmp_path)
    theirs = AutoModelForCausalLM.from_pretrained(
        fp8_dir, dtype=torch.float32, quantization_config=FineGrainedFP8Config(dequantize=True))
    ref = AutoModelForCausalLM.from_pretrained(deq_dir, dtype=torch.float32).state_dict()
    for name, t in theirs.state_dict().items():
        assert torch.equal(t, ref[name]), name


def test_long_steps_quantize_activations_and_stay_close(tmp_path):
    """A 40-token prefill runs the block GEMM's w8a8 path (activations per token and
    128-column group) where a layer's input is whole groups: logits within 12% (L2, each
    position; measured 5-9%, random weights and activations) of the dequantized weights',
    and the same argmax at most positions (measured 35 of 40)."""
    fp8_dir, deq_dir = write_fp8_pair(tiny_hf("llama"), "block", tmp_path)
    (prompt,) = prompts((40,))
    want, got = (Driver(runner(d), 1).step([Chunk(0, prompt)], sample_all=True)
                 for d in (deq_dir, fp8_dir))  # [40, V] each
    err = (got - want).norm(dim=-1) / want.norm(dim=-1)
    assert 1e-4 < err.max() < 0.12, err.max()  # above 1e-4: the activations were quantized
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.75


def test_ignored_modules_stay_16_bit_and_the_flag_changes_nothing(tmp_path):
    """compressed-tensors `ignore` (a regex) keeps the down projections in 16 bits; with
    `--quantization fp8` the checkpoint's scheme applies as with `none`."""
    fp8_dir, deq_dir = write_fp8_pair(tiny_hf("llama"), "ct-channel", tmp_path,
                                      ignore=("down_proj",))
    set_quantization_config(fp8_dir, compressed_tensors("channel", DYNAMIC_TOKEN,
                                                        ignore=[r"re:.*\.down_proj$"]))
    _, want = greedy(runner(deq_dir), prompts(), 4)
    for flag in ("none", "fp8"):
        ours = runner(fp8_dir, flag)
        mlp = ours.model.model.layers[0].mlp
        assert isinstance(mlp.down_proj, RowParallelLinear)
        assert mlp.down_proj.weight.dtype == torch.float32
        assert isinstance(mlp.gate_up_proj, Fp8Linear)
        torch.testing.assert_close(greedy(ours, prompts(), 4)[1], want, atol=1e-5, rtol=1e-5)


def test_deepseek_quantized_at_load_tracks_its_16_bit_twin():
    """`--quantization fp8` on a 16-bit DeepSeek (dummy weights): per-channel fp8 MLA
    projections, whose rope rows are permuted at load with their scales."""
    spec = resolve_model("dummy:deepseek-tiny")
    exact = ModelRunner(spec, "cpu", torch.float32, kv_slots=256, max_rows=4)
    fp8 = ModelRunner(spec, "cpu", torch.float32, kv_slots=256, max_rows=4, quantization="fp8")
    attn = fp8.model.model.layers[0].self_attn
    assert isinstance(attn.q_proj, Fp8Linear) and isinstance(attn.kv_b_proj, torch.nn.Linear)
    assert not isinstance(attn.kv_b_proj, DenseLinear)  # kept 16-bit: absorbed per head
    tokens, want = greedy(exact, prompts(), 4)
    _, got = greedy(fp8, prompts(), 4, forced=tokens)
    assert ((got - want).norm(dim=-1) / want.norm(dim=-1)).max() < 0.1


# ---------------------------------------------------------------- on the GPU
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["block", "ct-channel"])
def test_cuda_fp8_checkpoint_tracks_its_dequantized_twin(layout, tmp_path):
    """bf16 on the GPU, CUDA graphs on: a 40-token prefill (w8a8 products) and decode steps
    (weight-only) against the dequantized checkpoint fed the same tokens: logits within 15%
    (L2, each position: activation quantization and bf16 rounding)."""
    fp8_dir, deq_dir = write_fp8_pair(tiny_hf("llama"), layout, tmp_path)

    def make(folder) -> ModelRunner:
        return ModelRunner(resolve_model(str(folder)), "cuda", torch.bfloat16, kv_slots=256,
                           max_rows=4)

    tokens, want = greedy(make(deq_dir), prompts((40, 9)), 6)
    _, got = greedy(make(fp8_dir), prompts((40, 9)), 6, forced=tokens)
    got, want = got.float(), want.float()
    assert ((got - want).norm(dim=-1) / want.norm(dim=-1)).max() < 0.15
