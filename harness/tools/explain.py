"""``blockfuzz explain``: a trace op by op — rows, ownership, writes, verdicts.

For every op: the persistent-batch rows after it (request -> block ids per
KV-cache group and ``num_blocks``; rows that hold no request but keep ids are
flagged), every cache write that landed (group, block, offsets or state, value
class, the block's owner before the op) with writes no row of the op owns
marked ``!!``, and the invariant verdicts.  Rendered as a table on a terminal,
plain ASCII when piped, or ``--format json|md``.
"""

from __future__ import annotations

import json

from harness.core.invariants import classify_writes
from harness.core.session import Session
from harness.core.trace import Trace


def _writes(session: Session) -> list[dict] | None:
    """Every block the op changed, classified as ``NO_STALE_WRITE`` classifies it
    (None when the implementation crashed: its state was not observed)."""
    if session.config.runner == "sglang":
        return _token_slot_writes(session)
    if session.last is None:
        return None
    before, after, permit = session.last
    return [{"group": w.group, "block": w.block, "cells": w.cells_text, "value": w.value,
             "owner": w.owner, "offending": bool(w.offending),
             "layer": w.layer or "target"}  # the target model's layer, or the drafter's
            for w in classify_writes(before, after, permit)]


def _token_slot_rows(session: Session) -> list[dict] | None:
    """A token-slot engine: each live request's row and slots, the radix tree's
    paths (lock counts) and the free pages, as preformatted lines."""
    if session.last is None:
        return None
    obs = session.last[1]
    lines = []
    for req, row in sorted(obs.rows.items(), key=lambda kv: kv[1]):
        slots = obs.req_to_token[row, :obs.kv_len[req]].tolist()
        flag = " !!" if row == 0 or 0 in slots else ""
        lines.append({"text": f"row {row}: req {req}, {obs.kv_len[req]} tokens, slots "
                              f"{_runs(slots)}{flag}"})
    for tokens, slots, lock in obs.tree:
        lines.append({"text": f"tree: {len(tokens)} tokens at slots {_runs(list(slots))}, "
                              f"lock {lock}"})
    lines.append({"text": f"free pages: {len(obs.free_pages)} of {session.config.num_pages}"})
    if obs.state is not None:  # a hybrid model's Mamba pool
        for req, slot in sorted(obs.state_slots.items()):
            flag = " !!" if slot == 0 else ""
            lines.append({"text": f"state: req {req} at Mamba slot {slot}{flag}"})
        for tokens, slot, lock in obs.state_tree:
            lines.append({"text": f"tree state: after {len(tokens)} tokens at Mamba slot "
                                  f"{slot}, lock {lock}"})
        pad = (obs.padding or {}).get("state_indices")
        if pad is not None and obs.written is not None:  # this op replayed the graph
            lines.append({"text": f"graph state indices: {pad.tolist()} (PAD_SLOT_ID -1)"})
        lines.append({"text": f"free Mamba slots: {len(obs.state_free)} of "
                              f"{session.config.mamba_slots}"})
    return lines


def _runs(xs: list[int]) -> str:
    """``[3..7, 9, 12..13]``: consecutive runs folded."""
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}..{xs[j]}")
        i = j + 1
    return "[" + ", ".join(out) + "]"


def _token_slot_writes(session: Session) -> list[dict] | None:
    """The KV slots the op's forward wrote, each with what held it; a write the
    op computed no position for (and not slot 0) is offending."""
    from harness.core.invariants.token_slots import _allowed_writes, _owner_text
    from harness.core.invariants import CheckContext

    if session.last is None:
        return None
    before, after, _ = session.last
    if after.written is None:
        return []
    ctx = CheckContext(session.config, session.ledger, after, session.reference, 0, None,
                       before)
    allowed = _allowed_writes(ctx)
    out = []
    for s in dict.fromkeys(int(x) for x in after.written):
        v = float(after.kv[s])
        out.append({"group": 0, "block": s, "cells": "", "layer": "target",
                    "value": "NaN (padding)" if v != v else "KV",
                    "owner": "reserved padding slot" if s == 0 else _owner_text(ctx, s),
                    "offending": s not in allowed})
    out += _state_writes(ctx, before, after)
    return out


