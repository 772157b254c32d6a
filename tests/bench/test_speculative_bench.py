"""`python -m bench.speculative` on `dummy:tiny` (the plumbing; numbers come from a GPU):
its rows are written, every speculative run gave the plain run's tokens (the command
asserts it), the oracle's drafts are all kept, and the step log gives an idle share."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.speculative.mtp_layers import MtpReference

ROOT = Path(__file__).resolve().parents[2]


def _bench(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "spec"
    subprocess.run([sys.executable, "-m", "bench.speculative", "--model", "dummy:tiny",
                    "--batches", "1,3", "--max-tokens", "9", "--out", str(out), *args],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    assert out.with_suffix(".md").read_text().startswith("# Speculative decoding")
    return json.loads(out.with_suffix(".json").read_text())


def test_oracle_rows(tmp_path):
    res = _bench(tmp_path)
    assert [r["batch"] for r in res["rows"]] == [1, 3]
    for row in res["rows"]:
        assert "ngram" not in row  # random weights: no prompt text to look up
        oracle = row["oracle"]
        assert oracle["accepted"] == oracle["drafted"] > 0
        assert oracle["steps"] < row["plain"]["steps"]
        assert 0 <= row["plain"]["idle_pct"] <= 100


def test_draft_rows(tmp_path):
    res = _bench(tmp_path, "--algorithm", "draft", "--draft-model", "dummy:tiny-draft")
    rows = {(r["row"].split(":")[0], r["batch"]): r["draft_model"] for r in res["rows"]}
    assert set(rows) == {("iii", 1), ("iii", 3), ("iv", 1), ("iv", 3)}
    for batch in (1, 3):  # the target drafting for itself: every draft kept
        assert rows["iii", batch]["accepted"] == rows["iii", batch]["drafted"] > 0


def test_eagle_rows_with_a_random_head(tmp_path):
    """A `dummy:` target gets a random EAGLE head of its shape: it drafts, and the outputs
    are plain decoding's."""
    res = _bench(tmp_path, "--algorithm", "eagle")
    assert res["random_head"] and [r["batch"] for r in res["rows"]] == [1, 3]
    for row in res["rows"]:
        assert row["identical"] and row["draft_model"]["drafted"] > 0


def test_mtp_rows(tmp_path):
    MtpReference(tmp_path / "target")
    res = _bench(tmp_path, "--algorithm", "mtp", "--model", str(tmp_path / "target"))
    assert [r["batch"] for r in res["rows"]] == [1, 3]
    for row in res["rows"]:
        assert row["identical"] and row["draft_model"]["drafted"] > 0
