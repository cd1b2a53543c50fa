#!/usr/bin/env python
"""Scheduler-like driver for vLLM's KVCacheManager (hybrid FA + Mamba "align").

Groundwork for issue #16 (vLLM's KV-cache manager as a target), not a target:
it settles the question the issue asked — "0.26.0 in align mode ends with
blocks still referenced and the null block's ref_cnt negative".  Measured on
all nine releases 0.26.0..0.33.0 (docs/scope.md): with the
scheduler's call order below nothing leaks; the null block's ref_cnt goes
negative on 0.26.0..0.32.0 because ``free_blocks`` decrements it (its count is
not maintained there, and it never enters the free queue), and 0.33.0 skips
the null block.  Only ``--bug no_cow_release`` (never freeing the retained
copy-on-write endpoints) leaks, on every release alike.

Run it in a release's environment, e.g.
``~/.cache/blockfuzz/vllm-envs/vllm-0.33.0/bin/python scripts/probe_kv_cache_manager.py``
(``--scenario basic|pressure|random``, ``--seeds N``, ``--hash-block-size 4``,
``--bug NAME``); it prints the pool accounting once every request is freed.

Builds a KVCacheConfig with one full-attention group and one Mamba group
(mamba_cache_mode="align", prefix caching on), a KVCacheManager, and replays a
deterministic request trace with the same call order as
vllm/v1/core/sched/scheduler.py (sync scheduling, no spec decode, no connector):

  schedule():
    1. kv.new_step_starts()
    2. RUNNING reqs (FCFS):  n = num_tokens_with_spec - num_computed_tokens,
       capped by budget, then the Mamba block-aligned split;
       kv.allocate_slots(req, n, num_lookahead_tokens=0)
       (None -> preempt the last running req: kv.free(victim),
        num_computed_tokens=0, status PREEMPTED, back to the front of waiting)
    3. WAITING reqs (only if nothing was preempted this step):
       blocks, hit, req.shared_prefix_boundary = kv.get_computed_blocks(req)
       n = num_tokens - hit, capped by budget, Mamba split (with hit);
       kv.allocate_slots(req, n, num_new_computed_tokens=hit,
                         new_computed_blocks=blocks, num_lookahead_tokens=0,
                         has_scheduled_reqs=bool(running))   (None -> stop)
       req.num_computed_tokens = hit; status RUNNING
    4. kv.get_num_common_prefix_blocks(running[0])
    5. copies, retained = kv.take_kv_cache_block_copies();
       kv.block_pool.free_blocks(retained)       (non-deferred free path)
    6. kv.take_new_block_ids()                    (drain)
    7. _update_after_schedule: num_computed_tokens += n; num_in_flight_tokens += n
  update_from_output():
    num_in_flight_tokens -= n; if the req reached its end of prompt, append one
    sampled token (block hasher extends block_hashes); if len(output) >=
    max_tokens -> FINISHED_LENGTH_CAPPED -> kv.free(req) (removed from running).
  Aborts (finish_requests) between steps: kv.free(req) once.

--bug=NAME injects a wrong driver rule to show which rule produces which symptom:
  no_new_step       : skip kv.new_step_starts()
  no_cow_release    : never free the retained CoW endpoints from step 5
  double_free       : call kv.free() twice on finish
  no_inflight_dec   : never decrement num_in_flight_tokens
  free_before_alloc : (abort path) free while the request is still in `running`
                      and keep scheduling it
"""

import argparse
import dataclasses
import inspect
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PYTHONHASHSEED", "0")

import torch  # noqa: E402

import vllm  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.core.kv_cache_manager import KVCacheManager  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
)
from vllm.v1.request import Request, RequestStatus  # noqa: E402


def kw_filter(fn, **kw):
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kw.items() if k in params}


def make_tensor(size, layers):
    fields = {f.name for f in dataclasses.fields(KVCacheTensor)}
    if "shared_by" in fields:  # <= 0.2x
        return KVCacheTensor(size=size, shared_by=list(layers))
    kw = dict(size=size, layers=list(layers))
    if "layer_stride" in fields:
        kw["layer_stride"] = 0
    if "block_stride" in fields:
        kw["block_stride"] = 0
    return KVCacheTensor(**kw)


def build_config(num_blocks, fa_bs, mamba_bs):
    fa = FullAttentionSpec(
        block_size=fa_bs, num_kv_heads=1, head_size=8, dtype=torch.float16
    )
    mamba = MambaSpec(
        block_size=mamba_bs,
        shapes=((4, 4), (2, 4)),
        dtypes=(torch.float16, torch.float16),
        mamba_cache_mode="align",
    )
    groups = [
        KVCacheGroupSpec(layer_names=["layers.0.attn"], kv_cache_spec=fa),
        KVCacheGroupSpec(layer_names=["layers.1.mamba"], kv_cache_spec=mamba),
    ]
    tensors = [
        make_tensor(1024 * num_blocks, ["layers.0.attn", "layers.1.mamba"]),
    ]
    return KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=groups
    )


class Driver:
    def __init__(self, args):
        self.args = args
        self.bug = set(args.bug or [])
        import math

        self.block_size = math.lcm(args.fa_block_size, args.mamba_block_size)
        self.hash_block_size = args.hash_block_size or math.gcd(
            args.fa_block_size, args.mamba_block_size
        )
        cfg = build_config(args.num_blocks, args.fa_block_size, args.mamba_block_size)
        kv_cache_utils.init_none_hash(sha256)
        self.hasher = kv_cache_utils.get_request_block_hasher(
            self.hash_block_size, sha256
        )
        self.kv = KVCacheManager(
            **kw_filter(
                KVCacheManager.__init__,
                kv_cache_config=cfg,
                max_model_len=args.max_model_len,
                scheduler_block_size=self.block_size,
                hash_block_size=self.hash_block_size,
                enable_caching=True,
                use_eagle=False,
                log_stats=False,
            )
        )
        self.pool = self.kv.block_pool
        self.running: list[Request] = []
        self.waiting: list[Request] = []
        self.step_no = 0
        self.log = []
        self.freed_ids: set[str] = set()
        self.gcb_has_max_len = (
            "max_cache_hit_length"
            in inspect.signature(self.kv.get_computed_blocks).parameters
        )

    # ------------------------------------------------------------------ utils
    def make_request(self, rid, prompt, max_tokens):
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        req = Request(
            **kw_filter(
                Request.__init__,
                request_id=rid,
                prompt_token_ids=list(prompt),
                sampling_params=sp,
                pooling_params=None,
                arrival_time=float(self.step_no),
                block_hasher=self.hasher,
            )
        )
        return req

    def add_request(self, req):
        self.waiting.append(req)

    def mamba_split(self, req, n, hit=0):
        """Port of Scheduler._mamba_block_aligned_split (use_eagle=False)."""
        if "no_mamba_split" in self.bug:
            return n
        start = req.num_computed_tokens + hit
        if start >= max(req.num_prompt_tokens, req.num_tokens - 1):
            return n
        bs = self.block_size
        last_cache = req.num_tokens - req.num_tokens % bs
        end = start + n
        if end < last_cache:
            end = end // bs * bs
        nbb = (start // bs + 1) * bs
        partial = self.hash_block_size < bs
        tail = (
            req.num_prompt_tokens // self.hash_block_size * self.hash_block_size
            if partial
            else 0
        )
        spb = getattr(req, "shared_prefix_boundary", 0) or 0
        stops = (
            nbb if start % bs != 0 and nbb <= last_cache else 0,
            last_cache,
            tail if last_cache < tail < req.num_prompt_tokens else 0,
            start + (spb - start) // bs * bs if start < spb < end else 0,
        )
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)

    def _free(self, req):
        if "cache_on_finish" in self.bug:
            self.kv.cache_blocks(req, req.num_computed_tokens)
        self.kv.free(req)
        if "double_free" in self.bug:
            self.kv.free(req)
        self.freed_ids.add(req.request_id)

    def preempt(self, req):
        self._free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.insert(0, req)
        self.log.append(f"  preempt {req.request_id}")

    def abort(self, rid):
        for q in (self.running, self.waiting):
            for r in q:
                if r.request_id == rid:
                    if "free_before_alloc" not in self.bug:
                        q.remove(r)
                    r.status = RequestStatus.FINISHED_ABORTED
                    self._free(r)
                    self.log.append(f"  abort {rid}")
                    return

    # --------------------------------------------------------------- schedule
    def schedule(self):
        kv = self.kv
        budget = self.args.budget
        sched: dict[str, int] = {}
        preempted = []
        if "no_new_step" not in self.bug:
            kv.new_step_starts()

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = req.num_tokens_with_spec + req.num_output_placeholders - req.num_computed_tokens
            n = min(n, budget)
            n = self.mamba_split(req, n)
            if n == 0:
                i += 1
                continue
            while True:
                new_blocks = kv.allocate_slots(req, n, num_lookahead_tokens=0)
                if new_blocks is not None:
                    break
                victim = self.running.pop()
                if victim.request_id in sched:
                    budget += sched.pop(victim.request_id)
                self.preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if new_blocks is None:
                break
            sched[req.request_id] = n
            budget -= n
            i += 1

        if not preempted:
            while self.waiting and budget > 0:
                if len(self.running) >= self.args.max_num_seqs:
                    break
                req = self.waiting[0]
                if req.num_computed_tokens == 0:
                    if self.gcb_has_max_len:
                        blocks, hit, spb = kv.get_computed_blocks(req)
                    else:
                        blocks, hit, spb = kv.get_computed_blocks(req)
                    req.shared_prefix_boundary = spb
                else:
                    blocks, hit = kv.empty_kv_cache_blocks, 0
                num_computed = hit
                n = req.num_tokens - num_computed
                n = min(n, budget)
                n = self.mamba_split(req, n, hit)
                if n == 0:
                    break
                if "set_hit_before_alloc" in self.bug:
                    req.num_computed_tokens = num_computed
                new_blocks = kv.allocate_slots(
                    **kw_filter(
                        kv.allocate_slots,
                        request=req,
                        num_new_tokens=n,
                        num_new_computed_tokens=hit,
                        new_computed_blocks=None if "drop_hit_blocks" in self.bug else blocks,
                        num_lookahead_tokens=0,
                        num_external_computed_tokens=0,
                        delay_cache_blocks=False,
                        num_encoder_tokens=0,
                        has_scheduled_reqs=bool(self.running),
                    )
                )
                if new_blocks is None:
                    break
                self.waiting.pop(0)
                self.running.append(req)
                req.status = RequestStatus.RUNNING
                if "no_set_hit" not in self.bug:
                    req.num_computed_tokens = num_computed
                sched[req.request_id] = n
                budget -= n
                self.log.append(f"  admit {req.request_id} hit={hit} n={n}")

        if self.running:
            kv.get_num_common_prefix_blocks(self.running[0].request_id)

        if hasattr(kv, "take_kv_cache_block_copies"):
            copies, retained = kv.take_kv_cache_block_copies()
            if copies:
                self.log.append(
                    "  cow copies "
                    + ",".join(f"{c.src_block_id}->{c.dst_block_id}" for c in copies)
                )
                if "no_cow_release" not in self.bug:
                    self.pool.free_blocks(retained)
        if hasattr(kv, "take_new_block_ids"):
            kv.take_new_block_ids()

        # _update_after_schedule
        for rid, n in sched.items():
            req = next(r for r in self.running if r.request_id == rid)
            req.num_computed_tokens += n
            req.num_in_flight_tokens += n
            req.is_prefill_chunk = req.num_computed_tokens < (
                req.num_tokens + req.num_output_placeholders
            )
        return sched

    # ------------------------------------------------------ update_from_output
    def update_from_output(self, sched):
        finished = []
        for rid, n in sched.items():
            req = next((r for r in self.running if r.request_id == rid), None)
            if req is None:
                continue
            if "no_inflight_dec" not in self.bug:
                req.num_in_flight_tokens -= n
            if req.is_finished():
                continue
            if req.num_computed_tokens >= req.num_tokens:
                # sampled one token (deterministic)
                tok = 1000 + (sum(map(ord, rid)) % 7) * 100 + len(req.output_token_ids)
                req.append_output_token_ids(tok)
                if len(req.output_token_ids) >= req.sampling_params.max_tokens:
                    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                    finished.append(req)
        for req in finished:
            self.running.remove(req)
            self._free(req)
            self.log.append(f"  finish {req.request_id} out={len(req.output_token_ids)}")

    def step(self):
        self.step_no += 1
        sched = self.schedule()
        self.log.append(
            f"step {self.step_no}: sched={sched} free={self.pool.get_num_free_blocks()}"
        )
        self.update_from_output(sched)
        return sched

    # --------------------------------------------------------------- report
    def report(self):
        pool = self.pool
        total = pool.num_gpu_blocks
        free = pool.get_num_free_blocks()
        nz = [
            (b.block_id, b.ref_cnt, b.block_hash is not None)
            for b in pool.blocks
            if b.ref_cnt != 0 and not b.is_null
        ]
        leftover = {}
        for gid, m in enumerate(self.kv.coordinator.single_type_managers):
            live = {k: len(v) for k, v in m.req_to_blocks.items() if v}
            if live:
                leftover[gid] = live
        print(f"vllm {vllm.__version__}  bugs={sorted(self.bug) or 'none'}")
        print(
            f"block pool: free={free} total={total} "
            f"(usable={total - 1}, null block excluded)"
        )
        print(f"non-null blocks with ref_cnt != 0: {len(nz)}")
        for bid, rc, hashed in nz:
            print(f"  block {bid}: ref_cnt={rc} hashed={hashed}")
        print(f"null block (id {pool.null_block.block_id}) ref_cnt={pool.null_block.ref_cnt}"
              " (not maintained by BlockPool; excluded from the verdict)")
        naive = [b.block_id for b in pool.blocks if b.ref_cnt != 0]
        print(f"naive view, all blocks incl. null with ref_cnt != 0: {naive}")
        print(f"req_to_blocks left in managers: {leftover or 'none'}")
        clean = free == total - 1 and not nz
        print("RESULT:", "CLEAN" if clean else "LEAK")
        return clean