def _state_writes(ctx, before, after) -> list[dict]:
    """A hybrid model's Mamba state writes of the op (the layer's update, a
    cleared or copied slot), each with what held the slot before; a write
    ``SGL_STATE_NO_STALE_WRITE`` does not allow is offending."""
    from harness.core.invariants.token_slots import (_state_holder, allowed_state_writes,
                                                     state_writes)

    if after.state is None or before is None or before.state is None:
        return []
    allowed = allowed_state_writes(ctx)
    out = []
    for s in sorted(state_writes(before, after)):
        v = float(after.state[s])
        out.append({"group": "mamba", "block": s, "cells": "", "layer": "mamba",
                    "value": "Mamba state NaN (padding)" if v != v else "Mamba state",
                    "owner": "reserved padding slot" if s == 0 else _state_holder(before, s),
                    "offending": s not in allowed})
    return out


def _rows(session: Session) -> list[dict] | None:
    if session.config.runner == "sglang":
        return _token_slot_rows(session)
    if session.last is None:
        return None
    obs = session.last[1]
    rows = []
    for row, req in enumerate(obs.host_req_ids.tolist()):
        ids = [obs.host_block_table[g][row][: max(int(obs.host_num_blocks_per_row[g][row]), 0)]
               .tolist() for g in range(len(obs.host_block_table))]
        cfg = session.config
        stale = req == -1 and any((t[row] != cfg.empty_entry(g)).any()
                                  for g, t in enumerate(obs.host_block_table))
        if req == -1 and not stale:
            continue
        rows.append({"row": row, "req": None if req == -1 else req, "blocks": ids,
                     "stale": [t[row].tolist() for t in obs.host_block_table] if stale else None,
                     "computed": int(obs.num_computed_tokens[row]),
                     "prompt": int(obs.num_prompt_tokens[row])})
    return rows + _padding(obs)


def _padding(obs) -> list[dict]:
    """Rows the last forward padded (if this op was one): what the metadata fed them,
    with the counters the host row still holds (V1: a vacated row keeps its last
    request's)."""
    lf, md = obs.last_forward, obs.metadata
    if lf is None or md is None:
        return []
    out = []
    for row in range(lf.num_reqs, lf.num_reqs_padded):
        out.append({"row": row, "padding": True,
                    "seq_len": int(md["seq_lens"][row]),
                    "is_prefilling": bool(md["is_prefilling"][row]),
                    "computed": int(obs.num_computed_tokens[row]),
                    "prompt": int(obs.num_prompt_tokens[row])})
    return out


def explain(trace: Trace, faults=(), device: str | None = None, target: str = "gpu_impl",
            stop_at_first: bool = True) -> list[dict]:
    """One record per op run: op, rows, writes, violations (a first record with
    op ``start`` and op_index -1 when start-up, i.e. graph capture, broke one).

    Stops after the first violating op unless ``stop_at_first`` is False (then
    the consequences further down the trace show too).
    """
    session = Session(trace.config, faults, target, device)
    records = []
    if session.startup_violations:  # graph capture already broke an invariant
        records.append({"op_index": -1, "op": {"op": "start"}, "rows": [], "writes": [],
                        "violations": [v.to_json() for v in session.startup_violations]})
        if stop_at_first:
            return records
    for i, op in enumerate(trace.ops):
        found = session.apply(op)
        records.append({"op_index": i, "op": op, "rows": _rows(session),
                        "writes": _writes(session), "copies": _copies(session, op),
                        "violations": [v.to_json() for v in found]})
        if found and stop_at_first:
            break
    return records


def _copies(session: Session, op: dict) -> list[dict]:
    """Align mode: the running-state copies the reference's step made around its
    forward (which column, which block, to which, and why:
    ``ReferenceRunnerBase.mamba_copies``), what the target's should be."""
    from harness.core.ops import spec_of

    ref = session.reference
    if ref.config.runner == "sglang" or not spec_of(op).forward \
            or ref.config.mamba_cache_mode != "align":
        return []
    out = []
    for req, src, dst, kind in getattr(ref, "mamba_copies", ()):
        for g in ref.config.mamba_groups:
            ids = ref.runner_blocks[req][g]
            out.append({"req": req, "group": g, "from_column": src, "from_block": ids[src],
                        "to_column": dst, "to_block": ids[dst], "kind": kind})
    return out


def _op_text(op: dict, wrap: bool = False) -> str:
    """``name {json}``; ``wrap``: one field a line, so a narrow column folds inside a
    value, never across a key."""
    args = {k: v for k, v in op.items() if k != "op"}
    if not wrap:
        return op["op"] + " " + json.dumps(args, sort_keys=True, separators=(",", ":"))
    fields = [f"{json.dumps(k)}:{json.dumps(v, separators=(',', ':'))}"
              for k, v in sorted(args.items())]
    return op["op"] + "\n{" + ",\n ".join(fields) + "}"


