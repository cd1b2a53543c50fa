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


def _no_local_constants() -> None:
    """Keep generation a function of the seed alone.

    Hypothesis (6.131 and later) mixes into about one draw in twenty a constant
    harvested from the source of every *local* module in ``sys.modules`` —
    here blockfuzz's own modules and whatever tests a pytest worker imported.
    Which modules are loaded differs between the CLI, a pytest worker and a
    nightly worker, and every edit to our source changes the harvest, so the
    same seed drew different examples in different processes (a kill test
    passed in one pytest worker and missed in another).  Harvest nothing:
    Hypothesis's fixed global constants still apply.  Private API, guarded:
    a release without it needs nothing.
    """
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a Hypothesis without the harvest
        return
    if not hasattr(providers, "_get_local_constants"):
        return
    empty = providers.Constants(integers=providers.SortedSet(),
                                floats=providers.SortedSet(key=providers.float_to_int),
                                bytes=providers.SortedSet(), strings=providers.SortedSet())
    providers._get_local_constants = lambda: empty


_no_local_constants()


def get(name: str) -> settings:
    """The registered profile ``name``; raises ValueError for an unknown one."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return settings.get_profile(name)
