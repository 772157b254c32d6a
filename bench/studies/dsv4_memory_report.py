"""The Markdown of `bench.studies.dsv4_memory`: the answer line and the tables, from the
study's rows (`v4_row`, `dense_row`)."""

from __future__ import annotations

import datetime

GiB = 1 << 30
SHORT = {"sliding_attention": "SWA", "compressed_sparse_attention": "CSA",
         "heavily_compressed_attention": "HCA"}


def size(n: float) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"


def report(rows_v4: list[dict], rows_dense: list[dict], command: str, mla_name: str) -> str:
    """The report: V4 rows by part at 2,048 tokens, every row at each context the rows
    hold, the requests of 2,048 in the budget, and Sluice's pool today; `mla_name`: the
    dense row the answer line sets beside V4."""
    contexts = list(rows_v4[0]["bf16"]["per_request"])
    flash, pro = rows_v4
    mla = next(r for r in rows_dense if r["name"] == mla_name)
    art = rows_dense[0]
    ratio = art["bf16"]["per_request"][2048] / flash["bf16"]["per_request"][2048]
    lines = [
        f"# DeepSeek-V4 KV memory from its configs ({datetime.date.today()})", "",
        "Question: How many bytes of KV state does a DeepSeek-V4-Flash / -Pro request hold "
        "(window ring + compressed entries + indexer keys + partial block, bf16 and fp8), "
        "against the articles' dense formula, V2/V3 MLA and Llama-7B MHA, and how many "
        "2,048-token requests fit in 100 GiB?",
        f"Answer: A 2,048-token V4-Flash request holds {size(flash['bf16']['per_request'][2048])}"
        f" in bf16 ({flash['bf16']['requests_2048_in_budget']:,} fit in 100 GiB), "
        f"{ratio:,.0f}x less than the articles' dense formula on its shape "
        f"({art['bf16']['requests_2048_in_budget']:,} fit); V4-Pro "
        f"{size(pro['bf16']['per_request'][2048])} ({pro['bf16']['requests_2048_in_budget']:,}"
        f"); V3 MLA {size(mla['bf16']['per_request'][2048])} "
        f"({mla['bf16']['requests_2048_in_budget']:,}). Sluice's V4 state today (per-token "
        "pool rows, partial-block rings per request row) holds "
        f"{size(flash['sluice_pool_bf16']['per_request'][2048])} "
        f"({flash['sluice_pool_bf16']['requests_2048_in_budget']:,} fit). Arithmetic from "
        "config fields, no run.",
        "", f"`{command}`", "",
        "Numbers from the checkpoints' config.json fields (written into "
        "`bench/studies/dsv4_memory.py` as constants). V4 layers: Flash "
        f"{flash['layers']}, Pro {pro['layers']}. The window ring keeps `sliding_window` = 128 "
        "rows a layer; the partial block is reserved at `compress_rate - 1` tokens a layer "
        "(kv and gate logits, bf16, plus the CSA overlap half). fp8: 1 byte a value plus a "
        "float32 scale a row. KiB/MiB/GiB are powers of 2.", "",
        "## A 2,048-token request, by part", "",
        "| model | dtype | window ring | compressed entries | indexer keys | partial block "
        "| total |", "|---|---|---|---|---|---|---|",
    ]
    for r in rows_v4:
        for dt in ("bf16", "fp8"):
            p = r[dt]["parts_2048"]
            lines.append(f"| {r['name']} | {dt} | {size(p['window'])} | {size(p['compressed'])}"
                         f" | {size(p['indexer'])} | {size(p['partial'])} | "
                         f"{size(r[dt]['per_request'][2048])} |")
    lines += ["", "## Per token and per request, and requests of 2,048 in 100 GiB", "",
              "V4's bytes per token are the slope at long context (entries and indexer keys "
              "grow; the ring and the partial block do not); its per-request bytes include "
              "the ring and the partial block. Dense caches grow linearly.", "",
              "| model | dtype | bytes/token | 2,048 | 32k | 128k | 1M | 2,048-token requests "
              "in 100 GiB |", "|---|---|---|---|---|---|---|---|"]
    for r in rows_v4 + rows_dense:
        for dt in ("bf16", "fp8"):
            d = r[dt]
            per_token = d.get("bytes_per_token", d.get("bytes_per_token_asymptotic"))
            req = [size(d["per_request"][c]) for c in contexts]
            lines.append(f"| {r['name']} | {dt} | {per_token:,.0f} | " + " | ".join(req)
                         + f" | {d['requests_2048_in_budget']:,} |")
    lines += ["", "## What Sluice holds for V4 today", "",
              "One bf16 pool row per token and layer, each as wide as its layer type needs "
              "(sliding window: the K=V row, `head_dim`; HCA: and a slot for the entry of a "
              "window the token closes, `2 x head_dim`; CSA: and the indexer key's, `2 x "
              "head_dim + index_head_dim`), and per request row the rings of its partial "
              "block (the compressor and indexer inputs of its open windows and CSA overlap "
              "window: a fixed cost a row, counted in each request below). Prefix hits reuse "
              "rows at multiples of every rate and compute the last CSA window again. Every "
              "token's window row and entry slot stay in the pool: the compressed design "
              "above is what a pool of per-layer-type parts would hold.", "",
              "| model | row bytes a token, by layer type | bytes/token | rings a "
              "request row | 2,048 | 32k | 128k | 1M | 2,048-token requests in 100 GiB |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows_v4:
        d = r["sluice_pool_bf16"]
        types = ", ".join(f"{SHORT[t]} {b:,}" for t, b in d["row_bytes_by_layer_type"].items())
        req = [size(d["per_request"][c]) for c in contexts]
        lines.append(f"| {r['name']} | {types} | {d['bytes_per_token']:,} | "
                     f"{size(d['ring_bytes_per_row'])} | " + " | ".join(req)
                     + f" | {d['requests_2048_in_budget']:,} |")
    lines += ["", "Contexts past a model's `max_position_embeddings` (Llama-7B 4,096; V2/V3 "
              "128k-160k) are the formula's value, not something the model serves.", "",
              "The reserved partial block is mostly HCA's: 127 buffered tokens of kv and gate "
              "logits a layer. Folding each arriving token into a running per-channel softmax "
              "(max, sum, weighted sum: 3 x head_dim float32) would keep 6 KiB a layer "
              "instead; the table counts the buffered tokens, as transformers' cache holds "
              "them.", ""]
    return "\n".join(lines)
