"""Server configuration: one frozen dataclass, validated at construction.

The CLI (`runtime/launch.py`) and `Engine(**kwargs)` both build a `ServerConfig`; every
CLI flag maps onto one field of the same name (`--no-overlap` -> `overlap=False`).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import uuid
from dataclasses import dataclass, field

KV_MODES = ("token", "paged", "contiguous")
RESERVE_MODES = ("request", "max")  # contiguous: prompt + max_tokens, or the whole context
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float16", "bfloat16")
KV_DTYPES = ("auto", "fp8", "int8")


class ConfigError(ValueError):
    """A server option is invalid."""


@dataclass(frozen=True)
class ServerConfig:
    """Everything the three processes need to agree on."""

    model: str = "smollm2"
    host: str = "127.0.0.1"
    port: int = 30000
    rpc_port: int = 30001
    kv: str = "token"
    block_size: int | str = 16  # paged: slots per block, or "dynamic" (16/32/64 by length)
    reserve: str = "request"  # contiguous: region per request, one of RESERVE_MODES
    overlap: bool | None = None  # None: the KV mode's default (see `use_overlap`)
    chunk_size: int = 0  # prefill tokens per step; 0: 8192 on a GPU, 512 on the CPU
    max_running: int = 256
    kv_slots: int = 0  # 0: size the pool from memory (GPU) or a default (CPU)
    max_queue: int = 1024
    schedule_conservativeness: float = 1.0  # scales the KV reserved for running requests
    device: str = "auto"
    dtype: str = "auto"
    kv_dtype: str = "auto"
    mem_fraction: float = 0.85
    seed: int = 0
    torch_threads: int = 0  # 0: torch's default
    tp: int = 1  # tensor-parallel worker processes (one GPU each on CUDA, gloo on the CPU)
    cuda_graph: bool = True  # capture decode CUDA graphs at start-up (GPU only)
    log_level: str = "info"
    ready_timeout: float = 300.0
    # monitoring: /health, /metrics and the periodic log line (api process)
    stats_interval: float = 1.0  # seconds between scheduler stats polls
    log_interval: float = 10.0  # seconds between throughput log lines; 0: off
    stall_timeout: float = 30.0  # /health 503: work queued and no scheduler step this long
    kv_alert_ratio: float = 0.9  # /health 503: KV usage above this ratio ...
    kv_alert_seconds: float = 30.0  # ... for this many seconds
    # degraded mode: from `degrade_waiting` waiting requests, cap max_tokens and batch size
    degrade_waiting: int = 0  # 0: never degrade
    degrade_max_tokens: int = 128
    degrade_max_running: int = 0  # 0: keep max_running
    ipc_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="sluice-"))
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("model must be set")
        if self.kv not in KV_MODES:
            raise ConfigError(f"kv must be one of {KV_MODES}, got {self.kv!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ConfigError(f"kv_dtype must be one of {KV_DTYPES}, got {self.kv_dtype!r}")
        self._check_kv()
        if self.chunk_size < 0:
            raise ConfigError(f"chunk_size must be >= 0 (0: auto), got {self.chunk_size}")
        for name in ("max_running", "max_queue", "tp"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.schedule_conservativeness < 0:
            raise ConfigError("schedule_conservativeness must be >= 0")
        if self.kv_slots < 0:
            raise ConfigError(f"kv_slots must be >= 0, got {self.kv_slots}")
        if not 0.0 < self.mem_fraction <= 1.0:
            raise ConfigError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
        for name in ("port", "rpc_port"):
            if not 0 <= getattr(self, name) < 65536:
                raise ConfigError(f"{name} must be a TCP port, got {getattr(self, name)}")
        self._check_monitoring()

    def _check_monitoring(self) -> None:
        for name in ("stats_interval", "stall_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("log_interval", "kv_alert_seconds", "degrade_waiting",
                     "degrade_max_running"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 < self.kv_alert_ratio <= 1.0:
            raise ConfigError(f"kv_alert_ratio must be in (0, 1], got {self.kv_alert_ratio}")
        if self.degrade_max_tokens < 1:
            raise ConfigError(f"degrade_max_tokens must be >= 1, got {self.degrade_max_tokens}")

    def _check_kv(self) -> None:
        if self.reserve not in RESERVE_MODES:
            raise ConfigError(f"reserve must be one of {RESERVE_MODES}, got {self.reserve!r}")
        if self.block_size != "dynamic" and not (
                str(self.block_size).isdigit() and int(self.block_size) >= 1):
            raise ConfigError(f"block_size must be an integer >= 1 or 'dynamic', "
                              f"got {self.block_size!r}")

    @property
    def fixed_block_size(self) -> int | None:
        """The paged block size; None for `--block-size dynamic`."""
        return None if self.block_size == "dynamic" else int(self.block_size)

    @property
    def use_overlap(self) -> bool:
        """Overlap scheduling: as set, else on, except for paged KV, which is synchronous
        by default like vLLM V1 (`--kv paged --overlap` turns it on)."""
        return self.kv != "paged" if self.overlap is None else self.overlap

    def replace(self, **changes) -> ServerConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def worker_channel(self, rank: int) -> str:
        """The address the scheduler sends plans to for TP rank `rank`."""
        return self.ipc("worker_in" if rank == 0 else f"worker_in{rank}")

    def ipc(self, channel: str) -> str:
        """The ZMQ address of one internal channel (`ipc://` under `ipc_dir`)."""
        return f"ipc://{os.path.join(self.ipc_dir, f'{self.run_id}-{channel}')}"

    @property
    def rpc_addr(self) -> str:
        return f"tcp://{self.host}:{self.rpc_port}"

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))
