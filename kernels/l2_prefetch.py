"""Warming L2 with a buffer: a kernel that only asks L2 for every 128-byte line of a
contiguous tensor (`prefetch.global.L2`) and exits; the lines arrive after it has finished.

At decode batch 1, attention reads a few MB and spends most of its time waiting on latency.
Launched beside it on another stream, this kernel brings the next projection's weight into
the H200's 50 MB L2, and the projection then reads it from there instead of from HBM. No
result depends on it: a line that is evicted before use is read from HBM as it would be.
"""

import torch
import triton
import triton.language as tl

LINE = 128  # bytes an L2 request covers
LINES_PER_PROGRAM = 2048  # 256 KB a program: 128 programs for a 32 MB weight
BLOCK = 512  # lines a loop step of one program requests (4 a thread)


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the lines under `ptrs` (in bounds; one pointer per 128-byte line is enough).
    GPU only: the Triton interpreter has no inline assembly."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _l2_prefetch_kernel(ptr, n_lines, LINE: tl.constexpr, LINES_PER_PROGRAM: tl.constexpr,
                        BLOCK: tl.constexpr):
    first = tl.program_id(0) * LINES_PER_PROGRAM
    for i in range(0, LINES_PER_PROGRAM, BLOCK):
        line = tl.minimum(first + i + tl.arange(0, BLOCK), n_lines - 1)  # [BLOCK], in bounds
        prefetch_l2(ptr + line.to(tl.int64) * LINE)


def l2_prefetch(t: torch.Tensor) -> None:
    """Launch the L2 warm-up of contiguous CUDA tensor `t` on the current stream."""
    assert t.is_cuda and t.is_contiguous(), "l2_prefetch takes a contiguous CUDA tensor"
    n_lines = triton.cdiv(t.numel() * t.element_size(), LINE)
    if n_lines == 0:
        return
    grid = (triton.cdiv(n_lines, LINES_PER_PROGRAM),)
    _l2_prefetch_kernel[grid](t.view(-1).view(torch.uint8), n_lines, LINE, LINES_PER_PROGRAM,
                              BLOCK, num_warps=4)
