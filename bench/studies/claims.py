"""The seeds' claims, set against the measured cells of a `bench.studies.compare` results dict.

Pure functions of the results dict: table rows (lists of strings) for the report. Missing
cells (skipped, failed, another profile) give "n/m" rather than an error.
"""

from __future__ import annotations

import math

GiB = 1 << 30
# the seeds' table (A100 80GB): concurrency, our mode, their scheme, GB, tok/s, P99 ms, eff.
SEEDS_TABLE = (
    (50, "contiguous", "original (原始方案)", 45, 1240, 183, 0.58),
    (50, "paged", "PagedAttention", 18, 1350, 165, 0.82),
    (100, "contiguous", "original (原始方案)", "OOM", None, None, None),
    (100, "paged", "PagedAttention", 32, 2180, 217, 0.85),
    (150, "paged", "paged + CPU offload (分页+CPU卸载)", 48, 1950, 352, 0.79),
)
ROW_ORDER = ("contiguous", "paged", "sglang", "token-no-overlap")
HF_PEERS = {"hf_static": 764.0, "hf_batch": (375.0, 504.0)}  # docs/device.md, 64 x 512/128


def fmt(x, spec: str = ".1f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/m"
    return format(x, spec)


def get(res: dict, mode: str, cell: str, *path):
    """results["modes"][mode]["cells"][cell][path...], or None."""
    node = res.get("modes", {}).get(mode, {}).get("cells", {}).get(cell)
    if node is None or "client" not in node:
        return None
    for key in path:
        if not isinstance(node, dict) or node.get(key) is None:
            return None
        node = node[key]
    return node


def sweep_cells(res: dict, mode: str) -> list[tuple[str, int]]:
    """(cell name, the seeds' concurrency it stands for) of a mode's sweep cells."""
    cells = res.get("modes", {}).get(mode, {}).get("cells", {})
    return [(name, rep["cell"].get("seeds_concurrency", 0)) for name, rep in cells.items()
            if rep.get("cell", {}).get("kind") == "sweep"]


def sweep_name(res: dict, seeds_c: int) -> str | None:
    for mode in res.get("modes", {}):
        for name, c in sweep_cells(res, mode):
            if c == seeds_c:
                return name
    return None


def derived(res: dict, mode: str, cell: str | None) -> dict:
    """The report's numbers of one cell ({} when it did not run)."""
    if cell is None or get(res, mode, cell) is None:
        return {}
    rep = res["modes"][mode]["cells"][cell]
    c, s = rep["client"], rep.get("server", {})
    weights = res["meta"]["kv_budget"]["weight_bytes"]
    cut = bool(rep.get("truncated"))
    reserved = s.get("peak_kv_reserved_bytes") or None  # 0: no sample caught the load
    out = {
        "mem_gib": (weights + reserved) / GiB if reserved is not None else None,
        "kv_gib": reserved / GiB if reserved is not None else None,
        "held_gib": (weights + s["kv_held_at_peak_bytes"]) / GiB if reserved else None,
        "nvml_gib": s["peak_gpu_memory_bytes"] / GiB if s.get("peak_gpu_memory_bytes") else None,
        "tps": c["received_output_throughput"] if cut else c["output_throughput"],
        "total_tps": c["total_token_throughput"],
        "itl99": c["itl_ms"]["p99"], "tpot99": c["tpot_ms"]["p99"], "ttft99": c["ttft_ms"]["p99"],
        "ttft_mean": c["ttft_ms"]["mean"],
        "eff": s.get("memory_efficiency_at_peak"), "eff_avg": s.get("memory_efficiency_avg"),
        "frag": s.get("fragmentation_at_peak"), "peak_running": s.get("peak_running"),
        "retractions": s.get("retractions"), "clients": rep["cell"].get("concurrency"),
        "done": f"{c['completed']}/{c['requests']}" + (" cut" if cut else ""),
    }
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in out.items()}


def seeds_rows(res: dict) -> list[list[str]]:
    rows = []
    for seeds_c in (50, 100, 150):
        name = sweep_name(res, seeds_c)
        theirs = {mode: row for c, mode, *row in SEEDS_TABLE if c == seeds_c}
        for mode in [m for m in ROW_ORDER if m in res.get("modes", {})]:
            d = derived(res, mode, name)
            if mode in theirs:
                scheme, gb, tps, p99, eff = theirs[mode]
                seeds = [scheme, gb if isinstance(gb, str) else fmt(gb, ".0f"), fmt(tps, ".0f"),
                         fmt(p99, ".0f"), fmt(eff, ".0%")]
            else:
                seeds = ["(none)", "", "", "", ""]
            rows.append([
                seeds_c, *seeds, f"`{mode}` ({name or 'n/m'})",
                fmt(d.get("mem_gib")), fmt(d.get("nvml_gib")),
                f"{fmt(d.get('tps'), '.0f')} ({fmt(d.get('total_tps'), '.0f')})",
                f"{fmt(d.get('itl99'), '.0f')} / {fmt(d.get('tpot99'), '.0f')} / "
                f"{fmt(d.get('ttft99'), '.0f')}",
                f"{fmt(d.get('eff'), '.1%')} ({fmt(d.get('eff_avg'), '.1%')})",
                f"{fmt(d.get('peak_running'), '.0f')} of {d.get('clients', 'n/m')}",
                fmt(d.get("retractions"), ".0f"), d.get("done", "n/m")])
    return rows


def _ratio(a, b) -> float | None:
    return a / b if a is not None and b else None


def _each(res: dict, mode: str, key: str) -> list[tuple[int, float | None]]:
    return [(c, derived(res, mode, sweep_name(res, c)).get(key)) for c in (50, 100, 150)]


def claims(res: dict) -> list[list[str]]:
    rows = []
    kvb = res["meta"]["kv_budget"]["kv_bytes_per_token"]
    need = 100 * 2048 * kvb / GiB
    rows.append(["KV cache 8 KB/token for a 7B fp16 model (d_model 4096, 32 layers); 100 x "
                 "2048 tokens = 53.7 GB",
                 f"{kvb / 1024:.0f} KiB/token (per layer: K and V of each KV head, or MLA's "
                 f"one latent row); "
                 f"100 x 2048 tokens = {need:.1f} GiB",
                 "refuted: 8 KB counts one head of 32 and K or V only (64x too small); the "
                 "53.7 GB formula counts 1 byte per fp16 value (2x too small)"
                 if kvb == 64 * 8192 else "not this model's shape"])
    slots = res["meta"]["kv_slots"]
    rows.append(["(context) how many ~2048-token sequences the pool holds",
                 f"{slots} slots = {slots // 2048} sequences of 2048", "arithmetic"])
    cont = {k: derived(res, "contiguous", sweep_name(res, k)) for k in (50, 100, 150)}
    paged = {k: derived(res, "paged", sweep_name(res, k)) for k in (50, 100, 150)}
    rows.append(["contiguous: 45 GB at concurrency 50",
                 f"{fmt(cont[50].get('mem_gib'))} GiB (weights + reserved KV)",
                 _near(cont[50].get("mem_gib"), 45)])
    pr, clients = cont[100].get("peak_running"), cont[100].get("clients")
    rows.append(["contiguous: OOM at concurrency 100",
                 f"no OOM: peak {fmt(pr, '.0f')} of {clients} running, the rest waited for a "
                 "region", "n/m" if pr is None else "refuted as an OOM; a capacity limit"
                 if pr < clients else "refuted: all ran at once"])
    for key, label, theirs, spec, unit in (
            ("mem_gib", "memory 18 / 32 GB", (18, 32), ".1f", " GiB"),
            ("tps", "throughput 1350 / 2180 tok/s", (1350, 2180), ".0f", " tok/s"),
            ("itl99", "P99 latency 165 / 217 ms", (165, 217), ".0f", " ms (P99 ITL)"),
            ("eff", "memory efficiency 82 / 85%", (0.82, 0.85), ".1%", "")):
        ours = (paged[50].get(key), paged[100].get(key))
        verdict = _near_points if key == "eff" else _near
        rows.append([f"paged at concurrency 50 / 100: {label}",
                     " / ".join(fmt(v, spec) for v in ours) + unit,
                     verdict(ours[0], theirs[0]) + " / " + verdict(ours[1], theirs[1])])
    rows += _sglang_claims(res)
    rows += _offload_claims(res)
    rows += _other_claims(res, cont)
    return rows


