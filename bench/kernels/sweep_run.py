"""What the launch-config sweeps share: their flags (`--out`, `--budget-s`, `--smoke`) and a
run that keeps its time budget and rewrites its JSON after every row, so that a time limit
keeps what finished."""

import argparse
import json
import time
from pathlib import Path


def sweep_parser(description: str, budget_s: float) -> argparse.ArgumentParser:
    """A sweep's argument parser holding the flags every sweep takes."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=budget_s)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU interpreter check)")
    return ap


class SweepRun:
    """The rows of one sweep, written to `<out>/<name>.json` as each lands, within `budget_s`
    seconds from construction: `check_budget` raises TimeoutError once they are spent."""

    def __init__(self, out: Path, name: str, budget_s: float) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path, self.budget_s = out / f"{name}.json", budget_s
        self.rows: list[dict] = []
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def check_budget(self) -> None:
        if self.elapsed() > self.budget_s:
            raise TimeoutError

    def add(self, row: dict) -> None:
        """Keep `row`, print it, and rewrite the JSON."""
        self.rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        self.path.write_text(json.dumps(self.rows, indent=1))

    def spent(self) -> None:
        """Say that the budget ran out, and how many rows made it."""
        print(f"budget of {self.budget_s} s spent: {len(self.rows)} rows", flush=True)
