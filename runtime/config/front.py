"""The serving front: HTTP and RPC addresses, access, connection limits, output parsers."""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.config.checks import ConfigError, require_at_least, require_one_of

TOOL_CALL_PARSERS = ("auto", "none", "hermes", "llama3_json", "mistral", "deepseek_v3")
REASONING_PARSERS = ("none", "deepseek-r1", "qwen3")
REQUEST_BYTES_PER_TOKEN = 64  # JSON token ids take <= 8, text far less per token
MIN_REQUEST_BYTES = 1 << 20


@dataclass(frozen=True)
class FrontOptions:
    """How clients reach the server (the api process)."""

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
    max_request_bytes: int = 0
    """The largest HTTP request body or RPC message, in bytes: a larger body gets HTTP 413,
    a larger RPC message drops the client's connection; 0: 64 bytes per token of the
    context length, at least 1 MiB."""
    tool_call_parser: str = "auto"
    """Reads tool calls in the output: `hermes` (Qwen2.5, Qwen3), `llama3_json`, `mistral`,
    `deepseek_v3`, `auto` (the one the chat template shows) or `none`."""
    reasoning_parser: str = "none"
    """Splits `<think>` reasoning into `reasoning_content`: `deepseek-r1`, `qwen3` or `none`."""

    def check_front(self) -> None:
        if not self.host or not self.rpc_host:
            raise ConfigError("host and rpc_host must be set")
        for name in ("port", "rpc_port"):
            if not 0 <= getattr(self, name) < 65536:
                raise ConfigError(f"{name} must be a TCP port, got {getattr(self, name)}")
        if self.api_key and not (self.api_key.isascii() and self.api_key.isprintable()
                                 and " " not in self.api_key):
            raise ConfigError("api_key must be printable ASCII without spaces")
        if not self.read_timeout > 0:
            raise ConfigError(f"read_timeout must be > 0, got {self.read_timeout}")
        require_at_least(self, ("max_connections", "max_rpc_connections"), 1)
        require_at_least(self, ("max_request_bytes",), 0, " (0: from the context length)")
        require_one_of(self, "tool_call_parser", TOOL_CALL_PARSERS)
        require_one_of(self, "reasoning_parser", REASONING_PARSERS)

    def request_bytes_limit(self, max_context: int) -> int:
        """`max_request_bytes`, or its default for a context of `max_context` tokens."""
        return self.max_request_bytes or max(MIN_REQUEST_BYTES,
                                             REQUEST_BYTES_PER_TOKEN * max_context)

    @property
    def rpc_addr(self) -> str:
        return f"tcp://{self.rpc_host}:{self.rpc_port}"
