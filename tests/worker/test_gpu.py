"""The runtime on a CUDA device against HF transformers, and the overlap loop's safety there.

- A `ModelRunner` on `dummy:tiny` in bf16 (Triton attention and ops, CUDA-graph decode) gives
  HF's logits, within bf16 tolerance, with HF holding the very same weights.
- The whole `Engine` in fp32 on a tiny HF folder gives HF `generate`'s greedy tokens.
- With a KV pool so small that freed slots are reused at once, greedy outputs with overlap
  equal those without, and HF's. The same check with the scheduler and worker in one
  process, so the memory checker sees every kernel, is tests/worker/test_overlap_in_process.py
  (it ran clean under `compute-sanitizer --tool memcheck` on the H200).

The kernel-level comparisons on the device are in tests/kernels (fp16/bf16 cases marked gpu).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from runtime import Engine, SamplingParams
from runtime.model_config import resolve_model
from runtime.worker.model_runner import ModelRunner
from tests.worker.batching import Chunk, greedy, make_batch

pytestmark = pytest.mark.gpu
DEVICE = "cuda"


def hf_twin(runner: ModelRunner, spec, dtype: torch.dtype):
    """A transformers model holding the runner's weights (un-fused), in `dtype`, on DEVICE."""
    from transformers import AutoModelForCausalLM

    params = dict(runner.model.named_parameters())
    state = {name: params[p].narrow(0, start, rows).to(dtype)
             for name, (p, start, rows) in runner.model.checkpoint_targets().items()}
    hf = AutoModelForCausalLM.from_config(spec.hf_config(), dtype=dtype).eval()
    hf.load_state_dict(state, strict=True)
    return hf.to(DEVICE)


def test_bf16_prefill_and_graph_decode_logits_match_hf():
    spec = resolve_model("dummy:tiny")
    runner = ModelRunner(spec, DEVICE, torch.bfloat16, kv_slots=1024, max_rows=8, seed=0)
    assert runner.graphs is not None, "CUDA graphs were not captured"
    vocab = spec.hf_config().vocab_size
    lens, steps = [37, 5, 64], 6  # prompt lengths; decode steps after the batched prefill
    gen = torch.Generator().manual_seed(0)
    seqs = [torch.randint(3, vocab, (n + steps,), generator=gen).tolist() for n in lens]
    n = len(seqs)
    fb = make_batch([Chunk(i, s[:k]) for i, (s, k) in enumerate(zip(seqs, lens))], [0] * n, n,
                    sample_all=True, device=DEVICE)
    assert not fb.is_decode
    ours = [[part] for part in runner.forward(fb).split(lens)]  # [len_i, V] each
    for t in range(steps):  # a batch of 3 decodes replays the graph of 4 (one padding row)
        fb = make_batch([Chunk(i, [s[k + t]]) for i, (s, k) in enumerate(zip(seqs, lens))],
                        [k + t for k in lens], n, device=DEVICE)
        assert runner.graphs.can_run(fb)
        logits = runner.forward(fb).clone()  # [3, V]; replay reuses its output buffer
        for i in range(n):
            ours[i].append(logits[i : i + 1])
    hf16, hf32 = hf_twin(runner, spec, torch.bfloat16), hf_twin(runner, spec, torch.float32)
    with torch.no_grad():
        for seq, parts in zip(seqs, ours):
            got = torch.cat(parts).float()  # [len + steps, V]
            ids = torch.tensor([seq], device=DEVICE)
            want = hf16(ids).logits[0].float()
            exact = hf32(ids).logits[0].float()
            scale = exact.abs().max().item()
            # bf16 rounding differs between kernels; a wrong position or KV slot does not
            # stay within 5% of the logit range, nor 1% on average
            for ref in (want, exact):
                torch.testing.assert_close(got, ref, atol=0.05 * scale, rtol=0)
                assert (got - ref).abs().mean().item() < 0.01 * scale


def test_torch_backend_runs_eagerly_and_matches_triton_backend():
    """`attention_backend="torch"` on CUDA: no graphs, and the logits of the triton backend
    (graph decode) fed the same tokens, within TF32 rounding."""
    spec = resolve_model("dummy:tiny")
    runners = {
        name: ModelRunner(spec, DEVICE, torch.float32, kv_slots=1024, max_rows=8, seed=0,
                          attention_backend=name)
        for name in ("torch", "triton")
    }  # fmt: skip
    assert runners["torch"].graphs is None and runners["triton"].graphs is not None
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 1024, (n,), generator=gen).tolist() for n in (9, 40, 2)]
    tokens, want = greedy(runners["torch"], prompts, 8)
    _, got = greedy(runners["triton"], prompts, 8, forced=tokens)
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, atol=0.01 * scale, rtol=0)


# ---------------------------------------------------------------- fp32 engine vs HF greedy
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024,
            bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
# Logits here span about +-45 (std 11); attention's tl.dot runs in TF32 on the GPU, which moves
# them by up to ~0.02 (measured on CPU by rounding attention inputs to TF32); HF's median
# top-2 gap is ~2.5, so a divergence is accepted only where HF itself nearly tied.
GAP_TOL = 0.1
# dummy:tiny's logits have std ~0.3 (median top-2 gap ~0.07): the same rounding, scaled down
DUMMY_GAP_TOL = 3e-3


