"""blockfuzz benchmark: throughput of each layer and the kill rate, in one run.

Prints one table of steps/s (an op of a trace is a step) for
  - reference alone, gpu_impl alone (Triton interpreter or CUDA), the
    differential session (both + observations + invariants), and the whole
    fuzz loop (Hypothesis + session), on the same generated workload;
  - the share of fuzz wall time spent outside gpu_impl;
and one table per fault: examples, seconds, shrunk length to kill it from a seed.

Usage: python bench/bench.py [--examples N] [--seed S] [--device cpu|cuda|auto]
                             [--rounds R] [--only TEXT ...] [--no-kills]
Ratios are computed within this one run (same machine, same moment): each of
R rounds is one fuzz run, every example replayed through each layer right
after the loop ran it; each row is the median of its rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import time

from rich.console import Console
from rich.table import Table

from _recording import recording_machine  # bench/ is on sys.path when run as a script


def _time_apply(target_factory, workload):
    from harness.core.trace import apply_op

    start = time.perf_counter()
    steps = 0
    for ops in workload:
        target = target_factory()
        for op in ops:
            apply_op(target, op)
            steps += 1
    return steps, time.perf_counter() - start


def _timed(fn, clock, depth=None):
    """``fn`` (a method) with its wall time added to clock[0]; with ``depth`` (a
    one-item list shared by a class's timed methods) only the outermost of
    nested timed calls counts (``observe`` calls ``host_view``)."""
    def timed(self, *a, **k):
        if depth is not None and depth[0]:
            return fn(self, *a, **k)
        if depth is not None:
            depth[0] += 1
        t = time.perf_counter()
        try:
            return fn(self, *a, **k)
        finally:
            clock[0] += time.perf_counter() - t
            if depth is not None:
                depth[0] -= 1
    return timed


def _timed_gpu_target(clock):
    """A GpuImplTarget whose construction and every public method (each op's, the
    observation) are timed into clock[0]."""
    from harness import targets

    base, depth = targets.GpuImplTarget, [0]
    methods = {name: _timed(getattr(base, name), clock, depth) for name in dir(base)
               if not name.startswith("_") and callable(getattr(base, name))}
    methods["__init__"] = _timed(base.__init__, clock, depth)
    return type("Timed", (base,), methods)


@contextlib.contextmanager
def _timed_metadata_build(clock):
    """Time the runner shell's metadata-build phase (``_classify`` +
    ``_build_mamba_metadata``) into clock[0] while the block runs."""
    from gpu_impl.runner_shell import RunnerShell

    saved = {n: getattr(RunnerShell, n) for n in ("_classify", "_build_mamba_metadata")}
    for name, fn in saved.items():
        setattr(RunnerShell, name, _timed(fn, clock))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(RunnerShell, name, fn)


def _fuzz_paired(config, args, device, layers: dict):
    """One fuzz-loop run from the seed, each example's ops replayed through every
    layer of ``layers`` ({name: fn(ops) -> seconds}) right after the loop ran
    it, in an order that turns per example.  Returns (steps, loop seconds less
    the replays, loop seconds inside gpu_impl, {name: seconds}).

    Pairing per example puts every layer's time within a second of the loop's:
    the machine's load moves over seconds to minutes, so layers timed one
    after another in blocks (the loop, then each layer on the whole workload)
    could differ by more than the harness costs."""
    from hypothesis import seed

    from harness import targets
    from harness.search import machine as machine_mod
    from harness.search import profiles

    stats = {"traces": []}
    clock, paused, spent = [0.0], [0.0], dict.fromkeys(layers, 0.0)
    original = targets.GpuImplTarget
    timed_target = _timed_gpu_target(clock)
    names = list(layers)

    class Paired(recording_machine()):
        def teardown(self):
            super().teardown()
            start, inside = time.perf_counter(), clock[0]
            targets.GpuImplTarget = original  # the replays are no part of the loop
            try:
                k = len(self.stats["traces"]) % max(len(names), 1)
                for name in names[k:] + names[:k]:
                    spent[name] += layers[name](self.stats["traces"][-1])
            finally:
                targets.GpuImplTarget = timed_target
                clock[0] = inside
                paused[0] += time.perf_counter() - start

    targets.GpuImplTarget = timed_target
    try:
        m = machine_mod.make_machine(config, (), "gpu_impl", device, stats, base=Paired)
        seed(args.seed)(m)
        start = time.perf_counter()
        # What `blockfuzz fuzz` runs: its backend (every example drawn afresh), no shrinking.
        machine_mod.run(m, profiles.search_settings("dev", args.examples))
        fuzz_s = time.perf_counter() - start - paused[0]
    finally:
        targets.GpuImplTarget = original
    return stats["steps"], fuzz_s, clock[0], spent


def _throughput(config, args, device):
    """(rows, share of fuzz wall time outside gpu_impl, fuzz-loop steps/s) for one
    config: ``args.rounds`` fuzz runs, each example replayed through every
    layer right after the loop ran it (:func:`_fuzz_paired`); each row the
    median of its rounds, after a warm-up run."""
    from statistics import median

    from harness import targets
    from harness.core.session import Session
    from harness.search.coverage import Tracker

    def alone(factory):
        return lambda ops: _time_apply(factory, [ops])[1]

    def session_only(ops):
        start = time.perf_counter()
        session = Session(config, (), "gpu_impl", device)
        for op in ops:
            session.apply(op)
        return time.perf_counter() - start

    def with_tracker(ops):
        start = time.perf_counter()
        session, tracker = Session(config, (), "gpu_impl", device), Tracker(config)
        for op in ops:
            tracker.before(op, session.ledger, session.reference)
            session.apply(op)
            tracker.after(op, session.reference)
        return time.perf_counter() - start

    meta_clock = [0.0]  # seconds inside the metadata-build phase of the gpu_impl replay

    def gpu_alone(ops):
        with _timed_metadata_build(meta_clock):
            return _time_apply(lambda: targets.GpuImplTarget(config, (), device), [ops])[1]

    layers = {"ref": alone(lambda: targets.ReferenceTarget(config)), "gpu": gpu_alone,
              "session": session_only, "cov": with_tracker}
    times: dict[str, list] = {}
    shares, meta = [], []
    # Warm-up, not counted: a process's first examples of a config interpret
    # its kernels and fill caches (the first took 5x a later one's gpu_impl
    # time), and only the loop, running first, would pay for it.
    _fuzz_paired(config, argparse.Namespace(seed=args.seed + 1, examples=2), device, layers)
    for _ in range(args.rounds):
        meta_clock[0] = 0.0
        steps, fuzz_s, inside, spent = _fuzz_paired(config, args, device, layers)
        times.setdefault("fuzz", []).append(fuzz_s)
        shares.append((fuzz_s - inside) / fuzz_s)
        for name, s in spent.items():
            times.setdefault(name, []).append(s)
        meta.append(meta_clock[0] / spent["gpu"])
    t = {k: median(v) for k, v in times.items()}
    share = median(shares)
    rows = [("reference alone", steps, t["ref"]), ("gpu_impl alone", steps, t["gpu"]),
            (f"  of which metadata build ({median(meta):.1%} of gpu_impl's time)",
             steps, median(meta) * t["gpu"]),
            ("session (ref + gpu_impl + invariants)", steps, t["session"]),
            ("session + coverage tracker", steps, t["cov"]),
            ("fuzz loop (Hypothesis + session)", steps, t["fuzz"]),
            (f"  of which outside gpu_impl ({share:.1%} of the loop's time)", steps,
             share * t["fuzz"])]
    return rows, share, steps / t["fuzz"]


def _nightly_scaling(args, device, fuzz_rate, console):
    """Nightly steps/s with 1 and 2 workers, against the plain fuzz loop."""
    import tempfile
    from pathlib import Path

    from harness.search.nightly import Campaign, run

    t = Table(title=f"nightly throughput ({args.nightly:g} s budget each, runner v1, "
                    "geometry drawn)")
    for col in ("workers", "seeds", "steps", "seconds", "steps/s", "vs 1 worker",
                "per worker vs fuzz loop"):
        t.add_column(col)
    base = None
    for workers in (1, 2):
        with tempfile.TemporaryDirectory() as d:
            p = run(Campaign(Path(d), args.nightly, workers, (0, 1), device, "v1", (), None))
        rate = p.steps / p.elapsed
        base = base or rate
        t.add_row(str(workers), str(len(p.seeds)), str(p.steps), f"{p.elapsed:.0f}",
                  f"{rate:.0f}", f"{rate / base:.2f}x", f"{rate / workers / fuzz_rate:.2f}x")
    console.print(t)
    console.print(f"(fuzz loop reference rate: {fuzz_rate:.0f} steps/s, geometry drawn, v1)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=40, help="fuzz examples for throughput")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", action="append", metavar="TEXT",
                    help="only the configs whose label contains TEXT (repeatable), "
                         "e.g. --only default --only drawn")
    ap.add_argument("--rounds", type=int, default=3,
                    help="fuzz runs, each layer timed per example in each (the median "
                         "of the rounds is reported)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--kill-examples", type=int, default=200)
    ap.add_argument("--nightly", type=float, default=0, metavar="S",
                    help="also time `nightly` with 1 and 2 workers for S seconds each")
    ap.add_argument("--no-kills", action="store_true", help="skip the kill-rate table")
    args = ap.parse_args()

    from gpu_impl.device import select_device

    device = select_device(args.device).type
    from gpu_impl.faults import CATALOGUE
    from harness.search.fuzz import fuzz
    from reference import GroupSpec, RunnerConfig

    console = Console(width=None if Console().is_terminal else 150)
    console.print(f"blockfuzz bench: seed={args.seed} device={device} examples={args.examples}")
    t = Table(title="throughput (same workload per row group; an op = a step)")
    for col in ("config", "layer", "steps", "seconds", "steps/s", "vs gpu_impl alone"):
        t.add_column(col)
    shares = []
    drawn_rate = None
    for label, config in (("v1 default hybrid", RunnerConfig()),
                          ("v2 default hybrid", RunnerConfig(runner="v2")),
                          # the hybrid layout: one pool, attention and Mamba pages aliased
                          ("v1 kv_sharing hybrid", RunnerConfig(kv_sharing=True)),
                          ("v2 kv_sharing hybrid", RunnerConfig(runner="v2", kv_sharing=True)),
                          # issue #12's cache layouts: a quantized KV cache; a conv
                          # state with PAD_SLOT_ID padding and no Mamba null block;
                          # 24-token blocks split into 8-token kernel blocks
                          ("v1 int8 KV hybrid", RunnerConfig(kv_cache_dtype="int8")),
                          ("v1 conv3 pad_slot_no_null", RunnerConfig(
                              mamba_padding="pad_slot_no_null",
                              groups=(GroupSpec("attention", 4, 4),
                                      GroupSpec("mamba", 16, 16, conv_size=3)))),
                          ("v1 24-token blocks", RunnerConfig(
                              groups=(GroupSpec("attention", 24, 8), GroupSpec("mamba", 16, 16)),
                              max_num_blocks_per_req=2)),
                          ("v1 geometry drawn", None), ("v2 geometry drawn", None)):
        if args.only and not any(o in label for o in args.only):
            continue
        if config is None:
            runs = [fuzz(None, args.seed, args.examples, (), "gpu_impl", device, profile="dev",
                         runner=label[:2]) for _ in range(args.rounds)]
            r = sorted(runs, key=lambda r: r.search_seconds)[len(runs) // 2]  # the median
            t.add_row(label, "fuzz loop (Hypothesis + session)", str(r.steps),
                      f"{r.search_seconds:.2f}", f"{r.steps_per_s:.0f}", "-")
            drawn_rate = drawn_rate or r.steps_per_s
            continue
        rows, share, _ = _throughput(config, args, device)
        gpu_rate = rows[1][1] / rows[1][2]
        for name, steps, secs in rows:
            t.add_row(label, name, str(steps), f"{secs:.2f}", f"{steps / secs:.0f}",
                      f"{(steps / secs) / gpu_rate:.2f}x")
        shares.append(f"{label}: {share:.1%}")
    console.print(t)
    console.print("fuzz loop wall time outside gpu_impl (runner start-up and observations "
                  "count as gpu_impl; median of the rounds): " + "; ".join(shares))
    if args.nightly:
        _nightly_scaling(args, device, drawn_rate, console)
    if args.no_kills:
        return
    k = Table(title=f"kill rate (seed {args.seed}, <= {args.kill_examples} examples, profile ci, "
                    "geometry drawn per example)")
    for col in ("fault", "runner", "invariant", "expected", "examples", "search s",
                "hypothesis ops", "shrunk ops", "shrink replays", "shrink s"):
        k.add_column(col)
    from harness.targets.sglang_release import installed_version as sglang_version

    for fid in sorted(CATALOGUE):
        for runner in CATALOGUE[fid].runners:
            target = "sglang" if runner == "sglang" else "gpu_impl"
            if target == "sglang" and sglang_version() is None:
                k.add_row(fid, runner, "n/a (SGLang not installed)", *["-"] * 7)
                continue
            r = fuzz(None, args.seed, args.kill_examples, [fid], target,
                     device if target == "gpu_impl" else None, profile="ci", runner=runner)
            got = r.violation.invariant if r.violation else "NOT FOUND"
            k.add_row(fid, runner, got, "yes" if CATALOGUE[fid].caught_by(got) else "NO",
                      str(r.examples), f"{r.seconds - r.shrink_seconds:.1f}",
                      str(r.hypothesis_ops), str(len(r.trace.ops)) if r.trace else "-",
                      str(r.shrink_replays), f"{r.shrink_seconds:.1f}")
    console.print(k)


if __name__ == "__main__":
    main()
