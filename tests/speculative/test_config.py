"""The speculative flags are validated when the config is built."""

from __future__ import annotations

import pytest

from runtime.config.checks import ConfigError
from runtime.config.server import ServerConfig


@pytest.mark.parametrize("changes, field", [
    ({"speculative_algorithm": "medusa"}, "speculative_algorithm"),
    ({"speculative_num_draft_tokens": 0}, "speculative_num_draft_tokens"),
    ({"speculative_ngram_min": 3, "speculative_ngram_max": 2}, "speculative_ngram_min"),
    ({"speculative_ngram_min": 0}, "speculative_ngram_min"),
    ({"speculative_algorithm": "ngram", "kv": "paged", "block_size": "dynamic"},
     "speculative decoding"),
])
def test_bad_values_name_the_field(changes, field):
    with pytest.raises(ConfigError, match=field):
        ServerConfig(**changes)


def test_ngram_is_accepted_on_every_serving_layout():
    for kv in ("token", "paged", "contiguous"):
        assert ServerConfig(speculative_algorithm="ngram", kv=kv).speculative_algorithm == "ngram"