def _offload_claims(res: dict) -> list[list[str]]:
    """"Offloading costs about 10% throughput": each mode with a host tier against the same
    mode without, at the sweep's highest concurrency (n/m when either did not run)."""
    cell = sweep_name(res, 150)
    rows = []
    for tier, plain in (("paged-swap", "paged"), ("sglang-hicache", "sglang")):
        ours, base = derived(res, tier, cell).get("tps"), derived(res, plain, cell).get("tps")
        ratio = _ratio(ours, base)
        verdict = "n/m" if ratio is None else (
            f"confirmed ({ratio - 1:+.1%})" if abs(ratio - 0.9) <= 0.05 else
            f"refuted ({ratio - 1:+.1%})")
        rows.append([f"offload costs ~10% throughput: {tier} vs {plain} at the top concurrency",
                     f"{fmt(ours, '.0f')} vs {fmt(base, '.0f')} tok/s", verdict])
    return rows


def _near(ours, theirs, tol: float = 0.25) -> str:
    if ours is None:
        return "n/m"
    r = ours / theirs
    if abs(r - 1) <= tol:
        return f"confirmed ({r:.2f}x)"
    return f"refuted ({r:.2f}x theirs)"


def _near_points(ours, theirs, tol: float = 0.05) -> str:
    """For ratios: within `tol` (absolute) confirms."""
    if ours is None:
        return "n/m"
    pp = (ours - theirs) * 100
    return f"confirmed ({pp:+.1f} pp)" if abs(pp) <= tol * 100 else f"refuted ({pp:+.1f} pp)"


def _sglang_claims(res: dict) -> list[list[str]]:
    rows = []
    eff = {m: [v for _, v in _each(res, m, "eff_avg")] for m in ("sglang", "paged", "contiguous")}
    mixed = {m: derived(res, m, "mixed").get("eff_avg") for m in eff}

    def mean_ratio(a: str, b: str) -> float | None:
        rs = [x / y for x, y in zip(eff[a] + [mixed[a]], eff[b] + [mixed[b]]) if x and y]
        return sum(rs) / len(rs) if rs else None

    vs_p, vs_c = mean_ratio("sglang", "paged"), mean_ratio("sglang", "contiguous")
    rows.append(["SGLang-style dynamic batching: memory efficiency x2.2",
                 f"x{fmt(vs_p, '.2f')} vs paged, x{fmt(vs_c, '.2f')} vs contiguous (mean of "
                 "the sweep and mixed, live / reserved averaged over each run)",
                 "refuted" if vs_p is not None and vs_p < 1.5 and (vs_c or 0) < 1.5
                 else "confirmed vs contiguous" if vs_c and vs_c >= 1.8 else "n/m"
                 if vs_p is None else "not as stated"])
    names = [(sweep_name(res, c), f"c{c}") for c in (50, 100, 150)] + [("fixed", "fixed"),
                                                                        ("mixed", "mixed")]
    tput = [(label, _ratio(derived(res, "sglang", n).get("tps"),
                           derived(res, "paged", n).get("tps"))) for n, label in names]
    ok = [r for _, r in tput if r is not None]
    rows.append(["... but costs 15-20% throughput (vs paged)",
                 ", ".join(f"{fmt((r - 1) * 100 if r else None, '+.0f')}% {lb}" for lb, r in tput),
                 "n/m" if not ok else "confirmed" if all(0.75 <= r <= 0.9 for r in ok)
                 else "refuted: no loss" if min(ok) >= 0.95 else "mixed"])
    tail = [(label, _diff(derived(res, "sglang", n).get("itl99"),
                          derived(res, "paged", n).get("itl99"))) for n, label in names]
    ok = [d for _, d in tail if d is not None]
    rows.append(["... and adds 30-50 ms of tail latency (P99 ITL, vs paged)",
                 ", ".join(f"{fmt(d, '+.1f')} ms {lb}" for lb, d in tail),
                 "n/m" if not ok else "confirmed" if all(25 <= d <= 60 for d in ok)
                 else "refuted" if max(ok) < 25 else "mixed"])
    return rows


