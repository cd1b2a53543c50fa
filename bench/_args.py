"""Bench helper: argument types shared by the bench scripts."""

from __future__ import annotations


def parse_seeds(text: str) -> list[int]:
    """``0..9`` (inclusive) or ``0,3,5``."""
    if ".." in text:
        lo, hi = text.split("..")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]