def trace(d: Driver, scenario: str):
    """Deterministic trace: shared prefixes, chunked prefill, decodes, finishes."""
    bs = d.block_size
    P = list(range(1, 3 * bs + 1))  # 48-token shared prefix at bs=16
    Q = list(range(500, 500 + 4 * bs + 7))  # unrelated long prompt (71 tokens)
    plan = {
        1: [("A", P + [901, 902], 6)],
        2: [("D", Q, 4)],
        5: [
            ("B", P + [911, 912, 913, 914, 915], 4),  # prefix hit on P
            ("C", P + [901, 902], 3),  # identical prompt to A
        ],
        7: [("E", Q[: 2 * bs + 5] + [777] * 20, 5)],  # partial prefix of D
        9: [("F", P[: bs + 6] + [31, 32, 33], 3)],  # sub-block hit (fine hashes)
        10: [("G", P + [901, 902] + [5] * 40, 8)],  # long; aborted mid-prefill
        12: [("H", Q + [8] * 3, 2)],
    }
    aborts = {13: "G"}
    if scenario == "pressure":
        plan[3] = [("X%d" % k, [7000 + 13 * k + j for j in range(40)], 6) for k in range(3)]
    reqs = {}
    for s in range(1, 200):
        for rid, prompt, mt in plan.get(s, []):
            reqs[rid] = d.make_request(rid, prompt, mt)
            d.add_request(reqs[rid])
        if s in aborts:
            d.abort(aborts[s])
        d.step()
        if not d.running and not d.waiting and s > max(plan):
            break
    # safety: abort anything left
    for r in list(d.running) + list(d.waiting):
        d.abort(r.request_id)


