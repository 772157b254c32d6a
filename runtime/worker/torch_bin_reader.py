"""Read a checkpoint's PyTorch `.bin` files (`pytorch_model.bin`, or the shards
`pytorch_model.bin.index.json` lists) as `safetensors_reader` reads safetensors ones, and a
folder's tensors from whichever of the two it ships, safetensors preferred
(`folder_slices`).

A `.bin` file is opened with `torch.load(weights_only=True, mmap=True)`: the unpickler
builds tensors and plain containers only (a file naming any other class is refused, never
run), and each tensor is a view of the mapped file, read when it is copied. A file that is
not a plain state dict (tensor names to tensors) is refused by name.
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from runtime.worker.safetensors_reader import (
    SAFETENSORS_FILE,
    WeightLoadError,
    checkpoint_files,
    read_slices,
)

BIN_FILE = "pytorch_model.bin"  # a one-file checkpoint; its index adds .index.json
UNPICKLER_ERROR = "WeightsUnpickler error: "  # where torch's message says what it refused


class TensorSlice:
    """A loaded tensor behind a safetensors slice's interface (`get_shape()`, indexing),
    so a `.bin` tensor goes wherever a safetensors slice goes."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def get_shape(self) -> list[int]:
        return list(self.tensor.shape)

    def __getitem__(self, index) -> torch.Tensor:
        return self.tensor[index]


def read_bin_slices(path: Path, wanted: Callable[[str], bool],
                    ) -> Iterator[tuple[str, TensorSlice]]:
    """The `wanted` tensors of `.bin` file `path`, as (name, `TensorSlice`). Raises
    WeightLoadError, naming the file, for one that is unreadable or not a plain state dict
    of tensors."""
    if not zipfile.is_zipfile(path):
        raise WeightLoadError(f"{path}: truncated, or not a PyTorch zip checkpoint "
                              "(torch.save's format since PyTorch 1.6)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        detail = str(e).split(UNPICKLER_ERROR, 1)[-1].split(". ", 1)[0]
        raise WeightLoadError(f"{path}: not a plain state dict of tensors: it holds other "
                              f"objects, which are not loaded ({detail})") from None
    except (RuntimeError, ValueError, EOFError) as e:
        first = str(e).split(". ", 1)[0]
        raise WeightLoadError(f"{path}: unreadable PyTorch checkpoint ({first})") from None
    if not isinstance(state, dict):
        raise WeightLoadError(f"{path}: holds a {type(state).__name__}, not a state dict of "
                              "tensors")
    for name, value in state.items():
        if not (isinstance(name, str) and isinstance(value, torch.Tensor)):
            raise WeightLoadError(f"{path}: entry {name!r} is a {type(value).__name__}, "
                                  "not a tensor: not a plain state dict of tensors")
    for name, tensor in state.items():
        if wanted(name):
            yield name, TensorSlice(tensor)


def weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors files (`checkpoint_files`) or, when it has none, its `.bin`
    files. Raises WeightLoadError for a folder with neither, or an index that lists a file
    the folder lacks."""
    for single in (SAFETENSORS_FILE, BIN_FILE):
        suffix = Path(single).suffix
        if (folder / f"{single}.index.json").exists() or any(folder.glob(f"*{suffix}")):
            return checkpoint_files(folder, single)
    raise WeightLoadError(f"no .safetensors or .bin files in {folder}")


def folder_slices(folder: Path, wanted: Callable[[str], bool]) -> Iterator[tuple[str, object]]:
    """The `wanted` tensors of the folder's weight files (`weight_files`), file by file, as
    (name, slice): a safetensors slice or a `TensorSlice`, both sized by `get_shape()` and
    read by indexing (`sl[...]`, the whole tensor)."""
    for path in weight_files(folder):
        read = read_bin_slices if path.suffix == ".bin" else read_slices
        yield from read(path, wanted)
