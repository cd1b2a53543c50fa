"""Write docs/reference/{faults,ops,invariants}.md from the registries.

usage: python scripts/write_catalogues.py   (from the repository root)

The pages are generated, never edited by hand: tests/unit/test_catalogue_pages.py
fails when a committed page differs from what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.tools.catalogues import pages  # noqa: E402


def main() -> int:
    for rel, text in pages().items():
        path = ROOT / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
