"""The model's default sampling parameters (its generation_config.json), for the fields a
request leaves unset.

`--generation-config auto` reads the model folder's file, a folder path reads that folder's,
`none` ignores it. Only these keys are read: temperature, top_p, top_k, min_p,
repetition_penalty, and max_new_tokens (the default max_tokens); `do_sample` is not.
The tokenizer manager applies them to every request, whichever API it came through.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from runtime.wire.errors import InvalidRequest
from runtime.wire.sampling import SamplingParams

# generation_config.json key -> the SamplingParams field it defaults
GENERATION_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                   "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                   "max_new_tokens": "max_tokens"}
_BUILTIN = SamplingParams()


class InvalidGenerationConfig(ValueError):
    """A generation_config.json whose sampling values are not valid parameters."""


@dataclass(frozen=True)
class SamplingDefaults:
    """Default values of SamplingParams fields, by field name (empty: none)."""

    values: dict[str, float | int] = field(default_factory=dict)

    @classmethod
    def load(cls, source: str, model_path: str | None) -> SamplingDefaults:
        """The defaults `--generation-config source` names (`auto`: the file in
        `model_path`, if any; `none`; or a folder). Raise `InvalidGenerationConfig`."""
        folder = {"auto": model_path, "none": None}.get(source, source)
        path = Path(folder) / "generation_config.json" if folder is not None else None
        if path is None or not path.is_file():
            return cls()
        raw = json.loads(path.read_text())
        values = {name: raw[key] for key, name in GENERATION_KEYS.items()
                  if raw.get(key) is not None}
        try:
            SamplingParams(**values).validate()
        except (InvalidRequest, TypeError) as exc:
            raise InvalidGenerationConfig(f"{path}: {exc}") from None
        return cls(values)

    def apply(self, params: SamplingParams, given: Collection[str] | None) -> set[str]:
        """Set each field of `params` the request left unset to its default; return the
        names set. `given`: the fields the request set; None: those whose value differs
        from SamplingParams' own default (all a struct can tell, as for the Python
        `Engine` and the RPC client, whose wire form omits default values)."""
        filled = set()
        for name, value in self.values.items():
            unset = getattr(params, name) == getattr(_BUILTIN, name) if given is None \
                else name not in given
            if unset:
                setattr(params, name, value)
                filled.add(name)
        return filled
