"""Where a bench's results go: `<out>.json` (every number) and `<out>.md` (the tables)."""

from __future__ import annotations

import json
from pathlib import Path


def write_outputs(out: str, res: dict, text: str) -> None:
    """Write `res` to `<out>.json` and the markdown `text` to `<out>.md`, making out's
    folder."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.json").write_text(json.dumps(res, indent=2) + "\n")
    Path(f"{out}.md").write_text(text if text.endswith("\n") else text + "\n")