def random_trace(d: Driver, seed: int, n_reqs: int = 14):
    import random

    rng = random.Random(seed)
    bs = d.block_size
    prefixes = [[10000 * (k + 1) + j for j in range(rng.randint(1, 5) * bs + rng.randint(0, bs))]
                for k in range(3)]
    arrivals = {}
    for k in range(n_reqs):
        s = rng.randint(1, 25)
        pre = rng.choice(prefixes)
        cut = rng.randint(0, len(pre))
        prompt = pre[:cut] + [rng.randint(1, 50) for _ in range(rng.randint(1, 2 * bs))]
        arrivals.setdefault(s, []).append((f"R{k}", prompt, rng.randint(1, 3 * bs)))
    aborts = {}
    for k in range(n_reqs):
        if rng.random() < 0.2:
            aborts.setdefault(rng.randint(2, 40), []).append(f"R{k}")
    for s in range(1, 2000):
        for rid, prompt, mt in arrivals.get(s, []):
            d.add_request(d.make_request(rid, prompt, mt))
        for rid in aborts.get(s, []):
            d.abort(rid)
        d.step()
        if not d.running and not d.waiting and s > max(arrivals):
            break
    for r in list(d.running) + list(d.waiting):
        d.abort(r.request_id)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-blocks", type=int, default=48)
    ap.add_argument("--fa-block-size", type=int, default=16)
    ap.add_argument("--mamba-block-size", type=int, default=16)
    ap.add_argument(
        "--hash-block-size",
        type=int,
        default=0,
        help="prefix_match_unit; < block size enables sub-block (CoW) hits",
    )
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--scenario", default="basic", choices=["basic", "pressure", "random"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=0,
                    help="random scenario: run seeds [seed, seed+seeds) and summarize")
    ap.add_argument(
        "--bug",
        action="append",
        choices=[
            "no_new_step",
            "no_cow_release",
            "double_free",
            "no_inflight_dec",
            "free_before_alloc",
            "no_mamba_split",
            "cache_on_finish",
            "drop_hit_blocks",
            "no_set_hit",
            "set_hit_before_alloc",
        ],
    )
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    if args.scenario == "random" and args.seeds:
        bad = []
        npre = nhit = ncow = 0
        import contextlib
        import io

        for sd in range(args.seed, args.seed + args.seeds):
            d = Driver(args)
            exc = None
            try:
                random_trace(d, sd)
            except Exception as e:
                exc = f"{type(e).__name__}: {e}"
            npre += sum(1 for l in d.log if "preempt" in l)
            nhit += sum(1 for l in d.log if "admit" in l and "hit=0 " not in l)
            ncow += sum(l.count("->") for l in d.log if "cow" in l)
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                ok = d.report()
            if exc or not ok:
                bad.append((sd, exc, buf.getvalue()))
        print(f"vllm {vllm.__version__}: {args.seeds} seeds, {len(bad)} bad, "
              f"{npre} preemptions, {nhit} prefix hits, {ncow} CoW copies")
        for sd, exc, rep in bad[:3]:
            print(f"--- seed {sd} exc={exc}")
            print(rep)
        sys.exit(0 if not bad else 1)
    d = Driver(args)
    try:
        if args.scenario == "random":
            random_trace(d, args.seed)
        else:
            trace(d, args.scenario)
    except Exception as e:  # report what we have
        print(f"EXCEPTION during trace: {type(e).__name__}: {e}")
        if args.verbose:
            import traceback

            traceback.print_exc()
    if args.verbose:
        print("\n".join(d.log))
    ok = d.report()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
