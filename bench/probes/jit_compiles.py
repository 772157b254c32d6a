"""Which Triton kernels were compiled while a run was timed.

A kernel meets a new specialization (another constexpr, dtype, or an integer argument that
is now 1 or a multiple of 16) the first time a batch of a new shape reaches it, and Triton
compiles it then, on the host, for a second or more: a step that long is a stall the device
spends idle. Compiled kernels land in Triton's cache directory (shared by every process of
the engine), so the entries written after a run started name what it compiled; a kernel
loaded from the cache writes nothing.

    t = time.time()
    ...  # the timed run
    compiled_since(t)  # {"_extend_attention_kernel": 1, ...}
"""

from __future__ import annotations

import collections
from pathlib import Path

import triton


def compiled_since(t: float, root: Path | None = None) -> dict[str, int]:
    """Kernel name -> how many of its variants were compiled at or after wall time `t`, in
    `root` (default: Triton's cache directory, `TRITON_CACHE_DIR` where set)."""
    root = Path(triton.knobs.cache.dir) if root is None else root
    names = collections.Counter()
    for meta in root.glob("*/*.json"):
        if not meta.name.startswith("__grp__") and meta.stat().st_mtime >= t:
            names[meta.stem] += 1
    return dict(sorted(names.items()))
