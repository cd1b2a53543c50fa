"""The state machine's draws: Hypothesis choices without a strategy per draw.

An op's ``draw`` (:mod:`harness.core.ops`) picks a batch, a request, a size
many times per step.  Drawing each through ``st.data().draw(st.integers(..))``
costs a strategy lookup, a span, a random-state check and a note per draw —
measured at about 9x the choice itself (``bench/profile_fuzz.py``).
:class:`Draws` makes the same choices straight on the example's
``ConjectureData``: ``integer``, ``choice`` and ``boolean`` ask for exactly
the choice (kind and constraints) that ``st.integers`` / ``st.sampled_from``
/ ``st.booleans`` would, so a seed draws the same examples as before; any
other strategy goes through :meth:`draw`.  Choices still come from
Hypothesis, so its engine records and replays them.

:meth:`Draws.permutation` and :meth:`Draws.unique_sample` make the choices of
``st.permutations`` and ``st.lists(st.sampled_from(..), unique=True)`` the
same way, as those strategies' loops do in the installed Hypothesis release.  Building a strategy
per draw also left reference cycles (its cached properties' closures) for the
garbage collector: a step's batch draw made about 80 such objects.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st
from hypothesis.internal.conjecture import utils as cu
from hypothesis.internal.conjecture.junkdrawer import LazySequenceCopy

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
        """A shuffled copy of ``seq`` (as ``st.permutations(seq)``: the same
        Fisher-Yates choices)."""
        out = list(seq)
        for i in range(len(out) - 1):  # reversed Fisher-Yates, as the strategy shuffles
            j = self._cd.draw_integer(i, len(out) - 1)
            out[i], out[j] = out[j], out[i]
        return out

    def unique_sample(self, seq: Sequence, min_size: int = 0, max_size: int | None = None) -> list:
        """Distinct elements of ``seq``, in drawn order (as ``st.lists(st.sampled_from(seq),
        min_size=.., max_size=.., unique=True)``, whose choices it makes the same way).
        ValueError when ``min_size`` exceeds ``len(seq)``."""
        n = len(seq)
        if min_size > n:
            raise ValueError(f"{min_size} distinct elements from {n}")
        if n < 2 or max_size == 0:  # Hypothesis builds other strategies here: draw through them
            return self._cd.draw(st.lists(st.sampled_from(seq), min_size=min_size,
                                          max_size=max_size, unique=True))
        max_size = n if max_size is None else min(max_size, n)
        average = min(max(min_size * 2, min_size + 5), 0.5 * (min_size + max_size))
        remaining, seen, out = LazySequenceCopy(tuple(seq)), set(), []
        elements = cu.many(self._cd, min_size=min_size, max_size=max_size, average_size=average)

        def take() -> None:
            value = remaining.pop(self._cd.draw_integer(0, len(remaining) - 1))
            if value in seen:
                elements.reject("value already seen")
            else:
                seen.add(value)
                out.append(value)

        if not hasattr(elements, "__enter__"):  # Hypothesis before many() was a context
            while remaining and elements.more():  # manager: its strategy's loop
                take()
            return out
        with elements:
            for _ in elements:
                take()
                if not remaining:
                    break
        return out

    def draw(self, strategy, label=None):
        """A value of any Hypothesis ``strategy`` (``label`` is accepted for
        ``st.data().draw``'s signature and not used)."""
        return self._cd.draw(strategy)
