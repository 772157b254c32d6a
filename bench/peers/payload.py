"""Build the payloads for the GPU host without network, on a machine with PyPI access.

    python -m bench.peers.payload [--set vllm --set sluice] [--work DIR] [--part-mib N]
    python -m bench.peers.payload --plan     # only print the transfers of what is built

For each package set (`bench.peers.package_sets`: vLLM and what it imports that the host's
image lacks; Sluice's own runtime dependencies the image lacks):
1. download (`pip download --no-deps`, CPython 3.12 manylinux wheels) its packages;
2. install them (`pip install --target`, no bytecode) into `site/` (and the set's extras,
   which go last on the path, into `site-extra/`);
3. trim what a run on an H200 (sm_90) never loads (each path with its reason);
4. tar the folders and compress them with xz -9;
5. split the archive into parts that each fit one transfer beside the repository's own
   files (a transfer carries 64 MiB in all) and write them, each with the sha256
   manifest, to `.peers/<set>-<i>/` (git-ignored).

Then it prints the transfers: the part folders packed into as few as fit, each followed on
the host by `python3 -m bench.peers.unpack`, which gathers, checks and unpacks the parts
(docs/peers.md has the sequence). Downloads are cached in `--work`.
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
from bench.peers.package_sets import SETS, PackageSet
from bench.peers.unpack import CARRY_ROOT, ROOT

TRANSFER_BYTES = 64 << 20  # one transfer: the repository's files and the carried folders
MARGIN_BYTES = 2 << 20
PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")


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


def trim(site: Path, patterns: tuple[tuple[str, str], ...]) -> int:
    """Remove the paths under `site` that `patterns` (glob, reason) name; bytes removed."""
    removed = 0
    for pattern, _ in patterns:
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


def build(pset: PackageSet, work: Path, carried: Path, part_bytes: int) -> dict:
    """Steps 1-5 of the module docstring for one package set; the manifest."""
    work = work / pset.name
    downloads, site, extra = work.parent / "downloads", work / "site", work / "site-extra"
    install(pset.packages, downloads, site)
    folders = [site]
    if pset.extra:
        install(pset.extra, downloads, extra)
        folders.append(extra)
    print(f"{pset.name}: trimmed {trim(site, pset.trim) / 2**20:.0f} MiB", flush=True)
    archive = work / f"{pset.name}.tar.xz"
    t0 = time.monotonic()
    compress(folders, archive)
    print(f"{archive.name}: {archive.stat().st_size / 2**20:.1f} MiB in "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    return split(archive, carried, pset.name, part_bytes,
                 {"import": pset.module, "path": [f.name for f in folders], "env": pset.env,
                  "packages": list(pset.packages + pset.extra), "python": PYTHON})


def carry_plan(carried: Path, room: int) -> list[list[Path]]:
    """Every part folder under `carried` (by name, then part), packed into transfers of at
    most `room` bytes each: each folder goes into the first transfer it still fits."""
    folders = sorted((f for f in carried.iterdir() if f.is_dir()),
                     key=lambda f: (f.name.rsplit("-", 1)[0], int(f.name.rsplit("-", 1)[1])))
    calls: list[list[Path]] = []
    for folder in folders:
        size = _size(folder)
        fits = [c for c in calls if sum(_size(f) for f in c) + size <= room]
        if fits:
            fits[0].append(folder)
        else:
            calls.append([folder])
    return calls


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", choices=sorted(SETS),
                    help="package sets to build (default: all)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/sluice-peers-build"),
                    help="downloads, the installed folders and the archives (~1.5 GB)")
    ap.add_argument("--part-mib", type=int, default=0,
                    help="part size (default: what a transfer leaves beside the repository)")
    ap.add_argument("--plan", action="store_true", help="only print the transfers")
    args = ap.parse_args(argv)
    room = default_part_bytes()
    if not args.plan:
        part_bytes = args.part_mib << 20 if args.part_mib else room
        for name in args.set or sorted(SETS, reverse=True):
            build(SETS[name], args.work, CARRY_ROOT, part_bytes)
    names = sorted({f.name.rsplit("-", 1)[0] for f in CARRY_ROOT.glob("*-*")})
    unpack = "python3 -m bench.peers.unpack " + " ".join(f"--name {n}" for n in names)
    calls = carry_plan(CARRY_ROOT, room)
    print(f"{len(calls)} transfers to the GPU host, back to back:")
    for i, call in enumerate(calls, 1):
        carry = ", ".join(f'"{f.relative_to(ROOT)}"' for f in call)
        check = " --check" if i == len(calls) else ""
        print(f"  {i}. carry [{carry}]  ({sum(map(_size, call)) / 2**20:.1f} MiB): "
              f"{unpack}{check}")


if __name__ == "__main__":
    main()
