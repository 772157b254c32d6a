"""The peers table: per row, each engine's median and range over the repeats, and the ratio
Sluice / peer; start-up to ready; each engine's defaults; a plot of the ratios. Also merges
the results of several calls (each one group or a few) into one report:

    python -m bench.peers.report A.json B.json ... --out bench/results/peers/<name>
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.outputs import write_outputs
from bench.serving.metrics import finite

LATENCY = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99")
TARGET = 1.1  # the ratio every row should reach
LABELS = {"out_tok_s": "output tok/s", "total_tok_s": "total tok/s (in + out)"}
NOT_RUN = "not run"


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def table_rows(res: dict) -> list[dict]:
    """One entry per (group, row): each engine's metrics over its runs, and the ratios."""
    peer = res["peer"]["name"]
    rows = []
    for gname, g in res["groups"].items():
        for row in g["rows"]:
            entry = {"group": gname, "row": row, "kind": g["kind"], "headline": g["headline"],
                     "metrics": {}, "errors": {}}
            for engine, out in g["engines"].items():
                runs = out.get("rows", {}).get(row, {}).get("runs", [])
                err = out.get("error") or out.get("rows", {}).get(row, {}).get("error")
                if err:
                    entry["errors"][engine] = err
                keys = sorted({k for r in runs for k, v in r.items()
                               if isinstance(v, int | float) and not isinstance(v, bool)})
                entry["metrics"][engine] = {k: spread([r[k] for r in runs if k in r])
                                            for k in keys}
                if runs and "complete" in runs[0]:
                    entry["metrics"][engine]["all_complete"] = all(r["complete"] for r in runs)
            mine, theirs = entry["metrics"].get("sluice", {}), entry["metrics"].get(peer, {})
            entry["ratio"] = {k: mine[k]["median"] / theirs[k]["median"] for k in mine
                              if k in theirs and isinstance(theirs[k], dict)
                              and theirs[k]["median"]}
            rows.append(entry)
    return rows


def _cell(m: dict | None, key: str, fmt: str = ",.1f") -> str:
    if not m or key not in m:
        return "-"
    s = m[key]
    if s["n"] == 1:
        return f"{s['median']:{fmt}}"
    return f"{s['median']:{fmt}} [{s['min']:{fmt}}-{s['max']:{fmt}}]"


def answer(res: dict, rows: list[dict]) -> str:
    peer = res["peer"]
    ranked = sorted((r["ratio"][r["headline"]], r["row"]) for r in rows
                    if r["headline"] in r["ratio"])
    if not ranked:
        why = peer["status"] if peer["status"] != "run" else "no row finished on both"
        return f"{peer['name']} {why}; " + "; ".join(
            f"{r['row']}: Sluice {_cell(r['metrics'].get('sluice'), r['headline'])}"
            for r in rows)
    low = [f"{row} {x:.2f}" for x, row in ranked if x < TARGET]
    return (f"Sluice/{peer['name']} from {ranked[0][0]:.2f} ({ranked[0][1]}) to "
            f"{ranked[-1][0]:.2f} ({ranked[-1][1]}) over {len(ranked)} rows; "
            + (f"below {TARGET}: " + ", ".join(low) if low else f"every row >= {TARGET}"))


def markdown(res: dict, rows: list[dict]) -> str:
    meta, peer = res["meta"], res["peer"]
    pn = peer["name"] if peer["status"] == "run" else f"{peer['name']} ({NOT_RUN})"
    version = f" {peer['version']}" if peer.get("version") else ""
    head = [f"# Sluice and {peer['name']}{version}, one after the other on the same "
            f"workloads ({meta['device']}, {meta['date']})", "",
            "Question: How does Sluice compare with "
            f"{peer['name']} on the same workloads, same GPU, same dtype, in one call?",
            f"Answer: {answer(res, rows)}", "",
            f"Command: `{meta['command']}` at git {meta['git']}; dtype {meta['dtype']}; "
            f"{meta['repeats']} repeats a row: median [min-max]; served rows driven by "
            f"{meta['client']}. Start-up is to ready (offline: import + engine built; "
            "served: process start to the first 200 from /health).", ""]
    if peer["status"] != "run":
        head += [f"{peer['name']}: {peer['status']}.", ""]
    table = [f"| workload | metric | {pn} | Sluice | Sluice/{peer['name']} |",
             "|---|---|---|---|---|"]
    for r in rows:
        k = r["headline"]
        ratio = f"{r['ratio'][k]:.2f}" if k in r["ratio"] else NOT_RUN if \
            peer["status"] != "run" else "-"
        table.append(f"| {r['row']} | {LABELS.get(k, k)} | "
                     f"{_cell(r['metrics'].get(peer['name']), k)} | "
                     f"{_cell(r['metrics'].get('sluice'), k)} | {ratio} |")
    served = [r for r in rows if r["kind"] != "offline"]
    lat = []
    if served:
        lat = ["", f"Served latency, ms: {pn} / Sluice (Sluice/{peer['name']}), medians over "
               "the repeats (the JSON has the ranges); lower is better", "",
               "| workload | " + " | ".join(k.replace("_", " ").upper() for k in LATENCY)
               + " | prefix hit rate |", "|---" * (len(LATENCY) + 2) + "|"]
        for r in served:
            cells = [_pair(r, peer["name"], k, ",.1f") for k in LATENCY]
            lat.append(f"| {r['row']} | " + " | ".join(cells) + " | "
                       f"{_pair(r, peer['name'], 'prefix_hit_rate', '.2f')} |")
    start = ["", "Start-up to ready, s", "", f"| group | {pn} | Sluice |", "|---|---|---|"]
    for gname, g in res["groups"].items():
        start.append(f"| {gname} | " + " | ".join(_startup(g["engines"].get(e)) for e in
                                                  (peer["name"], "sluice")) + " |")
    errors = [f"- {r['row']}, {e}: {msg}" for r in rows for e, msg in r["errors"].items()]
    return "\n".join([*head, *table, *lat, *start, "", "Defaults", "", *_defaults(res),
                      *(["", "Errors", "", *errors] if errors else []), "",
                      *[f"- {n}" for n in res.get("notes", [])], ""])


