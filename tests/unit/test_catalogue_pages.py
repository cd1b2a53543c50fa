"""docs/reference/*.md are generated from the registries: a committed page that
differs from what ``scripts/write_catalogues.py`` writes is stale."""

from pathlib import Path

import pytest

from harness.tools.catalogues import pages

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("rel", sorted(pages()))
def test_committed_catalogue_page_is_fresh(rel):
    committed = (ROOT / rel).read_text(encoding="utf-8") if (ROOT / rel).exists() else None
    assert committed == pages()[rel], \
        f"{rel} is stale: run python scripts/write_catalogues.py and commit the result"


def test_every_registry_entry_is_on_its_page():
    from gpu_impl.faults import CATALOGUE
    from harness.core.invariants import REGISTRY as INVARIANTS
    from harness.core.ops import REGISTRY as OPS

    text = pages()
    assert all(f"## `{f}`" in text["docs/reference/faults.md"] for f in CATALOGUE)
    assert all(f"| `{o}` |" in text["docs/reference/ops.md"] for o in OPS)
    assert all(f"| `{i}` |" in text["docs/reference/invariants.md"] for i in INVARIANTS)
