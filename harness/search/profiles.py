"""Hypothesis settings profiles, registered here and loaded explicitly.

Hypothesis auto-loads its own built-in ``ci`` profile when ``$CI`` is set; ours
replace it by name and are always loaded on purpose (tests/conftest.py, the
CLI), never picked up implicitly.

- ``dev``: interactive runs; no example database so runs are pure functions of
  the seed.
- ``ci``: ``derandomize=True``, no database, no deadline — same verdict on every
  machine and under ``pytest -n 1`` / ``-n auto``.
- ``nightly``: many examples, longer op sequences.
- ``replay``: a single explicit run (used when re-checking a known trace).
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, Verbosity, settings

COMMON = dict(
    database=None,
    deadline=None,
    print_blob=False,
    report_multiple_bugs=False,
    suppress_health_check=list(HealthCheck),
    verbosity=Verbosity.quiet,
)

settings.register_profile("dev", max_examples=100, stateful_step_count=50, **COMMON)
settings.register_profile("ci", max_examples=50, stateful_step_count=50, derandomize=True,
                          **COMMON)
settings.register_profile("nightly", max_examples=100_000, stateful_step_count=40, **COMMON)
settings.register_profile("replay", max_examples=1, phases=[Phase.explicit], **COMMON)

PROFILES = ("dev", "ci", "nightly", "replay")


def get(name: str) -> settings:
    """The registered profile ``name``; raises ValueError for an unknown one."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return settings.get_profile(name)
