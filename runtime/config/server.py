"""`ServerConfig`: everything the server's processes need to agree on, one frozen dataclass
validated at construction.

The CLI (`runtime.launch.cli`) and `Engine(**kwargs)` both build one; every CLI flag maps
onto one field of the same name (`--no-overlap` -> `overlap=False`). The fields come in
option groups, one module each, with their docs and checks.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import os
import tempfile
import textwrap
import uuid
from dataclasses import dataclass, field

from runtime.config.checks import ConfigError
from runtime.config.front import FrontOptions
from runtime.config.kv_mode import KVMode
from runtime.config.model import ModelOptions
from runtime.config.monitoring import MonitoringOptions
from runtime.config.scale_out import ScaleOutOptions
from runtime.config.scheduling import SchedulingOptions
from runtime.config.speculative import SpeculativeOptions


# a dataclass takes its bases' fields last base first: the flags list the model first
@dataclass(frozen=True)
class ServerConfig(MonitoringOptions, ScaleOutOptions, SpeculativeOptions, SchedulingOptions,
                   FrontOptions, ModelOptions):
    """Everything the processes need to agree on: the option groups and the processes'
    own options below."""

    log_level: str = "info"
    """The log level of every process (debug, info, warning, error)."""
    ready_timeout: float = 300.0
    """Seconds to wait for every process to report ready at start-up."""
    shutdown_grace: float = 5.0
    """On SIGTERM or Ctrl-C: seconds the requests in flight get to finish before each gets
    an error (new requests are refused meanwhile)."""
    ipc_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="sluice-"))
    """The folder of the internal ZeroMQ `ipc://` sockets (internal: not a flag)."""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    """Names this server's sockets apart from others' in ipc_dir (internal: not a flag)."""

    def __post_init__(self) -> None:
        self.check_model()
        self.check_front()
        self.check_scheduling()
        self.check_speculative()
        self.check_scale_out()
        self.check_monitoring()
        if (self.speculative_algorithm != "none" and self.kv == "paged"
                and self.block_size == "dynamic"):
            raise ConfigError("speculative decoding needs kv token, contiguous or paged with a "
                              "fixed block size")
        if self.dp > 1 and self.port == 0:
            raise ConfigError(f"dp {self.dp} needs a port (the replicas take the ports after "
                              f"it), not 0")
        if self.dp > 1 and self.port + 1 + 2 * self.dp >= 65536:
            raise ConfigError(f"dp {self.dp} needs ports {self.port}.."
                              f"{self.port + 1 + 2 * self.dp}")
        if self.shutdown_grace < 0:
            raise ConfigError(f"shutdown_grace must be >= 0, got {self.shutdown_grace}")

    @property
    def kv_mode(self) -> KVMode:
        """The KV layout and what follows from it (page size, overlap, prefix cache)."""
        return KVMode.from_options(self)

    def replace(self, **changes) -> ServerConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def worker_channel(self, rank: int) -> str:
        """The address the scheduler sends plans to for TP rank `rank` (multi-node: bound
        by the scheduler, otherwise by the worker)."""
        if self.multi_node:
            return self._node0_tcp(2 + rank)
        return self.ipc("worker_in" if rank == 0 else f"worker_in{rank}")

    @property
    def results_channel(self) -> str:
        """The address the workers send step results to (bound by the scheduler)."""
        return self._node0_tcp(1) if self.multi_node else self.ipc("sched_res")

    @property
    def tp_init_method(self) -> str:
        """Where the TP ranks meet for torch.distributed."""
        if self.dist_init_addr:
            return f"tcp://{self.dist_init_addr}"
        return f"file://{os.path.join(self.ipc_dir, f'{self.run_id}-tp-store')}"

    def _node0_tcp(self, offset: int) -> str:
        host, _, port = self.dist_init_addr.rpartition(":")
        return f"tcp://{host}:{int(port) + offset}"

    def ipc(self, channel: str) -> str:
        """The ZMQ address of one internal channel (`ipc://` under `ipc_dir`)."""
        return f"ipc://{os.path.join(self.ipc_dir, f'{self.run_id}-{channel}')}"

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def field_docs(cls) -> dict[str, str]:
        """Each field's docstring (the string literal right after it), on one line."""
        docs: dict[str, str] = {}
        for klass in cls.__mro__:
            if dataclasses.is_dataclass(klass):
                docs |= _attribute_docs(klass)
        return docs


@functools.cache
def _attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings of the fields `cls` itself declares, read from its source (Python
    keeps no attribute docstrings at run time)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs
