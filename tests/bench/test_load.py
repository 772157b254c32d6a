"""`python -m bench.load` on the tiny preset, on the CPU: the folder it writes is a sharded
Hugging Face checkpoint that loads to the weights it was drawn from (transformers' logits on
those weights), and its report has every figure."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from bench.load.checkpoint import state_dict
from bench.load.driver import main, parse_size
from bench.load.memory import MemorySampler, release_free_memory, status_bytes
from runtime.model_config import resolve_model
from runtime.worker.loader import empty_model, load_hf_folder
from tests.worker.batching import assert_prefill_matches_hf

SHARD = "200KB"  # the tiny preset is ~4 MB in bf16


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("load")
    folder, out = tmp / "ckpt", tmp / "report"
    res = main(["--preset", "tiny", "--dir", str(folder), "--shard-size", SHARD,
                "--device", "cpu", "--repeats", "2", "--out", str(out)])
    return folder, out, res


def test_the_report_has_every_figure(report):
    _, out, res = report
    assert json.loads(out.with_suffix(".json").read_text()) == json.loads(json.dumps(res))
    meta = res["meta"]
    assert meta["command"].startswith("python -m bench.load --preset tiny")
    assert meta["device"] == "cpu" and meta["date"] and meta["dtype"] == "float32"
    assert res["read"]["gb"] == pytest.approx(res["checkpoint_gb"]) and res["read"]["gb_s"] > 0
    for name in ("load_cold", "load_warm"):
        r = res[name]
        assert r["s"] > 0 and r["base_anon_gb"] > 0 and r["peak_rss_gb"] > 0
        assert r["model_gb"] == pytest.approx(2 * res["checkpoint_gb"], rel=0.01)  # fp32
        assert {"anon_over_base_gb", "anon_over_model_gb", "gpu_peak_gb"} <= r.keys()
    assert len(res["read"]["all_s"]) == len(res["load_cold"]["all_s"]) == 2
    eng = res["engine"]
    assert eng["generated"] == 4 and eng["start_s"] > 0 and eng["worker_peak_rss_gb"] > 0
    md = out.with_suffix(".md").read_text()
    head = md.splitlines()[:5]  # the lines `bench.index` lists the report by
    assert head[2].startswith("Question: How long does loading tiny (float32")
    assert head[3].startswith(f"Answer: cold load {res['load_cold']['s']:.2f} s")
    for phase in ("read the files once", "load, cold", "load, warm",
                  "Engine() to ready, cold"):
        assert f"| {phase} |" in md
    assert "cold load <= 1.2x the read" in md and "Engine() start-up <= 30 s" in md


def test_the_folder_is_sharded_like_hub_checkpoints(report):
    folder, _, res = report
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files == res["files"]
    assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert set(index["weight_map"]) == {name for name, _ in state_dict("tiny")}
    held = {f: [n for n, g in index["weight_map"].items() if g == f] for f in files}
    for f in files:  # at most the shard size of data, or one tensor larger than that
        assert len(held[f]) == 1 or (folder / f).stat().st_size < parse_size(SHARD) + 4096


def test_the_folder_loads_to_the_weights_it_was_drawn_from(report):
    folder, _, _ = report
    spec = resolve_model(str(folder))
    hf = AutoModelForCausalLM.from_config(spec.hf_config(), dtype=torch.float32).eval()
    hf.load_state_dict({name: t.float() for name, t in state_dict("tiny")}, strict=True)
    assert_prefill_matches_hf(spec, hf, list(range(3, 40)))


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9 and parse_size("100MB") == 10**8
    assert parse_size("2GiB") == 2 * 2**30 and parse_size("1234") == 1234


def test_filling_a_model_copies_no_tensor_to_the_host(tmp_path):
    """Loading into allocated (and touched) parameters adds no checkpoint tensor's worth of
    anonymous host memory (RssAnon sampled every 5 ms): the copies read views of the mapped
    file, converting bf16 to fp32 on the fly."""
    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=8, vocab_size=32000)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp_path)
    model = empty_model(resolve_model(str(tmp_path)).hf_config(), "cpu", torch.float32)
    for p in model.parameters():
        p.zero_()  # every page of the model resident before the baseline
    largest = max(p.numel() * p.element_size() for p in model.parameters())  # fp32 embedding
    release_free_memory()
    base = status_bytes()["RssAnon"]
    with MemorySampler() as mem:
        load_hf_folder(model, tmp_path)
    assert mem.own.rss_anon - base < largest / 2  # less than the bf16 embedding
