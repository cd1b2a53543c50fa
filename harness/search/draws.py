"""The state machine's draws: Hypothesis choices for an example's start, a seeded
generator for its ops.

An example's start (steering prefix, geometry, swarm) is drawn by
:class:`Draws`, straight on the example's ``ConjectureData``: ``integer``,
``choice`` and ``boolean`` ask for exactly the choice (kind and constraints)
that ``st.integers`` / ``st.sampled_from`` / ``st.booleans`` would, without
building a strategy per draw (a strategy lookup, a span, a random-state check
and a note: about 9x the choice itself); any other strategy goes through
:meth:`Draws.draw`.  :meth:`Draws.permutation` and :meth:`Draws.unique_sample`
draw through ``st.permutations`` and ``st.lists(st.sampled_from(..),
unique=True)``: only an op draw run from a test's ``st.data()`` asks for
them, as the search's op draws come from :class:`ExampleDraws`.

Its ops are drawn by :class:`ExampleDraws`, the same API on a pseudo-random
generator seeded by one more Hypothesis choice (:func:`example_seed`): a
Hypothesis choice costs about 20 us and a step made about six.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache

from hypothesis import strategies as st
from hypothesis.internal.conjecture import utils as cu

# st.integers(lo, hi) weights its bounds when hi - lo exceeds this; such draws
# go through the strategy, so the choice stays the one it would make.
_UNWEIGHTED_SPAN = 127


class Draws:
    """Draw choices for one example; ``data``: the rule's ``st.data()`` object
    (its ``conjecture_data`` is the example's choice sequence)."""

    __slots__ = ("_cd",)

    def __init__(self, data) -> None:
        self._cd = data.conjecture_data

    def integer(self, lo: int, hi: int) -> int:
        """An int in [lo, hi] (as ``st.integers(lo, hi)``); ValueError when lo > hi."""
        if lo > hi:
            raise ValueError(f"empty range [{lo}, {hi}]")
        if hi - lo > _UNWEIGHTED_SPAN:
            return self._cd.draw(st.integers(lo, hi))
        return self._cd.draw_integer(lo, hi)

    def choice(self, seq: Sequence):
        """One element of ``seq`` (as ``st.sampled_from(seq)``: a single element
        is returned without a choice); ValueError when ``seq`` is empty."""
        n = len(seq)
        if n == 0:
            raise ValueError("choice from an empty sequence")
        if n == 1:
            return seq[0]
        return seq[self._cd.draw_integer(0, n - 1)]

    def boolean(self) -> bool:
        """True or False (as ``st.booleans()``)."""
        return self._cd.draw_boolean()

    def permutation(self, seq: Sequence) -> list:
        """A shuffled copy of ``seq`` (``st.permutations(seq)``)."""
        return self._cd.draw(st.permutations(seq))

    def unique_sample(self, seq: Sequence, min_size: int = 0, max_size: int | None = None) -> list:
        """Distinct elements of ``seq`` in drawn order (``st.lists(st.sampled_from(seq),
        min_size=.., max_size=.., unique=True)``); ValueError when ``min_size``
        exceeds ``len(seq)``."""
        if min_size > len(seq):
            raise ValueError(f"{min_size} distinct elements from {len(seq)}")
        return self._cd.draw(st.lists(st.sampled_from(seq), min_size=min_size,
                                      max_size=max_size, unique=True))

    def draw(self, strategy, label=None):
        """A value of any Hypothesis ``strategy`` (``label`` is accepted for
        ``st.data().draw``'s signature and not used)."""
        return self._cd.draw(strategy)


_SEED_BYTES = st.binary(min_size=8, max_size=8)  # (one strategy: validated once)


def example_seed(data, salt: int = 0) -> int:
    """One example's op-draw seed: a single Hypothesis choice on ``data`` (the
    rule's ``st.data()``), eight bytes, which Hypothesis draws uniformly (no
    bytes constants are mixed in, unlike a wide integer's bounds and constants,
    which would repeat seeds), with ``salt`` (any int, taken mod 2**64) above them.

    Hypothesis draws the first example of every run all-simplest (eight zero
    bytes): the salt (the run's seed) keeps that example's ops apart from
    one run to the next."""
    choice = int.from_bytes(data.conjecture_data.draw(_SEED_BYTES), "big")
    return ((salt % 2**64) << 64) | choice


@lru_cache(maxsize=4096)
def _p_continue(average: float, span: int) -> float:
    """The chance to draw one more element so a list averages ``average``
    elements past its minimum, at most ``span`` (Hypothesis's own estimate)."""
    return cu._calc_p_continue(average, span)


class ExampleDraws:
    """One example's op draws from a pseudo-random generator seeded by one
    Hypothesis choice (:func:`example_seed`): the API of :class:`Draws`, with the
    distributions Hypothesis gives them, at a Python ``random`` call each.

    A Hypothesis choice costs about 20 us (a span, the provider, a record),
    and a step made about six; the op draws now cost about 1 us each.  The
    search loses nothing it used: its backend draws every example afresh (no
    span mutation) and its shrink phase is off (:mod:`harness.search.shrink`
    shrinks traces), so Hypothesis only ever needed an example's choices to
    replay it, and the seed replays it.  Distributions: ``integer`` is uniform
    and, over more than 128 values, puts 6/128 on the bounds and their
    neighbours as ``st.integers`` does; ``unique_sample``'s length follows the
    geometric law of ``st.lists`` (same average).  ``seed``: any int.
    """

    __slots__ = ("_rng",)

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        """An int in [lo, hi]; ValueError when lo > hi."""
        if lo > hi:
            raise ValueError(f"empty range [{lo}, {hi}]")
        if hi - lo > _UNWEIGHTED_SPAN:
            u = self._rng.random() * 128  # the bounds' weights of st.integers
            if u < 6:
                return (lo, lo, lo + 1, hi - 1, hi, hi)[int(u)]
        return self._rng.randint(lo, hi)

    def choice(self, seq: Sequence):
        """One element of ``seq``; ValueError when ``seq`` is empty."""
        n = len(seq)
        if n == 0:
            raise ValueError("choice from an empty sequence")
        return seq[0] if n == 1 else seq[self._rng.randrange(n)]

    def boolean(self) -> bool:
        """True or False, evenly."""
        return self._rng.random() < 0.5

    def permutation(self, seq: Sequence) -> list:
        """A shuffled copy of ``seq``."""
        out = list(seq)
        self._rng.shuffle(out)
        return out

    def unique_sample(self, seq: Sequence, min_size: int = 0, max_size: int | None = None) -> list:
        """Distinct elements of ``seq`` in drawn order: ``min_size`` plus a geometric
        number more (the average ``st.lists(.., unique=True)`` uses), at most
        ``max_size``.  ValueError when ``min_size`` exceeds ``len(seq)``."""
        n = len(seq)
        if min_size > n:
            raise ValueError(f"{min_size} distinct elements from {n}")
        max_size = n if max_size is None else min(max_size, n)
        size = min_size
        if max_size > min_size:
            average = min(max(min_size * 2, min_size + 5), 0.5 * (min_size + max_size))
            p = _p_continue(average - min_size, max_size - min_size)
            rand = self._rng.random
            while size < max_size and rand() < p:
                size += 1
        return self._rng.sample(list(seq), size)

    def draw(self, strategy, label=None):
        """Refused: an op draw from a seeded example takes no Hypothesis strategy."""
        raise TypeError("an op draw takes its values from integer/choice/boolean/"
                        f"permutation/unique_sample, not a strategy ({strategy!r})")
