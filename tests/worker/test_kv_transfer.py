"""`KVTransfer` byte for byte: write-backs and loads of scattered slots, issued plan after plan
with no synchronisation between them, leave every slot holding what its order says, in the
token layout (single slots) and the paged one (whole pages), unquantized and fp8 (with
its scales). On a GPU the host pool is registered memory the copy kernel reads and
writes directly; this is also the test to run under the memory checker:

    compute-sanitizer --tool memcheck python -m pytest -q -m gpu tests/worker/test_kv_transfer.py
"""

from __future__ import annotations

import pytest
import torch

from kernels.kv.copy_slots import copy_slots
from runtime.wire.worker_channel import BatchPlan
from runtime.worker.kv_pool import KVPool
from runtime.worker.kv_transfer import KVTransfer

# cpu-kernel: the GPU path's copy kernel on CPU tensors, under the Triton interpreter (which
# runs only where there is no GPU)
DEVICES = ["cpu",
           pytest.param("cpu-kernel", marks=pytest.mark.skipif(
               torch.cuda.is_available(), reason="the Triton interpreter runs without a GPU")),
           pytest.param("cuda", marks=pytest.mark.gpu)]


def plan(writeback: tuple[list[int], list[int]] = ([], []),
         load: tuple[list[int], list[int]] = ([], [])) -> BatchPlan:
    """A plan with only copy orders: write back dev -> host, load host -> dev."""
    return BatchPlan(0, [], [], [], [], [], [], writeback_dev=writeback[0],
                     writeback_host=writeback[1], load_host=load[0], load_dev=load[1])


def random_pool(device: str, kv_dtype: str, kv_heads: int, head_dim: int, slots: int,
                gen: torch.Generator) -> KVPool:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    pool = KVPool(3, slots, kv_heads, head_dim, dtype, device, kv_dtype)
    for t in pool.layer_tensors():  # random bytes: the copies must not care what they mean
        raw = t.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, generator=gen, dtype=torch.uint8))
    return pool


def layer_bytes(pool: KVPool, slots: list[int]) -> list[torch.Tensor]:
    """The bytes of `slots` in every tensor of the pool, on the CPU."""
    idx = torch.tensor(slots, device=pool.k[0].device)
    return [t[idx].view(torch.uint8).cpu() for t in pool.layer_tensors()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("kv_heads,head_dim", [(3, 6), (2, 64)])
def test_write_backs_loads_and_host_slot_reuse_keep_every_byte(device, kv_dtype, page_size,
                                                               kv_heads, head_dim):
    device, kernel = device.removesuffix("-kernel"), device.endswith("-kernel")
    gen = torch.Generator().manual_seed(page_size * 100 + head_dim)
    pool = random_pool(device, kv_dtype, kv_heads, head_dim, 17 * 4, gen)
    xfer = KVTransfer(pool, 40)
    if kernel:
        xfer.copy = copy_slots
    pages = (torch.randperm(16, generator=gen) + 1).tolist()  # page p: slots p*ps .. p*ps+ps-1
    if page_size == 1:
        pages = (torch.randperm(64, generator=gen) + 1).tolist()
    slots = [p * page_size + i for p in pages for i in range(page_size)]
    a, b, c, d = (slots[k * 12:(k + 1) * 12] for k in range(4))  # disjoint device slots
    host = (torch.randperm(40, generator=gen) + 1)[:12].tolist()
    want_a, want_c = layer_bytes(pool, a), layer_bytes(pool, c)
    untouched = [s for s in range(1, pool.num_slots) if s not in b + d]
    want_untouched = layer_bytes(pool, untouched)

    xfer.run(plan(writeback=(a, host)))
    xfer.run(plan(load=(host, b)))  # b now holds a
    xfer.run(plan(writeback=(c, host), load=(host[::-1], d[::-1])))  # host reused: d holds c
    # the compute stream waits for the copies: these reads need no synchronisation
    got_b, got_d = layer_bytes(pool, b), layer_bytes(pool, d)
    assert same(got_b, want_a)
    assert same(got_d, want_c)
    assert same(layer_bytes(pool, untouched), want_untouched)
    if device == "cuda":
        torch.cuda.synchronize()
    # the host pool holds c's bytes: its groups' members are the pool's tensors in order
    host_members = [m for h in xfer.hosts for m in h.unbind(1)]  # [host slots + 1, ...] each
    assert same([m[host].contiguous().view(torch.uint8) for m in host_members], want_c)


@pytest.mark.parametrize("device", DEVICES)
def test_a_plan_without_copies_issues_nothing(device):
    pool = KVPool(2, 9, 1, 8, torch.float32, device.removesuffix("-kernel"))
    assert KVTransfer(pool, 4).run(plan()) is None


@pytest.mark.gpu
def test_host_pools_made_and_dropped_in_turn_keep_registering():
    """Small host pools (two groups each, fp8) created and dropped one after another: no two
    registrations share a page and a dropped pool is unregistered, so the next registration
    of the same memory succeeds and its copies are right."""
    for i in range(12):
        pool = KVPool(2, 9, 1, 8, torch.bfloat16, "cuda", "fp8")
        pool.k[0].view(torch.uint8).fill_(i)
        xfer = KVTransfer(pool, 3 + i % 4)
        xfer.run(plan(writeback=([1, 2], [2, 1])))
        torch.cuda.synchronize()
        assert (xfer.hosts[0][1:3, 0].view(torch.uint8) == i).all()
        del xfer, pool
