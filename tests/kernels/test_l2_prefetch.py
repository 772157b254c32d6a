"""L2 warm-up: the prefetch kernel takes any contiguous tensor and changes nothing, and
`TritonOps.warm_l2` forks and joins its side stream inside a CUDA graph capture so that the
weight's reader still sees the same numbers."""

import pytest
import torch

from kernels.l2_prefetch import l2_prefetch
from runtime.worker.ops import TorchOps, TritonOps

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("numel", [1, 63, 4097, 3 * 2048 * 64 + 5])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float32])
def test_prefetch_of_odd_sizes_changes_nothing(numel, dtype):
    t = torch.randn(numel, device="cuda").to(dtype)
    before = t.clone()
    l2_prefetch(t)
    torch.cuda.synchronize()
    assert torch.equal(t.view(torch.uint8), before.view(torch.uint8))


def test_warm_l2_in_a_graph_keeps_the_readers_result():
    ops = TritonOps(torch.zeros(1, 2, device="cuda"))
    w = torch.randn(512, 768, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 768, device="cuda", dtype=torch.bfloat16)
    want = x @ w.T
    with ops.warm_l2(w, 2):  # outside a capture: nothing forked
        pass
    assert ops._side is None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with ops.warm_l2(w, 2):
            y = torch.relu(x)  # the block the prefetch runs beside
        out = (x + 0 * y) @ w.T
    assert ops._side is not None
    for _ in range(3):
        graph.replay()
        torch.testing.assert_close(out, want, rtol=0, atol=0)
    with TorchOps.warm_l2(w, 2):  # the CPU ops: a plain context
        pass
