"""Read a checkpoint's safetensors files (`checkpoint_files`) tensor by tensor, each TP rank
only the part it holds.

The file is memory-mapped (`safe_open` on the CPU): a tensor, or this rank's rows or
columns of it, is a view of the mapped file pages, and the loader copies that view
straight into the model's parameter on its device. The host never holds more than one
tensor outside the page cache (a column slice, or a dtype conversion, may be made
contiguous on its way to a GPU), so a rank's anonymous memory stays flat while it loads,
and each rank reads only its share of the bytes: its rows of a row-split tensor; for a
column-split one, the pages its columns fall on.

The copies fault the file in as they go, in file order, and the kernel's read-ahead keeps
the disk streaming. The header is checked against the file's size first, so a truncated
file is refused by name and tensor before any data is read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from runtime.worker.tp import TPGroup

HEADER_LEN_BYTES = 8  # little-endian u64: the length of the JSON header that follows
MAX_HEADER_BYTES = 100 * 2**20  # larger than any real header: a corrupt length
FP8_DTYPE = "F8_E4M3"  # safetensors' name for torch.float8_e4m3fn
FP4_DTYPE = "I8"  # int8: how checkpoints store packed fp4 pairs
SAFETENSORS_FILE = "model.safetensors"  # a one-file checkpoint; its index adds .index.json

SplitDim = Callable[[str], int | None]


class WeightLoadError(RuntimeError):
    """A checkpoint does not fit the model built from its config, or cannot be read."""


def checkpoint_files(folder: Path, single: str = SAFETENSORS_FILE) -> list[Path]:
    """The weight files of a HF folder saved as `single` (`model.safetensors`, or
    `pytorch_model.bin`): the shards its index `<single>.index.json` lists, else `single`,
    else every file of its suffix. Raises WeightLoadError for a folder without any, or a
    shard the index lists but the folder lacks."""
    index = folder / f"{single}.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise WeightLoadError(f"{index}: lists {len(missing)} missing file(s): "
                                  f"{', '.join(missing[:3])}")
        return files
    if (folder / single).exists():
        return [folder / single]
    suffix = Path(single).suffix
    found = sorted(folder.glob(f"*{suffix}"))
    if not found:
        raise WeightLoadError(f"no {suffix} files in {folder}")
    return found


def tensor_spans(path: Path) -> dict[str, tuple[int, int]]:
    """Each tensor's bytes `[start, end)` in the file `path`, in file order, after checking
    that the header and every tensor's bytes lie within the file."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(HEADER_LEN_BYTES)
        if len(head) < HEADER_LEN_BYTES:
            raise WeightLoadError(f"{path}: {size} bytes, too short for a safetensors header")
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER_BYTES:
            raise WeightLoadError(f"{path}: not a safetensors file (header length {n})")
        if HEADER_LEN_BYTES + n > size:
            raise WeightLoadError(f"{path}: truncated: its header needs "
                                  f"{HEADER_LEN_BYTES + n} bytes, the file has {size}")
        base = HEADER_LEN_BYTES + n
        try:
            header = json.loads(fh.read(n))
            header.pop("__metadata__", None)
            spans = {name: (base + e["data_offsets"][0], base + e["data_offsets"][1])
                     for name, e in header.items()}
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            raise WeightLoadError(f"{path}: unreadable safetensors header ({e!r})") from None
    ordered = dict(sorted(spans.items(), key=lambda item: item[1][0]))
    for name, (_, end) in ordered.items():
        if end > size:
            raise WeightLoadError(f"{path}: truncated: tensor {name} ends at byte {end}, "
                                  f"the file has {size}")
    return ordered


def read_slices(path: Path, wanted: Callable[[str], bool]) -> Iterator[tuple[str, object]]:
    """The `wanted` tensors of safetensors file `path` in file order, as (name, safetensors
    slice). Raises WeightLoadError, naming the file, for a truncated or unreadable one."""
    names = [name for name in tensor_spans(path) if wanted(name)]
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in names:
                yield name, f.get_slice(name)
    except SafetensorError as e:
        raise WeightLoadError(f"{path}: {e}") from None


def rank_part(sl, name: str, tp: TPGroup, split_dim: SplitDim) -> torch.Tensor:
    """This rank's part of checkpoint tensor `name`, from its safetensors slice `sl`: the
    whole tensor when `split_dim(name)` is None or there is one rank, else the rank's
    contiguous 1/size of it along that dim (which the caller has checked divides). A view
    of the mapped file: nothing is read until it is copied."""
    dim = split_dim(name) if tp.size > 1 else None
    if dim is None:
        return sl[...]
    shape = sl.get_shape()
    n = shape[dim] // tp.size
    index = [slice(None)] * len(shape)
    index[dim] = slice(tp.rank * n, (tp.rank + 1) * n)
    return sl[tuple(index)]
