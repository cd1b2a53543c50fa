"""Behaviour coverage: which situations of this bug family a search exercised.

A *feature* is a situation known to matter for block-table / dummy-run bugs —
a FULL replay after a batch of another size, a dummy run right after the
persistent batch was condensed, a freed block handed out again a few ops
later.  :class:`Tracker` watches one example's ops (what the reference runner
did: its dispatched mode and padded sizes, its persistent rows, the ledger)
and reports the features each op hit; the fuzz machine counts them per run
(``fuzz --coverage``) and nightly per campaign (``report.json``).

Every feature lives in :data:`FEATURES` (id -> meaning); detectors are the
``_hits`` methods below.  Features are judged on the reference, so they mean
the same for every target and do not depend on a fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from reference import ATTENTION, MAMBA

from harness.core.ops import REGISTRY as OPS
from harness.core.ops.forward import MODES  # the cudagraph modes, FULL first
RUNNERS = ("v1", "v2")
GROUP_KINDS = (ATTENTION, MAMBA)
REUSE_WINDOW = 4  # ops: "a freed block reallocated soon"

FEATURES: dict[str, str] = {
    "full-replay-after-smaller": "a FULL replay whose padded batch is larger than the "
                                 "previous forward's",
    "full-replay-after-larger": "a FULL replay whose padded batch is smaller than the "
                                "previous forward's",
    "full-step-after-larger-step": "a FULL real step with fewer requests than the real step "
                                   "right before it (no dummy run between)",
    "batch-up-across-full": "a forward with more tokens than the FULL capture size the "
                            "previous forward replayed",
    "batch-down-across-full": "a forward padded to a smaller size than the FULL capture "
                              "size the previous forward replayed",
    "padded-tail-over-previous-tokens": "a forward with padded tokens where the previous "
                                        "forward had more real tokens (its tail is stale)",
    "padded-rows-over-previous-rows": "a forward with padded rows where the previous "
                                      "forward had more real rows",
    "dummy-after-condense": "a dummy run right after a condense",
    "dummy-after-swap": "a dummy run right after a swap",
    "dummy-after-remove": "a dummy run right after a remove",
    "freed-block-reused": f"a block freed by a remove handed out again within "
                          f"{REUSE_WINDOW} ops (same KV-cache group)",
    "page-reused-across-groups": f"kv_sharing: a block freed from one KV-cache group handed "
                                 f"to another group within {REUSE_WINDOW} ops (a Mamba state "
                                 "page now holding attention KV, or the reverse)",
    "row-vacated-reused": "a persistent row (V1 batch row / V2 state index) vacated by a "
                          "remove and later taken by another request",
    "loaded-next-to-padded": "a forward over a request whose KV was loaded (kv_load) "
                             "with padded rows or tokens beside it",
    "load-ends-after-leave": "a KV transfer completes or fails after its request left "
                             "(removed, or failed by a sibling transfer)",
    "store-ends-after-leave": "a store of a request's KV completes after the request left "
                              "(its blocks kept for the store)",
    "load-fails-beside-siblings": "a KV transfer fails while another transfer of its request "
                                  "is still in flight",
    "block-reused-after-late-load": f"a block freed when a departed request's last KV "
                                    f"transfer ended handed out again within {REUSE_WINDOW} ops",
    "resumed-after-blocks-reused": "a preempted request resumes while another request holds "
                                   "blocks it gave back",
    "host-block-stored": "engine allocator (new requests share prompts): an offload "
                         "completes, and a host block holds a prefix a new request can "
                         "onboard",
    "host-block-evicted": "an offload makes room in the host tier by evicting a block",
    "onboard-from-host": "a new request starts loading prompt blocks from the host tier",
    "offload-meets-pinned-host-block": "an offload into a full host tier while an onboard in "
                                       "flight still reads one of its blocks",
    "copy-reads-unretired-step": "a GPU -> host copy (an offload, or a save to the store) "
                                 "launched while a step in flight writes some of the "
                                 "tokens it copies",
    "step-completes-after-request-left": "a step in flight completes after one of its "
                                         "requests left",
    "step-completes-after-row-moved": "V1: a step in flight completes after one of its "
                                      "requests moved to another persistent row",
    "padding-over-prefilling-row": "a FULL forward padded over a V1 row whose last request's "
                                   "last step was a prompt chunk (engines keep its counters "
                                   "there: vLLM #41841)",
    "mamba-decodes-with-prefills": "a forward whose Mamba layers see decodes (up to 1 + k "
                                   "tokens, prior state) and prefills in one batch",
    "full-replay-mixed-batch": "a FULL replay of a batch that is not 1 + k tokens per row "
                               "(backends that capture mixed batches: cudagraph_support ALWAYS)",
    "backend-slots-padded": "a forward that builds metadata with padded tokens, on a config "
                            "whose attention backend keeps its own slot buffer",
    "spec-tokens-rejected": "a spec-decode step in which a decode kept fewer tokens than it "
                            "ran (its rejected tokens' KV and state columns are garbage)",
    "mamba-running-column": "a Mamba row that starts from a state column other than 0 (the "
                            "last step kept more than one token)",
    "draft-full-padded": "the drafter's single-token pass replayed FULL over padded rows",
    "spec-row-moved": "a spec-decode request that runs in another batch row than in its "
                      "previous step (condense, reorder or re-entry moved its accepted count)",
    "spec-row-count-foreign": "a request of a spec-decode config that runs in a batch row where "
                              "another request kept a different accepted count in the row's "
                              "previous forward, neither count a mid-prompt chunk's 0 (a new "
                              "request's count is 1): a count copied by row, not by request, "
                              "lands on it (vLLM PR #45100)",
    "spec-count-foreign-next-forward": "V1, hybrid: spec-row-count-foreign for a request with "
                                       "computed tokens (a step or a prefix hit before: it "
                                       "continues from a state column), in the "
                                       "forward right after the one whose counts are in the "
                                       "rows (a dummy run between empties the batch first: "
                                       "a late copy lands on no request)",
    "prefix-hit": "a request admitted with a prefix-cache hit (allocator engine)",
    "prompt-all-cached": "a request admitted whose whole prompt is in cached full blocks (the "
                         "hit must stop short of it: its last token is computed again)",
    "hit-on-freed-cached-block": "a prefix hit on a registered block no live request held "
                                 "(its owner finished; it sat in the free queue, evictable)",
    "cached-block-evicted": "a block registered in the prefix cache handed out as a new "
                            "block (evicted)",
    "prefix-of-uncomputed-blocks": "a request admitted whose prompt shares a full block with "
                                   "a live request that holds that block but has not "
                                   "computed it yet",
    "allocation-refused": "an admit or allocate the KV-cache manager refused (pool short)",
    "window-blocks-freed": "an allocate that freed blocks a request's sliding window left "
                           "(their entries nulled, the runner's row keeps the ids)",
    "window-hit": "a prefix hit whose sliding-window group's blocks before the window of "
                  "its first new token are the null block",
    "mamba-state-restored": "align mode: a request's first step starts from its prefix hit's "
                            "cached Mamba state, copied into its new state block",
    "mamba-state-restored-larger-block": "align mode: a Mamba state restored from a prefix hit "
                                         "where the state block is larger than an attention "
                                         "group's block (one hit, counted in different blocks "
                                         "per group: vLLM issue #55600)",
    "window-hit-drafter": "a window hit in a drafter config: EAGLE's lookup searches a run one "
                          "block longer than the window needs, then drops its last block for "
                          "the drafter to compute again (vLLM PR #17398)",
    "mamba-state-carried": "align mode: a running request's state copied into a new state "
                           "block as its tokens cross a Mamba block boundary",
    "full-spec-replay": "a real step with a drafter replayed from a FULL graph: a uniform "
                        "batch of 1 + k tokens per row",
    "placeholder-drafts": "a spec_step with placeholder drafts: a decode padded to 1 + k "
                          "tokens, none of them accepted",
    "mamba-state-carried-with-bias": "align mode with a drafter: a running state moved "
                                     "across a Mamba block boundary from the column past the "
                                     "old running one where the last accepted token left it "
                                     "(the accepted-token bias), the accepted count reset",
    "mamba-block-completed-with-bias": "align mode with a drafter: accepted tokens past the "
                                       "first complete a Mamba block, and the state at its "
                                       "end is copied into it after the forward from the "
                                       "column where the last of them left it (the "
                                       "accepted-token bias)",
    "mamba-spec-block-moved": "align mode with a drafter: a growing Mamba list moves a "
                              "speculative state block to its end (its old entry nulled; the "
                              "runner's row keeps the old id there)",
    "mamba-state-block-completed": "all mode: a chunk that starts inside a Mamba state block "
                                   "crosses its end, so that block's end state is written "
                                   "by a later chunk than the one that began it (vLLM PR "
                                   "#34587)",
    "mamba-state-read-from-hit": "all mode: a request's first step after a prefix hit reads "
                                 "its initial state straight from the hit's cached state "
                                 "block (no copy before the forward)",
    "mamba-short-prefill-across-blocks": "all mode: a prefill chunk shorter than the conv "
                                         "state reads its initial state through one state "
                                         "block and ends in another (the conv kernel's short "
                                         "branch: vLLM PR #56196)",
    "position-past-narrow-row": "a real forward over a request whose positions run past a "
                                "narrow group's row (GroupSpec.max_num_blocks: those tokens "
                                "have no slot in that group)",
    **{f"forward:{m}:{r}:{k}": f"a forward dispatched {m} on runner {r}, config with {k} group(s)"
       for m in MODES for r in RUNNERS for k in GROUP_KINDS},
}


@dataclass
class Tracker:
    """Feature detection over one example (one session, one config).

    Call :meth:`before` with the op and the ledger before it is applied, then
    :meth:`after` with the reference runner once it has been; ``after``
    returns the ids this op hit (each at most once per op).  ``first``:
    {feature id: op index of its first hit in this example}.
    """

    config: object
    op_index: int = 0
    prev_forward: object = None
    prev_real_forward: object = None
    prev_op: str | None = None
    freed: dict = field(default_factory=dict)  # (group, block) -> op index freed
    late_freed: dict = field(default_factory=dict)  # freed when a departed request's
    # last transfer ended: (group, block) -> op index
    _transfer: tuple | None = None  # a transfer's end: (its request had left, siblings)
    dispatched: list = field(default_factory=list)  # steps in flight: {req: row at dispatch}
    writes_in_flight: list = field(default_factory=list)  # steps in flight: {req: first token}
    preempted_blocks: dict = field(default_factory=dict)  # req -> {(group, block)} it gave back
    _resumed_over: bool = False
    vacated: set = field(default_factory=set)  # rows vacated by a remove, not yet reused
    loaded: set = field(default_factory=set)  # requests that arrived by kv_load
    left_prefilling: set = field(default_factory=set)  # V1 rows left in a prompt chunk
    first: dict = field(default_factory=dict)
    _pending_free: list = field(default_factory=list)
    last_row: dict = field(default_factory=dict)  # request -> batch row of its last step
    row_count: dict = field(default_factory=dict)  # batch row -> (request, count it kept)
    _rows_before: object = None

    def __post_init__(self) -> None:
        self._larger_state_blocks = _state_blocks_larger(self.config)
        self._late_copy_lands = NEEDS["spec-count-foreign-next-forward"](self.config)

    def before(self, op: dict, ledger, reference) -> None:
        self._sched_before = self._scheduler_state(op, ledger)
        self._pending_free = []
        self._transfer = None
        self._meets_pin = False
        self._copies_unretired = False
        self._stored = op["op"] == "offload_complete" and self.config.allocator == "engine" \
            and bool(getattr(
            ledger.transfers.get(op.get("handle")), "host_keys", None))
        if op["op"] in ("offload_begin", "kv_store_begin") and op.get("req") in ledger.requests:
            self._copies_unretired = self._copy_end(op, ledger) > min(
                (w[op["req"]] for w in self.writes_in_flight if op["req"] in w), default=1 << 30)
        if op["op"] == "offload_begin" and ledger.config.host_blocks:
            host = ledger.host
            self._meets_pin = len(host.blocks) >= host.capacity and any(
                b.pins for b in host.blocks.values())
        if op["op"] == "resume":
            self._resumed_over = any(
                self.preempted_blocks.get(op["req"], set()) & {(g, b) for g, ids in
                                                               enumerate(r.blocks) for b in ids}
                for r in ledger.requests.values())
        if op["op"] == "preempt" and op["req"] in ledger.requests:
            self.preempted_blocks[op["req"]] = {
                (g, b) for g, ids in enumerate(ledger.requests[op["req"]].blocks) for b in ids}
        if op["op"] in ("remove", "preempt") and op["req"] in ledger.requests:
            r = ledger.requests[op["req"]]
            if not r.pending:  # else its blocks are freed when its last transfer ends
                self._pending_free = [(g, b) for g, ids in enumerate(r.blocks) for b in ids]
        elif op["op"] in ("kv_load_complete", "kv_load_fail", "kv_store_complete",
                          "offload_complete", "onboard_complete") \
                and op.get("handle") in ledger.transfers:
            t = ledger.transfers[op["handle"]]
            r = ledger.owner_of_transfer(t)
            left = ledger.finishing.get(t.req) is t.owner
            last = r.pending == {t.handle}
            self._transfer = (left, not last)
            if last and (left or op["op"] == "kv_load_fail"):
                self._pending_free = [(g, b) for g, ids in enumerate(r.blocks) for b in ids]
        self._rows_before = reference.rows.req_ids.tolist()  # (Python ints: walked per row)
        # Read by the drafter's features (_spec_hits) and a dispatch's writes in flight only.
        spec = bool(self.config.num_speculative_tokens)
        self._counts_before = dict(getattr(reference, "num_accepted_of", {})) if spec else {}
        self._computed_before = ({req: r.num_computed_tokens
                                  for req, r in ledger.requests.items()}
                                 if spec or op["op"] == "step_dispatch" else {})
        rows = reference.rows
        self._prefilling_before = (rows.num_computed_tokens < rows.num_prompt_tokens).tolist()

    def after(self, op: dict, reference) -> list[str]:
        hit = self._hits(op, reference)
        for f in hit:
            self.first.setdefault(f, self.op_index)
        for gb in self._pending_free:
            self.freed[gb] = self.op_index
            if self._transfer is not None:
                self.late_freed[gb] = self.op_index
        self.prev_op = op["op"]
        self.op_index += 1
        return hit

    def _hits(self, op: dict, reference) -> list[str]:
        kind, hit = op["op"], []
        rows_after = reference.rows.req_ids.tolist()
        # Rows vacated by this op; rows reused after an earlier vacate.
        for row, (was, now) in enumerate(zip(self._rows_before, rows_after)):
            if now >= 0 and now != was and row in self.vacated:
                hit.append("row-vacated-reused")
                self.vacated.discard(row)
            if kind == "remove" and was >= 0 and now < 0:
                self.vacated.add(row)
            if now >= 0:
                self.left_prefilling.discard(row)
            elif was >= 0:  # left by this op (removed, unscheduled, or moved by condense)
                if self._prefilling_before[row]:
                    self.left_prefilling.add(row)
                else:
                    self.left_prefilling.discard(row)
        if kind == "kv_load":
            self.loaded.add(op["req"])
        if kind == "resume" and self._resumed_over:
            hit.append("resumed-after-blocks-reused")
        if kind == "step_dispatch":
            rows = reference.rows
            self.dispatched.append({int(r): rows.row_of(int(r))
                                    for r in reference.last_forward.req_ids})
            self.writes_in_flight.append({int(x[0]): self._computed_before[int(x[0])]
                                          for x in op["scheduled"]})
        if self._copies_unretired:
            hit.append("copy-reads-unretired-step")
        if kind == "step_complete" and self.writes_in_flight:
            self.writes_in_flight.pop(0)
        if kind == "step_complete" and self.dispatched:
            rows = reference.rows
            for req, row in self.dispatched.pop(0).items():
                if req not in reference.ledger.requests:
                    hit.append("step-completes-after-request-left")
                elif self.config.runner == "v1" and rows.row_of(req) != row:
                    hit.append("step-completes-after-row-moved")
        if self._transfer is not None:
            left, siblings = self._transfer
            if left:
                hit.append("store-ends-after-leave"
                           if kind in ("kv_store_complete", "offload_complete")
                           else "load-ends-after-leave")
            if kind == "kv_load_fail" and siblings:
                hit.append("load-fails-beside-siblings")
            r = reference.ledger.requests.get(op["req"])
            if r is not None and r.loaded:
                self.loaded.add(op["req"])
        if kind == "offload_begin":
            if reference.ledger.host.last_evicted:
                hit.append("host-block-evicted")
            if self._meets_pin:
                hit.append("offload-meets-pinned-host-block")
        if kind == "onboard_begin":
            hit.append("onboard-from-host")
        if kind == "offload_complete" and self._stored:
            hit.append("host-block-stored")
        if kind in ("admit", "allocate"):
            hit += self._scheduler_hits(op)
        if kind in ("add", "kv_load", "append", "admit", "allocate"):
            for g, ids in enumerate(op.get("blocks") or []):
                if any(self.op_index - self.freed.get((g, b), -10**9) <= REUSE_WINDOW
                       for b in ids):
                    hit.append("freed-block-reused")
                    break
            if any(self.op_index - self.late_freed.get((g, b), -10**9) <= REUSE_WINDOW
                   for g, ids in enumerate(op.get("blocks") or []) for b in ids):
                hit.append("block-reused-after-late-load")
            taken = {(g, b) for g, ids in enumerate(op.get("blocks") or []) for b in ids if b}
            if any(h != g and (h, b) in self.freed
                   and self.op_index - self.freed[(h, b)] <= REUSE_WINDOW
                   for g, b in taken for h in range(len(op.get("blocks") or []))):
                hit.append("page-reused-across-groups")
        if kind == "dummy_run" and self.prev_op in ("condense", "swap", "remove"):
            hit.append(f"dummy-after-{self.prev_op}")
        fwd = reference.last_forward if OPS[kind].forward else None
        if kind == "spec_step" and any(x[2] < x[1] for x in op["scheduled"]):
            hit.append("spec-tokens-rejected")
        if kind in ("spec_step", "step_dispatch") and any(
                len(x) > 3 and x[3] for x in op["scheduled"]):
            hit.append("placeholder-drafts")
        if fwd is not None and not fwd.dummy and fwd.cudagraph_mode == "FULL" \
                and self.config.num_speculative_tokens:
            hit.append("full-spec-replay")
        if fwd is not None and not fwd.dummy and any(
                reference.ledger.requests[r].last_seq_len > self.config.row_tokens(g)
                for g in self.config.narrow_groups for r in fwd.req_ids
                if r in reference.ledger.requests):
            hit.append("position-past-narrow-row")
        if fwd is not None:
            hit += self._forward_hits(fwd, reference)
            hit += self._spec_hits(fwd, reference)
            self.prev_forward = fwd
            self.prev_real_forward = None if fwd.dummy else fwd
        # dedupe, keep order
        return list(dict.fromkeys(hit))

    def _copy_end(self, op: dict, ledger) -> int:
        """The end of the token range a store or offload copies."""
        if op["op"] == "kv_store_begin":
            return op["num_tokens"]
        r = ledger.requests[op["req"]]
        return max(((r.blocks[g].index(b) + 1) * self.config.tokens_per_block(g)
                    for g, ids in enumerate(op["blocks"]) for b in ids
                    if g < len(r.blocks) and b in r.blocks[g]), default=0)

    def _scheduler_state(self, op: dict, ledger):
        """What the scheduler features need from the ledger before an admit /
        allocate: (ref counts, registrations, prefix-of-uncomputed)."""
        if op["op"] not in ("admit", "allocate"):
            return None
        uncomputed = all_cached = False
        if op["op"] == "admit" and self.config.enable_prefix_caching:
            tokens = ledger.prompt_tokens(op["req"], op["prompt_len"], op["prefix"])
            all_cached = ledger.expected_hit(np.append(tokens, -1))[0] >= op["prompt_len"]
        if op["op"] == "admit" and op["prefix"] and self.config.enable_prefix_caching:
            src, n = op["prefix"]
            r = ledger.requests.get(src)
            if r is not None:
                g = self.config.attention_groups[0]
                bs = self.config.tokens_per_block(g)
                uncomputed = r.num_computed_tokens < bs <= min(n, len(r.blocks[g]) * bs)
        return ([c.copy() for c in ledger.ref_count], [dict(x) for x in ledger.registered],
                uncomputed, all_cached)

    def _scheduler_hits(self, op: dict) -> list[str]:
        refs, registered, uncomputed, all_cached = self._sched_before
        blocks, hit = op.get("blocks"), op.get("num_cached_tokens") or 0
        out = ["prefix-of-uncomputed-blocks"] if uncomputed else []
        if all_cached:
            out.append("prompt-all-cached")
        if any(ids and self.config.groups[g].sliding_window
               for g, ids in enumerate(op.get("freed") or [])):
            out.append("window-blocks-freed")
        if blocks is None:
            return out + ["allocation-refused"]
        if op["op"] == "allocate" and any(
                self.config.pads_with_null(g) and any(0 < b < len(refs[g]) and refs[g][b]
                                                      for b in ids)
                for g, ids in enumerate(blocks)):
            out.append("mamba-spec-block-moved")  # an id the request held: moved to the end
        if hit:
            out.append("prefix-hit")
            if any(self.config.groups[g].sliding_window and ids and ids[0] == 0
                   for g, ids in enumerate(blocks)):
                out.append("window-hit")
                if self.config.num_speculative_tokens:
                    out.append("window-hit-drafter")
        for g, ids in enumerate(blocks):
            n_hit = self.config.hit_columns(g, hit)
            if any(refs[g][b] == 0 for b in ids[:n_hit] if 0 < b < len(refs[g])):
                out.append("hit-on-freed-cached-block")
            if any(b in registered[g] for b in ids[n_hit:]):
                out.append("cached-block-evicted")
        return out

    def _all_mode_hits(self, fwd, reference) -> list[str]:
        """Mamba prefix caching in all mode: which of the batch's chunks cross a
        state block they did not start, and which short prefill chunks read one
        state block and end in another."""
        cfg, n, hit = self.config, fwd.num_reqs, []
        qlen = np.diff(reference.query_start_loc[:n + 1]).astype(np.int64)
        seq = reference.seq_lens[:n].astype(np.int64)
        start = seq - qlen
        bs = cfg.tokens_per_block(cfg.mamba_groups[0])
        if ((start % bs != 0) & (start // bs < (seq - 1) // bs)).any():
            hit.append("mamba-state-block-completed")
        ledger = reference.ledger.requests
        if any(r in ledger and 0 < ledger[r].num_cached_tokens == int(s)
               for r, s in zip(fwd.req_ids, start)):
            hit.append("mamba-state-read-from-hit")
        conv = max(cfg.groups[g].conv_size for g in cfg.mamba_groups)
        if (reference.is_prefilling[:n] & (qlen > 1) & (qlen < conv) & (start > 0)
                & ((start - 1) // bs != (seq - 1) // bs)).any():
            hit.append("mamba-short-prefill-across-blocks")
        return hit

    def _forward_hits(self, fwd, reference=None) -> list[str]:
        cfg, hit = self.config, []
        for k in {cfg.groups[g].kind for g in range(len(cfg.groups))}:
            hit.append(f"forward:{fwd.cudagraph_mode}:{cfg.runner}:{k}")
        prev = self.prev_forward
        if prev is not None:
            if fwd.cudagraph_mode == "FULL" and fwd.num_tokens_padded > prev.num_tokens_padded:
                hit.append("full-replay-after-smaller")
            if fwd.cudagraph_mode == "FULL" and fwd.num_tokens_padded < prev.num_tokens_padded:
                hit.append("full-replay-after-larger")
            if prev.cudagraph_mode == "FULL" and fwd.num_tokens > prev.num_tokens_padded:
                hit.append("batch-up-across-full")
            if prev.cudagraph_mode == "FULL" and fwd.num_tokens_padded < prev.num_tokens_padded:
                hit.append("batch-down-across-full")
            if fwd.num_tokens_padded > fwd.num_tokens and prev.num_tokens > fwd.num_tokens:
                hit.append("padded-tail-over-previous-tokens")
            if fwd.num_reqs_padded > fwd.num_reqs and prev.num_reqs > fwd.num_reqs:
                hit.append("padded-rows-over-previous-rows")
        real = self.prev_real_forward
        if (not fwd.dummy and fwd.cudagraph_mode == "FULL" and real is not None
                and prev is real and fwd.num_reqs < real.num_reqs):
            hit.append("full-step-after-larger-step")
        if (cfg.runner == "v1" and fwd.cudagraph_mode == "FULL"
                and self.left_prefilling & set(range(fwd.num_reqs, fwd.num_reqs_padded))):
            hit.append("padding-over-prefilling-row")
        if (reference is not None and cfg.mamba_groups and fwd.metadata and not fwd.dummy
                and fwd.num_reqs > 1):
            n = fwd.num_reqs
            qlen = np.diff(reference.query_start_loc[:n + 1])
            # A decode: up to 1 + k tokens, prompt done (a one-token prompt chunk
            # with prior state counts too, as the Mamba builder counts it).
            decode = (qlen <= cfg.uniform_query_len) & (reference.seq_lens[:n] > qlen) & (
                ~reference.is_prefilling[:n] | (qlen == 1))
            if decode.any() and not decode.all():
                hit.append("mamba-decodes-with-prefills")
        if fwd.cudagraph_mode == "FULL" and fwd.num_tokens != fwd.num_reqs * cfg.uniform_query_len:
            hit.append("full-replay-mixed-batch")
        if not fwd.dummy and reference is not None:
            for _, _, _, kind in getattr(reference, "mamba_copies", ()):
                if kind == "completed":
                    continue  # mamba-block-completed-with-bias, below
                first = kind == "restored"
                hit.append("mamba-state-restored" if first else "mamba-state-carried")
                if first and self._larger_state_blocks:
                    hit.append("mamba-state-restored-larger-block")
        if not fwd.dummy and reference is not None:
            for e in getattr(reference, "mamba_events", ()):
                hit.append("mamba-state-carried-with-bias" if e == "carried-with-bias"
                           else "mamba-block-completed-with-bias")
        if not fwd.dummy and reference is not None and cfg.mamba_cache_mode == "all":
            hit += self._all_mode_hits(fwd, reference)
        if (fwd.metadata and fwd.num_tokens_padded > fwd.num_tokens
                and any(g.slot_buffer for g in cfg.groups)):
            hit.append("backend-slots-padded")
        if not fwd.dummy and self.loaded & set(fwd.req_ids) and (
                fwd.num_reqs_padded > fwd.num_reqs or fwd.num_tokens_padded > fwd.num_tokens):
            hit.append("loaded-next-to-padded")
        return hit


    def _spec_hits(self, fwd, reference) -> list[str]:
        """Speculative-decoding features of a forward (configs with a drafter)."""
        cfg, hit = self.config, []
        if not cfg.num_speculative_tokens:
            return hit
        rows = getattr(reference, "draft_rows", None)
        if rows and rows[1] > rows[0] and getattr(reference, "draft_full", False):
            hit.append("draft-full-padded")
        if fwd.dummy:
            return hit
        if cfg.mamba_groups and fwd.metadata and \
                (reference.state_columns[:fwd.num_reqs] > 0).any():
            hit.append("mamba-running-column")
        for b, req in enumerate(fwd.req_ids):
            if self.last_row.get(req, b) != b and self._counts_before.get(req, 1) != 1:
                hit.append("spec-row-moved")
            self.last_row[req] = b
            # Neither count a mid-prompt chunk's 0; a request that has not run yet
            # counts 1 (what add/admit give it), and a late copy would land on it too.
            was, own = self.row_count.get(b), self._counts_before.get(req, 0)
            if was is not None and was[0] != req and min(was[1], own) >= 1 and was[1] != own:
                hit.append("spec-row-count-foreign")
                if self._late_copy_lands and self.prev_real_forward is not None \
                        and self._computed_before.get(req, 0):
                    # No dummy run's update between, and a request with state to
                    # continue from (a first chunk reads no state column).
                    hit.append("spec-count-foreign-next-forward")
        after = getattr(reference, "num_accepted_of", {})
        for b, req in enumerate(fwd.req_ids):
            self.row_count[b] = (req, after.get(req, 1))
        return hit


def table_rows(counts: dict, examples: dict | None = None,
               runner: str | None = None) -> list[tuple]:
    """(feature, ops that hit it, examples that hit it or None, meaning) for every
    feature of ``runner``'s kind (token-slot features for ``sglang``, the
    block-table ones otherwise), in :data:`FEATURES` order (zero counts
    included: an unhit feature is the news)."""
    return [(f, counts.get(f, 0), None if examples is None else examples.get(f, 0), FEATURES[f])
            for f in features_of(runner)]


def features_of(runner: str | None) -> list[str]:
    """Feature ids of ``runner``'s kind, in :data:`FEATURES` order: the token-slot
    ones for ``sglang``, the block-table ones for v1 / v2 / drawn (None)."""
    token_slots = runner == "sglang"
    return [f for f in FEATURES if (f in TOKEN_SLOT_FEATURES) == token_slots]


V1_ONLY = ("dummy-after-condense", "dummy-after-swap", "padding-over-prefilling-row",
           "spec-count-foreign-next-forward")
"""Features only the V1 persistent batch has (condense and swap are V1 ops; V2
keeps accepted counts by request, not by batch row)."""


def _engine(c) -> bool:
    return c.allocator == "engine"


def _window(c) -> bool:
    return any(g.sliding_window for g in c.groups)


def _align_drafter(c) -> bool:
    """Align mode with a drafter (speculative state columns at a Mamba list's end)."""
    return c.mamba_cache_mode == "align" and c.num_speculative_tokens > 0


def _state_blocks_larger(c) -> bool:
    """Align mode with a Mamba state block larger than some attention group's block."""
    return c.mamba_cache_mode == "align" and bool(c.attention_groups) and \
        max(c.tokens_per_block(g) for g in c.mamba_groups) > \
        min(c.tokens_per_block(g) for g in c.attention_groups)


NEEDS = {
    "spec-tokens-rejected": lambda c: c.num_speculative_tokens > 0,
    "mamba-running-column": lambda c: c.num_speculative_tokens > 0 and bool(c.mamba_groups),
    "draft-full-padded": lambda c: c.num_speculative_tokens > 1,
    "spec-row-moved": lambda c: c.num_speculative_tokens > 0,
    "spec-row-count-foreign": lambda c: c.num_speculative_tokens > 0,
    "spec-count-foreign-next-forward": lambda c: (c.num_speculative_tokens > 0 and c.runner == "v1"
                                                  and bool(c.mamba_groups)),
    "mamba-decodes-with-prefills": lambda c: bool(c.mamba_groups),
    "full-replay-mixed-batch": lambda c: c.cudagraph_support == "ALWAYS",
    "backend-slots-padded": lambda c: any(g.slot_buffer for g in c.groups),
    "loaded-next-to-padded": lambda c: c.mamba_cache_mode == "none",
    "step-completes-after-row-moved": lambda c: c.runner == "v1",
    "resumed-after-blocks-reused": lambda c: c.allocator == "trace",
    "load-ends-after-leave": lambda c: c.mamba_cache_mode == "none",
    "store-ends-after-leave": lambda c: not any(g.sliding_window for g in c.groups),
    "load-fails-beside-siblings": lambda c: c.mamba_cache_mode == "none",
    "block-reused-after-late-load": lambda c: c.mamba_cache_mode == "none",
    "prefix-hit": lambda c: c.enable_prefix_caching,
    "prompt-all-cached": lambda c: c.enable_prefix_caching,
    "hit-on-freed-cached-block": lambda c: c.enable_prefix_caching,
    "cached-block-evicted": lambda c: c.enable_prefix_caching,
    "prefix-of-uncomputed-blocks": lambda c: c.enable_prefix_caching,
    "allocation-refused": _engine,
    "window-blocks-freed": _window,
    "window-hit": lambda c: _window(c) and c.enable_prefix_caching,
    "mamba-state-restored": lambda c: c.mamba_cache_mode == "align",
    "mamba-state-restored-larger-block": _state_blocks_larger,
    "window-hit-drafter": lambda c: (_window(c) and c.enable_prefix_caching
                                     and c.num_speculative_tokens > 0),
    "mamba-state-carried": lambda c: c.mamba_cache_mode == "align",
    "page-reused-across-groups": lambda c: c.kv_sharing,
    "position-past-narrow-row": lambda c: bool(c.narrow_groups),
    "mamba-state-carried-with-bias": lambda c: _align_drafter(c),
    "mamba-block-completed-with-bias": lambda c: _align_drafter(c),
    "mamba-spec-block-moved": lambda c: _align_drafter(c),
    "mamba-state-block-completed": lambda c: c.mamba_cache_mode == "all",
    "mamba-state-read-from-hit": lambda c: c.mamba_cache_mode == "all",
    "mamba-short-prefill-across-blocks": lambda c: c.mamba_cache_mode == "all" and any(
        g.conv_size > 2 for g in c.groups),
    "full-spec-replay": lambda c: c.num_speculative_tokens > 0 and bool(c.full_capture_sizes),
    "placeholder-drafts": lambda c: c.num_speculative_tokens > 0,
    "host-block-stored": lambda c: c.host_blocks > 0 and c.allocator == "engine",
    "host-block-evicted": lambda c: c.host_blocks > 0,
    # (allocator trace: a preempted request resumed onboards its own prefix)
    "onboard-from-host": lambda c: c.host_blocks > 0,
    "offload-meets-pinned-host-block": lambda c: c.host_blocks > 0,
    "copy-reads-unretired-step": lambda c: (c.host_blocks > 0 or not any(
        g.sliding_window for g in c.groups)) and bool(c.attention_groups),
}
"""What a pinned config needs for a feature to be reachable at all."""

NARROWS = {
    "window-hit": "prefix-hit",
    "window-hit-drafter": "prefix-hit",
    "mamba-state-restored": "prefix-hit",
    "mamba-state-restored-larger-block": "prefix-hit",
    "mamba-short-prefill-across-blocks": "prefix-hit",
    "mamba-state-read-from-hit": "prefix-hit",
    "mamba-state-carried-with-bias": "mamba-running-column",
    "mamba-block-completed-with-bias": "mamba-running-column",
    "spec-count-foreign-next-forward": "spec-row-count-foreign",
    "onboard-from-host": "host-block-stored",
    "offload-meets-pinned-host-block": "onboard-from-host",
}
"""Feature -> the broader feature met on the way to it (every window hit and every
Mamba state restored is a prefix hit).  For a feature a run has not hit yet,
steering (:func:`harness.search.steer.learn`) keeps the prefixes that hit its
broader feature in a config where it is reachable (its :data:`NEEDS`): the
frontier the search goes on from."""


def possible(feature: str, runner: str | None, config=None) -> bool:
    """Can ``feature`` be hit with the runner pinned to ``runner`` (None: drawn)
    and, when pinned, ``config`` (None: drawn per example)?"""
    if (runner == "sglang") != (feature in TOKEN_SLOT_FEATURES):
        return False  # token-slot features on token-slot runs only, and only they
    if feature in TOKEN_SLOT_FEATURES:
        return config is None or TOKEN_SLOT_NEEDS.get(feature, lambda c: True)(config)
    if runner == "v2" and feature in V1_ONLY:
        return False
    other = {"v1": "v2", "v2": "v1"}.get(runner or "")
    if other and feature.startswith("forward:") and f":{other}:" in feature:
        return False
    if config is None:
        return True
    if feature.startswith("forward:"):
        return feature.rsplit(":", 1)[1] in {g.kind for g in config.groups}
    return NEEDS.get(feature, lambda c: True)(config)


def reachable(runner: str | None = None, config=None) -> list[str]:
    """Feature ids a run with this runner / config pinning can hit."""
    return [f for f in FEATURES if possible(f, runner, config)]


def unhit(counts: dict, runner: str | None = None, config=None) -> list[str]:
    """Reachable feature ids with no hit (features the pinned runner or config
    cannot hit are not counted as missed)."""
    return [f for f in reachable(runner, config) if not counts.get(f)]


# -- token-slot engines (SGLang's shape: runner "sglang") --------------------------------
TOKEN_SLOT_FEATURES: dict[str, str] = {
    "sgl-prompt-from-finished": "a prompt that starts with a finished request's tokens "
                                "(what its radix tree may hold: a prefix hit)",
    "sgl-prompt-from-live": "a prompt that starts with a live request's tokens (not in "
                            "the tree yet: no hit)",
    "sgl-padded-decode": "a decode batch padded to a larger captured graph size (padded "
                         "rows at row 0 / slot 0)",
    "sgl-eager-decode": "a decode batch larger than every captured size (run unpadded)",
    "sgl-idle-batch": "an idle batch replayed in the decode graph (padding only)",
    "sgl-idle-after-decode": "an idle batch right after a padded decode (its buffers "
                             "hold the last batch's rows)",
    "sgl-evict-under-hit": "an eviction while a live request holds a hit on a finished "
                           "request's tokens (its path locked)",
    "sgl-admit-after-finish": f"a request admitted within {REUSE_WINDOW} ops of a finish "
                              "(freed rows and slots handed out again)",
    "sgl-pool-nearly-full": "live requests hold at least three quarters of the slots",
    "sgl-decode-opens-page": "a decode whose new position starts a page (paged allocator)",
    "sgl-hybrid-prompt-from-finished": "a hybrid model (Mamba pool): a prompt that starts "
                                       "with a finished request's tokens (a state the tree "
                                       "may hold, copied into the new request's slot)",
    "sgl-hybrid-padding-over-earlier-rows": "a hybrid model: a padded replay (decode or "
                                            "idle) whose padded rows were real rows of an "
                                            "earlier replay at that graph size",
    "sgl-hybrid-states-pressed": "a hybrid model: the live requests may need every Mamba "
                                 "slot but two (the tree's states give way to new ones)",
}
FEATURES.update(TOKEN_SLOT_FEATURES)
TOKEN_SLOT_NEEDS = {
    "sgl-prompt-from-finished": lambda c: c.radix_cache,
    "sgl-evict-under-hit": lambda c: c.radix_cache,
    "sgl-decode-opens-page": lambda c: c.page_size > 1,
    "sgl-eager-decode": lambda c: c.max_num_reqs > max(c.capture_bs),
    "sgl-hybrid-prompt-from-finished": lambda c: c.mamba_slots > 0 and c.radix_cache,
    "sgl-hybrid-padding-over-earlier-rows": lambda c: c.mamba_slots > 0,
    "sgl-hybrid-states-pressed": lambda c: c.mamba_slots > 0,
}


@dataclass
class TokenSlotTracker:
    """:class:`Tracker` for a token-slot config: the same ``before`` / ``after`` /
    ``first`` interface, features judged on the token-slot oracle."""

    config: object
    op_index: int = 0
    first: dict = field(default_factory=dict)
    last_finish: int = -REUSE_WINDOW - 1
    prev_forward: dict | None = None
    hits: set = field(default_factory=set)  # live requests admitted on a finished one's tokens
    real_rows: dict = field(default_factory=dict)  # graph size -> real rows of its last replay

    def before(self, op: dict, ledger, reference) -> None:
        self._opens = False
        if op["op"] == "sgl_decode" and self.config.page_size > 1:
            self._opens = any(reference.requests[r].kv_len % self.config.page_size == 0
                              for r in reference.live())
        self._source_live = None
        if op["op"] == "sgl_admit" and op.get("prefix"):
            src = reference.requests.get(op["prefix"][0])
            self._source_live = None if src is None else src.live

    def after(self, op: dict, reference) -> list[str]:
        cfg, kind, hit = self.config, op["op"], []
        fwd = reference.last_forward
        if kind == "sgl_admit":
            if self._source_live is False:
                hit.append("sgl-prompt-from-finished")
                self.hits.add(op["req"])
            elif self._source_live:
                hit.append("sgl-prompt-from-live")
            if self.op_index - self.last_finish <= REUSE_WINDOW:
                hit.append("sgl-admit-after-finish")
        elif kind == "sgl_decode":
            padded = fwd.get("padded_bs")
            if padded is None:
                hit.append("sgl-eager-decode")
            elif padded > len(fwd["reqs"]):
                hit.append("sgl-padded-decode")
            if self._opens:
                hit.append("sgl-decode-opens-page")
        elif kind == "sgl_idle":
            hit.append("sgl-idle-batch")
            prev = self.prev_forward or {}
            if prev.get("kind") == "decode" and prev.get("padded_bs"):
                hit.append("sgl-idle-after-decode")
        elif kind == "sgl_finish":
            self.last_finish = self.op_index
            self.hits.discard(op["req"])
        elif kind == "sgl_evict" and self.hits & set(reference.live()):
            hit.append("sgl-evict-under-hit")
        if reference.held_slots() * 4 >= cfg.num_slots * 3:
            hit.append("sgl-pool-nearly-full")
        if cfg.mamba_slots:
            hit += self._hybrid_hits(op, fwd, reference)
        if fwd is not None:
            self.prev_forward = fwd
        for f in hit:
            self.first.setdefault(f, self.op_index)
        self.op_index += 1
        return hit


    def _hybrid_hits(self, op: dict, fwd, reference) -> list[str]:
        """A hybrid model's features (a Mamba pool beside the KV pool)."""
        cfg, hit = self.config, []
        if op["op"] == "sgl_admit" and self._source_live is False:
            hit.append("sgl-hybrid-prompt-from-finished")
        padded = (fwd or {}).get("padded_bs") if op["op"] in ("sgl_decode", "sgl_idle") else None
        if padded is not None:
            real = len(fwd["reqs"])
            if real < padded and self.real_rows.get(padded, 0) > real:
                hit.append("sgl-hybrid-padding-over-earlier-rows")
            self.real_rows[padded] = real
        if cfg.mamba_slots_for(len(reference.live())) >= cfg.mamba_slots - 2:
            hit.append("sgl-hybrid-states-pressed")
        return hit


def tracker_for(config):
    """The coverage tracker of ``config``'s kind (block-table or token-slot)."""
    return TokenSlotTracker(config) if config.runner == "sglang" else Tracker(config)
