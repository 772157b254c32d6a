"""Sluice in the peer protocol (`bench.peers.protocol`): `Engine` offline, `sluice serve`
served, both on the group's `dummy:` preset (random weights drawn in the worker) at their
defaults, with the job's dtype and options; served, it reads the model folder's tokenizer."""

from __future__ import annotations

import sys
from dataclasses import fields

from bench.peers.protocol import Job, as_flags, main, timed_import
from bench.serving.server_proc import git_rev
from runtime.procutil import free_port

# the defaults that shape throughput, reported beside the numbers
REPORTED = ("kv", "max_running", "chunk_size", "kv_slots", "mem_fraction", "overlap",
            "cuda_graph", "block_size", "attention_backend", "schedule_conservativeness")


def defaults(options: dict) -> dict:
    """`ServerConfig`'s defaults of `REPORTED`, with the job's options over them."""
    from runtime.config.server import ServerConfig

    base = {f.name: f.default for f in fields(ServerConfig) if f.name in REPORTED}
    return {**base, **{k: v for k, v in options.items() if k in REPORTED}}


class SluiceOffline:
    name = "sluice"

    def start(self, job: Job) -> dict:
        (Engine, self._params), import_s = timed_import("runtime", "Engine", "SamplingParams")
        self.engine = Engine(model=f"dummy:{job.group.preset}", dtype=job.dtype, seed=job.seed,
                             log_level="warning", **job.options)
        return {"version": f"git {git_rev()}", "import_s": import_s,
                "defaults": {**defaults(job.options), "kv_slots": self.engine.stats().kv_total}}

    def generate(self, prompts: list[list[int]], max_tokens: int) -> int:
        params = self._params(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        outs = self.engine.generate(prompts, params, text=False)
        return sum(len(o.token_ids) for o in outs)

    def stop(self) -> None:
        self.engine.shutdown()


def serve_argv(job: Job, port: int) -> list[str]:
    return [sys.executable, "-m", "runtime.launch.cli", "serve", "--model",
            f"dummy:{job.group.preset}", "--tokenizer", job.model_dir, "--dtype", job.dtype,
            "--seed", str(job.seed), "--host", "127.0.0.1", "--port", str(port),
            "--rpc-port", str(free_port()), *as_flags(job.options)]


if __name__ == "__main__":
    main(SluiceOffline(), serve_argv)
