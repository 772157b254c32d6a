"""KV memory of DeepSeek-V4 (Flash, Pro) from their configs, beside the dense-MHA formula,
DeepSeek-V2/V3 MLA and the Llama-7B MHA shape: bytes per token, per request of 2,048 /
32k / 128k / 1M tokens, and how many 2,048-token requests fit in 100 GiB of KV.

A V4 layer keeps, per request:

- a **window ring** of the last `sliding_window` tokens' shared K=V row (`head_dim`
  values; one KV head), in every layer;
- **compressed entries**: one `head_dim` row per `compress_rate` tokens, in compressed
  sparse attention (CSA, rate 4) and heavily compressed attention (HCA, rate 128) layers;
- **indexer keys**: one `index_head_dim` row per CSA entry (the Lightning Indexer scores
  queries against them to pick the top `index_topk` entries);
- the **partial block**: the compressor inputs (projected kv and gate logits) of the tokens
  since the last closed window, plus in CSA layers the overlap half of the last closed
  window's tokens (the next entry mixes them in). A pool must reserve `compress_rate - 1`
  buffered tokens.

Bytes: "bf16" stores 2 bytes a value; "fp8" stores 1 byte a value plus one float32 scale
per stored row (the `--kv-dtype fp8` layout of `runtime.worker.kv_pool`), for the window,
the entries, the indexer keys, the MLA latent and the MHA heads alike. The partial block
stays bf16 in both (gate logits feed a softmax; it is small and bounded).

Beside that design, what Sluice holds for V4, read from the model code's layout: one pool
row per token and layer, its K=V row (`head_dim`), and beside the pool the entry pools by
window id (`runtime.worker.models.deepseek_v4_entries`: a CSA layer's entry and indexer
key, an HCA layer's entry, one id a window in the token layout and with pages a multiple
of the rate; HCA under pages of 16 or 64 tokens one id a page), and per request row the
rings of its partial block (compressor inputs: `deepseek_v4_partial`), bf16 only; in bf16
and under `--kv-dtype fp8` (rows and entries e4m3 with a float32 scale a row, indexer keys
bf16: `deepseek_v4_entries.v4_bytes_per_token`, what the worker sizes its pool by). The
layout before the entry pools (an entry slot in every token's row) is shown beside it.

    python -m bench.studies.dsv4_memory [--out bench/results/dsv4/<date>-kv-memory]
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
from dataclasses import asdict, dataclass

from bench.outputs import write_outputs
from bench.studies.dsv4_memory_report import report

GiB = 1 << 30
BUDGET = 100 * GiB
CONTEXTS = (2048, 32768, 131072, 1048576)
SCALE_BYTES = 4  # one float32 scale per fp8 row
CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"
RATIO_TO_TYPE = {0: SWA, 4: CSA, 128: HCA}  # config.json `compress_ratios` entries


@dataclass(frozen=True)
class V4Shape:
    """The config.json fields of a DeepSeek-V4 checkpoint that size its KV state."""

    name: str
    source: str  # where the numbers come from
    num_hidden_layers: int
    head_dim: int
    sliding_window: int
    index_head_dim: int
    layer_types: tuple[str, ...]
    compress_rates: tuple[tuple[str, int], ...] = ((CSA, 4), (HCA, 128))

    def rate(self, layer_type: str) -> int:
        return dict(self.compress_rates)[layer_type]


def _from_ratios(ratios: list[int], layers: int) -> tuple[str, ...]:
    """config.json's `compress_ratios` (one per layer, then the MTP layer's) as layer types."""
    return tuple(RATIO_TO_TYPE[r] for r in ratios[:layers])


# deepseek-ai/DeepSeek-V4-Flash config.json: num_hidden_layers 43, head_dim 512,
# sliding_window 128, index_head_dim 128, compress_ratios [0, 0, then 4, 128 alternating
# from layer 2, 4 at layer 42, then the MTP layer's 0]
FLASH = V4Shape(
    "DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Flash config.json", 43, 512, 128, 128,
    _from_ratios([0, 0] + [4, 128] * 20 + [4, 0], 43),
)
# deepseek-ai/DeepSeek-V4-Pro config.json: num_hidden_layers 61, head_dim 512,
# sliding_window 128, index_head_dim 128, compress_ratios [128, 128, then 4, 128
# alternating from layer 2, 4 at layer 60, then the MTP layer's 0]
PRO = V4Shape(
    "DeepSeek-V4-Pro", "deepseek-ai/DeepSeek-V4-Pro config.json", 61, 512, 128, 128,
    _from_ratios([128, 128] + [4, 128] * 29 + [4, 0], 61),
)


@dataclass(frozen=True)
class V4State:
    """Values (not bytes) of one request's V4 KV state, by part, all layers."""

    window: int  # ring rows x head_dim
    window_rows: int
    compressed: int
    compressed_rows: int
    indexer: int
    indexer_rows: int
    partial: int  # bf16 always


