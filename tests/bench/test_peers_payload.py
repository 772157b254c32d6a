"""The peer payload's journey on a small fake payload: trim, compress, split into parts that
fit a transfer, then on the other side gather the parts over several transfers, check them,
unpack, and import the packaged module through the environment the manifest gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.peers import archive, package_sets, payload, unpack


def fake_site(work):
    """site/ with a package `fakepeer` and files the trim list removes, site-extra/."""
    site, extra = work / "site", work / "site-extra"
    (site / "fakepeer").mkdir(parents=True)
    (site / "fakepeer" / "__init__.py").write_text("__version__ = '1.2.3'\n")
    (site / "fakepeer" / "data.bin").write_bytes(os.urandom(300_000))  # incompressible
    (site / "vllm" / "vllm_flash_attn").mkdir(parents=True)
    (site / "vllm" / "vllm_flash_attn" / "_vllm_fa2_C.abi3.so").write_bytes(b"x" * 1000)
    (site / "vllm" / "third_party" / "deep_gemm").mkdir(parents=True)
    for py in ("310", "312", "313"):
        (site / "vllm" / "third_party" / "deep_gemm" / f"_C.cpython-{py}-x86_64.so").write_text(py)
    (site / "bin").mkdir()
    (site / "bin" / "vllm").write_text("#!/bin/sh\n")
    (extra / "fakeextra").mkdir(parents=True)
    (extra / "fakeextra" / "__init__.py").write_text("")
    return site, extra


def build_parts(tmp_path, part_bytes=100_000, tool=True):
    work, carried = tmp_path / "work", tmp_path / "carried"
    site, extra = fake_site(work)
    assert payload.trim(site, package_sets.VLLM.trim) == 1000 + 2 * 3 + len("#!/bin/sh\n")
    assert sorted(p.name for p in (site / "vllm/third_party/deep_gemm").iterdir()) == [
        "_C.cpython-312-x86_64.so"]
    assert not (site / "bin").exists()
    assert not list((site / "vllm/vllm_flash_attn").iterdir())
    tar = work / "fake.tar.xz"
    payload.compress([site, extra], tar, level=1, tool=tool)
    manifest = archive.split(tar, carried, "fake", part_bytes,
                             {"import": "fakepeer", "path": ["site", "site-extra"],
                              "env": {"FAKE_FLAG": "1"}})
    return tar, carried, manifest


def test_parts_fit_and_each_folder_carries_the_manifest(tmp_path):
    tar, carried, manifest = build_parts(tmp_path)
    size = tar.stat().st_size
    assert len(manifest["parts"]) == -(-size // 100_000) >= 3
    assert [p["size"] for p in manifest["parts"][:-1]] == [100_000] * (len(manifest["parts"]) - 1)
    assert sum(p["size"] for p in manifest["parts"]) == manifest["size"] == size
    assert manifest["sha256"] == archive.sha256_of(tar)
    for i, part in enumerate(manifest["parts"], 1):
        folder = carried / f"fake-{i}"
        assert part["folder"] == folder.name
        assert json.loads((folder / archive.MANIFEST).read_text()) == manifest
        assert archive.sha256_of(folder / part["name"]) == part["sha256"]


def test_python_lzma_gives_the_same_files(tmp_path):
    _, carried, manifest = build_parts(tmp_path, part_bytes=10 << 20, tool=False)
    home = tmp_path / "home"
    assert unpack.main(["--name", "fake", "--carried", str(carried), "--home", str(home)]) == 0
    init = home / "fake" / "site" / "fakepeer" / "__init__.py"
    assert init.read_text() == "__version__ = '1.2.3'\n"


def carry(carried, dest, folders):
    """What one transfer brings: only `folders` of the carried set."""
    if dest.exists():
        subprocess.run(["rm", "-rf", str(dest)], check=True)
    dest.mkdir()
    for f in folders:
        subprocess.run(["cp", "-r", str(carried / f), str(dest / f)], check=True)


def test_parts_over_several_transfers_unpack_once_complete(tmp_path, capsys):
    _, carried, manifest = build_parts(tmp_path)
    names = [p["folder"] for p in manifest["parts"]]
    home, arrived = tmp_path / "home", tmp_path / "arrived"
    args = ["--name", "fake", "--carried", str(arrived), "--home", str(home)]
    carry(carried, arrived, names[:1])
    assert unpack.main(args) == 0
    out = capsys.readouterr().out
    assert f"fake: 1 of {len(names)} parts here" in out and f"arrived/{names[-1]}" in out
    assert unpack.unpacked_manifest(home / "fake") is None and unpack.peer_env(home / "fake") == {}
    carry(carried, arrived, names[1:])
    assert unpack.main(args) == 0
    assert "fake: unpacked fake.tar.xz" in capsys.readouterr().out
    site = home / "fake"
    assert (site / "site/fakepeer/data.bin").read_bytes() == (
        tmp_path / "work/site/fakepeer/data.bin").read_bytes()
    assert (site / "site-extra" / "fakeextra").is_dir()
    env = unpack.peer_env(site)
    assert env["FAKE_FLAG"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[:2] == [str(site / "site"), str(site / "site-extra")]
    carry(carried, arrived, [])
    assert unpack.main(args) == 0
    assert "fake: already unpacked" in capsys.readouterr().out


def test_a_corrupt_part_is_refused(tmp_path, capsys):
    _, carried, manifest = build_parts(tmp_path)
    part = carried / manifest["parts"][1]["folder"] / manifest["parts"][1]["name"]
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    home = tmp_path / "home"
    assert unpack.main(["--name", "fake", "--carried", str(carried), "--home", str(home)]) == 3
    assert "size or sha256 differs from the manifest" in capsys.readouterr().out
    assert unpack.unpacked_manifest(home / "fake") is None


def test_a_store_of_another_build_is_replaced(tmp_path):
    _, carried, first = build_parts(tmp_path)
    home = tmp_path / "home"
    store = home / "fake-parts"
    archive.collect([carried / first["parts"][0]["folder"]], store)
    tar2 = tmp_path / "other.tar.xz"
    tar2.write_bytes(os.urandom(5000))
    other = archive.split(tar2, tmp_path / "c2", "fake", 4000)
    manifest = archive.collect(sorted((tmp_path / "c2").glob("fake-*")), store)
    assert manifest == other and archive.missing(other, store) == []
    assert sorted(p.name for p in store.iterdir()) == ["manifest.json", "other.tar.xz.1",
                                                        "other.tar.xz.2"]
    with pytest.raises(archive.PartsError, match="another archive"):
        archive.collect([carried / "fake-1", tmp_path / "c2" / "fake-1"], store)


def test_an_archive_of_whole_parts_has_no_empty_last_part(tmp_path):
    tar = tmp_path / "a.bin"
    tar.write_bytes(b"y" * 8000)
    manifest = archive.split(tar, tmp_path / "c", "a", 4000)
    assert [p["size"] for p in manifest["parts"]] == [4000, 4000]
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["a-1", "a-2"]


def test_the_default_part_leaves_room_for_the_repository():
    part = payload.default_part_bytes()
    assert part % (1 << 20) == 0
    assert part + payload.tree_bytes() + payload.MARGIN_BYTES <= payload.TRANSFER_BYTES


def test_the_import_check_runs_in_the_peer_environment(tmp_path):
    _, carried, _ = build_parts(tmp_path)
    home = tmp_path / "home"
    assert unpack.main(["--name", "fake", "--carried", str(carried), "--home", str(home)]) == 0
    code = "import fakepeer, fakeextra, os; print(fakepeer.__version__, os.environ['FAKE_FLAG'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, **unpack.peer_env(home / "fake")}, check=True)
    assert out.stdout.split() == ["1.2.3", "1"]
    assert unpack.check_import(home / "fake") == 0


def test_small_parts_share_a_transfer_and_every_payload_unpacks_from_one_command(tmp_path):
    _, carried, manifest = build_parts(tmp_path, part_bytes=150_000)
    small_site = tmp_path / "small" / "site"
    (small_site / "smallpkg").mkdir(parents=True)
    (small_site / "smallpkg" / "__init__.py").write_text("__version__ = '0.1'\n")
    (small_site / "smallpkg" / "blob").write_bytes(os.urandom(20_000))
    small = tmp_path / "small.tar.xz"
    payload.compress([small_site], small, level=1)
    archive.split(small, carried, "small", 150_000, {"import": "smallpkg", "path": ["site"]})
    room = 200_000
    calls = payload.carry_plan(carried, room)
    names = [[f.name for f in call] for call in calls]
    assert len(manifest["parts"]) == 3  # 150,000 + 150,000 + the rest of ~300 kB
    assert names == [["fake-1", "fake-3", "small-1"], ["fake-2"]]  # first fit, in order
    assert all(sum(payload._size(f) for f in call) <= room for call in calls)
    home = tmp_path / "home"
    args = ["--carried", str(carried), "--home", str(home), "--name", "fake", "--name", "small"]
    assert unpack.main([*args, "--check"]) == 0
    assert (home / "small" / "site" / "smallpkg" / "blob").stat().st_size == 20_000
    assert unpack.unpacked_manifest(home / "fake") == manifest
