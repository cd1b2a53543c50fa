"""Which cache cells an op may write, and what it did write.

:func:`permit_for` asks the op registry (each op's ``permit``) for the cells an
op may change, from the ledger *before* it runs; :func:`classify_writes` diffs
two observations' caches (NaN-aware) and classifies every changed block
against that permit.  ``NO_STALE_WRITE`` and ``explain`` share the classifier,
so what the report marks ``!!`` is exactly what the invariant flags.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reference import NULL_BLOCK_ID, SENTINEL, Ledger, RunnerConfig
from reference.ledger import FREE, RESERVED

from harness.core.ops import spec_of


@dataclass(frozen=True)
class WritePermit:
    """Which cache cells an op may change, decided from the ledger *before* the op.

    cells[g]: {block: (first_offset, end_offset)} for attention groups (offsets
    within the block), {block: None} (any cell); Mamba null blocks are always
    allowed (scratch; ``null_scratch``: not where block 0 is an ordinary
    state block, ``mamba_padding`` ``pad_slot_no_null``); cells[("draft", g)]: the same for the drafter's layer on
    group ``g`` (speculative decoding).  owners[g]: the ledger's owner array before the op, for
    messages; runs: the requests the op writes for.
    """

    cells: dict
    owners: list
    runs: frozenset = frozenset()
    registered: tuple = ()  # per group: {block: hash key} in the prefix cache before the op
    held_in: dict | None = None  # kv_sharing: {block: the group its owner holds it in}
    null_scratch: frozenset = frozenset()  # Mamba groups whose block 0 is a scratch null block

    def describe(self, group: int, block: int) -> str:
        o = int(self.owners[group][block])
        text = {FREE: "a free block", RESERVED: "the null block"}.get(o, f"owned by req {o}")
        held = (self.held_in or {}).get(block)
        if o >= 0 and held is not None and held != group:  # a shared page, seen through another view
            text += f" as its group {held} block"
        return text


def owner_text(ledger: Ledger, group: int, block: int) -> str:
    return WritePermit({}, ledger.owner).describe(group, block)


def permit_for(config: RunnerConfig, ledger: Ledger, op: dict) -> WritePermit:
    """Cells ``op`` may write, from the ledger state before it runs (the op's
    registry entry decides; an op with no ``permit`` writes nothing)."""
    spec = spec_of(op)
    cells = {g: {} for g in range(len(config.groups))}
    runs = frozenset()
    if spec.permit is not None:
        granted, runs = spec.permit(config, ledger, op)
        for g, blocks in granted.items():
            cells.setdefault(g, {}).update(blocks)
    _share_pages(config, cells)
    held_in = {b: g for r in (*ledger.requests.values(), *ledger.finishing.values())
               for g, ids in enumerate(r.blocks)
               for b in ids} if config.kv_sharing else None
    return WritePermit(cells, [o.copy() for o in ledger.owner], runs,
                       tuple(dict(r) for r in ledger.registered), held_in,
                       config.scratch_null_groups)


def _share_pages(config: RunnerConfig, cells: dict) -> None:
    """Permits are per page where groups share pages (``kv_sharing``): a page
    the op may write through one view may change in the other — a Mamba state
    is the first tokens of the attention view (its conv and SSM parts), and an
    attention write may cover the state.  The null block is never widened (its page stays clean)."""
    for a, m in config.shared_pages().items():
        span = -(-config.state_floats(m) // config.head_size)  # tokens the state covers
        for b in [b for b in cells.get(m, {}) if b != NULL_BLOCK_ID]:
            have = cells[a].get(b, False)
            if have is not None:
                cells[a][b] = (0, span) if have is False else (0, max(have[1], span))
        for b in [b for b in cells.get(a, {}) if b != NULL_BLOCK_ID]:
            cells[m][b] = None


def changed_cells(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """NaN-aware per-cell change mask over all but the last axis."""
    same = (before == after) | (np.isnan(before) & np.isnan(after))
    return ~same.all(axis=-1)


def fmt_values(values: np.ndarray) -> str:
    if np.isnan(values).any():
        return "NaN"
    return "[" + ", ".join(f"{v:g}" for v in values.tolist()) + "]"


def value_class(values: np.ndarray) -> str:
    """payload / NaN / sentinel (a freed block's poison) / zero."""
    if np.isnan(values).any():
        return "NaN"
    if (values == SENTINEL).all():
        return "sentinel"
    if not values.any():
        return "zero"
    return "payload"


@dataclass(frozen=True)
class Write:
    """Cells of one block an op changed. offsets: changed offsets (attention),
    () for Mamba state; offending: offsets the permit does not allow (Mamba:
    (0,) when the state write is not allowed); why: the reason, '' when allowed."""

    group: int
    block: int
    mamba: bool
    offsets: tuple
    value: str
    owner: str
    offending: tuple
    why: str
    first_bad_value: str = ""
    layer: str = ""  # "" for the group's own layer, "draft" for the drafter's layer

    @property
    def cells_text(self) -> str:
        return "state" if self.mamba else f"[{min(self.offsets)}..{max(self.offsets)}]"


def _why(permit: WritePermit, group: int, block: int, allowed) -> str:
    if allowed is not False:
        return f"the op writes offsets [{allowed[0]}, {allowed[1]}) of it only"
    owner = int(permit.owners[group][block])
    if owner >= 0 and owner in permit.runs:
        return f"req {owner} runs in this op but writes nothing there"
    return "no row of this op owns it"


def _refused(g, block, mamba, changed, permit, layer=""):
    """(allowed, offsets changed, offsets the permit refuses) of one changed block;
    a Mamba block's single state counts as offset 0."""
    allowed = permit.cells.get((layer, g) if layer else g, {}).get(block, False)
    if mamba:
        scratch = block == NULL_BLOCK_ID and g in permit.null_scratch
        return allowed, (), () if (allowed is not False or scratch) else (0,)
    offs = [int(o) for o in np.flatnonzero(changed[block])]
    if allowed is None:
        return allowed, tuple(offs), ()
    if allowed is False:
        return allowed, tuple(offs), tuple(offs)
    return allowed, tuple(offs), tuple(o for o in offs if not allowed[0] <= o < allowed[1])


def _offends(g, block, mamba, changed, permit, layer="") -> bool:
    """Does a changed block hold a cell the permit refuses (``_refused``'s third
    item non-empty), without listing its offsets (most changed blocks are
    allowed: ``NO_STALE_WRITE`` asks this of every one)."""
    allowed = permit.cells.get((layer, g) if layer else g, {}).get(block, False)
    if mamba:
        return allowed is False and not (block == NULL_BLOCK_ID and g in permit.null_scratch)
    if allowed is None or allowed is False:
        return allowed is False  # (a changed block has a changed offset)
    row = changed[block]
    return bool(np.count_nonzero(row[:allowed[0]]) or np.count_nonzero(row[allowed[1]:]))


def _classify_block(g, block, mamba, b_cache, a_cache, changed, permit, layer="") -> Write:
    allowed, offsets, bad = _refused(g, block, mamba, changed, permit, layer)
    if mamba:
        cells = a_cache[block][None]
        first = fmt_values(a_cache[block]) if bad else ""
    else:
        cells = a_cache[block][list(offsets)]
        first = fmt_values(a_cache[block, bad[0]]) if bad else ""
    return Write(g, block, mamba, offsets, value_class(cells), permit.describe(g, block), bad,
                 _why(permit, g, block, allowed) if bad else "", first, layer)


def classify_writes(before, after, permit: WritePermit,
                    offending_only: bool = False) -> list[Write]:
    """Every block whose cache content changed between two observations, by group
    then block id, with the cells the permit does not allow (``offending_only``:
    only the blocks with such cells — what ``NO_STALE_WRITE`` judges)."""
    old = {name: v for name, _, v, _ in before.caches()}
    out = []
    for name, g, a_cache, mamba in after.caches():
        b_cache = old[name]
        if b_cache.shape == a_cache.shape and b_cache.tobytes() == a_cache.tobytes():
            continue  # bit for bit unchanged (every cache, on most ops)
        layer = "draft" if name.startswith("draft") else ""
        changed = changed_cells(b_cache, a_cache)
        blocks = np.flatnonzero(changed.reshape(len(changed), -1).any(axis=1)).tolist()
        if offending_only:
            blocks = [blk for blk in blocks if _offends(g, blk, mamba, changed, permit, layer)]
        out += [_classify_block(g, blk, mamba, b_cache, a_cache, changed, permit, layer)
                for blk in blocks]
    return out
