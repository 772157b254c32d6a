"""`KVMode`: how KV memory is laid out and scheduled, decided once from the config.

Every process reads the same record (`ServerConfig.kv_mode`): the scheduler builds its KV
manager and picks its retraction order from it, the worker sizes its page table by
`page_size`, and the loop keeps one or two batches in flight by `overlap`.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config.scheduling import SchedulingOptions

SERVING_KINDS = ("token", "paged")
STUDY_KINDS = ("contiguous", "dynamic")  # measured against the serving kinds, not tuned


@dataclass(frozen=True)
class KVMode:
    """The KV layout (`kind`) and everything that follows from it."""

    kind: str
    """`token` (any free slot, radix prefix cache), `paged` (fixed-size blocks, block-hash
    prefix cache), `dynamic` (16/32/64-slot blocks by request length) or `contiguous`
    (one region per request, reserved at admission)."""
    page_size: int
    """Slots per page of the worker's page table: the block size in `paged`, else 1."""
    overlap: bool
    """Plan the next batch while the device runs the current one (two in flight)."""
    prefix_cache: bool
    """Admission reuses the KV of a cached prompt prefix."""
    preempt_last_admitted: bool
    """Retraction takes the last admitted request first, only as many as needed (block
    layouts); else the one with the fewest outputs, until a few tokens per request fit."""
    reserve: str
    """`contiguous`: the region per request, `request` (prompt + max_tokens) or `max`."""

    @property
    def serving(self) -> bool:
        """A layout of the serving path; the others are kept to measure against it."""
        return self.kind in SERVING_KINDS

    @classmethod
    def from_options(cls, cfg: SchedulingOptions) -> KVMode:
        """The mode of `--kv`, `--block-size`, `--reserve` and `--overlap`."""
        kind = cfg.kv
        if kind == "paged" and cfg.block_size == "dynamic":
            kind = "dynamic"
        paged = cfg.kv == "paged"
        return cls(
            kind=kind,
            page_size=int(cfg.block_size) if kind == "paged" else 1,
            # block layouts run synchronously unless asked (`--kv paged --overlap`)
            overlap=not paged if cfg.overlap is None else cfg.overlap,
            prefix_cache=kind in SERVING_KINDS,
            preempt_last_admitted=paged,
            reserve=cfg.reserve,
        )
