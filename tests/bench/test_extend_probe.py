"""The extend probe edits the extend kernel's source and its key tiles': each cut must still
find the lines it replaces (or the probe would time the unchanged kernel under a cut's name),
and the variants timed as another way to the same result (`regpath`, `masked`, `per-head`,
the launch orders) must still compute the right output."""

import sys

import pytest
import torch

from bench.probes import extend as probe
from tests.kernels.test_extend_attention import make_inputs


def _source(mod) -> str:
    return mod.__spec__.loader.get_data(mod.__file__).decode()


@pytest.mark.parametrize("name", ["base", *probe.CUTS])
def test_every_cut_applies_to_the_kernel_source(name):
    mod = probe.variant(name)
    tiles = sys.modules[f"extend_tiles_{name.replace('-', '_')}"]
    assert f"from {tiles.__name__} import" in _source(mod)  # the kernel uses the cut tiles
    src = _source(mod) + _source(tiles)
    for old, new in probe.CUTS.get(name, []):
        assert new in src and (old in new or old not in src)  # regpath keeps what it precedes


@pytest.mark.parametrize("name", ["regpath", "masked", "per-head", *probe.ORDERS])
@pytest.mark.parametrize("heads", [(4, 2, 32), (4, 4, 32)])  # packed, and one head a program
def test_same_result_variants_keep_the_output(name, heads):
    args, _ = make_inputs([40, 7], [9, 20], heads, 16, torch.float32, seed=1)
    base, other = (probe.variant(n).extend_attention(*args) for n in ("base", name))
    torch.testing.assert_close(other, base)
