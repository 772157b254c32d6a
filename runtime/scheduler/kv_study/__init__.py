"""KV layouts kept beside the serving path to measure it against (`bench/fragmentation.py`).

- `ContiguousKV` (`--kv contiguous`): one region per request, reserved up front.
- `DynamicPagedKV` (`--kv paged --block-size dynamic`): 16/32/64-slot blocks per request.

Both index KV slot by slot (page size 1) and cache no prefixes. The scheduler reaches
them only through `build_study_kv`.
"""

from __future__ import annotations

from runtime.config.kv_mode import KVMode
from runtime.scheduler.kv_manager import KVManager
from runtime.scheduler.kv_study.contiguous_kv import ContiguousKV
from runtime.scheduler.kv_study.dynamic_kv import DynamicPagedKV


def build_study_kv(mode: KVMode, num_slots: int, num_rows: int, max_context: int) -> KVManager:
    """The manager of a study layout (`mode.kind` `contiguous` or `dynamic`)."""
    if mode.kind == "contiguous":
        return ContiguousKV(num_slots, num_rows, mode.reserve, min(max_context, num_slots))
    if mode.kind == "dynamic":
        return DynamicPagedKV(num_slots, num_rows)
    raise ValueError(f"{mode.kind!r} is not a study layout")
