"""The runtime's layering, read from the source: every import counts, at the top of a file,
inside a function or under `if TYPE_CHECKING:`.

    wire, config  <-  the ground floor  <-  scheduler / worker / api  <-  launch
                  <-  engine / client / ray_serve / frontend

A module imports from its own layer or below, the three process packages never from each
other, and no modules import each other in a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("runtime", "frontend")
# package or module -> layer; the longest matching prefix decides
LAYERS = {
    "runtime.wire": 0,
    "runtime.config": 0,
    "runtime.model_errors": 1,
    "runtime.model_config": 1,
    "runtime.model_presets": 1,
    "runtime.hub": 1,
    "runtime.grammar": 1,
    "runtime.procutil": 1,
    "kernels": 1,
    "runtime.scheduler": 2,
    "runtime.worker": 2,
    "runtime.api": 2,
    "runtime.launch": 3,
    "runtime.engine": 4,
    "runtime.client": 4,
    "runtime.ray_serve": 4,
    "runtime": 4,  # the package's face: `from runtime import Engine, SamplingParams`
    "frontend": 4,
}
PROCESS_LAYER = 2  # its packages run in different processes: none imports another


def _modules() -> dict[str, Path]:
    mods = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `path` imports (a name imported from a package that is one of
    its modules counts as that module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & known.keys()
            found |= subs or {node.module}
    return {m for m in found if m.split(".")[0] in (*SCANNED, "kernels")}


def _home(module: str) -> str:
    """The `LAYERS` entry `module` belongs to."""
    homes = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    assert homes, f"{module} belongs to no layer: add it to LAYERS"
    return max(homes, key=len)


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(path, mods) - {m} for m, path in mods.items()}


def _climbing(graph: dict[str, set[str]]) -> list[str]:
    """The imports that climb a layer or cross from one process package to another."""
    wrong = []
    for module, imported in graph.items():
        home = _home(module)
        for target in imported:
            there = _home(target)
            if (LAYERS[there] > LAYERS[home]
                    or (LAYERS[there] == LAYERS[home] == PROCESS_LAYER and there != home)):
                wrong.append(f"{module} -> {target}")
    return sorted(wrong)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other in a circle (Tarjan's strongly
    connected components of more than one module)."""
    circles = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v] & graph.keys():
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                on_stack.discard(w)
                component.append(w)
            on_stack.discard(v)
            if component:
                circles.append(sorted([v, *component]))

    for module in graph:
        if module not in index:
            visit(module)
    return circles


def test_every_import_goes_down_the_layers():
    assert _climbing(_graph()) == []


def test_no_modules_import_each_other_in_a_circle():
    assert _circles(_graph()) == []


def test_the_checks_see_every_kind_of_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\n"
                      "from runtime.wire import rpc\n"
                      "if TYPE_CHECKING:\n    from runtime.launch.server import run_server\n"
                      "def f():\n    import runtime.api.process\n")
    known = {"runtime.wire.rpc": source}
    found = _imports(source, known)
    assert found == {"runtime.wire.rpc", "runtime.launch.server", "runtime.api.process"}
    graph = {"runtime.scheduler.x": found, "runtime.wire.rpc": {"runtime.scheduler.x"},
             "runtime.launch.server": set(), "runtime.api.process": set()}
    assert _climbing(graph) == ["runtime.scheduler.x -> runtime.api.process",
                                "runtime.scheduler.x -> runtime.launch.server",
                                "runtime.wire.rpc -> runtime.scheduler.x"]
    assert _circles(graph) == [["runtime.scheduler.x", "runtime.wire.rpc"]]
