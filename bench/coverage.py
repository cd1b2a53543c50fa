"""Behaviour coverage per seed: which features a default 200-example search hits.

Records what ``blockfuzz fuzz --seed S --examples N`` generates (runner and
geometry drawn, no faults) — every example's config and ops, with the
generator of the checkout it runs from — then replays each example on the
reference with :class:`harness.search.coverage.Tracker` and counts, per
feature, the examples that hit it on each seed.  Generation needs no
gpu_impl (with no fault the fixed implementation never changes what is
drawn), so the record step runs on the NumPy reference and takes seconds.

``--before CHECKOUT`` also records with another checkout's generator (a git
worktree of an older revision) in a subprocess and puts both in one table:
the features are judged by this tree's tracker in both columns, so the
comparison is of generators only.

Usage: python bench/coverage.py [--seeds 0..9] [--examples 200] [--before DIR]
                                [--json OUT]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

from _args import parse_seeds  # noqa: E402  (bench/ is sys.path[0] when run as a script)


def record(seeds: list[int], examples: int, steering: bool = True) -> dict:
    """{seed: [(config JSON, ops), ...]} as the importable checkout's machine draws them."""
    from harness.search.machine import BlockFuzzMachine

    class Recording(BlockFuzzMachine):
        def teardown(self):
            if getattr(self, "session", None) is not None:
                self.stats.setdefault("recorded", []).append(
                    (self.cfg.to_json(), list(self.ops), getattr(self, "prefix_len", 0)))
            super().teardown()

    # What fuzz runs: chunks, steered (where the checkout has them).
    from harness.search.fuzz import _run_chunks

    params = inspect.signature(_run_chunks).parameters
    kw = {"steering": steering} if "steering" in params else {}
    out = {}
    for s in seeds:
        stats: dict = {}
        if "base" in params:
            _run_chunks(None, s, examples, (), "reference", None, None, "dev", stats, None, [],
                        base=Recording, **kw)
        else:  # an older checkout: one Hypothesis run, as its fuzz did
            from hypothesis import Phase, settings
            from hypothesis import seed as hypothesis_seed
            from hypothesis.stateful import run_state_machine_as_test

            from harness.search import profiles
            from harness.search.machine import make_machine

            m = make_machine(None, (), "reference", None, stats, None, base=Recording)
            hypothesis_seed(s)(m)
            run_state_machine_as_test(m, settings=settings(
                profiles.get("dev"), max_examples=examples, derandomize=False,
                phases=[Phase.explicit, Phase.generate]))
        out[s] = stats.get("recorded", [])
    return out


def features_per_seed(recorded: dict) -> dict:
    """{seed: {feature: examples that hit it}} judged by this tree's tracker.

    An example that started from a prefix (a seed corpus trace, a steering
    prefix) counts a feature only where its own drawn ops hit it after the
    prefix: the prefix hitting it again is no new exercise."""
    from harness.core.session import Session
    from harness.search.coverage import Tracker
    from reference import RunnerConfig

    out = {}
    for s, examples in recorded.items():
        counts: dict = {}
        for config_json, ops, *skip in examples:
            config = RunnerConfig.from_json(config_json)
            session, tracker = Session(config, (), "reference"), Tracker(config)
            hit = set()
            for i, op in enumerate(ops):
                tracker.before(op, session.ledger, session.reference)
                session.apply(op)
                found = tracker.after(op, session.reference)
                if i >= (skip[0] if skip else 0):
                    hit.update(found)
            for f in hit:
                counts[f] = counts.get(f, 0) + 1
        out[int(s)] = counts
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0..9", type=parse_seeds)
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--before", default=None, metavar="CHECKOUT")
    p.add_argument("--json", dest="json_out", default=None)
    p.add_argument("--no-steering", action="store_true",
                   help="this tree's generator without steering (harness.search.steer)")
    p.add_argument("--record-only", default=None, metavar="OUT", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.record_only:  # the subprocess side of --before
        Path(args.record_only).write_text(json.dumps(record(args.seeds, args.examples)))
        return 0

    from rich.console import Console
    from rich.table import Table

    from harness.search.coverage import FEATURES

    label = "this tree" + (" (no steering)" if args.no_steering else "")
    runs = {label: features_per_seed(record(args.seeds, args.examples, not args.no_steering))}
    if args.before:
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "rec.json"
            env = dict(os.environ, PYTHONPATH=str(Path(args.before).resolve()))
            subprocess.run([sys.executable, str(Path(__file__).resolve()), "--record-only",
                            str(out), "--seeds", ",".join(map(str, args.seeds)),
                            "--examples", str(args.examples)], check=True, env=env,
                           cwd=args.before)
            runs = {"before": features_per_seed(json.loads(out.read_text())), **runs}
    n = len(args.seeds)
    table = Table(title=f"behaviour coverage: seeds {args.seeds[0]}..{args.seeds[-1]}, "
                        f"{args.examples} examples, no fault — seeds hit / fewest examples "
                        "hitting it on one seed")
    table.add_column("feature")
    for label in runs:
        table.add_column(label)
    for f in FEATURES:
        cells = []
        for per_seed in runs.values():
            counts = [per_seed[s].get(f, 0) for s in args.seeds]
            cells.append(f"{sum(c > 0 for c in counts)}/{n} / {min(counts)}")
        table.add_row(f, *cells)
    Console(width=140).print(table)
    for label, per_seed in runs.items():
        missing = sorted({f for s in args.seeds for f in FEATURES if not per_seed[s].get(f)})
        print(f"{label}: every feature on every seed: {'yes' if not missing else 'no'}"
              + (f" (missing somewhere: {', '.join(missing)})" if missing else ""))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
