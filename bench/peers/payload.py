"""Build the vLLM payload for the GPU host without network, on a machine with PyPI access.

    python -m bench.peers.payload [--work /tmp/sluice-peers-build] [--part-mib N]

1. download (`pip download --no-deps`, CPython 3.12 manylinux wheels) vllm and the
   packages it imports that the GPU host's image lacks (`PACKAGES`), and a few that no
   traced import needs but an unusual code path might (`EXTRA`);
2. install them (`pip install --target`, no bytecode) into `site/` and `site-extra/`;
3. trim what a model on an H200 (sm_90) never loads (`TRIM`, each with its reason);
4. tar both folders and compress them with xz -9;
5. split the archive into parts that each fit one transfer beside the repository's own
   files (a transfer carries 64 MiB in all) and write them, each with the sha256
   manifest, to `.peers/vllm-<i>/` (git-ignored).

The GPU host's image has torch 2.11 (CUDA 13), triton, numpy, transformers, numba, scipy,
opencv, aiohttp, httpx, prometheus-client and tiktoken: vLLM 0.26.0 pins that torch. On
the host, `python3 -m bench.peers.unpack` after each transfer gathers, checks and unpacks
the parts (docs/peers.md has the sequence). Downloads are cached in `--work`.
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bench.peers.archive import split
from bench.peers.unpack import CARRY_ROOT, ROOT

NAME = "vllm"
VERSION = "0.26.0"
TRANSFER_BYTES = 64 << 20  # one transfer: the repository's files and the carried folders
MARGIN_BYTES = 2 << 20
PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")
# what `import vllm`, `LLM(...)`, `vllm serve` and `vllm bench serve` import that the image
# lacks. apache-tvm-ffi: vllm pins 0.1.10 but never imports it, and xgrammar 0.2.9 needs
# >= 0.1.11. typing-extensions: pydantic 2.14 needs >= 4.16, newer than the image may have.
PACKAGES = (
    f"vllm=={VERSION}",
    "pydantic==2.14.4", "pydantic-core==2.50.5", "typing-inspection==0.4.5",
    "annotated-types==0.8.0", "typing-extensions==4.16.0",
    "fastapi==0.136.3", "openai==3.63.0", "jiter==0.19.0", "sniffio==1.3.1", "httpx2==2.17.0",
    "httpcore2==2.17.0", "truststore==0.10.5", "cachetools==8.0.2", "blake3==1.0.11",
    "cbor2==6.3.0", "pybase64==1.5.1", "partial-json-parser==0.2.1.1.post7",
    "jsonschema==4.26.0", "referencing==0.37.0", "rpds-py==2026.9.1",
    "jsonschema-specifications==2025.9.1", "lark==1.2.2", "interegular==0.3.3",
    "lm-format-enforcer==0.11.3", "llguidance==1.7.6", "outlines-core==0.2.14",
    "xgrammar==0.2.9", "apache-tvm-ffi==0.1.15.post2", "torch-c-dlpack-ext==0.1.5",
    "compressed-tensors==0.17.0", "loguru==0.7.3", "depyf==0.20.0", "astor==0.8.1",
    "dill==0.4.1", "watchfiles==1.3.0", "python-json-logger==4.2.0", "ijson==3.6.0",
    "setproctitle==1.3.8", "openai-harmony==0.0.8", "mistral-common==1.13.1",
    "pydantic-extra-types==2.11.1", "gguf==0.19.0", "nvtx==0.2.15", "docstring-parser==0.18.0",
    "python-multipart==0.0.34", "sse-starlette==3.7.1", "uvicorn==0.55.0",
    "starlette==1.10.0", "prometheus-fastapi-instrumentator==8.1.0", "msgspec==0.23.0",
    "pyzmq==27.3.0",
)  # fmt: skip
# last on the path: they answer only an import nothing else answers
EXTRA = (
    "anthropic==2.17.0", "mcp==2.3.0", "mcp-types==2.3.0",
    "model-hosting-container-standards==0.1.16", "jmespath==1.1.0", "supervisor==4.3.0",
    "pyjwt==2.15.1", "opentelemetry-api==1.45.3", "opentelemetry-sdk==1.45.2",
    "opentelemetry-semantic-conventions==0.66b2", "opentelemetry-semantic-conventions-ai==0.5.1",
    "pycountry==26.2.16", "distro==1.9.0",
)  # fmt: skip
# (glob under site/, why an H200 run never loads it). The MoE kernels (_moe_C) stay: the
# DeepSeek-V2-Lite row needs them.
TRIM = (
    ("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "FA2 build: on sm_90 vLLM picks FA3"),
    ("vllm/vllm-rs", "Rust frontend binary, only with VLLM_USE_RUST_FRONTEND=1"),
    ("vllm/third_party/fmha_sm100", "sparse FMHA for sm_100"),
    ("vllm/third_party/deep_gemm/include", "DeepGEMM JIT headers (fp8 GEMMs only)"),
    ("vllm/third_party/deep_gemm/_C.cpython-31[!2]-*.so", "DeepGEMM for other Pythons"),
    ("mistral_common/data/tekken_*.json", "Mistral tokenizer data; no tokenizer is loaded"),
    ("bin", "console scripts; the peer runs through python -m"),
    ("**/__pycache__", "bytecode of the build machine's Python"),
)
ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0",  # flashinfer is not in the payload
       "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def pip(*args: str) -> None:
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", *args, "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", PYTHON, "--implementation", "cp", *plat]
    subprocess.run(cmd, check=True)


def install(packages: tuple[str, ...], downloads: Path, target: Path) -> None:
    """Download `packages` (cached in `downloads`) and install them into `target`."""
    downloads.mkdir(parents=True, exist_ok=True)
    pip("download", "-d", str(downloads), *packages)
    shutil.rmtree(target, ignore_errors=True)
    pip("install", "--no-index", "--find-links", str(downloads), "--no-compile", "--target",
        str(target), *packages)


def trim(site: Path) -> int:
    """Remove the `TRIM` paths under `site`; bytes removed."""
    removed = 0
    for pattern, _ in TRIM:
        for path in list(site.glob(pattern)):
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            removed += sum(p.stat().st_size for p in files)
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return removed


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def compress(folders: list[Path], dest: Path, level: int = 9, tool: bool = True) -> None:
    """tar `folders` (each under its own name) into `dest`, xz-compressed at `level`: by
    the xz tool on every core when there is one (and `tool`), else by Python's lzma."""
    xz = shutil.which("xz") if tool else None
    with open(dest, "wb") as out:
        if xz is None:
            with lzma.open(out, "wb", preset=level) as sink:
                _tar(folders, sink)
            return
        proc = subprocess.Popen([xz, f"-{level}", "-T0", "-c"], stdin=subprocess.PIPE,
                                stdout=out)
        with proc.stdin as sink:
            _tar(folders, sink)
        if proc.wait() != 0:
            raise RuntimeError(f"xz exited with {proc.returncode}")


