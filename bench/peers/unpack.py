"""On the GPU host without network: gather the peer payload's parts, join, check, unpack.

The payload (`python -m bench.peers.payload`) travels as folders `.peers/<name>-<i>/`, one
or a few per transfer. Run this after each transfer, from the repository root:

    python3 -m bench.peers.unpack [--check]

It copies the parts carried this time into a store that outlives the transfer
(`/tmp/sluice-peers/<name>-parts`), says which parts are still to come, and once all are
there checks every part's and the whole archive's sha256, unpacks it to
`/tmp/sluice-peers/<name>` and (with `--check`) imports the peer there. Unpacking again
the same archive is skipped. Standard library only: it runs before anything is installed.

`peer_env(site)` is how a peer's process finds the unpacked packages: the folders the
manifest lists, first on PYTHONPATH, and the manifest's environment variables.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from bench.peers.archive import (
    MANIFEST,
    PartsError,
    check_whole,
    collect,
    missing,
    open_joined,
)

ROOT = Path(__file__).resolve().parents[2]
CARRY_ROOT = ROOT / ".peers"  # where the payload's folders arrive (git-ignored)
HOME = Path("/tmp/sluice-peers")  # outlives one transfer while the host stays up
DONE = ".unpacked"  # in an unpacked site: the sha256 of the archive it came from


def site_dir(name: str, home: Path = HOME) -> Path:
    return home / name


def unpacked_manifest(site: Path) -> dict | None:
    """The manifest of the archive unpacked at `site`, or None if there is none (yet)."""
    done, manifest = site / DONE, site / MANIFEST
    if not (done.is_file() and manifest.is_file()):
        return None
    found = json.loads(manifest.read_text())
    return found if found["sha256"] == done.read_text().strip() else None


def peer_env(site: Path) -> dict[str, str]:
    """Environment for a process that imports the peer unpacked at `site`: its folders
    first on PYTHONPATH (before the caller's), and the manifest's variables."""
    manifest = unpacked_manifest(site)
    if manifest is None:
        return {}
    paths = [str(site / p) for p in manifest.get("path", ())]
    old = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join(paths + ([old] if old else [])),
            **manifest.get("env", {})}


def unpack(manifest: dict, store: Path, site: Path) -> float:
    """Check the joined parts and unpack them to `site` (replacing it); seconds taken."""
    t0 = time.monotonic()
    check_whole(manifest, store)
    tmp = site.with_name(site.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with open_joined(manifest, store) as f, tarfile.open(fileobj=f, mode="r|xz") as tar:
        tar.extractall(tmp, filter="data")
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    (tmp / DONE).write_text(manifest["sha256"] + "\n")
    shutil.rmtree(site, ignore_errors=True)
    tmp.rename(site)
    return time.monotonic() - t0


def check_import(site: Path, timeout: float = 300.0) -> int:
    """Import the peer's module (`manifest["import"]`) in a fresh interpreter; its exit code."""
    module = unpacked_manifest(site)["import"]
    code = (f"import time; t = time.time(); import {module} as m; "
            f"print('import {module}', m.__version__, 'in', round(time.time() - t, 1), 's')")
    try:
        return subprocess.run([sys.executable, "-c", code], env={**os.environ,
                              **peer_env(site)}, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"import {module} took over {timeout:.0f} s")
        return 124


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="vllm", help="the payload's name (its folders' prefix)")
    ap.add_argument("--carried", type=Path, default=CARRY_ROOT,
                    help="where the carried folders are (default .peers/)")
    ap.add_argument("--home", type=Path, default=HOME, help="the store and the unpacked site")
    ap.add_argument("--check", action="store_true", help="import the peer once unpacked")
    args = ap.parse_args(argv)
    store, site = args.home / f"{args.name}-parts", site_dir(args.name, args.home)
    try:
        manifest = collect(sorted(args.carried.glob(f"{args.name}-*")), store)
        if manifest is None:
            print(f"no parts of {args.name!r}: carry the folders {args.carried.name}/"
                  f"{args.name}-<i> that `python -m bench.peers.payload` wrote")
            return 2
        if unpacked_manifest(site) == manifest:
            print(f"{site}: already unpacked ({manifest['sha256'][:12]}...)")
        elif todo := missing(manifest, store):
            have = len(manifest["parts"]) - len(todo)
            print(f"{have} of {len(manifest['parts'])} parts here; still to carry: "
                  + " ".join(f"{args.carried.name}/{p['folder']}" for p in todo))
            return 0
        else:
            seconds = unpack(manifest, store, site)
            print(f"unpacked {manifest['archive']} to {site} in {seconds:.1f} s")
    except PartsError as exc:
        print(f"error: {exc}")
        return 3
    env = peer_env(site)
    print("peer environment: " + " ".join(f"{k}={v}" for k, v in env.items()))
    return check_import(site) if args.check else 0


if __name__ == "__main__":
    sys.exit(main())
