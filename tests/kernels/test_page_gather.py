import pytest
import torch

from kernels.kv.page_gather import gather_pages, gather_pages_ref
from tests.kernels.cases import DEVICE


@pytest.mark.parametrize("num_pages", [[1], [3, 0, 700, 5], [513, 1, 2, 512, 9]], ids=str)
def test_matches_reference(num_pages):
    gen = torch.Generator().manual_seed(len(num_pages))
    table = torch.randint(0, 10**6, (7, 1031), generator=gen).to(DEVICE)  # [R, M]
    rows = torch.randperm(7, generator=gen)[:len(num_pages)].to(DEVICE)  # [B]
    n = torch.tensor(num_pages, device=DEVICE)
    indptr = torch.zeros(len(num_pages) + 1, dtype=torch.int64, device=DEVICE)
    torch.cumsum(n, 0, out=indptr[1:])
    total = sum(num_pages)
    got = gather_pages(table, rows, n, indptr, total)
    assert torch.equal(got, gather_pages_ref(table, rows, n, indptr, total))
    # spot check the CSR layout: sequence 0 starts with its row's first pages
    assert got[:min(3, num_pages[0])].tolist() == table[rows[0], :min(3, num_pages[0])].tolist()


def test_a_table_with_a_row_stride_larger_than_its_width():
    table = torch.arange(4 * 64, device=DEVICE).reshape(4, 64)[:, :40]  # [4, 40], stride 64
    rows, n = torch.tensor([3, 1], device=DEVICE), torch.tensor([2, 4], device=DEVICE)
    indptr = torch.tensor([0, 2, 6], device=DEVICE)
    assert gather_pages(table, rows, n, indptr, 6).tolist() == [192, 193, 64, 65, 66, 67]
