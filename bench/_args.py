"""Bench helper: argument types and options shared by the bench scripts."""

from __future__ import annotations

import argparse


def parse_seeds(text: str) -> list[int]:
    """``0..9`` (inclusive) or ``0,3,5``."""
    if ".." in text:
        lo, hi = text.split("..")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def loop_parser(doc: str, examples: int) -> argparse.ArgumentParser:
    """A parser with the options of a bench that runs one fuzz loop (the
    profile benches): ``--runner``, ``--examples`` (default ``examples``),
    ``--seed``, ``--drawn``; ``doc``'s first line describes it."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--runner", default="v1", choices=("v1", "v2"))
    ap.add_argument("--examples", type=int, default=examples)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--drawn", action="store_true", help="draw the geometry per example")
    return ap
