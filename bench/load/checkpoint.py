"""A random checkpoint of a dummy preset's shape, written as a Hugging Face folder: bf16
safetensors under the transformers tensor names, sharded as the Hub's checkpoints are
(`model-0000i-of-0000n.safetensors` of at most `shard_bytes` each, with
`model.safetensors.index.json`; one `model.safetensors` when it fits in one), `config.json`
and a word-level tokenizer so that a server can start on it (prompts are token ids).

Every tensor is drawn from a generator seeded by the seed and its name, so `random_tensor`
gives any tensor again without the folder: matrices ~ N(0, 0.02), norms ~ 1 + N(0, 0.02).
The names and shapes are those the model built from the config asks for
(`checkpoint_targets`), in the model's order; at most one shard is in memory at a time.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

from runtime.model_config import resolve_model
from runtime.worker.loader import build_model

STD = 0.02
DTYPE = torch.bfloat16
MARKER = "bench-load.json"  # what the folder was written with, to reuse it


def tensor_shapes(preset: str) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor of `dummy:<preset>` by its transformers name, in model order."""
    with torch.device("meta"):
        model = build_model(resolve_model(f"dummy:{preset}").hf_config(), None, "none")
    params = dict(model.named_parameters())
    return {name: (rows, *params[param].shape[1:])
            for name, (param, _, rows) in model.checkpoint_targets().items()}


def random_tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Tensor `name` of the checkpoint written with `seed`, in bf16."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    t = torch.empty(shape, dtype=torch.float32).normal_(0.0, STD, generator=gen)
    return (t + 1.0 if name.endswith("norm.weight") else t).to(DTYPE)


def shard_plan(shapes: dict[str, tuple[int, ...]], shard_bytes: int) -> list[list[str]]:
    """Tensor names per file: in order, a new file whenever the next tensor would take the
    current one past `shard_bytes` (a tensor larger than that gets a file of its own)."""
    files: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = DTYPE.itemsize * torch.Size(shape).numel()
        if files[-1] and size + nbytes > shard_bytes:
            files.append([])
            size = 0
        files[-1].append(name)
        size += nbytes
    return files


def file_names(count: int) -> list[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A word-level tokenizer of `vocab_size` words `w<i>` (ids 0-2: unk, bos, eos)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(folder)


def write_checkpoint(folder: Path, preset: str, shard_bytes: int,
                     seed: int = 0) -> tuple[list[Path], bool]:
    """Write the random checkpoint of `preset` to `folder`, unless it was written with the
    same arguments already; (its safetensors files, whether they were written now)."""
    wanted = {"preset": preset, "shard_bytes": shard_bytes, "seed": seed, "dtype": str(DTYPE)}
    marker = folder / MARKER
    shapes = tensor_shapes(preset)
    plan = shard_plan(shapes, shard_bytes)
    paths = [folder / name for name in file_names(len(plan))]
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return paths, False
    folder.mkdir(parents=True, exist_ok=True)
    for old in [*folder.glob("*.safetensors"), folder / "model.safetensors.index.json", marker]:
        old.unlink(missing_ok=True)
    config = resolve_model(f"dummy:{preset}").hf_config()
    config.dtype = DTYPE
    config.save_pretrained(folder)
    write_tokenizer(folder, config.vocab_size)
    for path, names in zip(paths, plan, strict=True):
        save_file({n: random_tensor(n, shapes[n], seed) for n in names}, str(path),
                  metadata={"format": "pt"})
    if len(paths) > 1:
        total = sum(DTYPE.itemsize * torch.Size(s).numel() for s in shapes.values())
        weight_map = {n: p.name for p, names in zip(paths, plan, strict=True) for n in names}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    marker.write_text(json.dumps(wanted))
    return paths, True


def state_dict(preset: str, seed: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors as written, one at a time, without the folder."""
    for name, shape in tensor_shapes(preset).items():
        yield name, random_tensor(name, shape, seed)