def tiny_hf_folder(folder):
    """A random tiny Llama saved with a word-level tokenizer ("t0" .. "t511"): fp32, on DEVICE.

    Weights like tests/worker/checkpoints.py, LM head scaled up so logits spread widely and
    greedy near-ties are rare.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**TINY), dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape)
            param.copy_(1 + 0.1 * noise if "norm" in name else 0.05 * noise)
        model.lm_head.weight.mul_(20)
    model.save_pretrained(folder)
    vocab = TINY["vocab_size"]
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0", "bos_token": "t1",
        "eos_token": "t2", "pad_token": "t0"}))
    return model.to(DEVICE)


def hf_greedy(model, prompt: list[int], max_new: int) -> tuple[list[int], list[float]]:
    """HF's greedy continuation (stops after EOS, as ours) and its top-2 logit gap per step."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt], device=DEVICE), max_new_tokens=max_new,
                             do_sample=False, output_scores=True, return_dict_in_generate=True,
                             pad_token_id=0)
    gaps = [float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores]
    return out.sequences[0, len(prompt):].tolist(), gaps


def assert_same_greedy(ours: list[int], ref: list[int], gaps: list[float], what: str,
                       gap_tol: float = GAP_TOL) -> None:
    """Token-for-token equality; a divergence passes only at an HF near-tie (gap < gap_tol)."""
    if ours == ref:
        return
    k = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), min(len(ours), len(ref)))
    gap = gaps[k] if k < len(gaps) else float("inf")
    assert gap < gap_tol, (f"{what}: first difference at token {k}: ours {ours[k:k + 5]} vs HF "
                           f"{ref[k:k + 5]}, HF top-2 logit gap {gap:.3g}")


def test_fp32_engine_greedy_matches_hf(tmp_path):
    hf = tiny_hf_folder(tmp_path)
    gen = torch.Generator().manual_seed(1)
    lens = [1, 7, 33, 64, 130, 257]  # single chunk, several chunks, and decodes beside them
    prompts = [torch.randint(3, TINY["vocab_size"], (n,), generator=gen).tolist() for n in lens]
    max_new = 24
    with Engine(model=str(tmp_path), device=DEVICE, dtype="float32", chunk_size=64,
                kv_slots=4096, log_level="warning") as eng:
        outs = eng.generate(prompts, SamplingParams(max_tokens=max_new, temperature=0.0))
        stats = eng.stats()
    assert stats.invariant_error is None
    for prompt, out in zip(prompts, outs):
        ref, gaps = hf_greedy(hf, prompt, max_new)
        assert_same_greedy(out.token_ids, ref, gaps, f"prompt of {len(prompt)} tokens")
        # the tokenizer was loaded and detokenizes (t0..t2 are special, hence skipped)
        assert out.text.split() == [f"t{i}" for i in out.token_ids if i > 2]


# ---------------------------------------------------------------- overlap safety
def run_small_pool(overlap: bool, prompts: list[list[int]], max_tokens: list[int]):
    """Every request in flight at once (one thread each), each with its own max_tokens."""
    # conservativeness 0: admit without reserving room for future tokens, so running
    # requests outgrow the pool and get retracted (and re-prefilled) as well
    with Engine(model="dummy:tiny", device=DEVICE, dtype="float32", kv_slots=256,
                max_running=32, chunk_size=128, overlap=overlap, schedule_conservativeness=0.0,
                log_level="warning") as eng:
        with ThreadPoolExecutor(len(prompts)) as pool:
            outs = list(pool.map(lambda p, m: eng.generate(p, SamplingParams(
                max_tokens=m, temperature=0.0))[0], prompts, max_tokens))
        return [(o.token_ids, o.finish_reason) for o in outs], eng.stats()


def test_overlap_is_safe_when_the_pool_reuses_slots_at_once():
    """48 requests of 1..99 prompt tokens and 1..40 outputs through a 256-slot pool, 32 at a
    time: identical greedy outputs with and without overlap. Each must also be HF's greedy
    continuation (on the same seeded dummy weights) up to an HF near-tie: there the two runs,
    whose batches differ, may round either way."""
    gen = torch.Generator().manual_seed(2)
    n = 48
    lens = torch.randint(1, 100, (n,), generator=gen).tolist()
    prompts = [torch.randint(3, 1024, (k,), generator=gen).tolist() for k in lens]
    max_tokens = torch.randint(1, 41, (n,), generator=gen).tolist()
    with_overlap, stats_on = run_small_pool(True, prompts, max_tokens)
    without, stats_off = run_small_pool(False, prompts, max_tokens)
    for stats in (stats_on, stats_off):
        assert stats.invariant_error is None
        assert stats.running == 0 and stats.waiting == 0 and stats.kv_used == 0
        assert stats.num_retractions > 0  # the pool really was too small for the batch
    spec = resolve_model("dummy:tiny")  # the worker draws its weights as this runner does
    hf = hf_twin(ModelRunner(spec, DEVICE, torch.float32, kv_slots=64, max_rows=1, seed=0,
                             cuda_graph=False), spec, torch.float32)
    differ = 0
    for i, (on, off) in enumerate(zip(with_overlap, without)):
        what = f"request {i} (prompt {lens[i]}, max_tokens {max_tokens[i]})"
        ref, gaps = hf_greedy(hf, prompts[i], max_tokens[i])
        assert len(on[0]) == max_tokens[i] or on[1] == "stop", (what, on)
        for mode, (ids, _) in (("overlap", on), ("no overlap", off)):
            assert_same_greedy(ids, ref, gaps, f"{what}, {mode}", DUMMY_GAP_TOL)
        differ += on != off
    assert differ <= 2, f"{differ} requests differ between overlap and no overlap"
