"""Kernel benchmarks: time, bytes moved, GB/s and % of the H200 copy ceiling for every kernel.

Decode attention is the one that matters (memory bound, target >= 80% of copy bandwidth at
batch 64 x 4096 keys x 32 heads x 128, fp16); it is compared with torch SDPA's flash backend on
contiguous KV of the same shape. Writes `<out>.json` and `<out>.md`.

    python -m bench.kernels [--quick] [--sweep] [--only decode,extend] [--out PREFIX]
    python bench/kernels.py --tiny   # CPU smoke run of this script under TRITON_INTERPRET=1
"""

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from itertools import product
from pathlib import Path

import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a file: bench/ would shadow the `kernels` package
    sys.path[0] = str(Path(__file__).resolve().parents[1])
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from kernels.activation import silu_and_mul  # noqa: E402
from kernels.decode_attention import DecodeConfig, decode_attention, decode_num_splits  # noqa: E402
from kernels.extend_attention import extend_attention  # noqa: E402
from kernels.rmsnorm import rmsnorm  # noqa: E402
from kernels.rope import apply_rope, rope_cos_sin_cache  # noqa: E402
from kernels.store_kv import store_kv  # noqa: E402

COPY_CEILING_GBPS = 4260.0  # H200 device-to-device copy, bytes read + written (device.md)
GROUPS = ("copy", "decode", "extend", "store_kv", "rmsnorm", "rope", "silu_and_mul")


@dataclass(frozen=True)
class Preset:
    """Shapes and repetitions; ctx and extend_prefix must be multiples of 16 (the page)."""

    batch: int = 64
    ctx: int = 4096
    heads: int = 32
    gqa_kv_heads: int = 8
    head_dim: int = 128
    extend_batch: int = 4
    extend_new: int = 2048
    extend_prefix: int = 2048
    extend_new_after_prefix: int = 512
    tokens: int = 16384
    hidden: int = 4096
    inter: int = 11008
    copy_mib: int = 4096
    warmup: int = 10
    iters: int = 50
    variants: bool = True  # GQA decode and the extend-with-prefix rows


PRESETS = {
    "full": Preset(),
    "quick": Preset(tokens=4096, copy_mib=1024, warmup=3, iters=10, variants=False),
    "tiny": Preset(batch=2, ctx=96, heads=4, gqa_kv_heads=2, head_dim=32, extend_batch=2,
                   extend_new=40, extend_prefix=32, extend_new_after_prefix=24, tokens=8,
                   hidden=64, inter=48, copy_mib=1, warmup=1, iters=2),
}  # fmt: skip


@dataclass
class Row:
    kernel: str
    case: str
    time_us: float
    bytes: int
    flops: float = 0.0
    note: str = ""

    @property
    def gbps(self) -> float:
        return self.bytes / self.time_us / 1e3

    def as_dict(self) -> dict:
        pct = 100 * self.gbps / COPY_CEILING_GBPS
        tflops = self.flops / self.time_us / 1e6
        return {**asdict(self), "gbps": self.gbps, "pct_ceiling": pct, "tflops": tflops}


def timeit(fn, p: Preset) -> float:
    """Median microseconds of `fn()` over p.iters runs after p.warmup (CUDA events on a GPU)."""
    for _ in range(p.warmup):
        fn()
    if not torch.cuda.is_available():
        times = []
        for _ in range(p.iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(p.iters)]  # fmt: skip
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) * 1e3 for start, end in events)


