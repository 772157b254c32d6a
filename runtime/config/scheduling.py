"""Scheduling: the KV layout and pool, batch sizes, queues, preemption."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config.checks import ConfigError, require_at_least, require_one_of

KV_MODES = ("token", "paged", "contiguous")
RESERVE_MODES = ("request", "max")  # contiguous: prompt + max_tokens, or the whole context
PREEMPT_MODES = ("recompute", "swap")


@dataclass(frozen=True)
class SchedulingOptions:
    """How the scheduler lays out KV and batches requests."""

    kv: str = "token"
    """The KV cache layout: `token` (token slots, radix prefix cache),
    `paged` (fixed-size blocks, hashed prefix blocks) or `contiguous` (one region per
    request, no prefix reuse)."""
    block_size: int | str = 16
    """Paged KV: token slots per block, or `dynamic` (16/32/64 by request length)."""
    reserve: str = "request"
    """Contiguous KV: the region reserved per request, `request` (prompt + max_tokens)
    or `max` (the whole context)."""
    overlap: bool | None = None
    """Overlap scheduling (plan the next batch while the device runs the current one);
    unset: on, except for paged KV, which is synchronous by default."""
    chunk_size: int = 0
    """Prefill tokens per step (chunked prefill); 0: 8192 on a GPU, 512 on the CPU."""
    max_running: int = 256
    """The most requests running (holding KV) at once."""
    kv_slots: int = 0
    """The KV pool size in token slots; 0: size it from device memory (GPU) or a default
    (CPU). It also caps the context length."""
    max_queue: int = 1024
    """The most requests waiting beyond max_running; more get HTTP 429 (overloaded)."""
    max_request_seqs: int = 64
    """The most sequences (prompts x n) one request may run, further capped at a quarter
    of max_running + max_queue so one request leaves room for others; more is a 400."""
    schedule_conservativeness: float = 1.0
    """Scales the KV reserved for the future tokens of running requests at admission
    (higher: fewer retractions, smaller batches)."""
    preempt: str = "recompute"
    """What a request preempted when the KV pool runs out loses: `recompute` (its KV is
    freed and computed again) or `swap` (its KV goes to the host tier and comes back;
    needs --host-kv-gib)."""
    host_kv_gib: float = 0.0
    """GiB of (pinned) host memory per worker for a KV tier under the device pool: token
    KV keeps prefixes the device evicts there and loads them back on a hit; both layouts
    swap preempted requests there (`--preempt swap`). 0: off."""
    grammar_cache_size: int = 64
    """Compiled regexes each worker keeps (least recently used evicted first; a large one
    takes a few MB); a request with a regex not kept waits for its compile."""

    def check_scheduling(self) -> None:
        require_one_of(self, "kv", KV_MODES)
        require_one_of(self, "reserve", RESERVE_MODES)
        require_one_of(self, "preempt", PREEMPT_MODES)
        if self.block_size != "dynamic" and not (
                str(self.block_size).isdigit() and int(self.block_size) >= 1):
            raise ConfigError(f"block_size must be an integer >= 1 or 'dynamic', "
                              f"got {self.block_size!r}")
        if not self.host_kv_gib >= 0:
            raise ConfigError(f"host_kv_gib must be >= 0 (0: off), got {self.host_kv_gib}")
        if self.host_kv_gib and (self.kv not in ("token", "paged")
                                 or self.block_size == "dynamic"):
            raise ConfigError("host_kv_gib needs kv token or paged with a fixed block size")
        if self.preempt == "swap" and not self.host_kv_gib:
            raise ConfigError("preempt swap needs a host tier: set host_kv_gib > 0")
        require_at_least(self, ("chunk_size",), 0, " (0: auto)")
        require_at_least(self, ("kv_slots",), 0)
        require_at_least(self, ("max_running", "max_queue", "max_request_seqs",
                                "grammar_cache_size"), 1)
        if self.schedule_conservativeness < 0:
            raise ConfigError("schedule_conservativeness must be >= 0")
