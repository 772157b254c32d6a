"""The host-path benchmark: where the CPU time of a step goes, and what it costs end to end.

    python -m bench.host [--part scheduler,worker,api,output,e2e] [--out PREFIX]
                         [--device auto|cpu]
                         [--e2e-models dummy:tiny,dummy:llama3-1b,dummy:llama3-8b] [...]

Parts (`--help` lists each part's options):
- `scheduler` (`bench/host/scheduler.py`, CPU): scheduler ms per decode step;
- `worker` (`bench/host/worker.py`, CUDA): the worker's host time per decode step and its split;
- `api` (`bench/host/api.py`, CPU): the api process's CPU per streamed token;
- `output` (`bench/host/output.py`, CPU): the offline Engine's api-side CPU per output
  token, optionally against a baseline runtime in the same call;
- `e2e` (`bench/host/e2e.py`, CUDA): offline vs served tok/s and the GPU's busy fraction,
  token vs paged KV.
By default every part this machine can run: without CUDA, `worker` and `e2e` are skipped
unless `--device cpu` asks for a (slow, small-size) smoke run of them on the CPU.
Writes PREFIX.json and PREFIX.md after every row (so a run cut short keeps what it did) and
PREFIX.png at the end; default PREFIX: bench/results/<date>-host-<device>.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import re
import sys
import time
from pathlib import Path

from bench.host.e2e import add_args as add_e2e_args
from bench.serving.metrics import finite
from bench.serving.server_proc import ROOT, device_name, git_rev

PARTS = ("scheduler", "worker", "api", "output", "e2e")
GPU_PARTS = ("worker", "e2e")
OTHERS = {"scheduler": "bench.host.scheduler", "api": "bench.host.api",
          "output": "bench.host.output"}


def optional_module(name: str):
    """`name` imported, or None while it does not exist yet (another part's file)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", default=None, help=f"comma-separated subset of {','.join(PARTS)}")
    ap.add_argument("--out", default=None, help="output path prefix")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="worker and e2e parts; cpu: a smoke run on this machine")
    ap.add_argument("--dtype", default=None, help="default: float16 on CUDA, else auto")
    add_e2e_args(ap)
    for part, name in OTHERS.items():
        module = optional_module(name)
        if module is not None and hasattr(module, "add_args"):
            try:
                module.add_args(ap.add_argument_group(f"{part} part"))
            except argparse.ArgumentError as exc:
                print(f"warning: {name}.add_args: {exc}", file=sys.stderr)
    return ap


def run_other(part: str, args) -> dict:
    """The scheduler or api part, through its module's `run_<part>_bench`."""
    module = optional_module(OTHERS[part])
    if module is None:
        return {"skipped": f"{OTHERS[part]} does not exist yet"}
    fn = getattr(module, f"run_{part}_bench")
    return fn(args) if hasattr(module, "add_args") else fn()


def other_markdown(part: str, res: dict) -> list[str]:
    """A part's own Markdown if its module renders one, else its rows as a table."""
    module = optional_module(OTHERS[part])
    if module is not None and hasattr(module, "to_markdown"):
        return module.to_markdown(res).splitlines()
    rows = res.get("rows") or []
    keys = [k for k in (rows[0] if rows else {}) if not isinstance(rows[0][k], dict | list)]
    if not keys:
        return ["```json", json.dumps(finite(res), indent=1)[:4000], "```"]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in rows]
    if isinstance(res.get("profile"), str):
        lines += ["", "```", res["profile"].strip(), "```"]
    return lines