def v4_state(shape: V4Shape, tokens: int, *, ring: int | None = None,
             reserve_partial: bool = True) -> V4State:
    """The state one request of `tokens` tokens holds. `ring`: window rows a layer keeps
    (default `sliding_window`: the ring the next token is written into). With
    `reserve_partial` the partial block counts the `rate - 1` tokens a pool reserves;
    without, the `tokens % rate` tokens actually buffered (and the overlap half once a
    window closed), as a cache that grows by concatenation holds."""
    d, di = shape.head_dim, shape.index_head_dim
    ring = shape.sliding_window if ring is None else ring
    window = window_rows = compressed = compressed_rows = indexer = indexer_rows = partial = 0
    for kind in shape.layer_types:
        rows = min(tokens, ring)
        window_rows += rows
        window += rows * d
        if kind == SWA:
            continue
        m = shape.rate(kind)
        entries = tokens // m
        compressed_rows += entries
        compressed += entries * d
        buffered = m - 1 if reserve_partial else tokens % m
        if kind == HCA:
            partial += buffered * 2 * d  # kv and gate, head_dim each
            continue
        indexer_rows += entries
        indexer += entries * di
        # CSA projects two series (2 * width) for kv and gate, compressor and indexer
        partial += buffered * 2 * (2 * d + 2 * di)
        if reserve_partial or entries > 0:
            partial += m * 2 * (d + di)  # the last closed window's overlap half: kv and gate
    return V4State(window, window_rows, compressed, compressed_rows, indexer, indexer_rows,
                   partial)


def v4_bytes(state: V4State, kv_dtype: str) -> int:
    """Bytes of a V4 state in "bf16" or "fp8" (1 byte a value and a float32 scale a row)."""
    values = state.window + state.compressed + state.indexer
    rows = state.window_rows + state.compressed_rows + state.indexer_rows
    stored = 2 * values if kv_dtype == "bf16" else values + SCALE_BYTES * rows
    return stored + 2 * state.partial


@dataclass(frozen=True)
class DenseShape:
    """A cache whose every token stores `rows` rows of `width` values a layer (MHA: K and V
    per head; MLA: one latent row)."""

    name: str
    source: str
    layers: int
    rows: int
    width: int

    def bytes_per_token(self, kv_dtype: str) -> int:
        per_row = 2 * self.width if kv_dtype == "bf16" else self.width + SCALE_BYTES
        return self.layers * self.rows * per_row


