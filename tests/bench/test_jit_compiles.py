"""`bench.probes.jit_compiles`: the kernels a timed run compiled are the cache entries written after
it started (the grouping files Triton writes beside them are not kernels)."""

import os

from bench.probes.jit_compiles import compiled_since


def test_only_entries_written_after_the_start_are_counted(tmp_path):
    def entry(folder, name, mtime):
        d = tmp_path / folder
        d.mkdir(exist_ok=True)
        (d / f"{name}.json").write_text("{}")
        os.utime(d / f"{name}.json", (mtime, mtime))

    entry("a", "_old_kernel", 100.0)  # compiled before the run: loaded from the cache
    entry("b", "_extend_attention_kernel", 200.0)
    entry("c", "_extend_attention_kernel", 201.0)  # a second specialization
    entry("c", "__grp___extend_attention_kernel", 201.0)
    entry("d", "_rmsnorm_kernel", 150.0)
    assert compiled_since(150.0, tmp_path) == {"_extend_attention_kernel": 2, "_rmsnorm_kernel": 1}
    assert compiled_since(300.0, tmp_path) == {}
