"""The api side of the offline `Engine`: CPU per output token, without a GPU.

    python -m bench.host --part output [--output-cases dummy:tiny,smollm2,smollm2+ids]
        [--output-requests 512] [--output-tokens 256] [--output-repeats 3]
        [--output-baseline REV_OR_DIR]

What `Engine.generate` does with a decode-bound batch, with the scheduler replaced by a
stand-in (a child process) that, once every request arrived, sends what the real one sends
at full speed: one `BatchOut` per step, each request one token per step (its first with
the header, its last with LENGTH; the rest in the BatchOut columns, or as ReqOuts for a
runtime without them). The `TokenizerManager` runs on a `LoopThread`, as in an Engine, and
the whole outputs (`stream=False`) are joined as `Engine.generate` joins them.

Per case, prompts of token ids (greedy, ignore_eos, as `bench.host --part e2e` sends):
`dummy:tiny` has no tokenizer (ids only), `smollm2` detokenizes every token, `smollm2+ids`
asks for ids only (`text=False`; a runtime without that option makes the text). Measured
from the first BatchOut to the last output: this process's CPU time (all threads, zmq's
I/O thread included) per output token, the wall time, and the full (generation 2)
garbage collections in that time. Each run is a fresh process.

`--output-baseline` also runs every case against another runtime: a git revision (its
`runtime/` is exported to a temporary folder) or a folder holding a `runtime/` package;
the bench code stays this tree's. Baseline and current runs alternate in the same call.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.host.output_feed import PROMPT_LEN, output_ids, stand_in

ROOT = Path(__file__).resolve().parents[2]


def add_args(p) -> None:
    p.add_argument("--output-cases", default="dummy:tiny,smollm2,smollm2+ids",
                   help="comma-separated models; MODEL+ids: token ids only (text=False)")
    p.add_argument("--output-requests", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=256, help="per request")
    p.add_argument("--output-repeats", type=int, default=3)
    p.add_argument("--output-baseline", default="",
                   help="a git revision or a folder with runtime/: run it too, alternating")


class _FullCollections:
    """Counts and times the generation 2 garbage collections while installed."""

    def __init__(self) -> None:
        self.count, self.seconds, self._t0 = 0, 0.0, 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._t0


def measure(case: str, requests: int, tokens: int, profile: bool = False) -> dict:
    """One run in this process: CPU us per output token of the offline api side."""
    import inspect

    from runtime.api.loop_thread import LoopThread
    from runtime.api.tokenizer_manager import TokenizerManager
    from runtime.config.server import ServerConfig
    from runtime.model_config import resolve_model

    try:
        from runtime.wire.request_output import RequestOutput
        from runtime.wire.sampling import SamplingParams
    except ModuleNotFoundError:  # a baseline from before runtime/wire
        from runtime.messages import RequestOutput, SamplingParams

    model, _, mode = case.partition("+")
    ids = output_ids(model, tokens)
    cfg = ServerConfig(model=model, max_running=requests, max_queue=requests,
                       log_level="warning")
    rx, tx = mp.get_context("spawn").Pipe(duplex=False)
    proc = mp.get_context("spawn").Process(target=stand_in, daemon=True, args=(
        cfg.ipc("sched_in"), cfg.ipc("api_in"), requests, ids, tx))
    proc.start()
    loop = LoopThread("bench-output")
    tm = TokenizerManager(cfg, resolve_model(model))
    ids_only = mode == "ids" and "text" in inspect.signature(tm.generate).parameters
    kw = {"text": False} if ids_only else {}
    gcs, span = _FullCollections(), {}
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()

    def on_first_batch(batch) -> None:  # every request is in: output work starts
        del tm._dispatch
        gc.callbacks.append(gcs)
        span.update(cpu0=time.process_time(), wall0=time.perf_counter())
        if prof is not None:
            prof.enable()
        tm._dispatch(batch)

    async def whole(prompt: list[int], params: SamplingParams) -> RequestOutput:
        gen = tm.generate(prompt, params, stream=False, **kw)
        return RequestOutput.join([o async for o in gen])

    async def generate_all() -> list[RequestOutput]:
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        prompts = [[3 + (i * 7 + j) % 1000 for j in range(PROMPT_LEN)] for i in range(requests)]
        outs = list(await asyncio.gather(*(whole(p, params) for p in prompts)))
        span.update(cpu=time.process_time() - span["cpu0"],
                    wall=time.perf_counter() - span["wall0"])
        gc.callbacks.remove(gcs)
        if prof is not None:  # on the loop thread, where it was enabled
            prof.disable()
        return outs

    try:
        loop.run(tm.start())
        loop.run(tm.wait_limits(60))
        tm._dispatch = on_first_batch
        outs = loop.run(generate_all())
        columns = rx.recv()
    finally:
        loop.run(tm.close())
        loop.close()
        proc.join(10)
        proc.terminate()
        shutil.rmtree(cfg.ipc_dir, ignore_errors=True)
    text = tm.tokenizer.decode(ids, skip_special_tokens=True) if tm.tokenizer and not ids_only \
        else ""
    n = requests * tokens
    res = {"case": case, "requests": requests, "tokens": n, "columns": columns,
           "text": bool(text),
           "ok": sum(o.token_ids == ids and o.text == text for o in outs),
           "cpu_us_per_token": span["cpu"] / n * 1e6, "wall_s": span["wall"],
           "gc_full": gcs.count,
           "gc_full_s": gcs.seconds}
    if prof is not None:
        res["profile"] = _top(prof, n)
    return res


def _top(prof, n: int, k: int = 12) -> list[tuple[str, float]]:
    """The `k` functions with the most own time, in us per output token."""
    import pstats

    stats = pstats.Stats(prof).stats
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:k]
    return [(f"{Path(f).name}:{line}({fn})", round(v[2] / n * 1e6, 3))
            for (f, line, fn), v in rows]


def baseline_dir(spec: str, tmp: Path) -> Path:
    """A folder whose `runtime/` is the baseline: `spec` itself, or `spec`'s git export of
    `runtime/` and the `kernels/` it imports."""
    if (Path(spec) / "runtime").is_dir():
        return Path(spec).resolve()
    archive = subprocess.run(["git", "archive", spec, "runtime", "kernels"], cwd=ROOT,
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    return tmp


def run_case(case: str, args, code: Path | None, profile: bool = False) -> dict:
    """`measure` in a fresh process, against the runtime in `code` (None: this tree's)."""
    path = [str(code)] if code is not None else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [*path, str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    cmd = [sys.executable, "-m", "bench.host.output", "--case", case,
           "--output-requests", str(args.output_requests),
           "--output-tokens", str(args.output_tokens)] + (["--profile"] if profile else [])
    # the folder of `-m` comes first on sys.path: run from the runtime's own folder
    done = subprocess.run(cmd, cwd=code or ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-500:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _summary(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[0]["error"] if runs else "no runs"}
    us = [r["cpu_us_per_token"] for r in ok]
    return {"cpu_us_per_token": statistics.median(us), "min": min(us), "max": max(us),
            "wall_s": statistics.median(r["wall_s"] for r in ok),
            "gc_full": statistics.median(r["gc_full"] for r in ok),
            "gc_full_s": statistics.median(r["gc_full_s"] for r in ok),
            "tokens": ok[0]["tokens"], "ok_requests": min(r["ok"] for r in ok),
            "requests": ok[0]["requests"], "columns": ok[0]["columns"], "text": ok[0]["text"],
            "runs": runs}


def run_output_bench(args) -> dict:
    """Per case: `--output-repeats` runs of this tree's runtime (and of the baseline's,
    alternating), then one profiled run of this tree's."""
    result: dict = {"baseline": args.output_baseline or None, "rows": []}
    with tempfile.TemporaryDirectory(prefix="sluice-baseline-") as tmp:
        codes = {"current": None}
        if args.output_baseline:
            codes = {"baseline": baseline_dir(args.output_baseline, Path(tmp)), **codes}
        for case in args.output_cases.split(","):
            runs: dict[str, list[dict]] = {name: [] for name in codes}
            for _ in range(args.output_repeats):
                for name, code in codes.items():
                    runs[name].append(run_case(case, args, code))
                    print(f"output {case} {name}: {_line(runs[name][-1])}", flush=True)
            row = {"case": case, **{name: _summary(r) for name, r in runs.items()}}
            prof = run_case(case, args, None, profile=True)
            row["profile"] = prof.get("profile", prof.get("error"))
            if "baseline" in row and "error" not in row["baseline"] | row["current"]:
                row["speedup"] = (row["baseline"]["cpu_us_per_token"]
                                  / row["current"]["cpu_us_per_token"])
            result["rows"].append(row)
    return result


def _line(run: dict) -> str:
    if "error" in run:
        return "error: " + run["error"].splitlines()[-1]
    return (f"{run['cpu_us_per_token']:.2f} us/token, wall {run['wall_s']:.2f} s, "
            f"{run['gc_full']} full GCs ({run['gc_full_s']:.2f} s), ok {run['ok']}")


def to_markdown(res: dict) -> str:
    """The per-token table (median and range of the runs) and each case's profile."""
    lines = ["## api CPU per output token, offline Engine path (stand-in scheduler)", "",
             "CPU time of the whole process (all threads) from the first BatchOut to the "
             "last joined output, per output token; full GC = generation 2 collections "
             "in that time. Median [min - max] of the runs.", "",
             "| case | code | requests x tokens | text made | us/token | wall s | "
             "full GCs (s) | outputs ok |", "|---|---|---|---|---:|---:|---:|---:|"]
    for row in res["rows"]:
        for name in ("baseline", "current"):
            s = row.get(name)
            if s is None:
                continue
            code = f"baseline {res['baseline']}" if name == "baseline" else "this tree"
            if "error" in s:
                lines.append(f"| {row['case']} | {code} | | | error: {s['error'][-200:]} "
                             "| | | |")
                continue
            lines.append(
                f"| {row['case']} | {code} | {s['requests']} x {s['tokens'] // s['requests']}"
                f" | {'yes' if s['text'] else 'no'} | {s['cpu_us_per_token']:.2f} "
                f"[{s['min']:.2f} - {s['max']:.2f}] | "
                f"{s['wall_s']:.2f} | {s['gc_full']:g} ({s['gc_full_s']:.2f}) | "
                f"{s['ok_requests']} / {s['requests']} |")
    speedups = [f"{r['case']} {r['speedup']:.1f}x" for r in res["rows"] if "speedup" in r]
    if speedups:
        lines += ["", "Baseline / this tree, us per token: " + ", ".join(speedups) + "."]
    for row in res["rows"]:
        if isinstance(row.get("profile"), list):
            lines += ["", f"{row['case']}, this tree, own time per output token (cProfile, "
                          "one run; profiling slows it):", "", "| function | us/token |",
                      "|---|---:|"]
            lines += [f"| `{fn}` | {us} |" for fn, us in row["profile"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_args(p)
    p.add_argument("--case", default=None, help="one run of this case; JSON on stdout")
    p.add_argument("--profile", action="store_true", help="with --case: cProfile it")
    args = p.parse_args()
    if args.case:
        print(json.dumps(measure(args.case, args.output_requests, args.output_tokens,
                                 args.profile)))
        return
    print(to_markdown(run_output_bench(args)))


if __name__ == "__main__":
    main()
