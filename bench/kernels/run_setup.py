"""How a kernel benchmark picks its device and dtype: the `--tiny` and `--dtype` flags, CUDA or
the CPU under the Triton interpreter, and the report's meta for that run."""

import argparse
import sys

import torch

from bench.kernels.common import COPY_CEILING_GBPS


def add_run_args(parser: argparse.ArgumentParser, dtype_default: str) -> None:
    """The flags `run_setup` reads: `--tiny` (the CPU smoke run) and `--dtype`."""
    parser.add_argument("--tiny", action="store_true", help="toy shapes (CPU smoke run)")
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default=dtype_default,
                        help="compute dtype on a GPU (the CPU runs float32)")


def run_setup(tiny: bool, dtype_name: str, iters: int, **extra) -> tuple[str, torch.dtype, dict]:
    """The device, compute dtype and report meta of a kernel benchmark run: CUDA in `dtype_name`,
    else the CPU in float32 (the Triton interpreter), where only `tiny` shapes may run (else exit
    with a line). The meta names the device, then `extra`, then the dtype and versions."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and not tiny:
        sys.exit("no CUDA device: only --tiny runs here (through the Triton interpreter)")
    dtype = getattr(torch, dtype_name) if dev == "cuda" else torch.float32
    meta = {
        "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (interpreter)",
        **extra, "dtype": str(dtype)[6:], "torch": torch.__version__,
        "triton": __import__("triton").__version__, "ceiling_gbps": COPY_CEILING_GBPS,
        "iters": iters,
    }  # fmt: skip
    return dev, dtype, meta
