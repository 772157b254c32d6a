"""`sluice serve` with a model it cannot serve: one line naming the file and the problem,
a non-zero exit, no traceback, and no process left behind, wherever the problem shows
(the launcher's checks, the api's tokenizer, the worker's weights)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.model_config import resolve_model
from tests.e2e.server import process_alive, wait_for
from tests.worker.checkpoints import BASE

LLAMA = dict(BASE, model_type="llama", architectures=["LlamaForCausalLM"], rms_norm_eps=1e-5)


def serve(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Run `sluice serve` until it exits; its exit code and output lines (stdout and
    stderr), once every process of its session is gone."""
    cmd = [sys.executable, "-m", "runtime.launch.cli", "serve", "--port", "0",
           "--rpc-port", "0", "--torch-threads", "2", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                            start_new_session=True)
    out, _ = proc.communicate(timeout=300)
    assert wait_for(lambda: not session_pids(proc.pid), timeout=30), session_pids(proc.pid)
    return proc.returncode, out.splitlines()


def session_pids(sid: int) -> list[int]:
    """The live processes of session `sid`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and process_alive(int(entry.name)):
            pids.append(int(entry.name))
    return pids


def assert_one_line_error(code: int, lines: list[str], expected_code: int, *needles: str):
    assert code == expected_code, lines
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    errors = [line for line in lines if all(n in line for n in needles)]
    assert len(errors) == 1, "\n".join(lines)
    assert len(lines) <= 3, "\n".join(lines)  # the error, and at most a library's warning


def model_folder(tmp_path: Path, config: dict | None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("config, needles", [
    (dict(model_type="gpt2", vocab_size=50257), ("config.json: ", "model_type 'gpt2'")),
    (dict(model_type="mamba2"), ("config.json: model_type 'mamba2'",)),
    (dict(model_type="not_a_model"), ("config.json: model_type 'not_a_model' is not supported",)),
    (dict(LLAMA, quantization_config=dict(quant_method="gptq", bits=4)),
     ("config.json: quantization_config.quant_method 'gptq' is not supported",)),
    (None, ("model: no config.json in this folder",)),
], ids=["gpt2", "mamba2", "unknown-type", "gptq", "no-config"])
def test_the_launcher_refuses_a_model_it_cannot_build(tmp_path, config, needles):
    folder = model_folder(tmp_path, config)
    code, lines = serve("--model", str(folder))
    assert_one_line_error(code, lines, 2, str(folder), *needles)


def test_an_uncached_hub_id_offline_is_one_line(tmp_path):
    code, lines = serve("--model", "tiny-org/not-cached",
                        env={"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path)})
    assert_one_line_error(code, lines, 2, "tiny-org/not-cached (revision main) is not in the "
                          f"Hugging Face cache {tmp_path}, and HF_HUB_OFFLINE is set")


def test_a_checkpoint_without_weights_fails_the_worker_in_one_line(tmp_path):
    folder = model_folder(tmp_path, LLAMA)
    code, lines = serve("--model", str(folder))
    assert_one_line_error(code, lines, 1, "worker failed to start: no .safetensors files in",
                          str(folder))


def test_a_tokenizer_larger_than_the_vocabulary_fails_the_api_in_one_line():
    tokenizer = resolve_model("smollm2").path
    code, lines = serve("--model", "dummy:tiny", "--tokenizer", tokenizer)
    assert_one_line_error(code, lines, 1, "api failed to start: ", tokenizer,
                          "the tokenizer has 49152 ids, the model (dummy:tiny) embeds only 1024")
