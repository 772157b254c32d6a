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
    block_size: int = 16
    overlap: bool = True
    chunk_size: int = 512
    max_running: int = 64
    kv_slots: int = 0  # 0: size the pool from memory (GPU) or a default (CPU)
    max_queue: int = 1024
    schedule_conservativeness: float = 1.0  # scales the KV reserved for running requests
    device: str = "auto"
    dtype: str = "auto"
    kv_dtype: str = "auto"
    mem_fraction: float = 0.85
    seed: int = 0
    torch_threads: int = 0  # 0: torch's default
    log_level: str = "info"
    ready_timeout: float = 300.0
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
        for name in ("block_size", "chunk_size", "max_running", "max_queue"):
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

    def replace(self, **changes) -> ServerConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def ipc(self, channel: str) -> str:
        """The ZMQ address of one internal channel (`ipc://` under `ipc_dir`)."""
        return f"ipc://{os.path.join(self.ipc_dir, f'{self.run_id}-{channel}')}"

    @property
    def rpc_addr(self) -> str:
        return f"tcp://{self.host}:{self.rpc_port}"

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))
