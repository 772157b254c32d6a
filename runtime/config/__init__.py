"""The server's configuration: `ServerConfig` (`server`), one frozen dataclass built from
option groups (`model`, `front`, `scheduling`, `scale_out`, `monitoring`), each holding its
fields, their docs and its checks. Modules are imported by name; this package re-exports
nothing."""
