"""How the driver runs an engine: `python -m <engine module> offline|serve`, in its own
process, so that each engine has the GPU to itself and gives its memory back by exiting.

    python -m MODULE offline --job JOB.json --out OUT.json
    python -m MODULE serve --job JOB.json --port PORT

The job (`Job`) names the group (model shape and rows), the model folder, the dtype, the
repeats and the engine's own options. `offline` starts the engine once (timed from before
its import: start-up to ready), then for each row one short warm-up and `repeats` timed
generates of the row's prompts (`workloads.prompts`), and writes OUT.json:
`{"engine", "version", "defaults", "import_s", "start_s", "rows": {row: {"runs": [{"wall_s",
"output_tokens", "input_tokens"}]}}}`. `serve` becomes the engine's OpenAI-compatible
server on 127.0.0.1:PORT (streaming `/v1/completions`, `/v1/models`), answering GET
`/health` with 200 once ready, stopping on SIGTERM.

An engine module implements `OfflineEngine` and `serve_argv` and calls `main(...)`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from bench.peers.workloads import Group, prompts, warmup


@dataclass(frozen=True)
class Job:
    group: Group
    model_dir: str  # config.json (+ tokenizer) of the group's preset
    dtype: str = "bfloat16"
    repeats: int = 3
    seed: int = 0
    options: dict = field(default_factory=dict)  # this engine's own, named like its flags

    def write(self, path: Path) -> None:
        path.write_text(json.dumps({**asdict(self), "group": self.group.to_json()}))

    @classmethod
    def read(cls, path: Path) -> Job:
        d = json.loads(Path(path).read_text())
        return cls(**{**d, "group": Group.from_json(d["group"])})


class OfflineEngine(Protocol):
    name: str

    def start(self, job: Job) -> dict:
        """Import and build the engine; what it runs with (version, defaults, import_s)."""

    def generate(self, prompts: list[list[int]], max_tokens: int) -> int:
        """Greedy, ignoring EOS, token ids in and out; the output tokens produced."""

    def stop(self) -> None: ...


def timed_import(module: str, *names: str) -> tuple[list, float]:
    """`names` of `module`, imported, and the seconds the import took (an engine's `import_s`:
    its start-up before it builds)."""
    t0 = time.perf_counter()
    mod = importlib.import_module(module)
    found = [getattr(mod, name) for name in names]
    return found, time.perf_counter() - t0


def as_flags(options: dict) -> list[str]:
    """{"kv_slots": 4096, "enforce_eager": True} -> ["--kv-slots", "4096", "--enforce-eager"]."""
    flags = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False and value is not None:
            flags += [flag, str(value)]
    return flags


def run_offline(engine: OfflineEngine, job: Job) -> dict:
    """Start `engine`, run every row of the job, stop it; the result OUT.json holds."""
    t0 = time.perf_counter()
    info = engine.start(job)
    start_s = time.perf_counter() - t0
    print(f"[{engine.name}] ready in {start_s:.1f} s", flush=True)
    rows = {}
    for row in job.group.rows:
        engine.generate(*warmup(job.group, row))
        runs = []
        for repeat in range(job.repeats):
            batch = prompts(job.group, row, repeat)
            t0 = time.perf_counter()
            out = engine.generate(batch, row.output_len)
            wall = time.perf_counter() - t0
            runs.append({"wall_s": wall, "output_tokens": out,
                         "input_tokens": sum(map(len, batch))})
            print(f"[{engine.name}] {row.name}: {out / wall:.1f} out tok/s", flush=True)
        rows[row.name] = {"runs": runs}
    engine.stop()
    return {"engine": engine.name, "start_s": start_s, "options": job.options, **info,
            "rows": rows}


def main(engine: OfflineEngine, serve_argv: Callable[[Job, int], list[str]],
         argv: list[str] | None = None) -> None:
    """The command line of an engine module (see the module docstring)."""
    ap = argparse.ArgumentParser(prog=f"python -m <{engine.name} engine module>")
    ap.add_argument("mode", choices=("offline", "serve"))
    ap.add_argument("--job", type=Path, required=True)
    ap.add_argument("--out", type=Path, help="offline: where the result goes")
    ap.add_argument("--port", type=int, help="serve: the port to listen on")
    args = ap.parse_args(argv)
    job = Job.read(args.job)
    if args.mode == "offline":
        if args.out is None:
            ap.error("offline needs --out")
        args.out.write_text(json.dumps(run_offline(engine, job)))
        return
    if args.port is None:
        ap.error("serve needs --port")
    cmd = serve_argv(job, args.port)
    sys.stdout.flush()
    os.execv(cmd[0], cmd)  # the server takes this process over (and its SIGTERM)
