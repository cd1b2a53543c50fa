"""KV transfer ops: ``kv_load``.

Modelled on a P/D-disaggregation KV connector (``vllm/distributed/
kv_transfer/``): before a request's first step, an external agent writes its
prompt's KV (and, for Mamba groups, its final state) into the blocks just
allocated to it.  ``LOADED_BLOCKS_INTACT`` then guards that content until the
owner's first step.
"""

from __future__ import annotations

from harness.core.ops import INT, OpSpec, register
from harness.core.ops.lifecycle import _permit_all_blocks, _rename, _req


def _loadable(m) -> list[int]:
    if m.cfg.mamba_cache_mode == "align":  # not modelled: the ledger refuses it
        return []
    return [r for r, s in sorted(m.ledger.requests.items())
            if not (s.stepped or s.loaded or s.num_computed_tokens)
            and s.capacity_tokens(m.cfg) >= s.prompt_len]


def _draw_kv_load(m, data) -> dict:

    return {"op": "kv_load", "req": data.choice(_loadable(m))}


register(OpSpec(
    name="kv_load", summary="a remote prefill's KV lands in a new request's blocks",
    fields={"req": INT}, example={"op": "kv_load", "req": 0},
    apply=lambda t, op: t.kv_load(op["req"]),
    draw=_draw_kv_load,
    enabled=lambda m: bool(_loadable(m)), requests=_req, rename=_rename,
    permit=_permit_all_blocks))
