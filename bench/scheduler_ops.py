"""The scheduler side (``allocator: engine``): KV-cache manager calls per second
and the prefix-hit share of one recorded workload, and session ops/s with the
target's manager choosing blocks — gpu_impl's, and vLLM's where installed —
with prefix caching on and off, in one run; prints a table with the ratios.

The workload (deterministic, ``--seed``): requests arrive with prompts that
share a prefix of an earlier prompt two times in three, run their prompt in
chunks (``allocate`` then ``step``), decode a few tokens and finish; one
attention group of 4-token blocks — and a hybrid row: the same plus a Mamba
group of 8-token state blocks in align mode (chunks as align mode schedules
them, an ``allocate`` before every step; gpu_impl only: the vllm target
refuses hybrid configs until one block pool is shared, issue #12).

Usage: python bench/scheduler_ops.py [--rounds N] [--seed S] [--targets gpu_impl,vllm]
"""

from __future__ import annotations

import argparse
import random
import time


def workload(config, rounds: int, seed: int, target: str) -> list[dict]:
    """Ops generated against, and recorded through, a session on ``target``: which
    blocks its manager evicts decides later hits, so each target gets the
    workload its own choices lead to (same seed, same decisions)."""
    from harness.core.session import Session

    rng, session, ops = random.Random(seed), Session(config, (), target, "cpu", record=True), []
    live, prompts, next_req = {}, {}, 0
    align = config.mamba_cache_mode == "align"

    def legal(r, start, most):  # align mode: the largest chunk its scheduler would run
        return max([n for n in range(1, most + 1)
                    if session.ledger.align_problem(r, start, n, step=False) is None] or [0])

    def do(op):  # a release's own bug (a violation) does not stop the workload
        session.apply(op)
        ops.append(op)
        return op

    for _ in range(rounds):
        if len(live) < config.max_num_reqs and rng.random() < 0.6:
            prefix = []
            n = rng.randint(2, config.max_model_len // 2)
            if prompts and rng.random() < 2 / 3:
                src = rng.choice(sorted(prompts))
                prefix = [src, min(prompts[src], n)]
            tokens = session.ledger.prompt_tokens(next_req, n, prefix)
            hit, _ = session.ledger.expected_hit(tokens)
            from reference.ledger import RequestLedger

            new = legal(RequestLedger(next_req, n, []), hit,
                        min(n - hit, config.max_num_batched_tokens))
            op = do({"op": "admit", "req": next_req, "prompt_len": n, "prefix": prefix,
                     "num_new_tokens": new})
            if op["blocks"] is not None:
                live[next_req] = rng.randint(1, 4)  # decode steps before finishing
                prompts[next_req] = n
            next_req += 1
        sched = []
        for req in sorted(live):
            r = session.ledger.requests[req]
            left = r.prompt_len - r.num_computed_tokens
            n = min(max(left, 1), 4)
            if align:
                budget = config.max_num_batched_tokens - sum(k for _, k in sched)
                n = legal(r, r.num_computed_tokens, min(max(left, 1), budget))
                if not n or r.num_computed_tokens + n > config.max_model_len:
                    continue
                if do({"op": "allocate", "req": req, "num_new_tokens": n})["blocks"] is None:
                    continue
                # what it may step now: an earlier, larger allocation may have
                # put the state block past this chunk's end column
                n = max([k for k in range(1, n + 1) if session.ledger.align_problem(
                    r, r.num_computed_tokens, k, step=True) is None] or [0])
                if not n:
                    continue
            elif r.num_computed_tokens + n > min(r.capacity_tokens(config), config.max_model_len):
                if r.num_computed_tokens + n > config.max_model_len:
                    continue
                if do({"op": "allocate", "req": req, "num_new_tokens": n})["blocks"] is None:
                    continue
            sched.append([req, n])
        if sched:
            do({"op": "step", "scheduled": sched, "cudagraph_mode": "PIECEWISE"})
            for req, _ in sched:
                r = session.ledger.requests[req]
                if r.num_computed_tokens > r.prompt_len:
                    live[req] -= 1
        for req in [q for q, left in live.items() if left <= 0]:
            do({"op": "remove", "req": req})
            del live[req]
    return ops


def manager_rate(make, config, ops) -> float:
    """KV-cache manager calls/s (admit / allocate / free, and ``computed`` after
    each step) over the workload, the manager alone (no runner, no checks)."""
    import numpy as np

    from reference import Ledger

    ledger, manager, calls, computed = Ledger(config), make(config), 0, {}
    start = time.perf_counter()
    for op in ops:
        if op["op"] == "admit":
            tokens = ledger.prompt_tokens(op["req"], op["prompt_len"], op["prefix"])
            ledger.prompts[op["req"]] = tokens
            blocks, computed[op["req"]] = manager.admit(op["req"], np.asarray(tokens),
                                                        op["num_new_tokens"])
        elif op["op"] == "allocate":
            manager.allocate(op["req"], op["num_new_tokens"])
        elif op["op"] == "step":
            for req, n in op["scheduled"]:
                computed[req] += n
                manager.computed(req, computed[req])
        elif op["op"] == "remove":
            manager.free(op["req"])
        calls += 1
    return calls / (time.perf_counter() - start)


def _manager(target: str):
    if target == "vllm":
        from harness.targets.vllm_kv_cache import VllmKVCacheManager

        return VllmKVCacheManager
    from gpu_impl import FaultSet
    from gpu_impl.kv_cache_manager import KVCacheManager

    return lambda config: KVCacheManager(config, FaultSet())


def session_rate(config, ops, target: str) -> float:
    from harness.core.session import Session

    session = Session(config, (), target, "cpu", record=True)
    start = time.perf_counter()
    for op in ops:
        session.apply(dict(op))
    return len(ops) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--targets", default="gpu_impl,vllm")
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    from reference import GroupSpec, RunnerConfig

    rows = []
    hybrid = (GroupSpec("attention", 4, 4), GroupSpec("mamba", 8, 8))
    for caching, groups in ((True, (GroupSpec("attention", 4, 4),)),
                            (False, (GroupSpec("attention", 4, 4),)), ("align", hybrid)):
        config = RunnerConfig(runner="v1", groups=groups,
                              num_blocks=32, max_num_reqs=4, max_num_blocks_per_req=8,
                              max_num_batched_tokens=16, allocator="engine",
                              enable_prefix_caching=bool(caching),
                              reorder_batch_threshold=1 if caching == "align" else 0)
        for target in args.targets.split(","):
            if caching == "align" and target == "vllm":
                continue  # refused: vLLM's groups share one pool (issue #12)
            try:
                ops = workload(config, args.rounds, args.seed, target)
                rate = session_rate(config, ops, target)
            except Exception as e:  # noqa: BLE001 - a target not installed here
                print(f"{target}: skipped ({type(e).__name__}: {e})")
                continue
            admits = [op for op in ops if op["op"] == "admit"]
            share = sum(op["num_cached_tokens"] or 0 for op in admits) / max(
                1, sum(op["prompt_len"] for op in admits))
            rows.append((caching, target, len(ops), share, rate,
                         manager_rate(_manager(target), config, ops)))
    table = Table(title=f"allocator engine, {args.rounds} rounds (seed {args.seed}): session "
                        "ops/s (admit / allocate / step / remove)")
    for col in ("prefix caching", "target", "ops", "prefix-hit share", "session ops/s",
                "time vs gpu_impl", "manager calls/s"):
        table.add_column(col)
    base = {c: rate for c, t, _, _, rate, _ in rows if t == "gpu_impl"}
    for caching, target, n, share, rate, calls in rows:
        table.add_row({True: "on", False: "off"}.get(caching, "align (hybrid)"), target, str(n), f"{share:.0%}",
                      f"{rate:.0f}", f"{base[caching] / rate:.2f}x" if caching in base else "-",
                      f"{calls:.0f}")
    Console(width=110).print(table)


if __name__ == "__main__":
    main()
