"""Checkpoint loading, start-up to ready, from a real safetensors folder on local disk.

    python -m bench.load [--preset llama3-8b] [--dir /tmp/sluice-load-<preset>]
                         [--shard-size 5GB] [--device auto|cpu|cuda] [--dtype auto]
                         [--quantization none|fp8] [--repeats 1] [--no-engine]
                         [--out bench/results/load/<date>-load-<preset>-<cpu|gpu>]

1. write: a random bf16 checkpoint of the preset's shape (`bench.load.checkpoint`), sharded
   as Hub checkpoints are; a folder written with the same arguments is reused.
2. read: every file read once, in 64 MiB reads on one thread: the disk's read speed, and
   the time a load should not exceed by much. With `--repeats N` steps 2 and 3 alternate N
   times and the medians are reported.
3. load, cold: `load_model` in this process: wall time against the read's, peak anonymous
   memory (`RssAnon`, sampled every 5 ms) above the interpreter's just before (CUDA context
   included on a GPU), peak RSS, peak GPU memory allocated.
4. load, warm: the same with the files in the page cache: copying (and quantizing) alone.
5. quantize (`--quantization fp8`): the warm fp8 load minus a warm 16-bit one.
6. engine: `Engine(model=<folder>)` to ready (process start, load, KV pool, warm-up, CUDA
   graph capture), then one 4-token generate; its worker's peak RssAnon and RSS.

Each cold pass first drops the files from the page cache (fsync, then posix_fadvise
DONTNEED), so it reads the disk. Targets (issue 42, H200, Llama-3-8B shape): cold load <=
1.2x the read, peak RssAnon <= 2 GB above the interpreter's, Engine start-up <= 30 s. On the
CPU the model's own weights are host memory: the report subtracts them from the peak.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import torch

from bench.load.checkpoint import write_checkpoint
from bench.load.memory import MemorySampler, release_free_memory, status_bytes
from bench.offline.driver import git_commit
from bench.offline.parts import device_info
from bench.outputs import write_outputs
from runtime.model_config import resolve_model
from runtime.model_presets import DUMMY_PRESETS
from runtime.worker.loader import load_model
from runtime.worker.worker import resolve_device, resolve_dtype

GB = 1e9
READ_CHUNK = 64 * 2**20
LOAD_TARGET = 1.2  # x the read
ANON_TARGET_GB = 2.0  # above the interpreter's
ENGINE_TARGET_S = 30.0
UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """`5GB`, `100MB`, `2GiB` or a byte count -> bytes (KB/MB/GB decimal, as the Hub's)."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).upper() not in UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 5GB, 100MB, 2GiB)")
    return int(float(m.group(1)) * UNITS[m.group(2).upper()])


def evict(paths: list[Path]) -> None:
    """Drop the files' pages from the page cache, so the next read comes from the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_pass(paths: list[Path]) -> dict:
    """Read every file once, in order; seconds and GB/s."""
    view, n = memoryview(bytearray(READ_CHUNK)), 0
    t0 = time.perf_counter()
    for path in paths:
        with path.open("rb", buffering=0) as f:
            while k := f.readinto(view):
                n += k
    s = time.perf_counter() - t0
    return {"s": s, "gb": n / GB, "gb_s": n / GB / s}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_pass(folder: Path, device: torch.device, dtype: torch.dtype,
              quantization: str) -> dict:
    """`load_model` of the folder: seconds, the model's bytes, peak memory."""
    release_free_memory()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    spec = resolve_model(str(folder))
    base = status_bytes()["RssAnon"]
    with MemorySampler() as mem:
        t0 = time.perf_counter()
        model = load_model(spec, device, dtype, quantization=quantization)
        _sync(device)
        s = time.perf_counter() - t0
    model_gb = sum(t.numel() * t.element_size()
                   for t in [*model.parameters(), *model.buffers()]) / GB
    del model
    peak = mem.own
    out = {"s": s, "model_gb": model_gb, "base_anon_gb": base / GB,
           "anon_over_base_gb": (peak.rss_anon - base) / GB, "peak_rss_gb": peak.rss / GB,
           "gpu_peak_gb": None}
    if device.type == "cpu":  # the weights themselves are anonymous host memory here
        out["anon_over_model_gb"] = out["anon_over_base_gb"] - model_gb
    else:
        out["gpu_peak_gb"] = torch.cuda.max_memory_allocated(device) / GB
    return out


def engine_pass(folder: Path, device: str, dtype: str, quantization: str) -> dict:
    """`Engine` on the folder to ready, then one short generate; its worker's peaks."""
    from runtime import Engine, SamplingParams

    with MemorySampler(children=True) as mem:
        t0 = time.perf_counter()
        with Engine(model=str(folder), device=device, dtype=dtype, quantization=quantization,
                    log_level="warning") as eng:
            start_s = time.perf_counter() - t0
            out = eng.generate([[3, 4, 5, 6]], SamplingParams(max_tokens=4, temperature=0.0,
                                                                ignore_eos=True))[0]
    children = [p for pid, p in mem.peaks.items() if pid != os.getpid()]
    worker = max(children, key=lambda p: p.rss)  # the process that held the weights
    return {"start_s": start_s, "generated": len(out.token_ids),
            "worker_peak_anon_gb": worker.rss_anon / GB, "worker_peak_rss_gb": worker.hwm / GB}


def median_pass(passes: list[dict]) -> dict:
    """The pass of median time, with every pass's time (`all_s`) and the largest memory
    peaks of any."""
    out = dict(sorted(passes, key=lambda p: p["s"])[len(passes) // 2])
    out["all_s"] = [p["s"] for p in passes]
    for key in ("anon_over_base_gb", "anon_over_model_gb", "peak_rss_gb", "gpu_peak_gb"):
        if out.get(key) is not None:
            out[key] = max(p[key] for p in passes)
    return out


def run(args: argparse.Namespace) -> dict:
    """Every pass of the benchmark; the results by pass."""
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if device.type == "cuda":
        torch.zeros(1, device=device)  # the CUDA context belongs to the interpreter's baseline
    t0 = time.perf_counter()
    paths, written = write_checkpoint(args.dir, args.preset, args.shard_size, args.seed)
    res: dict = {"write_s": time.perf_counter() - t0 if written else None,
                 "files": [p.name for p in paths],
                 "checkpoint_gb": sum(p.stat().st_size for p in paths) / GB}
    reads, colds = [], []
    for _ in range(args.repeats):  # interleaved: a busy disk slows both alike
        evict(paths)
        reads.append(read_pass(paths))
        evict(paths)
        colds.append(load_pass(args.dir, device, dtype, args.quantization))
    res["read"], res["load_cold"] = median_pass(reads), median_pass(colds)
    read_pass(paths)  # every page in the cache
    res["load_warm"] = load_pass(args.dir, device, dtype, args.quantization)
    if args.quantization != "none":
        res["load_warm_16bit"] = load_pass(args.dir, device, dtype, "none")
        res["quantize_s"] = res["load_warm"]["s"] - res["load_warm_16bit"]["s"]
    if args.engine:
        evict(paths)
        res["engine"] = engine_pass(args.dir, str(device.type), str(dtype).split(".")[1],
                                    args.quantization)
    return res


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def runs(p: dict) -> str:
    return "" if len(p["all_s"]) == 1 else "; median of " + ", ".join(_f(s) for s in p["all_s"])


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def question_answer(meta: dict, res: dict) -> list[str]:
    """The report's `Question:` and `Answer:` lines (`bench.index`)."""
    read, cold, eng = res["read"], res["load_cold"], res.get("engine")
    cpu = meta["device"] == "cpu"
    over = cold["anon_over_model_gb"] if cpu else cold["anon_over_base_gb"]
    answer = (f"Answer: cold load {cold['s']:.2f} s, {cold['s'] / read['s']:.2f}x the "
              f"{read['s']:.2f} s read; peak RssAnon {over:.2f} GB above the interpreter"
              f"{' beyond the weights' if cpu else ''}")
    if eng:
        answer += f"; Engine() ready in {eng['start_s']:.1f} s"
    return [f"Question: How long does loading {meta['preset']} ({meta['dtype']}, quantization "
            f"{meta['quantization']}) from local safetensors take against reading its files "
            f"once, and with how much host memory ({meta['device']})?", answer + "."]


def markdown(meta: dict, res: dict) -> str:
    read, cold, warm = res["read"], res["load_cold"], res["load_warm"]
    ratio = cold["s"] / read["s"]
    cpu = meta["device"] == "cpu"
    quant = " fp8 weights" if meta["quantization"] == "fp8" else ""
    lines = [f"# Checkpoint loading: {meta['preset']} {meta['dtype']}{quant}", "",
             *question_answer(meta, res), "",
             f"`{meta['command']}`, {meta['date']}, commit {meta['commit']}; {meta['device']}"
             f" ({meta['cpu_threads']} CPU threads); torch {meta['torch']}.", "",
             f"Folder {meta['dir']}: {len(res['files'])} file(s), {res['checkpoint_gb']:.2f} GB "
             f"bf16 (shards of at most {meta['shard_size'] / GB:g} GB), "
             + (f"written in {res['write_s']:.1f} s" if res["write_s"] else "reused")
             + f"; the model in memory {cold['model_gb']:.2f} GB.", "",
             "| phase | seconds | notes |", "|---|---:|---|",
             f"| read the files once | {_f(read['s'])} | {read['gb_s']:.2f} GB/s: the disk, "
             f"one thread, 64 MiB reads, cold page cache{runs(read)} |",
             f"| load, cold | {_f(cold['s'])} | {ratio:.2f}x the read "
             f"(reading, copying{', quantizing' if quant else ''}){runs(cold)} |",
             f"| load, warm | {_f(warm['s'])} | copying{' and quantizing' if quant else ''} "
             "alone: the files in the page cache |"]
    if "quantize_s" in res:
        lines.append(f"| quantizing | {_f(res['quantize_s'])} | warm fp8 load minus warm "
                     f"16-bit load ({_f(res['load_warm_16bit']['s'])} s) |")
    eng = res.get("engine")
    if eng:
        lines += [f"| Engine() to ready, cold | {_f(eng['start_s'])} | then generated "
                  f"{eng['generated']} tokens |",
                  f"| of which not the load | {_f(eng['start_s'] - cold['s'])} | processes, "
                  "tokenizer, KV pool, warm-up, CUDA graphs (start-up minus the cold load) |"]
    over = "anon_over_model_gb" if cpu else "anon_over_base_gb"
    lines += ["", "| pass | peak RssAnon above the interpreter GB | of it beyond the weights GB "
              "| peak RSS GB | peak GPU allocated GB |", "|---|---:|---:|---:|---:|"]
    for name, r in (("load, cold", cold), ("load, warm", warm)):
        lines.append(f"| {name} | {_f(r['anon_over_base_gb'])} | "
                     f"{_f(r.get('anon_over_model_gb'))} | {_f(r['peak_rss_gb'])} | "
                     f"{_f(r['gpu_peak_gb'])} |")
    if eng:
        lines.append(f"| Engine worker (whole process) | {_f(eng['worker_peak_anon_gb'])} "
                     f"(absolute) | - | {_f(eng['worker_peak_rss_gb'])} | - |")
    lines += ["", "Memory: the largest peak of any pass. "
              f"Interpreter before the cold load: {cold['base_anon_gb']:.2f} GB RssAnon. "
              "Peak RSS counts the mapped checkpoint pages a process touched; RssAnon does not.",
              "", "Targets (GPU, Llama-3-8B shape):", "",
              f"- cold load <= {LOAD_TARGET}x the read: "
              f"**{_verdict(ratio <= LOAD_TARGET)}** ({ratio:.2f}x)",
              f"- peak RssAnon <= {ANON_TARGET_GB:g} GB above the interpreter"
              f"{' beyond the weights (CPU: they live there)' if cpu else ''}: "
              f"**{_verdict(cold[over] <= ANON_TARGET_GB)}** ({cold[over]:.2f} GB)"]
    if eng:
        lines.append(f"- Engine() start-up <= {ENGINE_TARGET_S:g} s: "
                     f"**{_verdict(eng['start_s'] <= ENGINE_TARGET_S)}** ({eng['start_s']:.1f} s)")
    if cpu:
        lines += ["", "A CPU run: the targets are the GPU's, shown for reference. Here the "
                  "weights are host memory, so each load also takes the kernel's zeroing of "
                  "their pages on first touch (the warm load shows it without the disk)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="llama3-8b", choices=sorted(DUMMY_PRESETS))
    parser.add_argument("--dir", type=Path, help="the checkpoint folder (default "
                                                 "/tmp/sluice-load-<preset>; reused)")
    parser.add_argument("--shard-size", type=parse_size, default=parse_size("5GB"))
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dtype", default="auto",
                        help="the model's dtype (auto: bfloat16 on a GPU, float32 on the CPU)")
    parser.add_argument("--quantization", default="none", choices=("none", "fp8"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1,
                        help="read and cold-load passes, interleaved (the median is reported)")
    parser.add_argument("--no-engine", dest="engine", action="store_false",
                        help="skip the Engine start-up pass")
    parser.add_argument("--out", help="output prefix (default bench/results/load/<date>-load-"
                                      "<preset>-<cpu|gpu>[-fp8])")
    args = parser.parse_args(argv)
    args.dir = args.dir or Path(f"/tmp/sluice-load-{args.preset}")
    res = run(args)
    device = resolve_device(args.device)
    info = device_info()
    given = sys.argv[1:] if argv is None else argv
    meta = {"command": " ".join(["python -m bench.load", *given]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "commit": git_commit(),
            "device": info["device"] if device.type == "cuda" else "cpu",
            "torch": info["torch"], "cpu_threads": torch.get_num_threads(),
            "preset": args.preset, "dir": str(args.dir), "shard_size": args.shard_size,
            "dtype": str(resolve_dtype(args.dtype, device)).split(".")[1],
            "quantization": args.quantization}
    kind = "gpu" if device.type == "cuda" else "cpu"
    fp8 = "-fp8" if args.quantization == "fp8" else ""
    date = time.strftime("%Y-%m-%d")
    out = args.out or f"bench/results/load/{date}-load-{args.preset}-{kind}{fp8}"
    md = markdown(meta, res)
    write_outputs(out, {"meta": meta, **res}, md)
    print(md)
    return {"meta": meta, **res}


if __name__ == "__main__":
    main()
