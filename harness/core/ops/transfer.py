"""KV transfer ops: ``kv_load``; asynchronous loads and stores; the host tier.

Modelled on a P/D-disaggregation KV connector (``vllm/distributed/
kv_transfer/``): before a request's first step, an external agent writes its
prompt's KV (and, for Mamba groups, its final state) into the blocks just
allocated to it.  ``LOADED_BLOCKS_INTACT`` then guards that content until the
owner's first step.
"""

from __future__ import annotations

from harness.core.ops import BLOCK_IDS, INT, OpSpec, Size, register
from harness.core.ops.lifecycle import _permit_all_blocks, _rename, _req


def _loadable(m) -> list[int]:
    if m.cfg.mamba_cache_mode != "none":  # not modelled: the ledger refuses it
        return []
    return [r for r, s in sorted(m.ledger.requests.items())
            if not (s.stepped or s.loaded or s.num_computed_tokens or s.pending or s.landed)
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


# -- asynchronous loads: kv_load_begin / kv_load_complete / kv_load_fail ---------------
# Modelled on a P/D decode instance's connector loads (vLLM's KV-connector API:
# the scheduler side in vllm/v1/core/sched/scheduler.py, the NIXL connector's
# per-request read handles): a request's prompt KV arrives in transfers that
# complete or fail independently; an abort is a ``remove`` while one is in
# flight.  The reference's rule (reference/ledger.py): a request that leaves
# keeps its blocks until its last transfer has ended; a failed transfer fails
# its request (the "fail" policy).  ``NO_FREE_WHILE_PENDING`` judges the target.
HANDLE = {"type": "integer", "minimum": 0}


def _open_columns(m, req: int) -> list[list[int]]:
    """Per group, the blocks of ``req`` a new transfer may load."""
    return m.ledger.open_load_blocks(m.ledger.requests[req])


def _transfer_loadable(m) -> list[int]:
    def now():
        if m.cfg.mamba_cache_mode != "none":  # Mamba prefix caching: refused
            return []
        return [r for r, s in sorted(m.ledger.requests.items())
                if not (s.stepped or s.loaded or s.num_computed_tokens or s.load_failed)
                and r not in m.ledger.finishing
                and s.capacity_tokens(m.cfg) >= s.prompt_len and any(_open_columns(m, r))]

    per_state = getattr(m, "per_state", None)
    return per_state("transfer_loadable", now) if per_state is not None else now()


def _draw_kv_load_begin(m, data) -> dict:
    req = data.choice(_transfer_loadable(m))
    avail = _open_columns(m, req)
    whole = data.integer(0, 2) == 0  # sometimes one transfer of everything left
    blocks = []
    for ids in avail:
        if whole or not ids:
            blocks.append(list(ids))
        else:  # mostly a run of consecutive blocks (one handle's share)
            if data.boolean():
                lo = data.integer(0, len(ids) - 1)
                blocks.append(ids[lo:data.integer(lo, len(ids) - 1) + 1])
            else:
                blocks.append(data.unique_sample(ids, 0, len(ids)))
    if not any(blocks):
        g = next(g for g, ids in enumerate(avail) if ids)
        blocks[g] = [avail[g][0]]
    handle = max(m.ledger.used_handles, default=-1) + 1
    return {"op": "kv_load_begin", "req": req, "handle": handle, "blocks": blocks}


def _handle_rename(op: dict, req, block) -> dict:
    return dict(op, req=req(op["req"]))


def _narrow_begin(op: dict):
    for g, ids in enumerate(op["blocks"]):
        if len(ids) > 1:
            yield dict(op, blocks=[b[:1] if h == g else b for h, b in enumerate(op["blocks"])])


def _permit_transfer_end(config, ledger, op):
    """A transfer's end writes its blocks and, when its request left and this was
    its last transfer, frees (poisons) all the request's blocks: any cell of them."""
    t = ledger.transfers.get(op["handle"])
    if t is None:  # an illegal op: the reference raises OpError next
        raise KeyError(op["handle"])
    r = ledger.owner_of_transfer(t)
    cells = {g: {b: None for b in ids} for g, ids in enumerate(r.blocks)}
    if config.draft_group is not None:
        cells[("draft", config.draft_group)] = dict(cells[config.draft_group])
    return cells, frozenset([t.req])


def _in_flight_of(kind: str, source: str | None = "remote"):
    """Handles of the transfers of ``kind`` ("load" / "store") from / to
    ``source`` ("remote" / "host"; None: either) in flight, by machine."""
    def now(m) -> list[int]:
        return sorted(h for h, t in m.ledger.transfers.items()
                      if t.kind == kind and source in (None, t.source))

    def handles(m) -> list[int]:
        per_state = getattr(m, "per_state", None)
        return per_state(("in flight", kind, source), lambda: now(m)) \
            if per_state is not None else now(m)
    return handles


_in_flight = _in_flight_of("load")
_loads_in_flight = _in_flight_of("load", None)  # what may fail: remote loads and onboards


def _draw_transfer_end(name: str, kind: str = "load", source: str | None = "remote"):
    def draw(m, data) -> dict:
        handle = data.choice(_in_flight_of(kind, source)(m))
        return {"op": name, "req": m.ledger.transfers[handle].req, "handle": handle}
    return draw


register(OpSpec(
    name="kv_load_begin", summary="a connector starts loading part of a new request's prompt "
    "KV (and Mamba state) into some of its blocks; nothing lands until it completes",
    fields={"req": INT, "handle": HANDLE, "blocks": BLOCK_IDS},
    example={"op": "kv_load_begin", "req": 0, "handle": 0, "blocks": [[4, 5], [9]]},
    apply=lambda t, op: t.kv_load_begin(op["req"], op["handle"], op["blocks"]),
    draw=_draw_kv_load_begin, enabled=lambda m: bool(_transfer_loadable(m)), requests=_req,
    rename=_rename, narrow=_narrow_begin, family="async"))
register(OpSpec(
    name="kv_load_complete", summary="a transfer in flight lands: its blocks get the prompt "
    "KV; a request that left meanwhile is freed after its last transfer",
    fields={"req": INT, "handle": HANDLE},
    example={"op": "kv_load_complete", "req": 0, "handle": 0},
    apply=lambda t, op: t.kv_load_complete(op["req"], op["handle"]),
    draw=_draw_transfer_end("kv_load_complete"),
    enabled=lambda m: bool(_in_flight(m)), requests=_req, rename=_handle_rename,
    permit=_permit_transfer_end, family="async"))
register(OpSpec(
    name="kv_load_fail", summary="a load in flight (from a remote instance or the host tier) "
    "fails: nothing lands, the engine fails its request, whose blocks stay reserved until "
    "its last transfer ends",
    fields={"req": INT, "handle": HANDLE},
    example={"op": "kv_load_fail", "req": 0, "handle": 0},
    apply=lambda t, op: t.kv_load_fail(op["req"], op["handle"]),
    draw=_draw_transfer_end("kv_load_fail", "load", None),
    enabled=lambda m: bool(_loads_in_flight(m)), requests=_req, rename=_handle_rename,
    permit=_permit_transfer_end, family="async"))


# -- stores: kv_store_begin / kv_store_complete -------------------------------------
# Modelled on a connector saving a request's computed KV to an external store
# or a CPU tier (vLLM's KV-connector ``save_kv_layer`` / offloading connector,
# with ``request_finished`` delaying the free until ``finished_sending``): the
# copy reads the request's blocks until it completes, and the store keys what
# it read by the prefix's token ids.  ``STORE_PROVENANCE`` judges what it saved.
def _storable(m) -> list[int]:
    if any(g.sliding_window for g in m.cfg.groups) or not m.cfg.attention_groups:
        return []
    return [r for r, s in sorted(m.ledger.requests.items())
            if s.num_computed_tokens >= 1 and r not in m.ledger.finishing]


def _draw_kv_store_begin(m, data) -> dict:
    req = data.choice(_storable(m))
    r = m.ledger.requests[req]
    unit = m.cfg.prefix_unit
    full = r.num_computed_tokens // unit * unit
    # Mostly its full blocks (what a connector saves), sometimes any prefix.
    n = full if full and data.integer(0, 2) else data.integer(1, r.num_computed_tokens)
    handle = max(m.ledger.used_handles, default=-1) + 1
    return {"op": "kv_store_begin", "req": req, "handle": handle, "num_tokens": n}


def _permit_store_end(config, ledger, op):
    """A store only reads; its end frees (poisons) the blocks of a request that
    left when it was that request's last transfer: any cell of them then."""
    t = ledger.transfers.get(op["handle"])
    if t is None:  # an illegal op: the reference raises OpError next
        raise KeyError(op["handle"])
    if ledger.finishing.get(t.req) is not t.owner or t.owner.pending != {t.handle}:
        return {}, frozenset()
    return _permit_transfer_end(config, ledger, op)


register(OpSpec(
    name="kv_store_begin", summary="a connector starts saving a request's first num_tokens "
    "tokens' KV to an external store; it reads the blocks until it completes",
    fields={"req": INT, "handle": HANDLE, "num_tokens": INT},
    example={"op": "kv_store_begin", "req": 0, "handle": 2, "num_tokens": 8},
    apply=lambda t, op: t.kv_store_begin(op["req"], op["handle"], op["num_tokens"]),
    draw=_draw_kv_store_begin, enabled=lambda m: bool(_storable(m)), requests=_req,
    rename=_handle_rename,
    sizes=lambda op: [Size("num_tokens", op["num_tokens"], 1,
                           lambda n: dict(op, num_tokens=n))],
    family="async"))
register(OpSpec(
    name="kv_store_complete", summary="a store in flight finishes: the external store holds "
    "what the blocks hold now, under the prefix's token ids",
    fields={"req": INT, "handle": HANDLE},
    example={"op": "kv_store_complete", "req": 0, "handle": 2},
    apply=lambda t, op: t.kv_store_complete(op["req"], op["handle"]),
    draw=_draw_transfer_end("kv_store_complete", "store"),
    enabled=lambda m: bool(_in_flight_of("store")(m)), requests=_req, rename=_handle_rename,
    permit=_permit_store_end, family="async"))


# -- the host tier: offload_begin / offload_complete, onboard_begin / onboard_complete
# Modelled on vLLM's offloading connector with its CPU tier (the scheduler side
# in vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py, the
# CPU manager in vllm/v1/kv_offload/cpu/manager.py) and SGLang's HiCache host
# pool: full computed blocks are copied to host blocks keyed by block hash;
# the engine evicts host blocks (LRU) to make room; a new request's full prompt
# blocks are onboarded from ready host blocks, which stay pinned until the
# copy ends.  The reference's rules: reference/host_tier.py; the invariants
# judging the copies: NO_FREE_WHILE_PENDING (a host block an onboard reads or
# an offload writes stays until it ends) and STORE_PROVENANCE (what a host
# block holds, and which blocks the tier holds).
def _offloadable(m) -> list[int]:
    if not m.cfg.host_blocks:
        return []
    return [r for r, s in sorted(m.ledger.requests.items())
            if r not in m.ledger.finishing
            and any(m.ledger.offloadable_columns(s, g) for g in m.cfg.attention_groups)]


def _stores_due(m) -> bool:
    """Does a request hold a full computed block whose hash the host tier lacks?
    vLLM's offloading connector stores each such block after the step that
    completed it (its scheduler side's ``build_connector_meta``)."""
    ledger = m.ledger
    return any(ledger.host_key(req, g, c) not in ledger.host.blocks
               for req in _offloadable(m) for g in m.cfg.attention_groups
               for c in ledger.offloadable_columns(ledger.requests[req], g))


def _draw_offload_begin(m, data) -> dict:
    req = data.choice(_offloadable(m))
    r = m.ledger.requests[req]
    blocks = []
    for g in range(len(m.cfg.groups)):
        cols = m.ledger.offloadable_columns(r, g)
        if not cols:
            blocks.append([])
            continue
        # Mostly the blocks computed since the last offload would be (a run
        # ending at the computed edge); sometimes all of them, or one.
        lo = data.integer(0, len(cols) - 1)
        hi = len(cols) - 1 if data.integer(0, 2) else data.integer(lo, len(cols) - 1)
        blocks.append([r.blocks[g][c] for c in cols[lo:hi + 1]])
    handle = max(m.ledger.used_handles, default=-1) + 1
    return {"op": "offload_begin", "req": req, "handle": handle, "blocks": blocks}


def _onboardable(m) -> list[int]:
    if not m.cfg.host_blocks:
        return []

    def now():  # as for kv_load_begin, but only the blocks held need be (the chunk's)
        if m.cfg.mamba_cache_mode != "none":  # Mamba prefix caching: refused
            return []
        return [r for r, s in sorted(m.ledger.requests.items())
                if not (s.stepped or s.loaded or s.load_failed)
                and s.num_computed_tokens == s.num_cached_tokens  # at most a prefix hit
                and r not in m.ledger.finishing
                and any(m.ledger.open_load_blocks(s, "host"))]

    per_state = getattr(m, "per_state", None)
    return per_state("onboardable", now) if per_state is not None else now()


def _draw_onboard_begin(m, data) -> dict:
    req = data.choice(_onboardable(m))
    avail = m.ledger.open_load_blocks(m.ledger.requests[req], "host")
    blocks = []
    for ids in avail:
        if not ids or data.integer(0, 2) == 0:
            blocks.append(list(ids))
        else:
            lo = data.integer(0, len(ids) - 1)
            blocks.append(ids[lo:data.integer(lo, len(ids) - 1) + 1])
    if not any(blocks):
        g = next(g for g, ids in enumerate(avail) if ids)
        blocks[g] = [avail[g][0]]
    handle = max(m.ledger.used_handles, default=-1) + 1
    return {"op": "onboard_begin", "req": req, "handle": handle, "blocks": blocks}


register(OpSpec(
    name="offload_begin", summary="a connector starts copying some of a request's full "
    "computed attention blocks to the host tier, which evicts its least recently used "
    "blocks to make room (or stores nothing); the copy reads the blocks until it completes",
    fields={"req": INT, "handle": HANDLE, "blocks": BLOCK_IDS},
    example={"op": "offload_begin", "req": 0, "handle": 3, "blocks": [[4, 5], []]},
    apply=lambda t, op: t.offload_begin(op["req"], op["handle"], op["blocks"]),
    draw=_draw_offload_begin, enabled=lambda m: bool(_offloadable(m)), requests=_req,
    rename=_rename, narrow=_narrow_begin, eager=_stores_due, family="async"))
register(OpSpec(
    name="offload_complete", summary="an offload in flight finishes: its host blocks hold "
    "what the request's blocks hold now and are ready to onboard",
    fields={"req": INT, "handle": HANDLE},
    example={"op": "offload_complete", "req": 0, "handle": 3},
    apply=lambda t, op: t.offload_complete(op["req"], op["handle"]),
    draw=_draw_transfer_end("offload_complete", "store", "host"),
    enabled=lambda m: bool(_in_flight_of("store", "host")(m)), requests=_req,
    rename=_handle_rename, permit=_permit_store_end, eager=lambda m: True, family="async"))
register(OpSpec(
    name="onboard_begin", summary="a connector starts loading a new request's full prompt "
    "blocks from ready host blocks of the same hashes, which stay pinned until it ends",
    fields={"req": INT, "handle": HANDLE, "blocks": BLOCK_IDS},
    example={"op": "onboard_begin", "req": 1, "handle": 4, "blocks": [[6, 7], []]},
    apply=lambda t, op: t.onboard_begin(op["req"], op["handle"], op["blocks"]),
    draw=_draw_onboard_begin, enabled=lambda m: bool(_onboardable(m)), requests=_req,
    rename=_rename, narrow=_narrow_begin, eager=lambda m: True, family="async"))
register(OpSpec(
    name="onboard_complete", summary="an onboard in flight lands: its blocks get what the host "
    "blocks hold now (the prompt's KV); a request that left meanwhile is freed after its "
    "last transfer",
    fields={"req": INT, "handle": HANDLE},
    example={"op": "onboard_complete", "req": 1, "handle": 4},
    apply=lambda t, op: t.onboard_complete(op["req"], op["handle"]),
    draw=_draw_transfer_end("onboard_complete", "load", "host"),
    enabled=lambda m: bool(_in_flight_of("load", "host")(m)), requests=_req,
    rename=_handle_rename, permit=_permit_transfer_end, family="async"))
