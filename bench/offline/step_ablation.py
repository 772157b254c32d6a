"""What each group of small kernels costs inside the decode step, measured by taking it out.

`bench.offline.profile_decode` sums kernel times, which under programmatic dependent launch
(`kernels.pdl`) include each kernel's wait for the one before: they overlap, and do not say
what a launch costs the step. This bench times the step itself (`ModelRunner.forward`,
CUDA-graph replay, as `bench.offline.fp8_weights` does) with one group of kernels removed, the graph
recaptured each time:
- `rmsnorm`: every RMSNorm and residual add (2 a layer + 1);
- `rope_store_kv`: RoPE and the KV store (1 a layer);
- `merge`: the split-KV merge of decode attention (1 a layer, where there are splits);
- `silu_mul`: the MLP's activation (1 a layer; the down projection reads the gate half);
  none where the down projection takes it in its loads (16-bit weights, one row);
- `attention`: rope_store_kv, stage 1 and the merge (3 a layer);
- `small`: rmsnorm, rope_store_kv, merge and silu_mul together.
The outputs are then wrong; only the time is of interest. Each variant, the base included,
is captured `--captures` times, in rounds of alternating order, and its cost is the median
step against the base's median; the report shows each variant's range over its captures.
Llama-family models on the Triton attention backend.

Why several captures: on the H200 (2026-12-03) the first capture of a runner and a recapture
of the same graph differed by -18 to +78 us a step, and the same tree's step differs by up
to 3% between H200s. A difference smaller than the ranges is noise.

    python -m bench.offline.step_ablation [--model dummy:llama3-8b] [--quantization none]
                                  [--context 576] [--captures 3]
                                  [--out bench/results/<date>-step-ablation]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import torch

from bench.offline.parts import decode_batch, time_ms
from bench.outputs import write_outputs
from bench.roofline import BANDWIDTH, ModelBytes
from kernels.attention.decode_config import decode_num_splits

GROUPS = ("rmsnorm", "rope_store_kv", "merge", "silu_mul", "attention", "small")
SMALL = ("rmsnorm", "rope_store_kv", "merge", "silu_mul")
ITERS = 150  # steps a timing (one timing a capture)


class _NoLaunch:
    """Stands in for a Triton kernel: `kernel[grid](...)` launches nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _cuts(group: str) -> list[tuple[object, str, object]]:
    """(owner, attribute, stand-in) that take `group`'s kernels out of the forward."""
    from runtime.worker import attention_triton
    from runtime.worker.ops import TritonOps

    decode_attention = sys.modules["kernels.attention.decode"]
    if group == "small":
        return [cut for g in SMALL for cut in _cuts(g)]
    return {
        "rmsnorm": [(TritonOps, "rmsnorm", staticmethod(lambda x, w, eps: x)),
                    (TritonOps, "add_rmsnorm", staticmethod(lambda x, res, w, eps: (x, res)))],
        "rope_store_kv": [(attention_triton, "rope_store_kv",
                           lambda q, k, v, *args, **kwargs: (q, None, None))],
        "merge": [(decode_attention, "_decode_attention_merge_kernel", _NoLaunch())],
        "silu_mul": [(TritonOps, "silu_mul", staticmethod(lambda x: x[:, : x.shape[1] // 2]))],
        "attention": [(attention_triton.TritonAttention, "forward_rotary",
                       lambda self, layer_id, q, k, v, fb, rotary: q)],
    }[group]


@contextlib.contextmanager
def without(group: str | None):
    """The forward with `group`'s kernels taken out while inside (None: unchanged)."""
    cuts = _cuts(group) if group else []
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in cuts]
    for owner, name, stand_in in cuts:
        setattr(owner, name, stand_in)
    try:
        yield
    finally:
        for owner, name, old in reversed(saved):
            setattr(owner, name, old)


def copy_tb_s() -> float:
    """Device-to-device copy bandwidth (bytes read + written), 2 GiB."""
    x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    return 2 * x.numel() / time_ms(lambda: y.copy_(x), 20) / 1e9


def launches(group: str, layers: int, merges: bool, act: bool) -> int:
    """Launches a step that `group` takes out: 2 norms a layer and a final one, 1 of each other
    kernel a layer, no merge where a sequence runs in one split, no activation where the down
    projection takes it in its loads (`act` False)."""
    merge = layers if merges else 0
    silu = layers if act else 0
    return {"rmsnorm": 2 * layers + 1, "merge": merge, "attention": 2 * layers + merge,
            "silu_mul": silu, "small": 3 * layers + 1 + merge + silu}.get(group, layers)


def run(model: str, quantization: str, ctx: int, captures: int) -> dict:
    """Time the batch-1 step as built, then `captures` rounds of recaptures: the base and the
    step without each group."""
    from runtime.model_config import resolve_model
    from runtime.worker.attention_triton import TritonAttention
    from runtime.worker.graph_runner import GraphRunner
    from runtime.worker.model_runner import ModelRunner
    from runtime.worker.models.dense_linear import fuses_gate
    from runtime.worker.models.llama import LlamaForCausalLM

    spec = resolve_model(model)
    runner = ModelRunner(spec, torch.device("cuda"), torch.bfloat16, kv_slots=spec.max_context,
                         max_rows=1, seed=0, quantization=quantization)
    if not (isinstance(runner.attn, TritonAttention)
            and isinstance(runner.model, LlamaForCausalLM)):
        raise SystemExit(f"{model}: the cuts fit Llama-family models on the Triton backend")
    fb = decode_batch(1, ctx, runner.vocab_size, runner.device)
    res = {"copy_tb_s": copy_tb_s(), "as_built_ms": time_ms(lambda: runner.forward(fb), ITERS),
           "variants": {}}
    order = ("base", *GROUPS)
    for rnd in range(captures):
        for name in order if rnd % 2 == 0 else order[::-1]:
            with without(None if name == "base" else name):
                runner.graphs = None  # frees the previous capture first
                runner.graphs = GraphRunner(runner.model, runner.attn, 1, runner.max_context,
                                            runner.device)
                runner.graphs.capture()
                ms = time_ms(lambda: runner.forward(fb), ITERS)
            res["variants"].setdefault(name, []).append(ms)
            print(f"{rnd} {name:14s} {ms:.4f}", flush=True)
    res["layers"] = runner.model.arch.num_layers
    down = runner.model.model.layers[0].mlp.down_proj.weight  # [hidden, inter]
    probe = torch.empty(1, 2 * down.shape[1], dtype=torch.bfloat16, device=runner.device)
    res["act_launched"] = not fuses_gate(probe, down)
    pool = runner.attn.pool  # the graph's split count, fixed for the longest context
    res["splits"] = decode_num_splits(1, pool.kv_heads, runner.max_context, runner.attn.num_sms,
                                      quantized=pool.quantized)
    return res


def _range(ms: list[float]) -> str:
    return f"{min(ms):.4f}-{max(ms):.4f}"


def markdown(res: dict) -> str:
    """The report: the step as built and recaptured, and each group's saving."""
    v = res["variants"]
    base = statistics.median(v["base"])
    lines = [f"# Decode step without each kernel group: {res['model']} "
             f"(--quantization {res['quantization']}), batch 1, context {res['context']}", "",
             f"Command: `{res['command']}`  ", f"Device: {res['device']}, {res['date']}", "",
             f"Copy bandwidth {res['copy_tb_s']:.3f} TB/s. Floor {res['floor_ms']:.3f} ms (at "
             f"{BANDWIDTH / 1e12:.2f} TB/s). Step as built {res['as_built_ms']:.4f} ms "
             f"({res['as_built_ms'] / res['floor_ms']:.3f}x floor); recaptured "
             f"{len(v['base'])} times, median {base:.4f} ms (range {_range(v['base'])}). "
             f"{res['splits']} split(s) a sequence.", "",
             "| removed | step ms | range over captures | saves us | launches | us a launch |",
             "|---|---|---|---|---|---|"]
    for g in GROUPS:
        ms = statistics.median(v[g])
        n = launches(g, res["layers"], res["splits"] > 1, res["act_launched"])
        saved = (base - ms) * 1e3
        per = f"{saved / n:.2f}" if n else "-"
        lines.append(f"| {g} | {ms:.4f} | {_range(v[g])} | {saved:.1f} | {n} | {per} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dummy:llama3-8b")
    ap.add_argument("--quantization", default="none", choices=("none", "fp8"))
    ap.add_argument("--context", type=int, default=576)
    ap.add_argument("--captures", type=int, default=3, help="recaptures of each variant")
    ap.add_argument("--out", default=f"bench/results/{time.strftime('%Y-%m-%d')}-step-ablation")
    args = ap.parse_args()
    res = run(args.model, args.quantization, args.context, args.captures)
    res |= {"model": args.model, "quantization": args.quantization, "context": args.context,
            "device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": f"python -m bench.offline.step_ablation --model {args.model} --quantization "
                       f"{args.quantization} --context {args.context} --captures {args.captures}",
            "floor_ms": ModelBytes.of(args.model, torch.bfloat16, args.quantization).floor_ms(
                1, args.context)}
    write_outputs(args.out, res, markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
