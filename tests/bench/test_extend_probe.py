"""The extend probe edits the extend kernel's source: each cut must still find the lines it
replaces (or the probe would time the unchanged kernel under a cut's name), and `regpath`,
timed as the 16-bit pool's register round trip, must still compute the right output."""

import pytest
import torch

from bench import extend_probe as probe
from tests.kernels.test_extend_attention import make_inputs


@pytest.mark.parametrize("name", ["base", *probe.CUTS])
def test_every_cut_applies_to_the_kernel_source(name):
    mod = probe.variant(name)
    src = mod.__spec__.loader.get_data(mod.__file__).decode()
    for old, new in probe.CUTS.get(name, []):
        assert new in src and (old in new or old not in src)  # regpath keeps what it precedes


def test_regpath_keeps_the_16_bit_output():
    args, _ = make_inputs([40, 7], [9, 20], (4, 2, 32), 16, torch.float32, seed=1)
    base, reg = (probe.variant(n).extend_attention(*args) for n in ("base", "regpath"))
    torch.testing.assert_close(reg, base)