# the articles' formula: dense MHA over d_model, K and V, every layer (2 x layers x d_model
# x bytes); here for V4-Flash's and V4-Pro's layers and hidden_size
ARTICLES_FLASH = DenseShape("articles' formula, V4-Flash shape (43 x d_model 4096)",
                            "2 x layers x d_model x bytes", 43, 2 * 64, 4096 // 64)
ARTICLES_PRO = DenseShape("articles' formula, V4-Pro shape (61 x d_model 7168)",
                          "2 x layers x d_model x bytes", 61, 2 * 128, 7168 // 128)
# MLA: kv_lora_rank + qk_rope_head_dim per layer (deepseek-ai/DeepSeek-V2, -V2-Lite, -V3
# config.json: num_hidden_layers 60 / 27 / 61, kv_lora_rank 512, qk_rope_head_dim 64)
MLA_V2 = DenseShape("DeepSeek-V2 MLA", "DeepSeek-V2 config.json", 60, 1, 512 + 64)
MLA_V2_LITE = DenseShape("DeepSeek-V2-Lite MLA", "DeepSeek-V2-Lite config.json", 27, 1, 576)
MLA_V3 = DenseShape("DeepSeek-V3 MLA", "DeepSeek-V3 config.json", 61, 1, 512 + 64)
# Llama-2-7B: 32 layers, 32 heads of 128, K and V
LLAMA_7B = DenseShape("Llama-7B MHA", "Llama-2-7b config.json", 32, 2 * 32, 128)
DENSE = (ARTICLES_FLASH, ARTICLES_PRO, MLA_V2, MLA_V2_LITE, MLA_V3, LLAMA_7B)


PAGED = (16, 64)  # page sizes of the paged layout shown (16: `--block-size`'s default)


def sluice_layout(shape: V4Shape, kv_dtype: str = "auto") -> dict:
    """What Sluice's V4 state takes for this shape (bf16 model, its pool in `kv_dtype`:
    "auto" or "fp8"), from the model code's own layout: the bytes a token takes in the
    token layout (its K=V rows and its share of the entry pools), in the paged layout of
    each of `PAGED`, and in the layout of an entry slot in every row (before the entry
    pools), and the bytes of one request row's partial-block rings (a fixed cost a row,
    beside the pool, bf16 either way)."""
    import torch
    from transformers import DeepseekV4Config

    from runtime.worker.models.deepseek_v4_arch import DeepseekV4Arch
    from runtime.worker.models.deepseek_v4_entries import (
        row_bytes_per_token,
        v4_bytes_per_token,
    )
    from runtime.worker.models.deepseek_v4_partial import ring_values

    config = DeepseekV4Config(
        num_hidden_layers=shape.num_hidden_layers, head_dim=shape.head_dim,
        sliding_window=shape.sliding_window, index_head_dim=shape.index_head_dim,
        layer_types=list(shape.layer_types), compress_rates=dict(shape.compress_rates))
    arch = DeepseekV4Arch.from_hf(config)

    def per_token(page_size: int, table: bool) -> int:
        return v4_bytes_per_token(arch, torch.bfloat16, page_size, table, kv_dtype)

    rows = row_bytes_per_token(arch, torch.bfloat16, kv_dtype)  # the K=V rows alone
    return {"kv_row_bytes": rows, "bytes_per_token": per_token(1, True),
            "bytes_per_token_paged": {p: per_token(p, False) for p in PAGED},
            "bytes_per_token_entry_in_rows": per_token(1, False),
            "ring_bytes_per_row": 2 * ring_values(arch)}


def v4_row(shape: V4Shape) -> dict:
    """Every number of a V4 shape: per-part bytes at 2,048 tokens, the asymptotic bytes a
    token, per-request bytes at each context, requests of 2,048 in the budget."""
    out: dict = {"name": shape.name, "source": shape.source,
                 "layers": {t: shape.layer_types.count(t) for t in (SWA, CSA, HCA)}}
    for dt in ("bf16", "fp8"):
        s = v4_state(shape, 2048)
        parts = {"window": v4_bytes(V4State(s.window, s.window_rows, 0, 0, 0, 0, 0), dt),
                 "compressed": v4_bytes(V4State(0, 0, s.compressed, s.compressed_rows,
                                                0, 0, 0), dt),
                 "indexer": v4_bytes(V4State(0, 0, 0, 0, s.indexer, s.indexer_rows, 0), dt),
                 "partial": 2 * s.partial}
        # the slope: bytes one more token adds at long context (entries grow, the ring not)
        far = 1 << 30
        slope = (v4_bytes(v4_state(shape, 2 * far), dt) - v4_bytes(v4_state(shape, far), dt))
        per_request = {c: v4_bytes(v4_state(shape, c), dt) for c in CONTEXTS}
        out[dt] = {"parts_2048": parts, "bytes_per_token_asymptotic": slope / far,
                   "per_request": per_request,
                   "requests_2048_in_budget": BUDGET // per_request[2048]}
    for dt, kv_dtype in (("bf16", "auto"), ("fp8", "fp8")):
        layout = sluice_layout(shape, kv_dtype)
        pool, ring = layout["bytes_per_token"], layout["ring_bytes_per_row"]
        per_request = {c: round(pool * c) + ring for c in CONTEXTS}
        before = round(layout["bytes_per_token_entry_in_rows"] * 2048) + ring
        out[f"sluice_pool_{dt}"] = {**layout, "per_request": per_request,
                                    "requests_2048_in_budget": BUDGET // per_request[2048],
                                    "requests_2048_in_budget_entry_in_rows": BUDGET // before}
    return out


def dense_row(shape: DenseShape) -> dict:
    out: dict = {"name": shape.name, "source": shape.source}
    for dt in ("bf16", "fp8"):
        per_token = shape.bytes_per_token(dt)
        per_request = {c: per_token * c for c in CONTEXTS}
        out[dt] = {"bytes_per_token": per_token, "per_request": per_request,
                   "requests_2048_in_budget": BUDGET // per_request[2048]}
    return out


def git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = f"bench/results/dsv4/{datetime.date.today()}-kv-memory"
    parser.add_argument("--out", default=default, help="output prefix (.json and .md)")
    args = parser.parse_args(argv)
    command = "python -m bench.studies.dsv4_memory"
    rows_v4 = [v4_row(FLASH), v4_row(PRO)]
    rows_dense = [dense_row(s) for s in DENSE]
    res = {"meta": {"command": command, "date": str(datetime.date.today()), "git": git_rev(),
                    "budget_bytes": BUDGET, "contexts": list(CONTEXTS)},
           "v4_shapes": [asdict(FLASH), asdict(PRO)], "v4": rows_v4, "dense": rows_dense}
    write_outputs(args.out, res, report(rows_v4, rows_dense, command, MLA_V3.name))
    for row in rows_v4:
        for dt in ("bf16", "fp8"):
            d = row[f"sluice_pool_{dt}"]
            paged = ", ".join(f"paged {p}: {b:,.0f}"
                              for p, b in d["bytes_per_token_paged"].items())
            print(f"{row['name']} {dt}: Sluice {d['bytes_per_token']:,.0f} bytes/token "
                  f"({paged}; an entry slot in every row: "
                  f"{d['bytes_per_token_entry_in_rows']:,.0f}), partial-block rings "
                  f"{d['ring_bytes_per_row']:,} bytes/request row; compressed design "
                  f"{row[dt]['bytes_per_token_asymptotic']:,.0f} bytes/token")
    print(f"wrote {args.out}.json and {args.out}.md")


if __name__ == "__main__":
    main()
