"""Bandwidth of the host KV tier's copies: write-backs (device -> pinned host) and loads
(pinned host -> device) of scattered slots in the KV pool's own layout, through
`KVTransfer`, against a plain pinned copy of the same bytes (what the bus allows).
The times are wall time per call, so they include building and uploading the slot lists.
A second table times each group's launch alone (K/V rows; a quantized pool's scale rows).

    python -m bench.kernels.kv_copy_bw                 # dummy:llama3-8b shape on the GPU
    python -m bench.kernels.kv_copy_bw --smoke         # dummy:tiny shape on the CPU

Writes bench/results/<date>-kv-copy-bw-<tag>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import time
from pathlib import Path

import torch

from bench.serving.server_proc import device_name, git_rev
from runtime.model_presets import DUMMY_PRESETS
from runtime.wire.worker_channel import BatchPlan
from runtime.worker.kv_pool import KVPool
from runtime.worker.kv_transfer import KVTransfer


def _timed(fn, device: torch.device, repeat: int) -> float:
    """Seconds per call of `fn`, after one warm-up call."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / repeat


def measure(model: str, device: torch.device, pool_slots: int, host_slots: int,
            tokens: list[int], repeat: int, kv_dtype: str = "auto") -> list[dict]:
    c = DUMMY_PRESETS[model.removeprefix("dummy:")]
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    pool = KVPool(c["num_hidden_layers"], pool_slots + 1, c["num_key_value_heads"], head_dim,
                  dtype, device, kv_dtype)
    xfer = KVTransfer(pool, host_slots)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for n in tokens:
        dev = (torch.randperm(pool_slots, generator=gen)[:n] + 1).tolist()
        host = (torch.randperm(host_slots, generator=gen)[:n] + 1).tolist()
        rows.append(_row(xfer, n * pool.bytes_per_token, device, dev, host, repeat))
    return rows


def _row(xfer: KVTransfer, nbytes: int, device: torch.device, dev: list[int],
         host: list[int], repeat: int) -> dict:
    """GB/s of writing back and loading `dev` <-> `host`, and of the bus on the same bytes."""
    wb = BatchPlan(0, [], [], [], [], [], [], writeback_dev=dev, writeback_host=host)
    ld = BatchPlan(0, [], [], [], [], [], [], load_host=host, load_dev=dev)

    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    return {
        "tokens": len(dev), "bytes": nbytes,
        "writeback_gbps": nbytes / _timed(lambda: xfer.run(wb), device, repeat) / 1e9,
        "load_gbps": nbytes / _timed(lambda: xfer.run(ld), device, repeat) / 1e9,
        "bus_d2h_gbps": nbytes / _timed(lambda: pinned.copy_(flat, non_blocking=True),
                                        device, repeat) / 1e9,
        "bus_h2d_gbps": nbytes / _timed(lambda: flat.copy_(pinned, non_blocking=True),
                                        device, repeat) / 1e9,
        "groups": _groups(xfer, device, dev, host, repeat),
    }


def _groups(xfer: KVTransfer, device: torch.device, dev: list[int], host: list[int],
            repeat: int) -> list[dict]:
    """GB/s of each group's launch alone (slot lists already on the device)."""
    d, h = (torch.tensor(x, dtype=torch.int64, device=device) for x in (dev, host))
    out = []
    for dev_t, host_t in xfer.groups:
        nbytes = len(dev) * len(dev_t.tensors) * dev_t.row_words * dev_t.base.element_size()
        writeback = functools.partial(xfer.copy, dev_t, host_t, d, h)
        load = functools.partial(xfer.copy, host_t, dev_t, h, d)
        out.append({"members": len(dev_t.tensors),
                    "row_bytes": dev_t.row_words * dev_t.base.element_size(),
                    "writeback_gbps": nbytes / _timed(writeback, device, repeat) / 1e9,
                    "load_gbps": nbytes / _timed(load, device, repeat) / 1e9})
    return out


def report(res: dict) -> str:
    lines = [f"# Host KV tier copy bandwidth ({res['device']}, {res['date']})", "",
             f"{res['model']} pool layout (kv_dtype {res['kv_dtype']}, {res['bytes_per_token']} "
             "bytes per token), scattered slots, all layers; GB/s. The bus columns copy the "
             "same bytes contiguously, pinned.", "",
             "| tokens | MB | write-back | bus D2H | of bus | load | bus H2D | of bus |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['tokens']} | {r['bytes'] / 1e6:.1f} | {r['writeback_gbps']:.1f} | "
                     f"{r['bus_d2h_gbps']:.1f} | {r['writeback_gbps'] / r['bus_d2h_gbps']:.0%} | "
                     f"{r['load_gbps']:.1f} | {r['bus_h2d_gbps']:.1f} | "
                     f"{r['load_gbps'] / r['bus_h2d_gbps']:.0%} |")
    last = res["rows"][-1]
    lines += ["", f"Each group's launch alone, {last['tokens']} tokens:", "",
              "| members | row bytes | write-back | load |", "|---|---|---|---|"]
    lines += [f"| {g['members']} | {g['row_bytes']} | {g['writeback_gbps']:.1f} | "
              f"{g['load_gbps']:.1f} |" for g in last["groups"]]
    return "\n".join([*lines, "", f"git {res['git']}", ""])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="dummy:tiny on the CPU, tiny sizes")
    ap.add_argument("--model", default="dummy:llama3-8b")
    ap.add_argument("--tokens", default="256,2048,16384")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--kv-dtype", default="auto", help="auto, fp8 or int8 (with scales)")
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--tag", default=None)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if args.smoke:
        args.model, args.tokens, args.repeat, args.tag = "dummy:tiny", "16,64", 2, "smoke"
    tokens = [int(t) for t in args.tokens.split(",")]
    rows = measure(args.model, device, 2 * max(tokens), 2 * max(tokens), tokens, args.repeat,
                   args.kv_dtype)
    c = DUMMY_PRESETS[args.model.removeprefix("dummy:")]
    res = {"date": datetime.date.today().isoformat(), "device": device_name(), "git": git_rev(),
           "model": args.model, "kv_dtype": args.kv_dtype, "rows": rows,
           "bytes_per_token": rows[0]["bytes"] // rows[0]["tokens"],
           "layers": c["num_hidden_layers"]}
    tag = args.tag or ("h200" if device.type == "cuda" else "cpu")
    if args.kv_dtype != "auto":
        tag += f"-{args.kv_dtype}"
    stem = Path(args.out_dir) / f"{res['date']}-kv-copy-bw-{tag}"
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(res, indent=1))
    stem.with_suffix(".md").write_text(report(res))
    print(report(res))


if __name__ == "__main__":
    main()