def _pair(row: dict, peer: str, key: str, fmt: str) -> str:
    """`peer / sluice (ratio)` medians of `key`, '-' where one is missing."""
    vals = [row["metrics"].get(e, {}).get(key) for e in (peer, "sluice")]
    text = " / ".join("-" if v is None else f"{v['median']:{fmt}}" for v in vals)
    return text + (f" ({row['ratio'][key]:.2f})" if key in row["ratio"] else "")


def _startup(out: dict | None) -> str:
    if not out or "start_s" not in out:
        return "-"
    extra = f" (import {out['import_s']:.1f} of it)" if "import_s" in out else ""
    return f"{out['start_s']:.1f}{extra}"  # an offline engine's start_s includes its import


def _defaults(res: dict) -> list[str]:
    lines = []
    for gname, g in res["groups"].items():
        for engine, out in g["engines"].items():
            shown = {**(out.get("defaults") or {}), **(out.get("options") or {})}
            version = f" {out['version']}" if out.get("version") else ""
            text = ", ".join(f"{k}={v}" for k, v in shown.items()) or "its defaults"
            lines.append(f"- {gname}, {engine}{version}: {text}")
    return lines


def plot(rows: list[dict], peer: str, path: Path) -> bool:
    """Bars of the headline ratio per row (lines at 1 and the target); False when nothing
    to plot or matplotlib is missing."""
    ratios = [(r["row"], r["ratio"][r["headline"]]) for r in rows if r["headline"] in r["ratio"]]
    if not ratios:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(ratios) + 1.2))
    ax.barh([n for n, _ in ratios][::-1], [x for _, x in ratios][::-1], color="tab:blue")
    ax.axvline(1.0, color="black", lw=1)
    ax.axvline(TARGET, color="tab:red", lw=1, ls="--", label=f"target {TARGET}")
    ax.set_xlabel(f"Sluice / {peer} (headline metric, median of repeats)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(res: dict, out: str) -> None:
    """`<out>.json`, `<out>.md` and, when there are ratios, `<out>.png`."""
    rows = table_rows(res)
    res = {**res, "table": rows}
    write_outputs(out, finite(res), markdown(res, rows))
    if plot(rows, res["peer"]["name"], Path(f"{out}.png")):
        print(f"wrote {out}.png")
    print(f"wrote {out}.md and {out}.json")


def merge(results: list[dict]) -> dict:
    """Several results as one: every group's rows from all of them (a later run of the same
    row replaces an earlier one), the metadata of the last, every command."""
    merged = {**results[-1], "groups": {}}
    for r in results:
        for name, g in r["groups"].items():
            if name not in merged["groups"]:
                merged["groups"][name] = json.loads(json.dumps(g))
                continue
            have = merged["groups"][name]
            have["rows"] += [row for row in g["rows"] if row not in have["rows"]]
            for engine, out in g["engines"].items():
                rows = {**have["engines"].get(engine, {}).get("rows", {}), **out.get("rows", {})}
                have["engines"][engine] = {**out, "rows": rows}
    merged["meta"] = {**results[-1]["meta"], "command": "; ".join(
        r["meta"]["command"] for r in results)}
    return merged


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="merge bench.peers results into one report")
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    write_report(merge([json.loads(p.read_text()) for p in args.results]), args.out)


if __name__ == "__main__":
    main()
