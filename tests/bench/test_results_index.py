"""`python -m bench.index --check`: every report in bench/results says what it asked and found,
every data file belongs to a report, every README link names a file, and INDEX.md is current."""

from bench import index


def test_results_are_indexed_and_findable(capsys):
    assert index.main(["--check"]) == 0, capsys.readouterr().err


def test_a_report_without_its_answer_is_reported(tmp_path, monkeypatch):
    topic = tmp_path / "kernels"
    topic.mkdir()
    (topic / "2026-12-04-x-h200.md").write_text("# X\n\nQuestion: is x fast?\n\n| a |\n")
    (topic / "2026-12-04-x-h200.json").write_text('{"meta": {"command": "python -m bench.x"}}')
    (topic / "stray.png").write_bytes(b"")
    monkeypatch.setattr(index, "RESULTS", tmp_path)
    monkeypatch.setattr(index, "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("see bench/results/kernels/missing.md\n")
    found = index.reports()
    assert [(r.question, r.answer, r.command) for r in found] == [
        ("is x fast?", "", "python -m bench.x")]
    bad = index.problems(found)
    assert any("no `Answer:` line" in b for b in bad)
    assert any("stray.png: belongs to no report" in b for b in bad)
    assert any("links bench/results/kernels/missing.md" in b for b in bad)
