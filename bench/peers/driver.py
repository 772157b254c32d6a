"""Sluice and a peer engine (vLLM) one after the other on the same workloads, in one call.

    python -m bench.peers [--only offline-7b,offline-8b,served,multiturn,long,deepseek]
        [--peer vllm | --peer MODULE] [--client auto|vllm|sglang|sluice] [--repeats 3]
        [--concurrency 16,64,256] [--sluice-option KEY=VALUE] [--peer-option KEY=VALUE]
        [--budget-s 570] [--out bench/results/peers/<date>-peers-<groups>]
    python -m bench.peers --tiny [--peer MODULE] --out PREFIX     # dummy:tiny on the CPU

For each group (`bench.peers.workloads`), Sluice and then the peer start in their own
process (`bench.peers.protocol`) and run every row `--repeats` times; the GPU is empty
between them. One table of medians, ranges and ratios Sluice / peer goes to
`<out>.md`, `<out>.json` and `<out>.png` (`bench.peers.report`). Both engines run bf16 at
their defaults; `--*-option` changes one (e.g. `--sluice-option max_running=512`) and the
report lists it. When the peer cannot be imported here (vLLM: neither installed nor
unpacked by `bench.peers.unpack`), the driver says so and runs Sluice alone: the peer's
column reads "not run". `--peer MODULE` runs any module that speaks the protocol.

Served rows use one load generator for both servers: `vllm bench serve` when vLLM can be
imported, else this repository's `bench.serving` (`--client` picks; `bench.peers.clients`).
`--budget-s`: start nothing after this many seconds (a call to the GPU host has a limit).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.peers import clients, groups
from bench.peers.groups import EngineRef
from bench.peers.model_dir import write_model_dir
from bench.peers.protocol import Job
from bench.peers.report import NOT_RUN, write_report
from bench.peers.sluice_engine import defaults as sluice_defaults
from bench.peers.unpack import HOME, peer_env, site_dir
from bench.peers.workloads import FULL, GROUPS, TINY
from bench.serving.server_proc import ROOT, device_name, git_rev

SLUICE = EngineRef("sluice", "bench.peers.sluice_engine", {})
TINY_SLUICE = {"device": "cpu", "torch_threads": 1, "kv_slots": 4096}
NOTES = (
    "Offline: both engines take token ids and return ids (no detokenization); greedy, EOS "
    "ignored, every request runs to its length. Weights are random (bf16) of the preset's "
    "shape: the work, not the tokens, is what compares.",
    "ITL counts chunks: a server that puts several tokens in one chunk when the client falls "
    "behind shows fewer, longer gaps; TPOT is the per-token figure.",
)


def importable(module: str, env: dict) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                          cwd=ROOT).returncode == 0


def resolve_peer(spec: str) -> EngineRef:
    """`vllm` (installed, or unpacked by `bench.peers.unpack`) or an engine module path."""
    if spec == "vllm":
        env = peer_env(site_dir("vllm"))
        if importable("vllm", env):
            return EngineRef("vllm", "bench.peers.vllm_engine", env)
        return EngineRef("vllm", "bench.peers.vllm_engine", env,
                         f"vllm cannot be imported here (not installed, and no payload "
                         f"unpacked at {site_dir('vllm', HOME)}: see docs/peers.md)")
    name = spec.rsplit(".", 1)[-1]
    return EngineRef(name, spec, {}, None if importable(spec, {}) else
                     f"module {spec} cannot be imported")


def choose_client(wanted: str, peer: EngineRef) -> tuple[str, dict]:
    """The load generator and the environment it runs in."""
    vllm_ok = peer.name == "vllm" and peer.missing is None
    if wanted == "auto":
        wanted = "vllm" if vllm_ok else "sluice"
    if wanted == "vllm" and not vllm_ok:
        sys.exit("--client vllm needs vLLM importable (--peer vllm, installed or unpacked)")
    if wanted == "sglang" and not importable("sglang", {}):
        sys.exit("--client sglang needs the sglang package importable")
    return wanted, {**os.environ, **peer.env} if wanted == "vllm" else dict(os.environ)


def parse_options(items: list[str]) -> dict:
    """`KEY=VALUE` items to options; a VALUE that reads as JSON (numbers, true) is that."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            sys.exit(f"an option is KEY=VALUE, got {item!r}")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except ValueError:
            out[key.replace("-", "_")] = value
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help=f"groups, of {','.join(GROUPS)}")
    ap.add_argument("--tiny", action="store_true", help="the CPU-sized groups (dummy:tiny)")
    ap.add_argument("--peer", default="vllm", help="vllm, or an engine module path")
    ap.add_argument("--client", default="auto", choices=("auto", *clients.CLIENTS))
    ap.add_argument("--repeats", type=int, default=None, help="default 3 (--tiny: 2)")
    ap.add_argument("--concurrency", default=None, help="served rows to run, e.g. 16,64")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--sluice-option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--peer-option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--budget-s", type=float, default=570.0)
    ap.add_argument("--work", type=Path, default=HOME / "work", help="model folders, logs")
    ap.add_argument("--out", default=None, help="output prefix (default under bench/results/"
                    "peers/; --tiny: under --work)")
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    names = args.only.split(",") if args.only else list(TINY if args.tiny else FULL)
    if unknown := [n for n in names if n not in GROUPS]:
        sys.exit(f"unknown group(s) {unknown}; have {','.join(GROUPS)}")
    repeats = args.repeats or (2 if args.tiny else 3)
    peer = resolve_peer(args.peer)
    if peer.missing:
        print(f"peer {peer.name}: not run: {peer.missing}. Running Sluice alone.", flush=True)
    client, client_env = choose_client(args.client, peer)
    options = {"sluice": {**(TINY_SLUICE if args.tiny else {}),
                          **parse_options(args.sluice_option)},
               peer.name: parse_options(args.peer_option)}
    engines = [SLUICE] + ([] if peer.missing else [peer])
    args.work.mkdir(parents=True, exist_ok=True)
    res = {"meta": {"command": " ".join(["python -m bench.peers", *(argv or sys.argv[1:])]),
                    "date": datetime.date.today().isoformat(), "git": git_rev(),
                    "device": device_name(), "dtype": args.dtype, "repeats": repeats,
                    "client": clients.DESCRIPTION[client], "options": options},
           "peer": {"name": peer.name, "status": "run" if not peer.missing else
                    f"{NOT_RUN}: {peer.missing}"},
           "groups": {}, "notes": list(NOTES)}
    for name in names:
        group = GROUPS[name]
        if args.concurrency and group.kind == "served":
            keep = {int(c) for c in args.concurrency.split(",")}
            group = replace(group, rows=tuple(r for r in group.rows if r.batch in keep))
        model_dir = write_model_dir(args.work / "models", group.preset, args.dtype)
        entry = res["groups"][name] = {"kind": group.kind, "preset": group.preset,
                                       "headline": group.headline,
                                       "rows": [r.name for r in group.rows], "engines": {}}
        for ref in engines:
            job = Job(group, str(model_dir), args.dtype, repeats, options=options[ref.name])
            if group.kind == "offline":
                out = groups.offline(ref, job, args.work, deadline)
            else:
                run_row = (groups.multiturn_row if group.kind == "multiturn"
                           else clients.runner(client, client_env))
                out = groups.served(ref, job, run_row, args.work, deadline)
                if ref is SLUICE:
                    out["defaults"] = sluice_defaults(job.options)
            entry["engines"][ref.name] = out
            if out.get("version") and ref is peer:
                res["peer"]["version"] = out["version"]
    tag = "tiny-cpu" if args.tiny else "-".join(names) if len(names) < 3 else "all"
    out = args.out or (str(args.work / f"peers-{tag}") if args.tiny else
                       str(ROOT / "bench/results/peers" / f"{res['meta']['date']}-peers-{tag}"))
    write_report(res, out)

