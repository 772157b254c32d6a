"""What every kernel benchmark shares: the presets, a result row and the table of rows, the
report writer, the timer, the ceiling, and kernels rebuilt from edited source (the probes)."""

import importlib.util
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bench.outputs import write_outputs

COPY_CEILING_GBPS = 4260.0  # H200 device-to-device copy, bytes read + written (device.md)


@dataclass(frozen=True)
class Preset:
    """Shapes and repetitions; contexts and extend_prefix must be multiples of 16 (the page).

    The decode rows run at each (batch, context) of `decode_points`; the first one is the
    headline shape (and the one `--sweep` searches).
    """

    decode_points: tuple[tuple[int, int], ...] = ((64, 4096), (16, 16384), (256, 1024))
    heads: int = 32
    gqa_kv_heads: int = 8
    head_dim: int = 128
    extend_batch: int = 4
    extend_new: int = 2048
    extend_prefix: int = 2048
    extend_new_after_prefix: int = 512
    tokens: int = 16384
    hidden: int = 4096
    inter: int = 11008
    copy_mib: int = 4096
    warmup: int = 10
    iters: int = 50
    variants: bool = True  # GQA decode and the extend-with-prefix rows


PRESETS = {
    "full": Preset(),
    "quick": Preset(decode_points=((64, 4096),), tokens=4096, copy_mib=1024, warmup=3, iters=10,
                    variants=False),
    "tiny": Preset(decode_points=((2, 96),), heads=4, gqa_kv_heads=2, head_dim=32, extend_batch=2,
                   extend_new=40, extend_prefix=32, extend_new_after_prefix=24, tokens=8,
                   hidden=64, inter=48, copy_mib=1, warmup=1, iters=2),
}  # fmt: skip


@dataclass
class Row:
    kernel: str
    case: str
    time_us: float
    bytes: int
    flops: float = 0.0
    note: str = ""
    group: str = ""  # rows compared with each other in a summary table (same shape)
    variant: str = ""  # what differs inside the group (the KV pool dtype)

    @property
    def gbps(self) -> float:
        return self.bytes / self.time_us / 1e3

    def as_dict(self) -> dict:
        pct = 100 * self.gbps / COPY_CEILING_GBPS
        tflops = self.flops / self.time_us / 1e6
        return {**asdict(self), "gbps": self.gbps, "pct_ceiling": pct, "tflops": tflops}


def timeit(fn, p: Preset, graph: bool = False) -> float:
    """Median microseconds of `fn()` over p.iters runs after p.warmup (CUDA events on a GPU).
    graph: each run a replay of `fn` captured in a CUDA graph, so that a kernel shorter than
    its Python launch is timed, not the launch (fn must not sync)."""
    for _ in range(p.warmup):
        fn()
    if graph and torch.cuda.is_available():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        fn = g.replay
    if not torch.cuda.is_available():
        times = []
        for _ in range(p.iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(p.iters)]  # fmt: skip
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) * 1e3 for start, end in events)


def rows_table(title: str, meta: dict, rows: list[dict]) -> list[str]:
    """Markdown lines: `# title (device)`, the meta line, and a table of `Row.as_dict()`s."""
    lines = [f"# {title} ({meta['device']})", "",
             ", ".join(f"{k}: {v}" for k, v in meta.items()), "",
             "| kernel | case | time (us) | MB moved | GB/s | % of copy ceiling | TFLOP/s | note |",
             "|---|---|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for d in rows:
        lines.append(f"| {d['kernel']} | {d['case']} | {d['time_us']:.1f} | {d['bytes'] / 1e6:.1f}"
                     f" | {d['gbps']:.0f} | {d['pct_ceiling']:.1f} | {d['tflops']:.1f}"
                     f" | {d['note']} |")  # fmt: skip
    return lines


def write_report(prefix: Path, data: dict, lines: list[str], echo: bool = True) -> None:
    """`<prefix>.json` of `data` and `<prefix>.md` of the markdown `lines`, printed when echo."""
    text = "\n".join(lines)
    write_outputs(str(prefix), data, text)
    if echo:
        print(text)


def module_with_cuts(src: str, cuts: list[tuple[str, str]], name: str):
    """A module loaded from `src` with each (old, new) of `cuts` replaced; every old text must
    be found (else a probe would time the unchanged kernel under a cut's name)."""
    for old, new in cuts:
        assert old in src, (name, old)
        src = src.replace(old, new)
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