def _tar(folders: list[Path], sink) -> None:
    with tarfile.open(fileobj=sink, mode="w|") as tar:
        for folder in folders:
            tar.add(folder, arcname=folder.name, filter=_plain)


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of the repository files a transfer carries (tracked, and untracked not ignored)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=root, capture_output=True, check=True).stdout
    return sum((root / n).stat().st_size for n in out.decode().split("\0")
               if n and (root / n).is_file())


def default_part_bytes() -> int:
    """The largest part that fits one transfer beside the repository's files (whole MiB)."""
    room = TRANSFER_BYTES - tree_bytes() - MARGIN_BYTES
    if room < 8 << 20:
        raise SystemExit(f"the repository's files leave {room >> 20} MiB of a transfer: too "
                         "little room for payload parts")
    return room >> 20 << 20


def build(work: Path, carried: Path, part_bytes: int) -> dict:
    """Steps 1-5 of the module docstring; the manifest."""
    downloads, site, extra = work / "downloads", work / "site", work / "site-extra"
    install(PACKAGES, downloads, site)
    install(EXTRA, downloads, extra)
    print(f"trimmed {trim(site) / 2**20:.0f} MiB", flush=True)
    archive = work / f"{NAME}-{VERSION}.tar.xz"
    t0 = time.monotonic()
    compress([site, extra], archive)
    print(f"{archive.name}: {archive.stat().st_size / 2**20:.1f} MiB in "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    return split(archive, carried, NAME, part_bytes,
                 {"import": NAME, "version": VERSION, "path": [site.name, extra.name],
                  "env": ENV, "python": PYTHON})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/sluice-peers-build"),
                    help="downloads, the installed folders and the archive (~1.5 GB)")
    ap.add_argument("--part-mib", type=int, default=0,
                    help="part size (default: what a transfer leaves beside the repository)")
    args = ap.parse_args(argv)
    part_bytes = args.part_mib << 20 if args.part_mib else default_part_bytes()
    manifest = build(args.work, CARRY_ROOT, part_bytes)
    folders = [f"{CARRY_ROOT.name}/{p['folder']}" for p in manifest["parts"]]
    print(f"{len(folders)} parts of at most {part_bytes >> 20} MiB: " + " ".join(folders))
    print("On the GPU host, one transfer per folder, each running "
          "`python3 -m bench.peers.unpack` (the last with --check).")


if __name__ == "__main__":
    main()
