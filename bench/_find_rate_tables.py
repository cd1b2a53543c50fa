"""Bench helper: find-rate tables written by ``bench/find_rate.py --json``, read
back and compared (``--rows``, ``--against``).  No side effects on import (the
tests load it without find_rate's environment settings)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

# A row's fields and their types: what find_rate.py writes and its table reads.
FIELDS = {"fault": str, "seed": int, "found": bool, "examples": int, "search_s": (int, float),
          "shrink_s": (int, float), "shrink_replays": int}


def load_rows(paths: str, flag: str) -> list[dict]:
    """The rows of the ``--json`` files in ``paths`` (comma-separated), in order.

    Raises ``ValueError`` with one line naming ``flag`` and the file when a
    file is missing, not JSON, holds no rows of find_rate.py (each with
    :data:`FIELDS` of their types), or repeats a (fault, seed) of an earlier
    row (overlapping runs: a seed counted twice)."""
    rows, seen = [], {}
    for path in paths.split(","):
        if not path:
            raise ValueError(f"{flag}: an empty file name in {paths!r}")
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise ValueError(f"{flag}: {path}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise ValueError(f"{flag}: {path}: not UTF-8 text") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{flag}: {path}: not JSON ({e.msg}, line {e.lineno})") from None
        got = data.get("rows") if isinstance(data, dict) else None
        if not isinstance(got, list) or not got:
            raise ValueError(f"{flag}: {path}: no rows written by find_rate.py --json "
                             "(a non-empty 'rows' list)")
        for i, r in enumerate(got):
            bad = [f for f, t in FIELDS.items() if not isinstance(r, dict) or f not in r
                   or not isinstance(r[f], t) or (t is int and isinstance(r[f], bool))]
            if bad:
                raise ValueError(f"{flag}: {path}: rows[{i}]: {', '.join(bad)} missing or of "
                                 f"the wrong type")
            key = (r["fault"], r["seed"])
            if key in seen:
                raise ValueError(f"{flag}: {path}: rows[{i}]: fault {key[0]} seed {key[1]} "
                                 f"again (also in {seen[key]}): overlapping seeds")
            seen[key] = path
        rows += got
    return rows


def compare(rows: list[dict], old: list[dict], examples: int) -> tuple[list[dict], dict]:
    """Per fault, on the (fault, seed) pairs both ``rows`` and ``old`` hold: seeds
    found and median examples to find (a miss counts as ``examples``: the
    budget both tables were run with) before and now.  Returns (one dict per
    fault both hold, counts: ``fewer`` faults found on fewer seeds, ``more``,
    ``higher`` / ``lower`` medians, ``faults`` compared, ``unpaired`` rows of
    either table without a partner).  Each table holds a (fault, seed) once
    (:func:`load_rows`)."""
    def key(r):
        return r["fault"], r["seed"]

    before = {key(r): r for r in old}
    pairs: dict = {}
    for r in rows:
        b = before.get(key(r))
        if b is not None:
            pairs.setdefault(r["fault"], []).append((b, r))
    paired = sum(map(len, pairs.values()))
    out, counts = [], {"fewer": 0, "more": 0, "higher": 0, "lower": 0, "faults": 0,
                       "unpaired": len(rows) + len(old) - 2 * paired}
    for fault in sorted(pairs):
        def side(i):
            mine = [p[i] for p in pairs[fault]]
            return (sum(r["found"] for r in mine),
                    statistics.median(r["examples"] if r["found"] else examples for r in mine))
        (f0, m0), (f1, m1) = side(0), side(1)
        out.append({"fault": fault, "seeds": len(pairs[fault]), "found_before": f0,
                    "found_now": f1, "median_before": m0, "median_now": m1})
        counts["faults"] += 1
        counts["fewer"] += f1 < f0
        counts["more"] += f1 > f0
        counts["higher"] += m1 > m0
        counts["lower"] += m1 < m0
    return out, counts
