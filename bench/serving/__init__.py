"""Served load: one or more `sluice serve` processes driven over HTTP, the client side's
TTFT / TPOT / ITL and the server's /metrics."""
