"""A large archive carried in parts: split into folders that each fit one transfer, with a
sha256 manifest in every folder, and joined again on the other side, checked part by part
and whole.

`split(archive, root, prefix, part_bytes, extra)` writes

    <root>/<prefix>-1/<archive>.1   <root>/<prefix>-1/manifest.json
    <root>/<prefix>-2/<archive>.2   <root>/<prefix>-2/manifest.json   ...

The manifest (the same in every folder) names the archive, its size and sha256, and each
part's folder, size and sha256, plus `extra` (what the archive holds and how to use it).
On the receiving side `collect` copies the parts of any carried folders into one store
(several transfers may each bring some), `missing` says which are still to come, and
`open_joined` reads the parts in order as one stream after `check_whole` verified them.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from collections.abc import Iterable
from pathlib import Path

MANIFEST = "manifest.json"
CHUNK = 1 << 20


class PartsError(RuntimeError):
    """A part is corrupt, belongs to another archive, or the whole does not check out."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def split(archive: Path, root: Path, prefix: str, part_bytes: int,
          extra: dict | None = None) -> dict:
    """Cut `archive` into parts of at most `part_bytes`, one folder `<prefix>-<i>` each
    under `root` (earlier `<prefix>-*` folders are removed first); the manifest."""
    if part_bytes < 1:
        raise ValueError(f"part_bytes must be >= 1, got {part_bytes}")
    for old in root.glob(f"{prefix}-*"):
        shutil.rmtree(old)
    parts, whole = [], hashlib.sha256()
    with open(archive, "rb") as src:
        while True:
            folder = root / f"{prefix}-{len(parts) + 1}"
            name = f"{archive.name}.{len(parts) + 1}"
            h, size = hashlib.sha256(), 0
            folder.mkdir(parents=True)
            with open(folder / name, "wb") as out:
                while size < part_bytes and (block := src.read(min(CHUNK, part_bytes - size))):
                    out.write(block)
                    h.update(block)
                    whole.update(block)
                    size += len(block)
            if size == 0 and parts:  # the archive ended on a part boundary
                shutil.rmtree(folder)
                break
            parts.append({"name": name, "folder": folder.name, "size": size,
                          "sha256": h.hexdigest()})
            if size < part_bytes:
                break
    manifest = {"archive": archive.name, "size": archive.stat().st_size,
                "sha256": whole.hexdigest(), "parts": parts, **(extra or {})}
    for p in parts:
        (root / p["folder"] / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def collect(folders: Iterable[Path], store: Path) -> dict | None:
    """Copy the parts found in `folders` into `store`, each checked against its manifest;
    the manifest of the archive they belong to (None when no folder has one). A store
    holding parts of another archive is emptied first."""
    manifest = None
    for folder in folders:
        if not (folder / MANIFEST).is_file():
            continue
        found = json.loads((folder / MANIFEST).read_text())
        if manifest is not None and found["sha256"] != manifest["sha256"]:
            raise PartsError(f"{folder} holds a part of another archive than the other "
                             "folders carried (build the parts again, carry one build)")
        manifest = found
        _adopt(store, manifest)
        for part in manifest["parts"]:
            src = folder / part["name"]
            if src.is_file() and not _good(store / part["name"], part):
                if not _good(src, part):
                    raise PartsError(f"{src}: size or sha256 differs from the manifest")
                shutil.copyfile(src, store / part["name"])
    if manifest is None and (store / MANIFEST).is_file():
        manifest = json.loads((store / MANIFEST).read_text())
    return manifest


def _adopt(store: Path, manifest: dict) -> None:
    """Make `store` the home of `manifest`'s parts, dropping another archive's."""
    path = store / MANIFEST
    if path.is_file() and json.loads(path.read_text())["sha256"] != manifest["sha256"]:
        shutil.rmtree(store)
    store.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=1) + "\n")


def _good(path: Path, part: dict) -> bool:
    return (path.is_file() and path.stat().st_size == part["size"]
            and sha256_of(path) == part["sha256"])


def missing(manifest: dict, store: Path) -> list[dict]:
    """The parts not (or not intact) in `store`."""
    return [p for p in manifest["parts"] if not _good(store / p["name"], p)]


def check_whole(manifest: dict, store: Path) -> None:
    """Raise `PartsError` unless the parts in `store`, joined, are the archive."""
    h, size = hashlib.sha256(), 0
    with open_joined(manifest, store) as f:
        while block := f.read(CHUNK):
            h.update(block)
            size += len(block)
    if size != manifest["size"] or h.hexdigest() != manifest["sha256"]:
        raise PartsError(f"the joined parts are not {manifest['archive']} "
                         f"({size} bytes, sha256 {h.hexdigest()[:12]}...; want "
                         f"{manifest['size']}, {manifest['sha256'][:12]}...)")


class _Joined(io.RawIOBase):
    """The parts' bytes, one file after the other, as one read-only stream."""

    def __init__(self, paths: list[Path]) -> None:
        self._paths = list(paths)
        self._file = None

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while True:
            if self._file is None:
                if not self._paths:
                    return 0
                self._file = open(self._paths.pop(0), "rb")  # noqa: SIM115 (closed below)
            n = self._file.readinto(buf)
            if n:
                return n
            self._file.close()
            self._file = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        super().close()


def open_joined(manifest: dict, store: Path) -> io.BufferedReader:
    """The archive as one buffered stream over its parts in `store`, in order."""
    return io.BufferedReader(_Joined([store / p["name"] for p in manifest["parts"]]), CHUNK)