def _diff(a, b):
    return a - b if a is not None and b is not None else None


def _other_claims(res: dict, cont: dict) -> list[list[str]]:
    rows = []
    frag = {r["mode"]: r for r in (res.get("fragmentation") or {}).get("results", [])}
    f32, fdyn = frag.get("paged-32"), frag.get("paged-dynamic")
    rows.append(["fragmentation: fixed block 32 -> 12.3%, dynamic -> 7.8%",
                 f"{fmt(f32 and f32['frag_avg'], '.2%')} / {fmt(fdyn and fdyn['frag_avg'], '.2%')}"
                 " (run average; at peak "
                 f"{fmt(f32 and f32['frag_at_peak'], '.2%')} / "
                 f"{fmt(fdyn and fdyn['frag_at_peak'], '.2%')})",
                 "n/m" if not f32 or not fdyn else "refuted: both far lower, dynamic no better"
                 if f32["frag_avg"] < 0.05 and fdyn["frag_avg"] >= f32["frag_avg"]
                 else "refuted: both far lower" if f32["frag_avg"] < 0.05 else "see table"])
    mix = {m: derived(res, m, "mixed").get("frag") for m in ("contiguous", "paged", "sglang")}
    rows.append(["variable-length requests waste up to 40% of KV memory (fragmentation)",
                 ", ".join(f"{m} {fmt(v, '.1%')}" for m, v in mix.items()) + " (mixed, at peak)",
                 "n/m" if mix["contiguous"] is None else
                 "confirmed for contiguous only" if mix["contiguous"] >= 0.25 and
                 (mix["paged"] or 0) < 0.1 else "see numbers"])
    top = {m: derived(res, m, sweep_name(res, 150)) for m in ("contiguous", "paged", "sglang")}
    peak = {m: d.get("peak_running") for m, d in top.items()}
    clients = next((d["clients"] for d in top.values() if d.get("clients")), "n/m")
    rows.append(["max concurrency without OOM: 80 (original) -> 200 (paged), x2.5",
                 ", ".join(f"{m} {fmt(v, '.0f')}" for m, v in peak.items())
                 + f" running at once of {clients} clients",
                 "n/m" if None in (peak["contiguous"], peak["paged"]) else
                 f"x{peak['paged'] / max(1, peak['contiguous']):.2f} paged vs contiguous"])
    long = {m: derived(res, m, "long") for m in ("contiguous", "paged", "sglang")}
    rows.append(["32k context: 512 GB in the original scheme (batch 64), ~48 GB paged",
                 ", ".join(f"{m} {fmt(d.get('kv_gib'))} GiB KV" for m, d in long.items())
                 + " for the long workload (the same in every mode: the KV of the tokens)",
                 "refuted: paging does not shrink the KV of live tokens"
                 if long["paged"].get("kv_gib") else "n/m"])
    on, off = derived(res, "sglang", "fixed"), derived(res, "token-no-overlap", "fixed")
    idle = {m: get(res, m, "fixed", "gpu_steps", "idle_fraction")
            for m in ("sglang", "token-no-overlap")}
    rows.append(["SGLang-style pipelines compute with memory release (CUDA events)",
                 f"fixed: {fmt(on.get('tps'), '.0f')} tok/s with overlap, "
                 f"{fmt(off.get('tps'), '.0f')} without; GPU idle "
                 f"{fmt(idle['sglang'], '.1%')} vs {fmt(idle['token-no-overlap'], '.1%')}",
                 "measured" if on and off else "n/m"])
    rows.append(_peers_row(res))
    return rows


