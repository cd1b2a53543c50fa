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

:func:`search_settings` is what a fuzz search runs under: one of these
profiles, the example count, no shrink phase, and the :data:`SEARCH_BACKEND`
(every example drawn afresh; see :class:`FreshExamples`).
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.internal.conjecture import providers

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
    if not hasattr(providers, "_get_local_constants"):
        return
    empty = providers.Constants(integers=providers.SortedSet(),
                                floats=providers.SortedSet(key=providers.float_to_int),
                                bytes=providers.SortedSet(), strings=providers.SortedSet())
    providers._get_local_constants = lambda: empty


_no_local_constants()


SEARCH_BACKEND = "blockfuzz-fresh"


class FreshExamples(providers.HypothesisProvider):
    """Hypothesis's own random draws, every example drawn afresh from the seed's stream.

    Registered as the :data:`SEARCH_BACKEND` (Hypothesis's extension point for
    other backends, marked experimental there: ``AVAILABLE_PROVIDERS`` and
    ``settings.backend``).  Each choice is drawn as Hypothesis draws it, from
    the engine's random stream (so a run stays a pure function of its seed),
    but the engine then generates every example from scratch, except the
    first of each Hypothesis run (each chunk), which it always draws all
    simplest on its own backend.  With its own backend it would instead, after
    each new example, run a few copies of it (up to six) with spans duplicated
    (its structure mutator), and start each run with examples whose draws
    after a shared prefix are all the simplest choice.  Both help
    a property test find a small failing input; here they spent a run's
    examples on near-copies: on seeds 0..2 a 200-example run had about 55
    distinct geometries and 100 distinct (geometry, first ten ops) openings
    (about 140 and 170 drawn afresh), and a rare geometry class met on a seed was
    often one geometry with its copies.  The search keeps its own local
    search, directed where it matters: steering (:mod:`harness.search.steer`)
    starts examples from the run's rarest prefixes and configs.  Failing
    examples are still replayed by Hypothesis's backend before it reports
    them (they replay: a machine example is deterministic), and its shrink
    phase is off (:mod:`harness.search.shrink` shrinks traces).  A failing
    example therefore runs three times (found, replayed on Hypothesis's
    backend, replayed when reported), and ``stats`` counts its steps each time.
    """


# A dotted path, as every Hypothesis release with backends accepts.
providers.AVAILABLE_PROVIDERS[SEARCH_BACKEND] = f"{__name__}.FreshExamples"


def search_settings(profile: str, examples: int) -> settings:
    """Settings of one search run: ``profile`` (see :func:`get`), ``examples`` examples,
    generation only (our trace shrinker shrinks), every example drawn afresh."""
    # Hypothesis's own shrinker re-runs hundreds of examples through the Triton
    # interpreter; our trace shrinker (harness/shrink.py) needs tens of replays.
    return settings(get(profile), max_examples=examples, derandomize=False,
                    phases=[Phase.explicit, Phase.generate], backend=SEARCH_BACKEND)


def get(name: str) -> settings:
    """The registered profile ``name``; raises ValueError for an unknown one."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    return settings.get_profile(name)
