"""`bench.offline.lora`: its random adapters are valid PEFT folders of the model's shapes,
and the report shows every row, a failed one with its error."""

import torch

from bench.offline import lora as bench
from runtime.model_config import resolve_model
from runtime.worker.lora.manager import LoraOptions
from runtime.worker.model_runner import ModelRunner


def test_random_adapters_load_for_every_projection(tmp_path):
    paths = bench.write_adapters("dummy:tiny", tmp_path, 2, rank=4)
    assert [p.split("=")[0] for p in paths] == ["adapter0", "adapter1"]
    runner = ModelRunner(resolve_model("dummy:tiny"), "cpu", torch.float32, kv_slots=64,
                         max_rows=2, lora=LoraOptions(dict(p.split("=") for p in paths), 2, 4))
    assert len(runner.lora.layers) == 2 * 4  # qkv, o, gate_up, down of each layer
    runner.lora.load_slots([(0, "adapter0"), (1, "adapter1")])
    assert runner.lora.resident == ["adapter0", "adapter1"]


def test_report_rows():
    ok = {"tok_s": 1000.0, "all_tok_s": [990.0, 1000.0]}
    res = {"model": "m", "dtype": "bfloat16", "adapters": 8, "rank": 16, "command": "c",
           "device": "d", "date": "t",
           "offline": {"base": ok, "lora-none": {**ok, "tok_s": 950.0},
                       "lora-mixed": {"error": "exit code 1"}},
           "steps": {"graphs": True, "steps": [{"batch": 1, "context": 576, "none_ms": 2.0,
                                                "mixed_ms": 2.5, "ratio": 1.25}]}}
    text = bench.markdown(res)
    assert "| lora-none | 950 | 0.95 |" in text
    assert "| lora-mixed | - | - | exit code 1 |" in text
    assert "| 1 | 576 | 2.000 | 2.500 | 1.25 |" in text
