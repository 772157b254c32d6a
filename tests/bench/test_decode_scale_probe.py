"""The decode-scale probe edits the Gluon stage 1's source: each of its cuts must still find
the lines it replaces, or the probe would time the unchanged kernel under a cut's name."""

import pytest

from bench.probes import decode_scale as probe


@pytest.mark.parametrize("name", ["base", *probe.CUTS])
def test_every_cut_applies_to_the_kernel_source(name):
    mod = probe.variant(name)
    assert callable(mod.decode_quant_gluon_stage1)
    src = mod.__spec__.loader.get_data(mod.__file__).decode()
    assert "LAST = _decode_quant_gluon_kernel" in src
    for old, new in probe.CUTS.get(name, []):
        assert old not in src and new in src
