"""`--lora-paths name=path ...`, `--max-loras`, `--max-lora-rank`: parsed, validated at
construction, and one-line CLI errors."""

from __future__ import annotations

import pytest

from runtime.config.checks import ConfigError
from runtime.config.server import ServerConfig
from runtime.launch.cli import build_parser, config_from_args, main


def test_flags_map_onto_the_fields():
    args = build_parser().parse_args(["serve", "--lora-paths", "sql=/a/sql", "chat=/b",
                                      "--max-loras", "2", "--max-lora-rank", "16"])
    cfg = config_from_args(args)
    assert cfg.lora_paths == ("sql=/a/sql", "chat=/b")
    assert cfg.lora_adapters == {"sql": "/a/sql", "chat": "/b"}
    assert (cfg.max_loras, cfg.max_lora_rank) == (2, 16)
    assert ServerConfig().lora_paths == () and ServerConfig().lora_adapters == {}


@pytest.mark.parametrize("paths, words", [
    (("sql",), "must be 'name=path'"),
    (("sql=",), "must be 'name=path'"),
    (("a:b=/x",), "the name must be"),
    (("sql=/a", "sql=/b"), "taken (twice)"),
    (("smollm2=/a",), "taken (by the base model)"),
    ("sql=/a", "must be a list"),
])
def test_bad_lora_paths_are_refused(paths, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        ServerConfig(lora_paths=paths)


@pytest.mark.parametrize("field", ["max_loras", "max_lora_rank"])
def test_slot_and_rank_bounds(field):
    with pytest.raises(ConfigError, match=f"{field} must be >= 1"):
        ServerConfig(**{field: 0})


def test_cli_error_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--lora-paths", "no-equals-sign"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("sluice: lora_paths entry 'no-equals-sign' must be "
                                       "'name=path'\n")
