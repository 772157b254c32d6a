"""`Engine` in a plain script, with no `if __name__ == "__main__":` guard: the README's
example as written, and a script that never shuts its engine down."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_example(after: str) -> str:
    """The first Python block of the README after the text `after`."""
    text = (ROOT / "README.md").read_text()
    start = text.index("```python\n", text.index(after)) + len("```python\n")
    return text[start : text.index("```", start)]


def _run_script(source: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run `source` as a script file, its temp folder in `tmp_path`."""
    script = tmp_path / "script.py"
    script.write_text(source)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "TMPDIR": str(tmp_path)}
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _assert_clean(done: subprocess.CompletedProcess, tmp_path: Path) -> None:
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    assert "Fatal Python error" not in done.stderr
    assert [n for n in os.listdir(tmp_path) if n.startswith("sluice-")] == []


def test_readme_engine_example_runs_as_written(tmp_path):
    done = _run_script(_readme_example("In-process, with no server"), tmp_path)
    _assert_clean(done, tmp_path)
    generated = re.search(r"\] (length|stop)\n(.*)", done.stdout, re.S)
    assert generated is not None, done.stdout
    assert generated.group(2).strip(), "the stream printed nothing"


def test_an_engine_a_script_leaves_running_stops_at_exit(tmp_path):
    done = _run_script(
        textwrap.dedent("""
        from runtime import Engine, SamplingParams

        eng = Engine(torch_threads=2)
        out = eng.generate("The capital of France is", SamplingParams(max_tokens=4,
                                                                      temperature=0.0))
        print(out[0].text)
    """),
        tmp_path,
    )
    _assert_clean(done, tmp_path)
    assert "Paris" in done.stdout