def _peers_row(res: dict) -> list[str]:
    """HF transformers (bench/offline/driver.py's file if at hand, else docs/device.md) against our
    fixed workload, which has the peers' shape."""
    off = (res.get("offline_peers") or {}).get("results", {})
    tok = {k: (off.get(k) or {}).get("tok_s") for k in ("hf_static", "hf_batch", "sluice_overlap")}
    if tok["hf_static"]:
        src = f"{res['offline_peers']['file']}: static generate {tok['hf_static']:.0f} tok/s, " \
              f"generate_batch {fmt(tok['hf_batch'], '.0f')}, Sluice Engine offline " \
              f"{fmt(tok['sluice_overlap'], '.0f')}"
    else:
        src = "docs/device.md: static generate 764 tok/s, generate_batch 375-504 tok/s"
    hf = tok["hf_static"] or HF_PEERS["hf_static"]
    fixed = {m: derived(res, m, "fixed").get("tps") for m in ("sglang", "paged")}
    return [f"(peers, offline) HF transformers at 64 x 512 in / 128 out; {src}",
            ", ".join(f"{m} {fmt(v, '.0f')} tok/s ({fmt(_ratio(v, hf), '.1f')}x HF static)"
                      for m, v in fixed.items()) + " served over HTTP (fixed workload)",
            "measured"]


def star_rows(res: dict) -> list[list[str]]:
    sweep = [sweep_name(res, c) for c in (50, 100, 150)]

    def mean_tps(mode: str) -> float | None:
        vs = [derived(res, mode, n).get("tps") for n in sweep]
        vs = [v for v in vs if v is not None]
        return sum(vs) / len(vs) if vs else None

    rows = []
    shape = next((f"{c['n']} x {c['input_len']}/{c['output_len']}" for e in
                  res.get("modes", {}).values() for name, rep in e["cells"].items()
                  if name == "fixed" and (c := rep.get("cell", {})).get("n")), "n/m")
    specs = (
        ("fixed-length requests", "★★★★★", "★★★☆☆", f"out tok/s, fixed {shape}",
         lambda m: derived(res, m, "fixed").get("tps"), True, ".0f"),
        ("", "", "", "out tok/s, sweep mean", mean_tps, True, ".0f"),
        ("variable-length streaming", "★★★☆☆", "★★★★★", "out tok/s, mixed",
         lambda m: derived(res, m, "mixed").get("tps"), True, ".0f"),
        ("", "", "", "P99 TPOT ms, mixed", lambda m: derived(res, m, "mixed").get("tpot99"),
         False, ".1f"),
        ("", "", "", "memory efficiency, mixed", lambda m: derived(res, m, "mixed").get("eff_avg"),
         True, ".1%"),
        ("very long context", "★★★★☆", "★★☆☆☆", "mean TTFT ms, long",
         lambda m: derived(res, m, "long").get("ttft_mean"), False, ".0f"),
        ("", "", "", "out tok/s, long", lambda m: derived(res, m, "long").get("tps"), True, ".0f"),
    )
    for scenario, sp, ss, measure, fn, higher, spec in specs:
        p, s = fn("paged"), fn("sglang")
        rows.append([scenario, sp, ss, measure, fmt(p, spec), fmt(s, spec), _better(p, s, higher)])
    return rows


def _better(p, s, higher: bool) -> str:
    if p is None or s is None:
        return "n/m"
    if abs(p - s) <= 0.05 * max(abs(p), abs(s)):
        return "tie (within 5%)"
    return ("paged" if p > s else "sglang") if higher else ("paged" if p < s else "sglang")
