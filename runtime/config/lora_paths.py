"""`--lora-paths name=path ...`: the LoRA adapters a server loads, by the names requests
pick them with."""

from __future__ import annotations

import re

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # no ":" (OpenAI's "base:name")


def parse_lora_paths(entries: object, model: str) -> dict[str, str]:
    """`name -> path` of `entries`, a tuple (or list) of "name=path" strings; raise
    ValueError naming the first bad entry. Names are unique, at most 64 characters of
    letters, digits, '.', '_' and '-', and never the base model's name."""
    if isinstance(entries, str) or not isinstance(entries, (tuple, list)):
        raise ValueError(f"lora_paths must be a list of 'name=path' strings, got {entries!r}")
    adapters: dict[str, str] = {}
    for entry in entries:
        name, sep, path = entry.partition("=") if isinstance(entry, str) else ("", "", "")
        if not sep or not path:
            raise ValueError(f"lora_paths entry {entry!r} must be 'name=path'")
        if not NAME.fullmatch(name):
            raise ValueError(f"lora_paths entry {entry!r}: the name must be 1-64 letters, "
                             "digits, '.', '_' or '-' (starting with a letter or digit)")
        if name in adapters or name == model:
            raise ValueError(f"lora_paths entry {entry!r}: the name {name!r} is taken "
                             f"({'by the base model' if name == model else 'twice'})")
        adapters[name] = path
    return adapters
