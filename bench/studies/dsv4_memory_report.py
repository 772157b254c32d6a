"""The Markdown of `bench.studies.dsv4_memory`: the answer line and the tables, from the
study's rows (`v4_row`, `dense_row`)."""

from __future__ import annotations

import datetime

GiB = 1 << 30


def size(n: float) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"


def report(rows_v4: list[dict], rows_dense: list[dict], command: str, mla_name: str) -> str:
    """The report: V4 rows by part at 2,048 tokens, every row at each context the rows
    hold, the requests of 2,048 in the budget, and Sluice's pool and entry pools; `mla_name`: the
    dense row the answer line sets beside V4."""
    contexts = list(rows_v4[0]["bf16"]["per_request"])
    flash, pro = rows_v4
    mla = next(r for r in rows_dense if r["name"] == mla_name)
    art = rows_dense[0]
    sluice, fp8 = flash["sluice_pool_bf16"], flash["sluice_pool_fp8"]
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
        f"({mla['bf16']['requests_2048_in_budget']:,}). Sluice's V4 state (K=V rows a token, "
        "entry pools by window, partial-block rings per request row) takes "
        f"{sluice['bytes_per_token']:,.0f} bytes a token in the token layout, "
        f"{sluice['bytes_per_token_entry_in_rows']:,.0f} with an entry slot in every row as "
        f"before, and holds {size(sluice['per_request'][2048])} a 2,048-token request "
        f"({sluice['requests_2048_in_budget']:,} fit, "
        f"{sluice['requests_2048_in_budget_entry_in_rows']:,} before); with `--kv-dtype fp8` "
        f"{fp8['bytes_per_token']:,.0f} bytes a token, {size(fp8['per_request'][2048])} a "
        f"request ({fp8['requests_2048_in_budget']:,} fit). Arithmetic from config fields, "
        "no run.",
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
    paged = list(sluice["bytes_per_token_paged"])
    lines += ["", "## What Sluice holds for V4", "",
              "One pool row per token and layer, its K=V row (`head_dim`; bf16, or under "
              "`--kv-dtype fp8` e4m3 with a float32 scale, as the entries: the fp8 rows "
              "below; the indexer keys and rings stay bf16), and entry "
              "pools beside the pool by window id: a CSA layer's entry and indexer key "
              "(`head_dim + index_head_dim`) a 4 tokens, an HCA layer's entry (`head_dim`) "
              "a 128 tokens; in the token layout the scheduler hands the ids out with the "
              "slots of the closing tokens, in the paged layout they follow the pages "
              "(`ceil(page_size / rate)` ids a page: pages of 16 or 64 give HCA one id a "
              "page, 8 or 2 times its windows). Per request row, the rings of its partial "
              "block (the compressor and indexer inputs of its open windows and CSA overlap "
              "window: a fixed cost a row, counted in each request below). Prefix hits "
              "reuse rows and entries at multiples of every rate and compute the last CSA "
              "window again. Every token's window row stays in the pool: the compressed "
              "design above keeps only the ring. \"Before\": the layout with a slot for "
              "an entry (and indexer key) in every token's row.", "",
              "| model | K=V rows a token | bytes/token, token layout | "
              + " | ".join(f"paged {p}" for p in paged) + " | before | rings a request row "
              "| 2,048 | 32k | 128k | 1M | 2,048-token requests in 100 GiB (before) |",
              "|" + "---|" * (10 + len(paged))]
    for r, dt in ((r, dt) for r in rows_v4 for dt in ("bf16", "fp8")):
        d = r[f"sluice_pool_{dt}"]
        req = [size(d["per_request"][c]) for c in contexts]
        lines.append(f"| {r['name']} {dt} | {d['kv_row_bytes']:,} | {d['bytes_per_token']:,.0f} | "
                     + " | ".join(f"{b:,.0f}" for b in d["bytes_per_token_paged"].values())
                     + f" | {d['bytes_per_token_entry_in_rows']:,.0f} | "
                     f"{size(d['ring_bytes_per_row'])} | " + " | ".join(req)
                     + f" | {d['requests_2048_in_budget']:,} "
                     f"({d['requests_2048_in_budget_entry_in_rows']:,}) |")
    lines += ["", "Contexts past a model's `max_position_embeddings` (Llama-7B 4,096; V2/V3 "
              "128k-160k) are the formula's value, not something the model serves.", "",
              "The reserved partial block is mostly HCA's: 127 buffered tokens of kv and gate "
              "logits a layer. Folding each arriving token into a running per-channel softmax "
              "(max, sum, weighted sum: 3 x head_dim float32) would keep 6 KiB a layer "
              "instead; the table counts the buffered tokens, as transformers' cache holds "
              "them.", ""]
    return "\n".join(lines)
