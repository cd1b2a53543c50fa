"""Profile the fuzz loop: where a step's time goes outside the implementation.

Runs ``blockfuzz fuzz`` (gpu_impl, no faults) under ``cProfile`` for one
config (or drawn geometry) and prints two tables: the functions with the most
cumulative time, and the time attributed to each layer (Hypothesis, the
state machine's draws, the reference, gpu_impl, observations, invariants,
coverage).  Nothing is timed against a threshold; it says where to look.

Usage:
  python bench/profile_fuzz.py [--runner v1|v2] [--examples N] [--seed S]
                               [--drawn] [--top N] [--out FILE.prof]

``--out`` keeps the raw profile (``python -m pstats FILE.prof`` or
``snakeviz FILE.prof`` to browse it).  ``py-spy record -o fuzz.svg -- python
bench/profile_fuzz.py --no-profile`` gives a sampling flame graph instead.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from rich.console import Console
from rich.table import Table

# (layer, path fragments of the functions whose *own* time counts to it); the
# first match wins, so the more specific fragments come first.
LAYERS = (
    ("gpu_impl (kernels, runner shell)", ("/gpu_impl/", "/triton/")),
    ("reference", ("/reference/",)),
    ("invariants", ("/harness/core/invariants/",)),
    ("observations", ("/harness/core/observation.py",)),
    ("coverage + steering", ("/harness/search/coverage.py", "/harness/search/steer.py")),
    ("op draws + machine", ("/harness/core/ops/", "/harness/search/machine.py",
                            "/harness/search/swarm.py", "/harness/search/geometry.py")),
    ("session + targets glue", ("/harness/",)),
    ("hypothesis", ("/hypothesis/",)),
    ("numpy", ("/numpy/",)),
    ("torch", ("/torch/",)),
)


def _layer_of(filename: str) -> str:
    for name, frags in LAYERS:
        if any(f in filename for f in frags):
            return name
    return "other (stdlib)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runner", default="v1", choices=("v1", "v2"))
    ap.add_argument("--examples", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--drawn", action="store_true", help="draw the geometry per example")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", help="write the raw profile here")
    ap.add_argument("--no-profile", action="store_true",
                    help="run the loop without cProfile (for py-spy)")
    args = ap.parse_args()

    from harness.search.fuzz import fuzz
    from reference import RunnerConfig

    config = None if args.drawn else RunnerConfig(runner=args.runner)
    prof = None if args.no_profile else cProfile.Profile()
    start = time.perf_counter()
    if prof:
        prof.enable()
    r = fuzz(config, args.seed, args.examples, (), "gpu_impl", "cpu", profile="dev",
             runner=args.runner)
    if prof:
        prof.disable()
    wall = time.perf_counter() - start
    console = Console(width=None if Console().is_terminal else 160)
    console.print(f"fuzz: runner={args.runner} drawn={args.drawn} seed={args.seed} "
                  f"examples={args.examples}: {r.steps} steps in {wall:.1f} s "
                  f"({r.steps / wall:.0f} steps/s{' under cProfile' if prof else ''})")
    if not prof:
        return
    if args.out:
        prof.dump_stats(args.out)
    stats = pstats.Stats(prof)
    total = stats.total_tt
    own: dict[str, float] = {}
    for (filename, _line, _fn), (_cc, _nc, tt, _ct, callers) in stats.stats.items():
        if filename == "~" and callers:  # a builtin: its time goes to its callers' layers
            for (caller_file, _, _), caller_stats in callers.items():
                layer = _layer_of(caller_file)
                own[layer] = own.get(layer, 0.0) + caller_stats[2]
            continue
        own[_layer_of(filename)] = own.get(_layer_of(filename), 0.0) + tt
    t = Table(title="own time per layer (cProfile; a builtin's time goes to its caller's layer)")
    for col in ("layer", "seconds", "share", "ms per step"):
        t.add_column(col)
    for name, secs in sorted(own.items(), key=lambda kv: -kv[1]):
        t.add_row(name, f"{secs:.2f}", f"{secs / total:.1%}", f"{1000 * secs / r.steps:.3f}")
    console.print(t)
    t = Table(title=f"top {args.top} functions by cumulative time")
    for col in ("function", "calls", "own s", "cumulative s", "ms per step"):
        t.add_column(col)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])[:args.top]
    for (filename, line, fn), (_cc, nc, tt, ct, _callers) in rows:
        where = filename.split("site-packages/")[-1].split("/main/")[-1]
        t.add_row(f"{where}:{line}({fn})", str(nc), f"{tt:.2f}", f"{ct:.2f}",
                  f"{1000 * ct / r.steps:.3f}")
    console.print(t)


if __name__ == "__main__":
    main()
