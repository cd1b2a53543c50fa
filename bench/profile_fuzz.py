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

import cProfile
import pstats
import time

from rich.console import Console
from rich.table import Table

from _args import loop_parser  # bench/ is sys.path[0] when run as a script

# Library code (the standard library, NumPy, torch, builtins) is no layer of
# its own: its time is charged to the layer that called it.
LIBRARY = "library code no layer called"
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
)


def _layer_of(filename: str) -> str:
    for name, frags in LAYERS:
        if any(f in filename for f in frags):
            return name
    return LIBRARY


def own_time_per_layer(stats: pstats.Stats, rounds: int = 60) -> dict[str, float]:
    """Seconds of own time per layer.  Library code's own time (a builtin,
    ``inspect.getcallargs`` under Triton's launcher, a NumPy comparison in an
    invariant) goes to the layer of the nearest caller outside library code:
    first split over its callers by its own time under each, then up through
    library callers by the cumulative time of each call edge (solved by
    iteration, ``rounds`` at most, so cycles through library code converge).
    Only what no layer reaches (the profiler's root) stays :data:`LIBRARY`."""
    def layer(func) -> str:  # a builtin's file is "~": no fragment matches it
        return _layer_of(func[0])

    def edges(func, field: int) -> list:
        """[(caller, weight)] without self-calls (recursion's time is already
        in the outer edges), weights normalised; [] when there are none."""
        out = [(c, e[field]) for c, e in stats.stats[func][4].items() if c != func]
        total = sum(w for _, w in out)
        return [(c, w / total) for c, w in out] if total > 0 else []

    library = [f for f in stats.stats if layer(f) == LIBRARY]
    up = {f: edges(f, 3) for f in library}
    share = {f: {LIBRARY: 1.0} for f in library}  # where a library function's time ends up

    def mix(pairs) -> dict[str, float]:
        out: dict[str, float] = {}
        for caller, w in pairs:
            for k, frac in (share[caller] if caller in share else {layer(caller): 1.0}).items():
                out[k] = out.get(k, 0.0) + frac * w
        return out or {LIBRARY: 1.0}

    for _ in range(rounds):
        moved = 0.0
        for f in library:
            new = mix(up[f])
            moved = max(moved, *(abs(new.get(k, 0.0) - share[f].get(k, 0.0))
                                 for k in new.keys() | share[f].keys()))
            share[f] = new
        if moved < 1e-9:
            break
    own: dict[str, float] = {}
    for func, (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        name = layer(func)
        for k, frac in (mix(edges(func, 2)) if name == LIBRARY else {name: 1.0}).items():
            own[k] = own.get(k, 0.0) + tt * frac
    return own


def main() -> None:
    ap = loop_parser(__doc__, examples=15)
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
    own = own_time_per_layer(stats)
    t = Table(title="own time per layer (cProfile; library code's time — builtins, the "
                    "standard library, NumPy, torch — goes to the layer that called it)")
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
