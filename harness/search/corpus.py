"""Seed corpora: traces a search starts examples from (what it learned before).

Coverage-guided fuzzers keep the inputs that reached something new and mutate
them; blockfuzz's equivalent is a *seed corpus* of traces — earlier findings
and, from a nightly campaign, the shortest op prefix that first hit each of
the rarest behaviour-coverage features.  With a seed corpus, an example draws
(from the seed, like every other choice) whether to begin from one of its
traces: it takes that trace's config, applies its ops as its first ops, and
goes on drawing from there.  A failing example therefore records the prefix
too, and the trace shrinker removes whatever of it is not needed.

A run is a pure function of (seed, corpus): traces are read in file-name
order and only the ones the run can express are kept (:func:`usable`).
"""

from __future__ import annotations

from pathlib import Path

from harness.core.trace import Trace, TraceError, canonical_json, load, write_atomic

PREFIX_META = "coverage_prefix"  # meta key naming the feature a prefix trace first hit


def load_dir(path: str | Path) -> list[Trace]:
    """Every ``*.json`` trace under ``path``, in file-name order.

    Raises :class:`TraceError` naming the file for one that cannot be used, and
    for a path that is not a directory or holds no trace (an empty corpus is
    almost always a wrong path).
    """
    root = Path(path)
    if not root.is_dir():
        raise TraceError(str(root), "", "not a directory of traces")
    files = sorted(root.glob("*.json"))
    if not files:
        raise TraceError(str(root), "", "holds no *.json trace")
    return [load(f) for f in files]


def usable(traces, config=None, runner: str | None = None, target: str = "gpu_impl") -> list:
    """The traces a run can start from: same config when the run pins one, same
    runner when it pins a runner, and a config the target does not refuse."""
    from harness.targets import target_spec

    spec = target_spec(target)
    return [t for t in traces
            if (config is None or t.config == config)
            and (runner is None or t.config.runner == runner)
            and spec.refusal(t.config) is None]


def prefix_trace(config, ops: list[dict], feature: str, found_by: str) -> Trace:
    """A corpus entry: ``ops`` (legal from a fresh runner on ``config``), the
    shortest prefix seen that hit ``feature``; ``expect`` pass (without faults)."""
    return Trace(config, [dict(op) for op in ops], {"verdict": "pass"},
                 {PREFIX_META: feature, "found_by": found_by})


def write_dir(path: str | Path, traces: dict) -> None:
    """Write {file stem: trace JSON object} into ``path`` (atomically per file)."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    for stem, obj in sorted(traces.items()):
        write_atomic(root / f"{stem}.json", canonical_json(obj))
