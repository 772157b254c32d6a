import json

from bench.outputs import write_outputs


def test_writes_json_and_markdown_into_a_new_folder(tmp_path):
    out = tmp_path / "new" / "run"
    write_outputs(str(out), {"ms": 4.25}, "| a |")
    write_outputs(str(out) + "-2", {}, "ends\n")
    assert json.loads((tmp_path / "new" / "run.json").read_text()) == {"ms": 4.25}
    assert (tmp_path / "new" / "run.md").read_text() == "| a |\n"
    assert (tmp_path / "new" / "run-2.md").read_text() == "ends\n"
