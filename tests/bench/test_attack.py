"""The attack battery's cheap groups against the in-process api over a fake scheduler, so
the script does not rot: their inputs still get the answers the battery expects."""

from __future__ import annotations

import json
from argparse import Namespace
from types import SimpleNamespace

import pytest

from tests.api.conftest import cfg, spec, tok  # noqa: F401 (fixtures)
from tests.api.fake_scheduler import FakeScheduler
from tests.api.http.test_health import http_front
from tests.attack import __main__ as attack
from tests.attack import defects
from tests.attack.harness import Tally


@pytest.fixture
def script_ids(tok):  # noqa: F811
    return tok.encode(" a short answer")


def test_cheap_groups_find_nothing_wrong_and_the_report_is_written(cfg, spec, script_ids,  # noqa: F811
                                                                    tmp_path):
    tallies = []
    with FakeScheduler(cfg, lambda r: script_ids), http_front(cfg, spec) as url:
        target = SimpleNamespace(url=url, model=cfg.model, rpc_addr=cfg.rpc_addr)
        for name, group in (("int64_nesting", defects.int64_and_nesting),
                            ("admission", defects.admission),
                            ("bad_rids", defects.bad_rids),
                            ("token_bias", defects.token_bias)):
            tally = Tally(name)
            group(target, tally, "small")
            tallies.append(tally)
    for t in tallies:
        assert t.tried > 0 and t.failed == 0 and t.lost == 0, (t.group, t.notes)
    args = Namespace(model="fake", scale="small")
    attack.write(tmp_path / "out", tallies, args, 1.0, tmp_path)
    rows = json.loads((tmp_path / "out.json").read_text())["groups"]
    assert [r["group"] for r in rows] == ["int64_nesting", "admission", "bad_rids",
                                          "token_bias"]
    assert "| admission | 3 | 0 | 0 |" in (tmp_path / "out.md").read_text()


def test_unknown_groups_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        attack.main(["--groups", "nope", "--out", str(tmp_path / "x")])
