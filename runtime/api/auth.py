"""The API key (`--api-key` / SLUICE_API_KEY), shared by the HTTP and RPC fronts."""

from __future__ import annotations

import hmac
import ipaddress
import logging

log = logging.getLogger(__name__)

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})  # listen on every address


def key_matches(given: str | bytes | None, expected: str) -> bool:
    """Whether a client's key is the server's (always, when the server has none); the
    comparison takes the same time wherever the strings differ."""
    if not expected:
        return True
    if given is None:
        return False
    if isinstance(given, str):
        given = given.encode("utf-8", "surrogateescape")
    return hmac.compare_digest(given, expected.encode())


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or name to listen on) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def warn_if_exposed(front: str, host: str, api_key: str) -> None:
    """Log a warning when `front` listens beyond loopback with no API key."""
    if not api_key and not is_loopback(host):
        log.warning(
            "%s listens on %s without an API key: anyone who can reach this address "
            "can use the server. Set SLUICE_API_KEY (or --api-key), or listen on "
            "127.0.0.1.",
            front,
            host or "every address",
        )