def _rows_text(rows: list[dict] | None) -> str:
    if rows is None:
        return "(not observed: the implementation crashed)"
    parts = []
    for r in rows:
        if "text" in r:
            parts.append(r["text"])
        elif r.get("padding"):
            flag = " !!" if r["is_prefilling"] or r["seq_len"] else ""
            parts.append(f"row {r['row']}: padding, seq_len {r['seq_len']}, "
                         f"{'prefilling' if r['is_prefilling'] else 'no prefill'} (row keeps "
                         f"{r['computed']} of {r['prompt']} computed){flag}")
        elif r["stale"] is not None:
            parts.append(f"row {r['row']}: EMPTY but holds {r['stale']} !!")
        else:
            parts.append(f"row {r['row']}: req {r['req']} {r['blocks']}")
    return "\n".join(parts) or "(empty batch)"


def _writes_text(writes: list[dict] | None, copies=()) -> str:
    if writes is None:
        return "(not observed)"
    what = {"restored": "restored from its hit", "carried": "carried",
            "completed": "copied after the forward into the block accepted tokens completed"}
    lines = [f"reference: req {c['req']} g{c['group']} state {what[c['kind']]}: column "
             f"{c['from_column']} (block {c['from_block']}) -> column {c['to_column']} "
             f"(block {c['to_block']})" for c in copies]
    return "\n".join(lines + [
        f"{'!! ' if w['offending'] else ''}"
        f"{'drafter layer: ' if w.get('layer') == 'draft' else ''}"
        + (f"slot {w['block']} {w['value']} ({w['owner']})" if w["cells"] == "" else
           f"g{w['group']} block {w['block']} {w['cells']} {w['value']} ({w['owner']})")
        for w in writes]) or "-"


def _verdict_text(rec: dict) -> str:
    if not rec["violations"]:
        return "ok"
    return "\n".join(f"{v['invariant']}"
                     + (f" (group {v['group']})" if v.get("group") is not None else "")
                     + f": {v['detail']}" for v in rec["violations"])


def layout_note(config) -> str | None:
    """One line on how the caches alias (``kv_sharing``), or None: read before
    the writes column, where one physical write shows in both views."""
    if config.runner == "sglang":
        return None
    pairs = config.shared_pages()
    if not pairs:
        return None
    def where(m: int) -> str:
        conv, span = config.groups[m].conv_size, -(-config.state_floats(m) // config.head_size)
        parts = f"conv state ({conv} tokens) then SSM state" if conv else "SSM state"
        return ("token 0 of block b's attention view" if span == 1
                else f"tokens 0..{span - 1} of block b's attention view ({parts})")

    shared = ", ".join(f"group {a} (attention) and group {m} (Mamba)" for a, m in pairs.items())
    views = "; ".join(f"group {m}'s state of block b is {where(m)}" for m in pairs.values())
    return (f"layout: kv_sharing — one block pool for every group; {shared} share pages: "
            f"{views}, so one write into it is listed in both views")


def render(records: list[dict], fmt: str, console=None, caption: str | None = None) -> str | None:
    """``fmt``: text (rich table, ASCII when not a terminal), json or md;
    ``caption``: a line printed above the table (text, md)."""
    if fmt == "json":
        return json.dumps(records, indent=1, sort_keys=True)
    if fmt == "md":
        lines = ([caption, ""] if caption else []) + \
            ["| # | op | rows after | writes | verdict |", "|---|---|---|---|---|"]
        for rec in records:
            cells = [str(rec["op_index"]), f"`{_op_text(rec['op'])}`", _rows_text(rec["rows"]),
                     _writes_text(rec["writes"], rec.get("copies", ())), _verdict_text(rec)]
            lines.append("| " + " | ".join(c.replace("\n", "<br>").replace("|", "\\|")
                                           for c in cells) + " |")
        return "\n".join(lines)
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    plain = not console.is_terminal
    if plain:
        console = Console(width=160, no_color=True, highlight=False)
    table = Table(box=box.ASCII if plain else box.SQUARE, show_lines=True, title=caption)
    for col in ("#", "op", "rows after", "writes", "verdict"):
        table.add_column(col, overflow="fold")
    for rec in records:
        bad = bool(rec["violations"])
        table.add_row(str(rec["op_index"]), _op_text(rec["op"], wrap=True), _rows_text(rec["rows"]),
                      _writes_text(rec["writes"], rec.get("copies", ())), _verdict_text(rec),
                      style="bold red" if bad and not plain else None)
    console.print(table)
    return None
