"""Server configuration: one frozen dataclass, validated at construction.

The CLI (`runtime/launch.py`) and `Engine(**kwargs)` both build a `ServerConfig`; every
CLI flag maps onto one field of the same name (`--no-overlap` -> `overlap=False`).
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

from runtime.config_checks import (
    ConfigError,
    check_exposure,
    check_lora,
    check_monitoring,
    check_scale_out,
)
from runtime.kv_mode import KVMode
from runtime.lora_paths import parse_lora_paths

KV_MODES = ("token", "paged", "contiguous")
RESERVE_MODES = ("request", "max")  # contiguous: prompt + max_tokens, or the whole context
PREEMPT_MODES = ("recompute", "swap")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float16", "bfloat16")
KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "int8")
QUANTIZATIONS = ("none", "fp8")
ATTENTION_BACKENDS = ("auto", "triton", "torch")
TOOL_CALL_PARSERS = ("auto", "none", "hermes", "llama3_json", "mistral", "deepseek_v3")
REASONING_PARSERS = ("none", "deepseek-r1", "qwen3")
REQUEST_BYTES_PER_TOKEN = 64  # JSON token ids take <= 8, text far less per token
MIN_REQUEST_BYTES = 1 << 20


@dataclass(frozen=True)
class ServerConfig:
    """Everything the three processes need to agree on."""

    model: str = "smollm2"
    """The model: `smollm2` (the bundled SmolLM2-135M-Instruct), `dummy:<preset>` (random
    weights), a Hugging Face folder (config.json, safetensors, tokenizer), a .gguf file, or
    a Hugging Face Hub id (`org/name`, fetched into the Hub cache on first use)."""
    revision: str = "main"
    """The Hub revision of a Hub id model: a branch, tag or commit."""
    tokenizer: str = ""
    """The tokenizer's folder or Hub id; empty: the model's own (a model without one, as
    `dummy:` presets, takes prompts as token ids only)."""
    generation_config: str = "auto"
    """Default sampling parameters for what a request leaves unset: `auto` (the model's
    generation_config.json), `none` (ignore it) or a folder holding one."""
    host: str = "127.0.0.1"
    """The address the HTTP server listens on."""
    rpc_host: str = "127.0.0.1"
    """The address the RPC server listens on (apart from host: exposing HTTP does not
    expose RPC)."""
    port: int = 30000
    """The HTTP port (OpenAI-compatible API, /generate, /metrics, /health); 0: a free port,
    named in the `serving` log line."""
    rpc_port: int = 30001
    """The TCP port of the native ZeroMQ RPC server (`runtime.client.Client`); 0: a free
    port, named in the `serving` log line."""
    api_key: str = field(default="", repr=False)
    """The key every HTTP route but /health requires as `Authorization: Bearer <key>`,
    and every RPC request carries; empty: none. `sluice serve` reads SLUICE_API_KEY
    when the flag is not given (the environment keeps it out of `ps`)."""
    allowed_hosts: str = ""
    """Comma-separated Host names HTTP requests may address besides host (and the
    loopback names when host is loopback or a wildcard), against DNS rebinding; `*`: any.
    With a wildcard host and no names, any Host is accepted."""
    cache_report: bool = True
    """Report cached_tokens (prefix-cache hits) to clients; --no-cache-report reports 0,
    so one client cannot probe another's prompts. /metrics keeps the hit counters."""
    read_timeout: float = 30.0
    """Seconds a client may take to send one request's headers and body (HTTP) or to
    finish its connection handshake (RPC); slower connections are closed."""
    max_connections: int = 2048
    """The most open HTTP connections; one beyond it is closed at once."""
    max_rpc_connections: int = 256
    """The most open RPC connections (one per client); one beyond it is closed at once,
    before its handshake."""
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
    unset: on, except for paged KV, which is synchronous by default like vLLM V1."""
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
    max_request_bytes: int = 0
    """The largest HTTP request body or RPC message, in bytes: a larger body gets HTTP 413,
    a larger RPC message drops the client's connection; 0: 64 bytes per token of the
    context length, at least 1 MiB."""
    schedule_conservativeness: float = 1.0
    """Scales the KV reserved for the future tokens of running requests at admission
    (higher: fewer retractions, smaller batches)."""
    preempt: str = "recompute"
    """What a request preempted when the KV pool runs out loses: `recompute` (its KV is
    freed and computed again) or `swap` (its KV goes to the host tier and comes back;
    needs --host-kv-gib)."""
    device: str = "auto"
    """The device: `auto` (CUDA when available), `cpu` or `cuda`."""
    dtype: str = "auto"
    """The weights' and activations' dtype: `float32`, `float16`, `bfloat16`, or `auto`
    (bfloat16 on a GPU, float32 on the CPU)."""
    kv_dtype: str = "auto"
    """The KV cache's storage: `auto` (the model's dtype), `fp8` / `int8` (quantized with a
    float32 scale per token and KV head), or `fp8_e4m3` (float8_e4m3fn with one scale for
    the whole tensor, 1: no scales stored or read; not for latent (MLA) pools)."""
    quantization: str = "none"
    """The weights of the layers' projections: `none` (the model's dtype) or `fp8`
    (float8_e4m3fn with a scale per output channel, quantized at load, activations
    quantized per token; needs a GPU of compute capability 8.9+, or runs dequantized on
    the CPU). The embedding and the LM head stay in the model's dtype."""
    mem_fraction: float = 0.85
    """The fraction of GPU memory the worker may use (weights, activations, KV pool)."""
    host_kv_gib: float = 0.0
    """GiB of (pinned) host memory per worker for a KV tier under the device pool: token
    KV keeps prefixes the device evicts there and loads them back on a hit; both layouts
    swap preempted requests there (`--preempt swap`). 0: off."""
    seed: int = 0
    """The random seed of weight initialization (dummy models) and sampling."""
    torch_threads: int = 0
    """Torch's intra-op threads in each worker; 0: on the CPU, the fastest of one, half
    and all of the CPUs the worker may use, re-measured on live steps as the machine's load
    changes (TP ranks split the CPUs evenly); on a GPU, torch's default."""
    tp: int = 1
    """Tensor-parallel worker processes (one GPU each on CUDA, gloo on the CPU)."""
    nnodes: int = 1
    """Hosts the tensor-parallel group spans: each runs tp / nnodes worker ranks; node 0
    also runs the api and the scheduler. More than 1 needs dist_init_addr."""
    node_rank: int = 0
    """This host's place among the nnodes hosts (0: the one with the api and scheduler)."""
    dist_init_addr: str = ""
    """`host:port` of node 0, reachable from every node: torch.distributed meets at port,
    and with nnodes > 1 the scheduler serves its worker channels on the next tp + 1 ports
    of host. Empty: a file store under the ipc folder (one host)."""
    dp: int = 1
    """Data-parallel engine replicas on this host, each a whole server on its own tp GPUs
    (or, on the CPU, its own processes), behind `sglang-router` on port. Replica i serves
    HTTP on port + 1 + i and RPC on port + 1 + dp + i; the router's Prometheus metrics are
    on port + 1 + 2 * dp. 1: one server, no router."""
    router_policy: str = "cache_aware"
    """dp > 1: how sglang-router picks a replica: `cache_aware` (the replica whose cache
    likely holds the longest prefix, unless loads are unbalanced), `round_robin`,
    `random` or `power_of_two`."""
    attention_backend: str = "auto"
    """The attention kernels: `triton` (GPU; on the CPU only under TRITON_INTERPRET=1),
    `torch` (the kernels' torch references; no CUDA graphs), or `auto` (triton on a GPU,
    torch on the CPU)."""
    grammar_cache_size: int = 64
    """Compiled regexes each worker keeps (least recently used evicted first; a large one
    takes a few MB); a request with a regex not kept waits for its compile."""
    tool_call_parser: str = "auto"
    """Reads tool calls in the output: `hermes` (Qwen2.5, Qwen3), `llama3_json`, `mistral`,
    `deepseek_v3`, `auto` (the one the chat template shows) or `none`."""
    reasoning_parser: str = "none"
    """Splits `<think>` reasoning into `reasoning_content`: `deepseek-r1`, `qwen3` or `none`."""
    lora_paths: tuple[str, ...] = ()
    """LoRA adapters to serve, as `name=path` (a PEFT folder: adapter_config.json and
    adapter_model.safetensors); a request picks one by name (OpenAI `model`, SGLang
    `lora_path`, native `lora`)."""
    max_loras: int = 8
    """LoRA adapters held on the device at once; the others load when a request needs
    them, in the place of the least recently used one no running request holds."""
    max_lora_rank: int = 64
    """The largest LoRA rank an adapter may have."""
    cuda_graph: bool = True
    """Capture decode CUDA graphs at start-up (GPU, triton attention only)."""
    log_level: str = "info"
    """The log level of every process (debug, info, warning, error)."""
    ready_timeout: float = 300.0
    """Seconds to wait for every process to report ready at start-up."""
    shutdown_grace: float = 5.0
    """On SIGTERM or Ctrl-C: seconds the requests in flight get to finish before each gets
    an error (new requests are refused meanwhile)."""
    # monitoring: /health, /metrics and the periodic log line (api process)
    stats_interval: float = 1.0
    """Seconds between polls of the scheduler's stats (monitoring)."""
    log_interval: float = 10.0
    """Seconds between throughput log lines; 0: off."""
    stall_timeout: float = 30.0
    """/health answers 503 when work is queued and no scheduler step ran for this many
    seconds."""
    kv_alert_ratio: float = 0.9
    """/health answers 503 when KV usage stays above this ratio for kv_alert_seconds."""
    kv_alert_seconds: float = 30.0
    """How long KV usage must stay above kv_alert_ratio before /health answers 503."""
    # degraded mode: from `degrade_waiting` waiting requests, cap max_tokens and batch size
    degrade_waiting: int = 0
    """Degraded mode starts at this many waiting requests; 0: never degrade."""
    degrade_max_tokens: int = 128
    """Degraded mode: the max_tokens cap of requests arriving meanwhile."""
    degrade_max_running: int = 0
    """Degraded mode: the batch size cap; 0: keep max_running."""
    ipc_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="sluice-"))
    """The folder of the internal ZeroMQ `ipc://` sockets (internal: not a flag)."""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    """Names this server's sockets apart from others' in ipc_dir (internal: not a flag)."""

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("model must be set")
        if self.generation_config not in ("auto", "none") and not os.path.isfile(
                os.path.join(self.generation_config, "generation_config.json")):
            raise ConfigError("generation_config must be auto, none or a folder with "
                              f"generation_config.json, got {self.generation_config!r}")
        if self.kv not in KV_MODES:
            raise ConfigError(f"kv must be one of {KV_MODES}, got {self.kv!r}")
        if self.device not in DEVICES:
            raise ConfigError(f"device must be one of {DEVICES}, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ConfigError(f"kv_dtype must be one of {KV_DTYPES}, got {self.kv_dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"quantization must be one of {QUANTIZATIONS}, "
                              f"got {self.quantization!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"attention_backend must be one of {ATTENTION_BACKENDS}, "
                              f"got {self.attention_backend!r}")
        self._check_kv()
        for name, allowed in (("tool_call_parser", TOOL_CALL_PARSERS),
                              ("reasoning_parser", REASONING_PARSERS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.chunk_size < 0:
            raise ConfigError(f"chunk_size must be >= 0 (0: auto), got {self.chunk_size}")
        for name in ("max_running", "max_queue", "tp", "grammar_cache_size", "max_request_seqs",
                     "max_connections", "max_rpc_connections", "nnodes", "dp", "max_loras",
                     "max_lora_rank"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.schedule_conservativeness < 0:
            raise ConfigError("schedule_conservativeness must be >= 0")
        if self.kv_slots < 0:
            raise ConfigError(f"kv_slots must be >= 0, got {self.kv_slots}")
        if self.torch_threads < 0:
            raise ConfigError(f"torch_threads must be >= 0 (0: auto), got {self.torch_threads}")
        if self.max_request_bytes < 0:
            raise ConfigError(f"max_request_bytes must be >= 0 (0: from the context length), "
                              f"got {self.max_request_bytes}")
        if not 0.0 < self.mem_fraction <= 1.0:
            raise ConfigError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
        for name in ("port", "rpc_port"):
            if not 0 <= getattr(self, name) < 65536:
                raise ConfigError(f"{name} must be a TCP port, got {getattr(self, name)}")
        if self.shutdown_grace < 0:
            raise ConfigError(f"shutdown_grace must be >= 0, got {self.shutdown_grace}")
        check_lora(self)
        check_monitoring(self)
        check_exposure(self)
        check_scale_out(self)

    def _check_kv(self) -> None:
        if not self.host_kv_gib >= 0:
            raise ConfigError(f"host_kv_gib must be >= 0 (0: off), got {self.host_kv_gib}")
        if self.host_kv_gib and (self.kv not in ("token", "paged")
                                 or self.block_size == "dynamic"):
            raise ConfigError("host_kv_gib needs kv token or paged with a fixed block size")
        if self.preempt not in PREEMPT_MODES:
            raise ConfigError(f"preempt must be one of {PREEMPT_MODES}, got {self.preempt!r}")
        if self.preempt == "swap" and not self.host_kv_gib:
            raise ConfigError("preempt swap needs a host tier: set host_kv_gib > 0")
        if self.reserve not in RESERVE_MODES:
            raise ConfigError(f"reserve must be one of {RESERVE_MODES}, got {self.reserve!r}")
        if self.block_size != "dynamic" and not (
                str(self.block_size).isdigit() and int(self.block_size) >= 1):
            raise ConfigError(f"block_size must be an integer >= 1 or 'dynamic', "
                              f"got {self.block_size!r}")

    @property
    def kv_mode(self) -> KVMode:
        """The KV layout and what follows from it (page size, overlap, prefix cache)."""
        return KVMode.from_config(self)

    @property
    def lora_adapters(self) -> dict[str, str]:
        """The LoRA adapters of `lora_paths`: name -> folder."""
        return parse_lora_paths(self.lora_paths, self.model)

    def request_bytes_limit(self, max_context: int) -> int:
        """`max_request_bytes`, or its default for a context of `max_context` tokens."""
        return self.max_request_bytes or max(MIN_REQUEST_BYTES,
                                             REQUEST_BYTES_PER_TOKEN * max_context)

    def replace(self, **changes) -> ServerConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def multi_node(self) -> bool:
        """The scheduler and its workers meet over TCP (they may be on other hosts)."""
        return self.nnodes > 1

    @property
    def local_ranks(self) -> range:
        """The TP ranks this host runs."""
        per_node = self.tp // self.nnodes
        return range(self.node_rank * per_node, (self.node_rank + 1) * per_node)

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

    @property
    def rpc_addr(self) -> str:
        return f"tcp://{self.rpc_host}:{self.rpc_port}"

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def field_docs(cls) -> dict[str, str]:
        """Each field's docstring (the string literal right after it), on one line."""
        return _attribute_docs(cls)


@functools.cache
def _attribute_docs(cls: type) -> dict[str, str]:
    # read from the class source, as vLLM's config does: attribute docstrings are not
    # kept at runtime
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs
