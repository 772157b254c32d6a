"""On the GPU host without network: gather the peer payload's parts, join, check, unpack.

The payload (`python -m bench.peers.payload`) travels as folders `.peers/<name>-<i>/`, one
or a few per transfer. Run this after each transfer, from the repository root:

    python3 -m bench.peers.unpack --name vllm --name sluice [--check]

For each payload it copies the parts carried this time into a store that outlives the
transfer (`/tmp/sluice-peers/<name>-parts`), says which parts are still to come, and once
all are there checks every part's and the whole archive's sha256, unpacks it to
`/tmp/sluice-peers/<name>` and (with `--check`) imports its module there. Unpacking the
same archive again is skipped. Standard library only: it runs before anything is installed.

`peer_env(site)` is how a process finds the unpacked packages: the folders the manifest
lists, first on PYTHONPATH, and the manifest's environment variables (printed too).
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
    """Import the payload's module (`manifest["import"]`) in a fresh interpreter; its exit
    code."""
    module = unpacked_manifest(site)["import"]
    if not module:
        return 0
    code = (f"import time; t = time.time(); import {module} as m; "
            f"print('import {module}', m.__version__, 'in', round(time.time() - t, 1), 's')")
    try:
        return subprocess.run([sys.executable, "-c", code], env={**os.environ,
                              **peer_env(site)}, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"import {module} took over {timeout:.0f} s")
        return 124


def gather(name: str, carried: Path, home: Path, check: bool) -> int:
    """Collect, and once complete unpack (and check), the payload `name`; an exit code."""
    store, site = home / f"{name}-parts", site_dir(name, home)
    try:
        manifest = collect(sorted(carried.glob(f"{name}-*")), store)
        if manifest is None:
            print(f"{name}: no parts here: carry the folders {carried.name}/{name}-<i> that "
                  "`python -m bench.peers.payload` wrote")
            return 2
        if unpacked_manifest(site) == manifest:
            print(f"{name}: already unpacked at {site}")
        elif todo := missing(manifest, store):
            have = len(manifest["parts"]) - len(todo)
            print(f"{name}: {have} of {len(manifest['parts'])} parts here; still to carry: "
                  + " ".join(f"{carried.name}/{p['folder']}" for p in todo))
            return 0
        else:
            seconds = unpack(manifest, store, site)
            print(f"{name}: unpacked {manifest['archive']} to {site} in {seconds:.1f} s")
    except PartsError as exc:
        print(f"{name}: error: {exc}")
        return 3
    env = peer_env(site)
    print(f"{name} environment: " + " ".join(f"{k}={v}" for k, v in env.items()))
    return check_import(site) if check else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", action="append",
                    help="a payload's name, its folders' prefix (repeatable; default vllm)")
    ap.add_argument("--carried", type=Path, default=CARRY_ROOT,
                    help="where the carried folders are (default .peers/)")
    ap.add_argument("--home", type=Path, default=HOME, help="the stores and unpacked sites")
    ap.add_argument("--check", action="store_true", help="import each one once unpacked")
    args = ap.parse_args(argv)
    return max(gather(n, args.carried, args.home, args.check) for n in args.name or ["vllm"])


if __name__ == "__main__":
    sys.exit(main())
