"""Programmatic dependent launch (PDL) for the decode-step kernels, on sm_90 and newer.

A kernel launched with PDL may start while the kernel before it on the stream is still
running: its programs become resident, run their set-up, and block in `griddepcontrol.wait`
until the previous kernel has finished and its writes are visible. At decode batch 1 a step is
~300 short kernels, and PDL hides each one's launch and ramp behind the tail of the one before.
A weight-streaming kernel also asks L2 for its first weight tile before it waits (weights are
no kernel's output, so they can be read early).

The contract every PDL kernel keeps: `pdl_wait` comes before its first read of anything an
earlier kernel wrote and before its first write, on every path through the kernel (so that a
kernel never finishes before the one it follows, which keeps the wait transitive along the
stream). Kernels that do not take part (cuBLAS, torch) are launched normally and simply
serialize as usual. What no PDL kernel writes may be read before the wait, off the critical
path: weights, scales and norm weights, and a step's positions, slots, lengths and page
table (copied in before its first kernel). The KV pool is not among them (the store kernel
before attention writes each sequence's newest key), but asking L2 for its lines early is
safe: the store lands in L2 as well.

`SLUICE_PDL=0` turns it off (for A/B measurements); the Triton interpreter never uses it.
"""

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_OFF = {"PDL": False}


def pdl_args(device: torch.device) -> dict:
    """Keyword arguments for a launch on `device`: the kernel's `PDL` constexpr and, where PDL
    is on, Triton's `launch_pdl` option (a shared dict: unpack it, do not change it)."""
    if device.type != "cuda":
        return _OFF
    env = os.environ
    return _args(device.index or 0, env.get("SLUICE_PDL", "1"), env.get("TRITON_INTERPRET", "0"))


@functools.cache
def _args(index: int, switch: str, interpret: str) -> dict:
    on = switch != "0" and interpret != "1" and torch.cuda.get_device_capability(index) >= (9, 0)
    return {"PDL": True, "launch_pdl": True} if on else _OFF


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Let the next kernel launch, then wait for the previous one (no-op without PDL)."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the lines under `ptrs` (in bounds; one pointer per 128-byte line is enough).
    Compiled code only (the interpreter has no inline assembly): call it under `if PDL:`."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def prefetch_rows_l2(ptr, rows, col0, cols, ELEMS: tl.constexpr):
    """Ask L2 for the 128-byte lines of ELEMS elements (at least one line) of each row: element
    offsets rows `[R]` (int64) plus col0 .. col0 + ELEMS, columns held below `cols`. Compiled
    code only, under `if PDL:`, as `prefetch_l2`."""
    LINE: tl.constexpr = 1024 // ptr.dtype.element_ty.primitive_bitwidth  # elements a line
    LINES: tl.constexpr = max(ELEMS // LINE, 1)
    offs = tl.minimum(col0 + tl.arange(0, LINES) * LINE, cols - 1)  # [LINES]
    prefetch_l2(ptr + rows[:, None] + offs[None, :])  # [R, LINES]
