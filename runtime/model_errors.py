"""Why a model the user named cannot be served: raised while resolving `--model` and
`--tokenizer` (`runtime.model_config`) or fetching from the Hub (`runtime.hub`)."""

from __future__ import annotations


class ModelNotFound(FileNotFoundError):
    """The `--model` argument names nothing we can load."""


class UnsupportedArchitecture(NotImplementedError):
    """The checkpoint's config asks for a piece of its architecture the runtime does not
    implement; `field` names the config.json field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class TokenizerError(ValueError):
    """The tokenizer is missing, does not load, or has ids the model has no embedding for."""


# what the user named (a model, its files, its tokenizer) cannot be served: one line says why
MODEL_ERRORS = (ModelNotFound, TokenizerError)
