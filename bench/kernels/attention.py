"""The attention rows of `bench.kernels`: decode and extend over 16-bit, fp8 and int8 KV pools.

Decode is memory bound: its bytes are what the kernel reads (K and V in the pool's dtype, the
float32 per-(token, head) scales of a quantized pool, q, the page table) and its target is a
share of the copy ceiling. Each decode row is compared with the same shape over a 16-bit pool
in a summary table; the MHA shapes are also compared with torch SDPA's flash backend.
"""

from dataclasses import asdict, replace
from functools import partial
from itertools import product

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.kernels.common import COPY_CEILING_GBPS, Row, timeit
from kernels.attention.decode import DecodeConfig, decode_attention, decode_num_splits
from kernels.attention.extend import extend_attention
from kernels.kv.store import scale_pairs, store_kv
from runtime.worker.kv_pool import KV_STORAGE, kv_dtype_scaled

# the quantized kv dtypes' pool dtypes: with a float32 scale per (slot, head), and without
# (a per-tensor scale of 1: the codes are the values)
QUANT_POOLS = {name: dtype for name, dtype in KV_STORAGE.items() if kv_dtype_scaled(name)}
UNSCALED_POOLS = {name: dtype for name, dtype in KV_STORAGE.items() if not kv_dtype_scaled(name)}
LAYOUTS = (("token", 1), ("paged16", 16))


def pool_name(pool_dtype: torch.dtype) -> str:
    return next((n for n, d in QUANT_POOLS.items() if d == pool_dtype), str(pool_dtype)[6:])


def paged_pool(k, v, page_size, pool_dtype, scaled=True):
    """Scatter contiguous k, v `[B, H, L, D]` into a pool over shuffled pages (quantized per
    (slot, head) for an fp8/int8 `pool_dtype`, or cast when not `scaled`).

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
    if pool_dtype != k.dtype and scaled:  # the engine pool's layout: K's and V's side by side
        pairs = scale_pairs(num_slots, H, k.device)  # [S, H, 2]
        scales = {"k_scale": pairs[..., 0], "v_scale": pairs[..., 1]}
    k_rows, v_rows = (x.transpose(1, 2).reshape(B * L, H, D) for x in (k, v))  # [B*L, H, D]
    store_kv(k_rows, v_rows, k_buf, v_buf, slots.flatten(), **scales)
    kv_indptr = torch.arange(B + 1, device=k.device, dtype=torch.int32) * pages_per_seq
    return k_buf, v_buf, kv_indptr, pages.to(torch.int32), scales


def bench_decode(p, dev, dtype, args):
    Hq, D = p.heads, p.head_dim
    swept = QUANT_POOLS.get(args.sweep_pool, dtype)
    rows, sweep = [], []
    for (B, L), Hkv in product(p.decode_points, (Hq, p.gqa_kv_heads) if p.variants else (Hq,)):
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
        for (layout, page_size), pool_dtype in product(LAYOUTS, (dtype, *QUANT_POOLS.values())):
            k_buf, v_buf, indptr, indices, scales = paged_pool(k, v, page_size, pool_dtype)
            splits = decode_num_splits(B, Hkv, L, quantized=pool_dtype != dtype)  # as in graphs
            run = partial(decode_attention, q, k_buf, v_buf, indptr, indices, seq_lens,
                          page_size, D**-0.5, num_splits=splits, **scales)  # fmt: skip
            err = "" if ref is None else f"err vs sdpa {(run() - ref).abs().max().item():.1e}"
            kv_bytes = 2 * B * L * Hkv * D * k_buf.element_size()
            nbytes = kv_bytes + 2 * q.nbytes + indices.nbytes + 2 * B * L * Hkv * 4 * bool(scales)
            name = pool_name(pool_dtype)
            rows.append(Row("decode", f"{layout} {name} {shape}", timeit(run, p), nbytes,
                            note=f"splits {splits} {err}", group=f"{layout} {shape}",
                            variant=name))  # fmt: skip
            headline = p.decode_points[0] == (B, L)
            if args.sweep and headline and layout == "token" and pool_dtype == swept:
                sweep += sweep_decode(run, nbytes, p, Hkv == Hq, name)
            del k_buf, v_buf, scales
        del q, k, v
        if dev == "cuda":
            torch.cuda.empty_cache()
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
        qo = torch.arange(B + 1, device=dev, dtype=torch.int32) * new
        prefix_lens = torch.full((B,), prefix, dtype=torch.int32, device=dev)
        flops = 4 * D * Hq * B * (new * prefix + new * (new + 1) / 2)
        case = f"B{B} prefix{prefix} new{new} H{Hq}/{Hkv} D{D} paged16"
        pools = (dtype, *QUANT_POOLS.values()) if prefix else (dtype,)
        for pool_dtype in pools:  # a quantized pool only changes how the prefix is read
            k_buf, v_buf, indptr, indices, scales = paged_pool(kc, kc, 16, pool_dtype)
            run = partial(extend_attention, q, kn, vn, k_buf, v_buf, qo, prefix_lens, indptr,
                          indices, 16, D**-0.5, max_new_len=new, **scales)  # fmt: skip
            nbytes = 2 * q.nbytes + 2 * kn.nbytes + 2 * B * prefix * Hkv * D * k_buf.element_size()
            nbytes += 2 * B * prefix * Hkv * 4 * bool(scales)
            name = pool_name(pool_dtype)
            rows.append(Row("extend", f"{case} {name}", timeit(run, p), nbytes, flops,
                            group=case, variant=name))  # fmt: skip
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


def pool_summary(rows: list[dict], base: str) -> list[str]:
    """Markdown: one line per (kernel, group) of rows over several pools, with each pool's
    time, % of the copy ceiling and speed-up over the `base` (16-bit) pool."""
    groups: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        if r["group"]:
            groups.setdefault((r["kernel"], r["group"]), {})[r["variant"]] = r
    variants = [v for v in (base, *QUANT_POOLS) if any(v in g for g in groups.values())]
    if len(variants) < 2:
        return []
    head = "| kernel | case | " + " | ".join(f"{v} us | {v} %" for v in variants)
    head += " | " + " | ".join(f"{base}/{v}" for v in variants[1:]) + " |"
    lines = ["", f"## Pools side by side (% of the copy ceiling; speed-up over {base})", "",
             head, "|---|---|" + "---:|" * (3 * len(variants) - 1)]  # fmt: skip
    for (kernel, group), by in groups.items():
        cells = [f"{by[v]['time_us']:.1f} | {by[v]['pct_ceiling']:.1f}" if v in by else "- | -"
                 for v in variants]  # fmt: skip
        ratios = [f"{by[base]['time_us'] / by[v]['time_us']:.2f}x"
                  if v in by and base in by else "-" for v in variants[1:]]  # fmt: skip
        lines.append(f"| {kernel} | {group} | " + " | ".join(cells + ratios) + " |")
    return lines
