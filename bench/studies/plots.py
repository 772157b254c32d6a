"""The PNG plots of `bench.studies.compare` (matplotlib, Agg): four files beside `<stem>.json`.

- `<stem>-throughput.png`: output tok/s vs concurrency, one line per mode;
- `<stem>-p99-tpot.png`: P99 TPOT (solid) and P99 ITL (dotted) vs concurrency;
- `<stem>-memory.png`: weights + peak KV reserved (solid) and + KV holding live tokens
  (dotted) vs concurrency, with the budget;
- `<stem>-fragmentation.png`: fragmentation by KV manager and block size (replay).
The seeds' numbers are black stars, where the sweep ran at the seeds' own concurrency.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.studies.claims import SEEDS_TABLE, derived, sweep_cells

GiB = 1 << 30
SEEDS_COL = {"mem_gib": 3, "tps": 4, "tpot99": 5}  # index in a SEEDS_TABLE row


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _sweep_plot(plt, res: dict, path: Path, key: str, ylabel: str, title: str,
                dashed: str | None = None, budget: float | None = None) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs_by_seeds = {}
    for mode in res.get("modes", {}):
        pts = []
        for name, seeds_c in sweep_cells(res, mode):
            d = derived(res, mode, name)
            if d.get(key) is not None:
                pts.append((d["clients"], d[key], d.get(dashed) if dashed else None))
                xs_by_seeds[seeds_c] = d["clients"]
        if not pts:
            continue
        pts.sort()
        (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=mode)
        if dashed and all(p[2] is not None for p in pts):
            ax.plot([p[0] for p in pts], [p[2] for p in pts], linestyle=":",
                    color=line.get_color())
    col = SEEDS_COL.get(key)
    if col is not None:
        for row in SEEDS_TABLE:
            value = row[col]
            if isinstance(value, int | float) and xs_by_seeds.get(row[0]) == row[0]:
                ax.plot(xs_by_seeds[row[0]], value, "k*", markersize=10)
                ax.annotate(f"seeds {row[1]}", (xs_by_seeds[row[0]], value), fontsize=7,
                            xytext=(4, 4), textcoords="offset points")
    if budget:
        ax.axhline(budget, color="grey", linestyle="--", linewidth=1)
        ax.annotate("memory budget", (ax.get_xlim()[0], budget), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    m = res["meta"]
    ax.set(xlabel="concurrent clients", ylabel=ylabel, title=f"{title}\n{m['model']}, "
           f"{m['device']}, {m['date']}")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fragmentation_plot(plt, res: dict, path: Path) -> None:
    frag = (res.get("fragmentation") or {}).get("results", [])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if frag:
        names = [r["mode"] for r in frag]
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [r["frag_at_peak"] * 100 for r in frag], 0.4,
               label="at peak reserved")
        ax.bar([x + 0.2 for x in xs], [r["frag_avg"] * 100 for r in frag], 0.4,
               label="run average")
        for name, seeds in (("paged-32", 12.3), ("paged-dynamic", 7.8)):
            if name in names:
                ax.plot(names.index(name), seeds, "k*", markersize=10)
                ax.annotate(f"seeds {seeds}%", (names.index(name), seeds), fontsize=7,
                            xytext=(4, 4), textcoords="offset points")
        ax.set_xticks(list(xs), names, rotation=30, ha="right", fontsize=8)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "bench.studies.fragmentation did not run", ha="center",
                transform=ax.transAxes)
    ax.set(ylabel="internal fragmentation (%)", title="KV fragmentation by manager and block "
           "size (bench.studies.fragmentation replay, seeds' mixed workload)")
    ax.title.set_fontsize(9)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plots(prefix: Path, res: dict) -> list[Path]:
    plt = _plt()
    stem = prefix.name
    paths = [prefix.with_name(f"{stem}-{n}.png") for n in
             ("throughput", "p99-tpot", "memory", "fragmentation")]
    _sweep_plot(plt, res, paths[0], "tps", "output tokens/s", "Throughput vs concurrency "
                "(~2048-token sequences)")
    _sweep_plot(plt, res, paths[1], "tpot99", "ms", "P99 TPOT (solid) and P99 ITL (dotted) "
                "vs concurrency", dashed="itl99")
    kv = res["meta"]["kv_budget"]
    budget = kv["budget_bytes"] / GiB if kv.get("used") == "--gpu-memory-budget" else None
    _sweep_plot(plt, res, paths[2], "mem_gib", "GiB", "Weights + peak KV reserved (solid), "
                "+ KV holding live tokens (dotted)", dashed="held_gib", budget=budget)
    _fragmentation_plot(plt, res, paths[3])
    return paths


if __name__ == "__main__":
    src = Path(sys.argv[1])
    print(write_plots(src.with_suffix(""), json.loads(src.read_text())))