def paged_pool(k, v, page_size, pool_dtype):
    """Scatter contiguous k, v `[B, H, L, D]` into a pool over shuffled pages.

    Returns (k_buf, v_buf, kv_indptr, kv_indices, scales); page 0 stays unused (padding sink).
    """
    B, H, L, D = k.shape
    pages_per_seq = L // page_size
    pages = torch.randperm(B * pages_per_seq, device=k.device) + 1  # [B * L/ps]
    tok = torch.arange(L, device=k.device)
    slots = pages.view(B, pages_per_seq)[:, tok // page_size] * page_size + tok % page_size
    num_slots = (B * pages_per_seq + 1) * page_size
    k_buf = torch.empty(num_slots, H, D, dtype=pool_dtype, device=k.device)  # [S, H, D]
    v_buf = torch.empty_like(k_buf)
    scales = {}
    if pool_dtype != k.dtype:
        scales = {n: torch.ones(num_slots, H, device=k.device) for n in ("k_scale", "v_scale")}
    k_rows, v_rows = (x.transpose(1, 2).reshape(B * L, H, D) for x in (k, v))  # [B*L, H, D]
    store_kv(k_rows, v_rows, k_buf, v_buf, slots.flatten(), **scales)
    kv_indptr = torch.arange(B + 1, device=k.device, dtype=torch.int32) * pages_per_seq
    return k_buf, v_buf, kv_indptr, pages.to(torch.int32), scales


def bench_copy(p, dev, dtype, args):
    x = torch.empty(p.copy_mib << 20, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    return [Row("copy", f"{p.copy_mib} MiB", timeit(lambda: y.copy_(x), p), 2 * x.numel())]


def bench_decode(p, dev, dtype, args):
    B, L, Hq, D = p.batch, p.ctx, p.heads, p.head_dim
    fp8 = torch.float8_e4m3fn
    rows, sweep = [], []
    for Hkv in (Hq, p.gqa_kv_heads) if p.variants else (Hq,):
        q = torch.randn(B, Hq, D, device=dev, dtype=dtype)  # [B, Hq, D]
        k = torch.randn(B, Hkv, L, D, device=dev, dtype=dtype)  # [B, Hkv, L, D]
        v = torch.randn(B, Hkv, L, D, device=dev, dtype=dtype)  # [B, Hkv, L, D]
        shape = f"B{B} L{L} H{Hq}/{Hkv} D{D}"
        ref = None
        if Hkv == Hq:
            backend = SDPBackend.FLASH_ATTENTION if dev == "cuda" else SDPBackend.MATH
            sdpa = partial(F.scaled_dot_product_attention, q[:, :, None], k, v)
            with sdpa_kernel(backend):
                ref = sdpa()[:, :, 0]  # [B, Hq, D]
                t = timeit(sdpa, p)
            rows.append(Row("decode", f"sdpa {backend.name.lower()} {shape}", t,
                            2 * k.nbytes + 2 * q.nbytes))  # fmt: skip
        seq_lens = torch.full((B,), L, dtype=torch.int32, device=dev)
        for (layout, page_size), pool_dtype in product(
            (("token", 1), ("paged16", 16)), (dtype, fp8)
        ):
            k_buf, v_buf, indptr, indices, scales = paged_pool(k, v, page_size, pool_dtype)
            run = partial(decode_attention, q, k_buf, v_buf, indptr, indices, seq_lens,
                          page_size, D**-0.5, **scales)  # fmt: skip
            err = "" if ref is None else f"err vs sdpa {(run() - ref).abs().max().item():.1e}"
            kv_bytes = 2 * B * L * Hkv * D * k_buf.element_size()
            nbytes = kv_bytes + 2 * q.nbytes + indices.nbytes + 2 * B * L * Hkv * 4 * bool(scales)
            splits = decode_num_splits(B, Hkv, L)
            rows.append(Row("decode", f"{layout} {str(pool_dtype)[6:]} {shape}", timeit(run, p),
                            nbytes, note=f"splits {splits} {err}"))  # fmt: skip
            swept = fp8 if args.sweep_pool == "fp8" else dtype
            if args.sweep and layout == "token" and pool_dtype == swept:
                sweep += sweep_decode(run, nbytes, p, Hkv == Hq, str(pool_dtype)[6:])
    return rows, sweep


def sweep_decode(run, nbytes, p, mha, pool):
    """Time the token-layout decode over split counts and launch configs; best first."""
    out = []
    dots = (None, True) if mha else (None,)
    for splits, block_n, warps, stages, dot in product(
        (1, 2, 4, 8), (32, 64, 128), (4, 8), (2, 3), dots
    ):
        cfg = DecodeConfig(block_n=block_n, num_warps=warps, num_stages=stages, use_dot=dot)
        t = timeit(partial(run, num_splits=splits, config=cfg), replace(p, iters=p.iters // 2 + 1))
        out.append({"mha": mha, "pool": pool, "splits": splits, **asdict(cfg), "time_us": t,
                    "pct_ceiling": 100 * nbytes / t / 1e3 / COPY_CEILING_GBPS})  # fmt: skip
        print("sweep", out[-1], flush=True)  # partial results survive a time limit
    return sorted(out, key=lambda r: r["time_us"])


def bench_extend(p, dev, dtype, args):
    B, Hq, Hkv, D = p.extend_batch, p.heads, p.gqa_kv_heads, p.head_dim
    rows = []
    cases = [(0, p.extend_new)] + ([(p.extend_prefix, p.extend_new_after_prefix)] * p.variants)
    for prefix, new in cases:
        T = B * new
        q, kn, vn = (torch.randn(T, h, D, device=dev, dtype=dtype) for h in (Hq, Hkv, Hkv))
        kc = torch.randn(B, Hkv, max(prefix, 16), D, device=dev, dtype=dtype)  # the prefix
        k_buf, v_buf, indptr, indices, _ = paged_pool(kc, kc, 16, dtype)
        qo = torch.arange(B + 1, device=dev, dtype=torch.int32) * new
        prefix_lens = torch.full((B,), prefix, dtype=torch.int32, device=dev)
        run = partial(extend_attention, q, kn, vn, k_buf, v_buf, qo, prefix_lens, indptr,
                      indices, 16, D**-0.5, max_new_len=new)  # fmt: skip
        flops = 4 * D * Hq * B * (new * prefix + new * (new + 1) / 2)
        nbytes = 2 * q.nbytes + 2 * kn.nbytes + 2 * B * prefix * Hkv * D * k_buf.element_size()
        case = f"B{B} prefix{prefix} new{new} H{Hq}/{Hkv} D{D} paged16"
        rows.append(Row("extend", case, timeit(run, p), nbytes, flops))
        if prefix == 0:  # the same causal prefill through SDPA flash (KV heads expanded)
            qs = q.view(B, new, Hq, D).transpose(1, 2)  # [B, Hq, new, D]
            ks, vs = (x.view(B, new, Hkv, D).transpose(1, 2).repeat_interleave(Hq // Hkv, 1)
                      for x in (kn, vn))  # fmt: skip
            backend = SDPBackend.FLASH_ATTENTION if dev == "cuda" else SDPBackend.MATH
            sdpa = partial(F.scaled_dot_product_attention, qs, ks, vs, is_causal=True)
            with sdpa_kernel(backend):
                err = (sdpa().transpose(1, 2).reshape(T, Hq, D) - run()).abs().max().item()
                t = timeit(sdpa, p)
            note = f"err vs sdpa {err:.1e}"
            rows.append(
                Row("extend", f"sdpa {backend.name.lower()} {case}", t, nbytes, flops, note)
            )
    return rows


def bench_store_kv(p, dev, dtype, args):
    Hkv, D, rows = p.gqa_kv_heads, p.head_dim, []
    for T, pool_dtype in product((p.batch, p.tokens), (dtype, torch.float8_e4m3fn)):
        k, v = (torch.randn(T, Hkv, D, device=dev, dtype=dtype) for _ in range(2))
        num_slots = 2 * T + 1
        slots = torch.randperm(num_slots - 1, device=dev)[:T] + 1
        k_buf = torch.empty(num_slots, Hkv, D, dtype=pool_dtype, device=dev)
        v_buf = torch.empty_like(k_buf)
        scales = {}
        if pool_dtype != dtype:
            scales = {n: torch.empty(num_slots, Hkv, device=dev) for n in ("k_scale", "v_scale")}
        nbytes = 2 * k.nbytes + 2 * T * Hkv * D * k_buf.element_size() + slots.nbytes
        nbytes += 2 * T * Hkv * 4 * bool(scales)
        t = timeit(partial(store_kv, k, v, k_buf, v_buf, slots, **scales), p)
        rows.append(Row("store_kv", f"T{T} H{Hkv} D{D} -> {str(pool_dtype)[6:]}", t, nbytes))
    return rows


def bench_rmsnorm(p, dev, dtype, args):
    x, r = (torch.randn(p.tokens, p.hidden, device=dev, dtype=dtype) for _ in range(2))
    w = torch.randn(p.hidden, device=dev, dtype=dtype)
    case = f"T{p.tokens} hidden{p.hidden}"
    return [
        Row("rmsnorm", case, timeit(lambda: rmsnorm(x, w, 1e-6), p), 2 * x.nbytes + w.nbytes),
        Row("rmsnorm", f"{case} +residual", timeit(lambda: rmsnorm(x, w, 1e-6, r), p),
            4 * x.nbytes + w.nbytes),
    ]  # fmt: skip


def bench_rope(p, dev, dtype, args):
    T, Hq, Hkv, D = p.tokens, p.heads, p.gqa_kv_heads, p.head_dim
    q = torch.randn(T, Hq, D, device=dev, dtype=dtype)  # [T, Hq, D]
    k = torch.randn(T, Hkv, D, device=dev, dtype=dtype)  # [T, Hkv, D]
    cache = rope_cos_sin_cache(D, 8192, 500000.0, None, dev)  # [8192, D]
    pos = torch.randint(0, 8192, (T,), device=dev)
    nbytes = 2 * (q.nbytes + k.nbytes) + T * D * 4 + pos.nbytes
    return [Row("rope", f"T{T} H{Hq}/{Hkv} D{D}", timeit(lambda: apply_rope(q, k, pos, cache), p),
                nbytes)]  # fmt: skip


def bench_silu_and_mul(p, dev, dtype, args):
    x = torch.randn(p.tokens, 2 * p.inter, device=dev, dtype=dtype)  # [T, 2I]
    t = timeit(lambda: silu_and_mul(x), p)
    return [Row("silu_and_mul", f"T{p.tokens} I{p.inter}", t, x.nbytes * 3 // 2)]


def write_results(prefix: Path, meta: dict, rows: list[Row], sweep: list[dict]) -> None:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    data = {"meta": meta, "rows": [r.as_dict() for r in rows], "decode_sweep": sweep}
    prefix.with_suffix(".json").write_text(json.dumps(data, indent=2))
    lines = [f"# Kernel benchmark ({meta['device']})", "",
             ", ".join(f"{k}: {v}" for k, v in meta.items()), "",
             "| kernel | case | time (us) | MB moved | GB/s | % of copy ceiling | TFLOP/s | note |",
             "|---|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for d in data["rows"]:
        lines.append(f"| {d['kernel']} | {d['case']} | {d['time_us']:.1f} | {d['bytes'] / 1e6:.1f}"
                     f" | {d['gbps']:.0f} | {d['pct_ceiling']:.1f} | {d['tflops']:.1f}"
                     f" | {d['note']} |")  # fmt: skip
    if sweep:
        lines += ["", f"## Decode sweep (token layout, {sweep[0]['pool']} pool, fastest 10 per "
                  "head layout)", "",
                  "| mha | splits | block_n | warps | stages | use_dot | time (us) | % ceiling |",
                  "|---|---:|---:|---:|---:|---|---:|---:|"]  # fmt: skip
        for mha in (True, False):
            for s in [s for s in sweep if s["mha"] == mha][:10]:
                lines.append(f"| {mha} | {s['splits']} | {s['block_n']} | {s['num_warps']} |"
                             f" {s['num_stages']} | {s['use_dot']} | {s['time_us']:.1f} |"
                             f" {s['pct_ceiling']:.1f} |")  # fmt: skip
    prefix.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations and variants")
    parser.add_argument("--tiny", action="store_true", help="toy shapes (CPU smoke run)")
    parser.add_argument("--sweep", action="store_true", help="search decode launch configs")
    parser.add_argument("--sweep-pool", choices=("compute", "fp8"), default="compute",
                        help="the KV pool dtype the sweep runs on")
    parser.add_argument("--only", default=",".join(GROUPS), help=f"subset of {','.join(GROUPS)}")
    parser.add_argument("--out", default="bench/results/kernels", help="output path prefix")
    args = parser.parse_args()
    only = args.only.split(",")
    assert set(only) <= set(GROUPS), f"--only takes {GROUPS}, got {only}"
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and not args.tiny:
        sys.exit("no CUDA device: only --tiny runs here (through the Triton interpreter)")
    preset_name = "tiny" if args.tiny else "quick" if args.quick else "full"
    p = PRESETS[preset_name]
    dtype = torch.float16 if dev == "cuda" else torch.float32
    meta = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)",
        "preset": preset_name, "dtype": str(dtype)[6:], "torch": torch.__version__,
        "triton": __import__("triton").__version__, "ceiling_gbps": COPY_CEILING_GBPS,
        "iters": p.iters,
    }  # fmt: skip
    torch.manual_seed(0)
    rows, sweep = [], []
    for group in only:
        result = globals()[f"bench_{group}"](p, dev, dtype, args)
        if group == "decode":
            result, sweep = result
        rows += result
        if dev == "cuda":
            torch.cuda.empty_cache()
    write_results(Path(args.out), meta, rows, sweep)


if __name__ == "__main__":
    main()
