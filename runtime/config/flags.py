"""Command-line flags from a frozen config dataclass: one `--field-name` flag per field,
its help the field's documentation, booleans with a `--no-` form, tuples of strings as
space-separated values."""

from __future__ import annotations

import argparse
import dataclasses


def add_field_flags(parser: argparse.ArgumentParser, cls: type, docs: dict[str, str],
                    skip: frozenset[str] = frozenset()) -> None:
    """One flag per field of dataclass `cls` but `skip`; `docs`: field name -> help."""
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = "auto" if f.default is None else f.default
        # argparse %-formats help strings
        text = f"{docs.get(f.name, '')} (default: {default})".replace("%", "%%").lstrip()
        if f.type in ("bool", bool, "bool | None"):  # None: decided later by the config
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=f.default, help=text)
        elif f.type == "tuple[str, ...]":  # `--lora-paths a=/x b=/y`
            parser.add_argument(flag, dest=f.name, nargs="+", type=str, default=f.default,
                                help=text)
        else:
            typ = {"int": int, "float": float}.get(str(f.type), str)
            parser.add_argument(flag, dest=f.name, type=typ, default=f.default, help=text)


def field_values(cls: type, args: argparse.Namespace,
                 skip: frozenset[str] = frozenset()) -> dict:
    """The parsed values of `cls`'s flags (lists as tuples), by field name."""
    names = {f.name for f in dataclasses.fields(cls)} - skip
    return {k: tuple(v) if isinstance(v, list) else v
            for k, v in vars(args).items() if k in names}
