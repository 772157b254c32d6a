"""The model and how it runs: weights, tokenizer, dtypes, device, kernels, LoRA adapters."""

from __future__ import annotations

import os
from dataclasses import dataclass

from runtime.config.checks import ConfigError, require_at_least, require_one_of
from runtime.config.lora_paths import parse_lora_paths

DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float16", "bfloat16")
KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "int8")
QUANTIZATIONS = ("none", "fp8")
ATTENTION_BACKENDS = ("auto", "triton", "torch")


@dataclass(frozen=True)
class ModelOptions:
    """What model is served and how the workers run it."""

    model: str = "smollm2"
    """The model: `smollm2` (the bundled SmolLM2-135M-Instruct), `dummy:<preset>` (random
    weights), a Hugging Face folder (config.json, safetensors, tokenizer), a .gguf file, or
    a Hugging Face Hub id (`org/name`, fetched into the Hub cache on first use)."""
    revision: str = "main"
    """The Hub revision of a Hub id model: a branch, tag or commit."""
    tokenizer: str = ""
    """The tokenizer's folder or Hub id; empty: the model's own (a model without one, as
    `dummy:` presets, takes prompts as token ids only)."""
    generation_config: str = "auto"
    """Default sampling parameters for what a request leaves unset: `auto` (the model's
    generation_config.json), `none` (ignore it) or a folder holding one."""
    device: str = "auto"
    """The device: `auto` (CUDA when available), `cpu` or `cuda`."""
    dtype: str = "auto"
    """The weights' and activations' dtype: `float32`, `float16`, `bfloat16`, or `auto`
    (bfloat16 on a GPU, float32 on the CPU)."""
    kv_dtype: str = "auto"
    """The KV cache's storage: `auto` (the model's dtype), `fp8` / `int8` (quantized with a
    float32 scale per token and KV head), or `fp8_e4m3` (float8_e4m3fn with one scale for
    the whole tensor, 1: no scales stored or read; not for latent (MLA) pools)."""
    quantization: str = "none"
    """The weights of the layers' projections: `none` (the model's dtype) or `fp8`
    (float8_e4m3fn with a scale per output channel, quantized at load, activations
    quantized per token; needs a GPU of compute capability 8.9+, or runs dequantized on
    the CPU). The embedding and the LM head stay in the model's dtype."""
    mem_fraction: float = 0.85
    """The fraction of GPU memory the worker may use (weights, activations, KV pool)."""
    seed: int = 0
    """The random seed of weight initialization (dummy models) and sampling."""
    torch_threads: int = 0
    """Torch's intra-op threads in each worker; 0: on the CPU, the fastest of one, half
    and all of the CPUs the worker may use, re-measured on live steps as the machine's load
    changes (TP ranks split the CPUs evenly); on a GPU, torch's default."""
    attention_backend: str = "auto"
    """The attention kernels: `triton` (GPU; on the CPU only under TRITON_INTERPRET=1),
    `torch` (the kernels' torch references; no CUDA graphs), or `auto` (triton on a GPU,
    torch on the CPU)."""
    cuda_graph: bool = True
    """Capture decode CUDA graphs at start-up (GPU, triton attention only): the target's,
    and a drafter's (`--speculative-algorithm draft|eagle|mtp`)."""
    lora_paths: tuple[str, ...] = ()
    """LoRA adapters to serve, as `name=path` (a PEFT folder: adapter_config.json and
    adapter_model.safetensors); a request picks one by name (OpenAI `model`, SGLang
    `lora_path`, native `lora`)."""
    max_loras: int = 8
    """LoRA adapters held on the device at once; the others load when a request needs
    them, in the place of the least recently used one no running request holds."""
    max_lora_rank: int = 64
    """The largest LoRA rank an adapter may have."""

    def check_model(self) -> None:
        if not self.model:
            raise ConfigError("model must be set")
        if self.generation_config not in ("auto", "none") and not os.path.isfile(
                os.path.join(self.generation_config, "generation_config.json")):
            raise ConfigError("generation_config must be auto, none or a folder with "
                              f"generation_config.json, got {self.generation_config!r}")
        for name, allowed in (("device", DEVICES), ("dtype", DTYPES), ("kv_dtype", KV_DTYPES),
                              ("quantization", QUANTIZATIONS),
                              ("attention_backend", ATTENTION_BACKENDS)):
            require_one_of(self, name, allowed)
        require_at_least(self, ("torch_threads",), 0, " (0: auto)")
        if not 0.0 < self.mem_fraction <= 1.0:
            raise ConfigError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
        require_at_least(self, ("max_loras", "max_lora_rank"), 1)
        try:
            parse_lora_paths(self.lora_paths, self.model)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    @property
    def lora_adapters(self) -> dict[str, str]:
        """The LoRA adapters of `lora_paths`: name -> folder."""
        return parse_lora_paths(self.lora_paths, self.model)
