"""`ConfigError` and the checks option groups share: each raises `ConfigError` naming the
field at fault."""

from __future__ import annotations

from collections.abc import Iterable


class ConfigError(ValueError):
    """A server option is invalid."""


def require_one_of(options: object, name: str, allowed: Iterable[str]) -> None:
    """`options.<name>` is one of `allowed`."""
    value = getattr(options, name)
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {allowed}, got {value!r}")


def require_at_least(options: object, names: Iterable[str], low: int, note: str = "") -> None:
    """Each `options.<name>` is >= `low` (`note`: what the bound means, said after it)."""
    for name in names:
        value = getattr(options, name)
        if value < low:
            raise ConfigError(f"{name} must be >= {low}{note}, got {value}")
