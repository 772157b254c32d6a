"""The load generators the served rows can use, one pointed at each server in turn, and the
same flat metrics from each (`out_tok_s`, `total_tok_s`, `ttft_p50` ... `e2e_p99` in ms).

- `vllm`: `vllm bench serve` (random dataset, fixed lengths, `--ignore-eos`), run in the
  vLLM package's environment; the default when vLLM can be imported.
- `sglang`: `python -m sglang.bench_serving --backend vllm` (the same endpoint), when the
  sglang package can be imported.
- `sluice`: this repository's `bench.serving` client (token-id prompts), which needs
  nothing else.

All of them define TTFT, TPOT, ITL and E2E as `vllm bench serve` does. Every run of a row
uses its own seed (`repeat`), the same for both servers.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.peers.workloads import Group, Row, vocab_size
from bench.serving.data import make_dataset
from bench.serving.driver import run_load

CLIENTS = ("vllm", "sglang", "sluice")
DESCRIPTION = {
    "vllm": "`vllm bench serve` (vLLM's own load generator)",
    "sglang": "`python -m sglang.bench_serving --backend vllm` (SGLang's load generator)",
    "sluice": "`bench.serving` (this repository's load generator, token-id prompts)",
}
# our metric name -> the names other generators give it in `<stat>_<name>_ms` keys
ALIASES = {"ttft": ("ttft",), "tpot": ("tpot",), "itl": ("itl",),
           "e2e": ("e2el", "e2e_latency", "e2e")}
STATS = (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99"))


class ClientFailed(RuntimeError):
    """The load generator did not finish or wrote no result."""


def flat_summary(c: dict) -> dict:
    """`bench.serving.metrics.summarize`'s dict as flat metrics."""
    out = {"out_tok_s": c["output_throughput"], "total_tok_s": c["total_token_throughput"],
           "completed": c["completed"], "failed": c["failed"], "duration_s": c["duration_s"],
           "tokens_per_chunk": c["tokens_per_chunk"]}
    for name in ALIASES:
        out.update({f"{name}_{ours}": c[f"{name}_ms"][ours] for ours, _ in STATS})
    return {k: v for k, v in out.items() if not (isinstance(v, float) and math.isnan(v))}


def flat_result(r: dict) -> dict:
    """A `vllm bench serve` or `sglang.bench_serving` result file as flat metrics."""
    out = {"out_tok_s": r["output_throughput"],
           "total_tok_s": r.get("total_token_throughput", r.get("total_throughput")),
           "completed": r.get("completed"), "failed": r.get("failed", 0),
           "duration_s": r.get("duration", r.get("benchmark_duration"))}
    for name, theirs in ALIASES.items():
        for ours, stat in STATS:
            found = [r[k] for t in theirs if (k := f"{stat}_{t}_ms") in r]
            if found:
                out[f"{name}_{ours}"] = found[0]
    return out


def run_sluice(url: str, model: str, group: Group, row: Row, repeat: int,
               deadline: float, tokenizer: str = "") -> dict:
    """One run of `row` with this repository's client (token ids: `tokenizer` unused)."""
    specs = make_dataset("fixed", row.requests, vocab_size(group.preset), seed=repeat + 1,
                         input_len=row.input_len, output_len=row.output_len)
    run = asyncio.run(run_load(url, model, specs, concurrency=row.batch, progress=False,
                               deadline=max(1.0, deadline - time.monotonic())))
    return flat_summary(run.report()["client"]) | {"truncated": run.truncated}


def vllm_command(url: str, model: str, tokenizer: str, row: Row, seed: int,
                 out: Path) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
            "--backend", "openai", "--base-url", url, "--model", model,
            "--tokenizer", tokenizer, "--dataset-name", "random",
            "--random-input-len", str(row.input_len), "--random-output-len",
            str(row.output_len), "--random-range-ratio", "0", "--num-prompts",
            str(row.requests), "--max-concurrency", str(row.batch), "--ignore-eos",
            "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,90,99", "--disable-tqdm", "--save-result",
            "--result-dir", str(out.parent), "--result-filename", out.name]


def sglang_command(url: str, model: str, tokenizer: str, row: Row, seed: int,
                   out: Path) -> list[str]:
    return [sys.executable, "-m", "sglang.bench_serving", "--backend", "vllm",
            "--base-url", url, "--model", model, "--tokenizer", tokenizer,
            "--dataset-name", "random", "--random-input-len", str(row.input_len),
            "--random-output-len", str(row.output_len), "--random-range-ratio", "1.0",
            "--num-prompts", str(row.requests), "--max-concurrency", str(row.batch),
            "--seed", str(seed), "--output-file", str(out), "--disable-tqdm"]


def run_external(command: Callable[..., list[str]], url: str, model: str, group: Group,
                 row: Row, repeat: int, deadline: float, tokenizer: str,
                 env: dict | None = None) -> dict:
    """Run an outside load generator once; its result file as flat metrics."""
    with tempfile.TemporaryDirectory(prefix="peers-client-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = command(url, model, tokenizer, row, repeat + 1, out)
        try:
            rc = subprocess.run(cmd, env=env, timeout=max(1.0, deadline - time.monotonic()),
                                stdout=subprocess.DEVNULL).returncode
        except subprocess.TimeoutExpired:
            raise ClientFailed(f"{cmd[2]} ran past the time budget") from None
        if rc != 0 or not out.is_file():
            raise ClientFailed(f"{' '.join(cmd[2:5])} exited with {rc} and no result")
        lines = out.read_text().strip().splitlines()  # sglang appends one JSON line a run
        return flat_result(json.loads(lines[-1]))


def runner(client: str, env: dict | None = None) -> Callable[..., dict]:
    """The function that runs one row once with `client`: f(url, model, group, row,
    repeat, deadline, tokenizer) -> flat metrics."""
    if client == "sluice":
        return run_sluice
    command = vllm_command if client == "vllm" else sglang_command

    def run(url, model, group, row, repeat, deadline, tokenizer):
        return run_external(command, url, model, group, row, repeat, deadline, tokenizer, env)

    return run
