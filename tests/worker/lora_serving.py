"""Test helper: a tiny checkpoint with LoRA adapters, and a scheduler and worker serving
them in one process, stepped as the server steps them."""

from __future__ import annotations

import torch

from runtime.config.server import ServerConfig
from runtime.model_config import spec_for
from runtime.scheduler.loop import build_scheduler
from runtime.wire.sampling import SamplingParams
from runtime.wire.scheduler_input import GenerateReq
from runtime.worker.worker import Worker
from tests.worker.checkpoints import BASE, tiny_checkpoint
from tests.worker.in_process import run_to_end
from tests.worker.lora_adapters import tiny_adapters

MAX_TOKENS = 12


def checkpoint_with_adapters(name: str, tmp):
    """(base folder, adapter folders, reference models by adapter name, None the base)."""
    base = tiny_checkpoint(name, tmp / "base")
    folders, merged = tiny_adapters(tmp / "base", tmp)
    return str(tmp / "base"), folders, {None: base, **merged}


def config(base: str, folders: dict[str, str], **options) -> ServerConfig:
    """A CPU fp32 server of `base` with the adapters `folders` (`options` override)."""
    defaults = dict(device="cpu", dtype="float32", kv_slots=512, max_running=8, chunk_size=48,
                    torch_threads=2, log_level="warning")
    return ServerConfig(model=base, lora_paths=tuple(f"{n}={p}" for n, p in folders.items()),
                        **{**defaults, **options})


class InProcess:
    """A scheduler and a worker stepped in one process, as the server steps them."""

    def __init__(self, cfg: ServerConfig) -> None:
        spec = spec_for(cfg)
        self.worker = Worker(cfg, spec)
        self.sched = build_scheduler(cfg, self.worker.ready_message(), spec.max_context)
        self.count = 0

    def run(self, requests: list[tuple[list[int], str | None]]) -> list[tuple[list[int], int]]:
        """Submit every (prompt, adapter) at once and run them to the end: (output ids,
        cached prompt tokens) of each."""
        rids = []
        for prompt, lora in requests:
            rids.append(f"r{self.count}")
            self.count += 1
            params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, lora=lora)
            self.sched.add(GenerateReq(rids[-1], prompt, params))
        outs = {rid: [] for rid in rids}
        cached = dict.fromkeys(rids, 0)
        run_to_end(self.sched, self.worker, outs, cached)
        return [(outs[r], cached[r]) for r in rids]


def prompts(n: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, BASE["vocab_size"], (k,), generator=gen).tolist()
            for k in torch.randint(5, 70, (n,), generator=gen).tolist()]