class Report:
    """The meta data and each part's result; rewrites PREFIX.json and PREFIX.md on update."""

    def __init__(self, out: Path, args) -> None:
        self.out, self.args = out, args
        self.meta = {"command": " ".join(["python -m bench.host", *sys.argv[1:]]),
                     "device": device_name(), "date": datetime.date.today().isoformat(),
                     "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "git": git_rev(),
                     "args": dict(vars(args))}
        self.parts: dict[str, dict] = {}

    def update(self, part: str, result: dict, line: str | None = None) -> None:
        if line:
            print(line, flush=True)
        self.parts[part] = result
        self.out.parent.mkdir(parents=True, exist_ok=True)
        data = {"meta": self.meta, "parts": self.parts}
        self.out.with_name(self.out.name + ".json").write_text(
            json.dumps(finite(data), indent=2, default=str) + "\n")
        self.out.with_name(self.out.name + ".md").write_text("\n".join(self.markdown()) + "\n")

    def markdown(self) -> list[str]:
        from bench.host import e2e as host_e2e
        from bench.host import worker as host_worker

        m = self.meta
        lines = [f"# Host path ({m['device']}, {m['date']})", "", f"Command: `{m['command']}`  ",
                 f"Device: {m['device']}; git {m['git']}; dtype {self.args.dtype}."]
        for part in PARTS:
            res = self.parts.get(part)
            if res is None:
                continue
            lines += ["", f"## {part}", ""]
            if "skipped" in res or "error" in res:
                lines.append(res.get("skipped") or f"error: {res['error']}")
            elif part == "worker":
                lines += host_worker.markdown(res)
            elif part == "e2e":
                lines += host_e2e.markdown(res, self.args)
            else:
                lines += other_markdown(part, res)
        return lines

    def plot(self) -> Path | None:
        """Served/offline and busy fractions per model (e2e rows), as one PNG."""
        rows = [r for r in self.parts.get("e2e", {}).get("rows", [])
                if r.get("offline", {}).get("tok_s")]
        if not rows:
            return None
        try:
            import matplotlib
        except ImportError:
            print("no matplotlib: no plot", flush=True)
            return None

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        series = {"served / offline tok/s": [r.get("served_over_offline") or 0 for r in rows],
                  "GPU busy, offline": [r["offline"]["steps"].get("busy") or 0 for r in rows],
                  "GPU busy, served": [r.get("served", {}).get("steps", {}).get("busy") or 0
                                       for r in rows]}
        fig, ax = plt.subplots(figsize=(7, 3.5))
        width = 0.8 / len(series)
        for i, (label, values) in enumerate(series.items()):
            ax.bar([x + i * width for x in range(len(rows))], values, width, label=label)
        ax.set_xticks([x + width for x in range(len(rows))], [r["model"] for r in rows])
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.set_ylabel("fraction")
        ax.set_title(f"Host path end to end, {self.meta['device']}", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = self.out.with_name(self.out.name + ".png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


def default_out(device: str) -> Path:
    """bench/results/<date>-host-<device>: the GPU's model ("h200"), else "cpu"."""
    if device.startswith("cpu"):
        slug = "cpu"
    else:
        slug = re.sub(r"[^a-z0-9]+", "-", device.split(",")[0].lower().removeprefix("nvidia "))
    return ROOT / "bench" / "results" / f"{datetime.date.today().isoformat()}-host-{slug}"


def main(argv: list[str] | None = None) -> Report:
    args = build_parser().parse_args(argv)
    import torch

    cuda = torch.cuda.is_available() and args.device != "cpu"
    if args.dtype is None:
        args.dtype = "float16" if cuda else "auto"
    if args.torch_threads is None:
        args.torch_threads = 0 if cuda else 1
    parts = args.part.split(",") if args.part else list(PARTS)
    if not set(parts) <= set(PARTS):
        sys.exit(f"--part takes a subset of {','.join(PARTS)}, got {args.part}")
    report = Report(Path(args.out) if args.out else default_out(device_name()), args)
    args.deadline = time.monotonic() + args.budget_s  # the GPU parts start nothing after it
    for part in (p for p in PARTS if p in parts):
        if part in GPU_PARTS and not cuda and args.device != "cpu":
            report.update(part, {"skipped": f"{part}: needs CUDA (or --device cpu for a smoke "
                                            "run on this machine)"}, f"skipping {part}: no CUDA")
            continue
        print(f"=== {part}", flush=True)
        t0 = time.monotonic()
        try:
            if part == "worker":
                from bench.host.worker import run_worker_bench

                result = run_worker_bench(args, report.update)
            elif part == "e2e":
                from bench.host.e2e import run_e2e_bench

                result = run_e2e_bench(args, report.update)
            else:
                result = run_other(part, args)
        except Exception as exc:  # one part failing leaves the others' results
            result = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        report.update(part, result, f"=== {part}: {time.monotonic() - t0:.1f} s")
    png = report.plot()
    print("\n".join(report.markdown()))
    print(f"wrote {report.out}.json, .md" + (f", {png.name}" if png else ""))
    return report


if __name__ == "__main__":
    main()
