"""vLLM in the peer protocol (`bench.peers.protocol`): `LLM` offline and `vllm serve` served,
on the model folder's config.json with random weights (`load_format="dummy"`), at its
defaults, with the job's dtype and options. Offline it takes token ids and returns ids
(`skip_tokenizer_init`, `detokenize=False`), as Sluice's offline side does with
`text=False`; served it tokenizes and detokenizes with the folder's tokenizer."""

from __future__ import annotations

import sys

from bench.peers.protocol import Job, as_flags, main, timed_import

# (name in the report, attribute path under the engine's vllm_config)
REPORTED = (
    ("max_num_seqs", "scheduler_config.max_num_seqs"),
    ("max_num_batched_tokens", "scheduler_config.max_num_batched_tokens"),
    ("async_scheduling", "scheduler_config.async_scheduling"),
    ("gpu_memory_utilization", "cache_config.gpu_memory_utilization"),
    ("block_size", "cache_config.block_size"),
    ("enable_prefix_caching", "cache_config.enable_prefix_caching"),
    ("num_gpu_blocks", "cache_config.num_gpu_blocks"),
    ("cudagraph_mode", "compilation_config.cudagraph_mode"),
    ("max_cudagraph_capture_size", "compilation_config.max_cudagraph_capture_size"),
    ("max_model_len", "model_config.max_model_len"),
    ("dtype", "model_config.dtype"),
)


def _dig(obj, path: str):
    for name in path.split("."):
        obj = getattr(obj, name, None)
    return obj if obj is None or isinstance(obj, bool | int | float) else str(obj)


class VllmOffline:
    name = "vllm"

    def start(self, job: Job) -> dict:
        (LLM, self._params, version), import_s = timed_import(
            "vllm", "LLM", "SamplingParams", "__version__")
        self.llm = LLM(model=job.model_dir, load_format="dummy", skip_tokenizer_init=True,
                       dtype=job.dtype, seed=job.seed, **job.options)
        config = getattr(self.llm.llm_engine, "vllm_config", None)
        return {"version": version, "import_s": import_s,
                "defaults": {name: _dig(config, path) for name, path in REPORTED}}

    def generate(self, prompts: list[list[int]], max_tokens: int) -> int:
        params = self._params(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                              detokenize=False)
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                                 use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    def stop(self) -> None:
        del self.llm


def serve_argv(job: Job, port: int) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", job.model_dir,
            "--load-format", "dummy", "--dtype", job.dtype, "--seed", str(job.seed),
            "--host", "127.0.0.1", "--port", str(port), *as_flags(job.options)]


if __name__ == "__main__":
    main(VllmOffline(), serve_argv)
