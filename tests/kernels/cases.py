"""Shared test parameters and input builders for the kernel tests."""

import pytest
import torch

# fp32 and fp16 run everywhere (the CPU through Triton's interpreter); bf16 only on a GPU:
# the interpreter's bf16 arithmetic is wrong on the CPU (every bf16 attention, MLA, MoE and
# skinny-GEMM case there misses its torch reference by up to 1e9, the fp16 ones all pass).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [
    pytest.param(torch.float32, id="fp32"),
    pytest.param(torch.float16, id="fp16"),
    pytest.param(torch.bfloat16, id="bf16", marks=pytest.mark.gpu),
]
# fp32 on a GPU goes through TF32 in tl.dot, hence the looser fp32 bound there.
ATTN_TOL = {
    torch.float32: 1e-5 if DEVICE == "cpu" else 2e-3,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}
ELEMENTWISE_TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def page_table(
    lens: list[int], page_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A CSR page table over shuffled pages for sequences of `lens` tokens.

    Page 0 is never handed out, so slot 0 stays the padding sink. Returns
    (kv_indptr [B+1] int32, kv_indices [nnz] int32, num_slots) on DEVICE.
    """
    pages = [-(-n // page_size) for n in lens]
    total = sum(pages)
    ids = (torch.randperm(total + 2, generator=gen) + 1)[:total]  # a few spare pages, unused
    indptr = torch.tensor([0] + pages, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    num_slots = (total + 3) * page_size
    return indptr.to(DEVICE), ids.to(torch.int32).to(DEVICE), num_slots


def randn(*shape, dtype=torch.float32, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)
