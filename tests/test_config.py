"""`ServerConfig`'s field docstrings and the `sluice serve --help` they become."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from runtime.config.checks import ConfigError
from runtime.config.server import ServerConfig
from runtime.launch.cli import _INTERNAL, build_parser


def serve_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def test_every_field_has_a_docstring():
    docs = ServerConfig.field_docs()
    missing = [f.name for f in dataclasses.fields(ServerConfig) if not docs.get(f.name)]
    assert not missing, f"ServerConfig fields without a docstring: {missing}"
    assert "\n" not in "".join(docs.values())  # one line each, ready for --help


def test_every_flag_has_its_fields_docstring_as_help():
    docs = ServerConfig.field_docs()
    flags = {a.dest: a for a in serve_parser()._actions if a.dest != "help"}
    assert set(flags) == set(ServerConfig.field_names()) - _INTERNAL
    for name, action in flags.items():
        assert action.help and action.help.startswith(docs[name]), name
        assert "(default: " in action.help, name


def test_help_prints_the_docstrings_of_boolean_flags_too(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["serve", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--overlap, --no-overlap Overlap scheduling" in text
    assert "--cuda-graph, --no-cuda-graph Capture decode CUDA graphs" in text
    assert "Prefill tokens per step (chunked prefill)" in text  # --chunk-size


def test_attention_backend_flag_is_validated():
    args = build_parser().parse_args(["serve", "--attention-backend", "torch"])
    assert args.attention_backend == "torch"
    assert ServerConfig().attention_backend == "auto"  # triton on a GPU, torch on the CPU
    with pytest.raises(ConfigError, match="attention_backend"):
        ServerConfig(attention_backend="flash")


def test_quantization_flag_is_validated():
    args = build_parser().parse_args(["serve", "--quantization", "fp8"])
    assert args.quantization == "fp8"
    assert ServerConfig().quantization == "none"
    with pytest.raises(ConfigError, match="quantization must be one of"):
        ServerConfig(quantization="int4")


def test_tool_call_and_reasoning_parsers_are_checked():
    cfg = ServerConfig(tool_call_parser="hermes", reasoning_parser="qwen3")
    assert (cfg.tool_call_parser, cfg.reasoning_parser) == ("hermes", "qwen3")
    assert ServerConfig().tool_call_parser == "auto" and ServerConfig().reasoning_parser == "none"
    with pytest.raises(ConfigError, match="tool_call_parser must be one of"):
        ServerConfig(tool_call_parser="qwen")
    with pytest.raises(ConfigError, match="reasoning_parser must be one of"):
        ServerConfig(reasoning_parser="r1")


def test_generation_config_flag_is_validated(tmp_path):
    args = build_parser().parse_args(["serve", "--generation-config", "none", "--revision",
                                      "v1", "--tokenizer", "org/tok"])
    assert (args.generation_config, args.revision, args.tokenizer) == ("none", "v1", "org/tok")
    assert ServerConfig().generation_config == "auto"
    with pytest.raises(ConfigError, match="generation_config must be auto, none or a folder"):
        ServerConfig(generation_config=str(tmp_path))  # no generation_config.json in it
    (tmp_path / "generation_config.json").write_text("{}")
    assert ServerConfig(generation_config=str(tmp_path)).generation_config == str(tmp_path)
