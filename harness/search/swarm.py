"""Swarm testing (Groce et al., ISSTA 2012): each example first draws its own mix.

A uniform mix of every op makes long runs of one kind rare: a bug that needs
six FULL decodes of shrinking batches with no dummy run between is drawn
once in hundreds of examples.  So every example begins by drawing a
:class:`Swarm` — a weight per op (some off, some heavy), the cudagraph modes
its forwards may request, and how often a step is a pure decode — and the
machine draws every op under it.  The draw comes from Hypothesis's data, so
it is a function of the seed; what a failing example did is recorded as ops,
so the trace shrinker never sees the swarm.

The geometry is swarmed the same way by :func:`harness.search.geometry.runner_configs`
(each example draws its runner, groups, kernel split, DCP, capture sizes).

Knobs for op draws (read as ``m.swarm.<knob>``): ``modes`` (the cudagraph
modes a forward may request), ``decode_eighths`` (share, in eighths, of
steps and dummy runs that are uniform decode batches: 1 + k tokens per request),
``whole_batch_eighths`` (share of steps that schedule every steppable
request), ``boundary_eighths`` (share of batch sizes drawn at boundaries,
:meth:`Swarm.size`: one off a capture size, one below the previous forward —
where padding starts and padded tails cover what the last batch wrote).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.core.ops.forward import MODES  # the cudagraph modes, FULL first
# Mode sets an example may keep (first: all of them, what shrinking moves towards).
MODE_SETS = (MODES, ("FULL",), ("FULL", "PIECEWISE"), ("FULL", "NONE"),
             ("PIECEWISE", "NONE"))
WEIGHTS = (2, 2, 6, 0, 1)  # per op; 0 turns the op off for this example
ALWAYS_ON = ("add", "step", "admit", "allocate",  # without them an example exercises nothing
             "sgl_admit", "sgl_decode")  # (token-slot ops: the same two roles)
FORWARD_FACTOR = 2  # forwards (step, dummy run) are where kernels write: drawn more often
EAGER_FACTOR = 4  # an op the engine would take now (OpSpec.eager): drawn this much more often


@dataclass(frozen=True)
class Swarm:
    """One example's op mix; :data:`DEFAULT` is the plain uniform mix."""

    weights: dict = field(default_factory=dict)  # op name -> weight; missing: 2
    modes: tuple = MODES
    decode_eighths: int = 4
    whole_batch_eighths: int = 0
    boundary_eighths: int = 0

    def weight(self, op: str) -> int:
        return self.weights.get(op, 2)

    def decode(self, data) -> bool:
        """Draw whether a forward is a uniform decode batch (1 + k tokens per request)."""
        return data.integer(0, 7) < self.decode_eighths

    def whole_batch(self, data) -> bool:
        """Draw whether a step schedules every steppable request."""
        return self.whole_batch_eighths > 0 and data.integer(0, 7) < \
            self.whole_batch_eighths


    def size(self, data, lo: int, hi: int, config, last_forward, field: str) -> int:
        """A batch size in [lo, hi]: with the boundary share, one of the boundary
        values in range — a capture size +- 1, the previous forward's ``field``
        (``num_tokens`` / ``num_reqs``) - 1 — otherwise any."""
        if self.boundary_eighths and data.integer(0, 7) < self.boundary_eighths:
            near = {s + d for s in config.cudagraph_capture_sizes for d in (-1, 1)}
            if last_forward is not None:
                near.add(getattr(last_forward, field) - 1)
            near = sorted(v for v in near if lo <= v <= hi)
            if near:
                return data.choice(near)
        return data.integer(lo, hi)


DEFAULT = Swarm()


def draw_swarm(data, op_names: list[str]) -> Swarm:
    """One example's :class:`Swarm` over the drawable ``op_names``; ``data``: the
    machine's :class:`~harness.search.draws.Draws` (each knob one ``choice``, the
    choice ``st.sampled_from`` makes, so a seed draws the swarms it drew as a
    strategy)."""
    weights = {}
    for name in op_names:
        w = data.choice(WEIGHTS)
        weights[name] = max(w, 1) if name in ALWAYS_ON else w
    return Swarm(weights=weights,
                 modes=data.choice(MODE_SETS),
                 decode_eighths=data.choice((4, 7, 2, 8)),
                 whole_batch_eighths=data.choice((0, 4, 0, 2)),
                 boundary_eighths=data.choice((0, 6, 3)))


def pick(ops: list, swarm: Swarm, data, machine=None):
    """Draw one of ``ops`` (OpSpecs whose precondition holds) by swarm weight
    (forward ops times :data:`FORWARD_FACTOR`, ops whose ``eager(machine)``
    holds times :data:`EAGER_FACTOR`);
    when every one of them is weighted 0, all are equally likely (the example
    must go on)."""
    if not ops:
        raise AssertionError("no op is enabled (dummy_run always is: has it been "
                             "unregistered?)")
    weights = [swarm.weight(s.name) * (FORWARD_FACTOR if s.forward else 1)
               * (EAGER_FACTOR if s.eager is not None and machine is not None
                  and s.eager(machine) else 1) for s in ops]
    if not any(weights):
        weights = [1] * len(ops)
    k = data.integer(0, sum(weights) - 1)
    for spec, w in zip(ops, weights):
        if k < w:
            return spec
        k -= w
    raise AssertionError("unreachable")
