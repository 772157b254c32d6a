"""The attack battery: `python -m tests.attack [--groups a,b] [--scale small|full] --out PREFIX`.

Starts its own `sluice serve` on loopback (SmolLM2 on the CPU by default; `--model
dummy:tiny` works too), runs each group against it and, after each, checks that the
server still answers `/health` and a real generation, that the KV pool is back to idle
(no request, no reserved slot) and how big the api has grown. Groups that kill processes
start servers of their own. Every wait is bounded. Writes PREFIX.md (a table: tried /
failed / lost per group, and the checks) and PREFIX.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.attack import defects, http_inputs, http_load, processes, rpc_frames
from tests.attack.harness import Tally, Target, after_group, checks_passed

GROUPS: dict[str, Callable[[Target, Tally, str], None]] = {
    "http_malformed": http_inputs.malformed_http,
    "rpc_malformed": rpc_frames.rpc_malformed,
    "rpc_oversize": rpc_frames.rpc_oversize,
    "streams": http_load.streams,
    "disconnects": http_load.disconnects,
    "upload_disconnects": http_load.upload_disconnects,
    "rid_retry": http_load.rid_retry,
    "slowloris": http_load.slowloris,
    "idle_connections": http_load.idle_connections,
    "stop_strings": defects.stop_strings,
    "huge_prompt": defects.huge_prompt,
    "regexes": defects.regexes,
    "admission": defects.admission,
    "int64_nesting": defects.int64_and_nesting,
    "bad_rids": defects.bad_rids,
    "cache_probe": defects.cache_probe,
    "token_bias": defects.token_bias,
    "sigstop": processes.sigstop,
}
OWN_SERVERS = {"sigkill": processes.sigkill, "sigterm": processes.sigterm}  # fresh servers


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.attack", description=__doc__.split("\n")[0])
    p.add_argument("--groups", default="all",
                   help=f"comma-separated, of: {', '.join([*GROUPS, *OWN_SERVERS])}")
    p.add_argument("--scale", choices=("small", "full"), default="small")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--out", required=True, help="PREFIX of PREFIX.md and PREFIX.json")
    args = p.parse_args(argv)
    names = [*GROUPS, *OWN_SERVERS] if args.groups == "all" else args.groups.split(",")
    unknown = [n for n in names if n not in GROUPS and n not in OWN_SERVERS]
    if unknown:
        p.error(f"unknown groups {unknown}")
    log_dir = Path(tempfile.mkdtemp(prefix="attack-logs-"))
    t0 = time.monotonic()
    tallies = []
    target = None
    if any(n in GROUPS for n in names):
        target = Target(args.model, log_dir, "main")
        target.start()
    try:
        for name in names:
            tally = Tally(name)
            start = time.monotonic()
            print(f"[attack] {name} ...", flush=True)
            try:
                if name in GROUPS:
                    GROUPS[name](target, tally, args.scale)
                else:
                    OWN_SERVERS[name](args.model, log_dir, tally, args.scale)
            except Exception as e:  # a group that broke is reported, the others still run
                tally.fail(f"the group itself raised {e!r}")
            if name in GROUPS:
                after_group(target, tally)
            tally.seconds = round(time.monotonic() - start, 1)
            tallies.append(tally)
            print(f"[attack] {name}: tried {tally.tried} failed {tally.failed} lost "
                  f"{tally.lost} checks {tally.checks} {tally.notes[:2]}", flush=True)
            if target is not None and not target.alive:
                print(f"[attack] the server died; its log:\n{target.server.log_tail()}")
                break
    finally:
        if target is not None:
            target.stop()
    write(Path(args.out), tallies, args, time.monotonic() - t0, log_dir)
    bad = [t.group for t in tallies if t.failed or t.lost
           or (t.group in GROUPS and not checks_passed(t))]
    print(f"[attack] done in {time.monotonic() - t0:.0f} s; groups with problems: {bad or 'none'}")
    return 1 if bad else 0


def write(prefix: Path, tallies: list[Tally], args: argparse.Namespace, seconds: float,
          log_dir: Path) -> None:
    prefix.parent.mkdir(parents=True, exist_ok=True)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    meta = {"model": args.model, "scale": args.scale, "seconds": round(seconds),
            "machine": f"{platform.node()} ({platform.machine()}, python {sys.version.split()[0]})",
            "revision": rev, "server_logs": str(log_dir)}
    rows = [{"group": t.group, "tried": t.tried, "failed": t.failed, "lost": t.lost,
             "seconds": t.seconds, "checks": t.checks, "notes": t.notes} for t in tallies]
    prefix.with_suffix(".json").write_text(json.dumps({"meta": meta, "groups": rows},
                                                      indent=1, default=str) + "\n")
    lines = [f"# Attack battery ({args.scale}, {args.model})", "",
             f"`python -m tests.attack --scale {args.scale} --model {args.model}` at {rev}, "
             f"{meta['seconds']} s on {meta['machine']}.", "",
             "| group | tried | failed | lost | s | checks after the group |",
             "|---|---:|---:|---:|---:|---|"]
    for t in tallies:
        checks = ", ".join(f"{k} {v}" for k, v in t.checks.items())
        lines.append(f"| {t.group} | {t.tried} | {t.failed} | {t.lost} | {t.seconds} | {checks} |")
    notes = [f"- {t.group}: {n}" for t in tallies for n in t.notes]
    if notes:
        lines += ["", "Examples of what failed or was lost:", "", *notes]
    prefix.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
