"""Steering within a run: examples that start where the run's rarest situations began.

A seed corpus (:mod:`harness.search.corpus`) carries what earlier campaigns
learned into a run; this does the same *inside* one run, as coverage-guided
fuzzers keep every input that reached something rare and spend more of the
search on it.  After each example the machine records, per behaviour-coverage
feature, runner and group kinds (``spec-row-moved@v1+mamba``: a situation on
V1 is not the same situation on V2 — a V1-only bug needs it there — nor in an
attention-only config, where no Mamba state depends on it), how many examples
hit it and the shortest op prefix (with its config) that first hit it.  An
example then draws (from the seed, like every other choice) whether to start
from one of the prefixes of the :data:`RAREST` least-hit keys, in
:data:`SHARE_EIGHTHS` of examples: it takes that config, applies the prefix as
its first ops and draws on from there.  Each re-use hits the key again, so
its count grows and the energy moves on to the next rarest — a situation hit
once gets a few continuations, not the whole run.

Configs get the same treatment: per pair of config traits (:func:`traits`:
a drafter and a sliding window, V1 and a Mamba group, ...) the examples run
under it are counted, and :data:`CONFIG_EIGHTHS` of examples take the config
of one of the :data:`RAREST` least-run pairs and draw all their ops — bugs of
this family live where two mechanisms meet, and a pair the geometry draws
rarely can get few examples in a run by chance (a pair never drawn stays
out: only configs seen can be re-used).

A feature the run has not hit yet gets a frontier: for each feature that
narrows a broader one (:data:`harness.search.coverage.NARROWS`: a window hit
is a prefix hit in a window config), the run keeps, under
``towards:feature@runner[+mamba]``, the shortest prefix that hit the broader
feature in a config where the narrow one is reachable, and how many examples
got there without it.  Until the feature is hit on that runner and group
kinds, up to :data:`FRONTIER` of the :data:`RAREST` prefixes an example may
start from are such frontier prefixes (fewest tries first), so a run
continues from where it came closest; once the feature is hit its ordinary
key takes over.  Configs get a frontier too: until the feature is hit, up to
:data:`FRONTIER` of the configs an example may take are configs where it is
reachable (fewest examples first), for a feature whose configs are rare.
Besides those shares, while any frontier is open :data:`FRONTIER_EIGHTHS`
of examples start from a frontier entry (:func:`frontier`): a narrow feature
whose config is rare (a window hit with a drafter, a Mamba state restored on
V2 where the state block is larger) otherwise got a few examples in a run.

The pools are recomputed between chunks (:data:`harness.search.fuzz.STEER_CHUNK`
examples, 25: the first chunk has no pool) and frozen within one.

Determinism: the records are a function of the examples before, which are a
function of the seed, so a run stays a pure function of (seed, corpus).  A
failing example records the prefix as its first ops; the trace shrinker drops
what the failure does not need.
"""

from __future__ import annotations

import zlib
from itertools import combinations

from harness.core.trace import Trace
from harness.search.coverage import NARROWS, NEEDS

SHARE_EIGHTHS = 2  # of examples start from a rare prefix (once there is one)
CONFIG_EIGHTHS = 1  # of examples take the config of a rare pair of config traits
FRONTIER_EIGHTHS = 1  # of examples start from a frontier entry (while one is open)
RAREST = 6  # keys whose prefixes an example may start from
MAX_PREFIX_OPS = 40  # longer prefixes are not kept (an example's own ops come after)
FRONTIER = 3  # of the RAREST prefixes at most this many are frontier prefixes
TOWARDS = "towards:"  # key prefix of a frontier entry


def traits(config) -> list[str]:
    """The config's geometry traits, sorted: its runner and each engine mechanism
    it turns on (a Mamba group or attention only, a drafter, a sliding window,
    prefix caching, Mamba align or all mode, kv_sharing, decode context parallelism,
    kernel blocks smaller than allocation blocks, a second attention group, a
    row narrower than a request, FULL graphs of mixed batches, a backend slot buffer, an int8 KV cache,
    PAD_SLOT_ID Mamba padding, the engine's KV-cache manager, no capture sizes).

    Bugs of this family live where two mechanisms meet (a window and a drafter
    on one prefix hit; a drafter's accepted counts and V1's condense), and the
    geometry draws each mechanism with its own odds, so a pair can be rare in
    one run by chance: :func:`learn_config` counts examples per pair of traits.
    A token-slot config (runner ``sglang``): its runner, the paged allocator,
    the radix cache, decode batches that can outgrow the captured sizes, a
    hybrid model's Mamba pool."""
    c = config
    if c.runner == "sglang":
        on = {"sglang": True, "paged": c.page_size > 1, "radix": c.radix_cache,
              "eager-decodes": c.max_num_reqs > max(c.capture_bs),
              "mamba": c.mamba_slots > 0}
        return sorted(t for t, v in on.items() if v)
    on = {c.runner: True,
          "mamba": bool(c.mamba_groups),
          "attention-only": not c.mamba_groups,
          "drafter": c.num_speculative_tokens > 0,
          "window": any(g.sliding_window for g in c.groups),
          "prefix-caching": c.enable_prefix_caching,
          "align": c.mamba_cache_mode == "align",
          "all-mode": c.mamba_cache_mode == "all",
          "kv-sharing": c.kv_sharing,
          "dcp": c.dcp_world_size > 1,
          "kernel-blocks": any(g.kernel_block_size < g.block_size for g in c.groups),
          "two-attention-groups": len(c.attention_groups) > 1,
          "narrow-row": bool(c.narrow_groups),
          "full-mixed": c.cudagraph_support == "ALWAYS",
          "slot-buffer": any(g.slot_buffer for g in c.groups),
          "int8": c.kv_cache_dtype == "int8",
          "pad-slot": c.mamba_padding != "null",
          "engine-allocator": c.allocator == "engine",
          "no-graphs": not c.cudagraph_capture_sizes}
    return sorted(t for t, v in on.items() if v)


def config_keys(config) -> list[str]:
    """Steering keys of the config's trait pairs (``cfg:drafter+window``)."""
    return [f"cfg:{a}+{b}" for a, b in combinations(traits(config), 2)]


def key(feature: str, config) -> str:
    """The steering key of a feature hit under ``config``: the feature, its runner
    and, for a hybrid config, ``+mamba`` (``spec-row-moved@v1+mamba``: a
    situation in an attention-only config is not the same situation where a
    Mamba group's state columns depend on it)."""
    mamba = config.runner != "sglang" and config.mamba_groups
    return f"{feature}@{config.runner}{'+mamba' if mamba else ''}"


def _order(table: dict, salt: int):
    """Sort key for the rarest: examples, then a hash of (key, ``salt``) — ties
    are reshuffled as the run goes on (``salt``: examples run so far), so they
    do not always go to the same names (a tied key may still go unpicked)."""
    return lambda k: (table[k][0], zlib.crc32(f"{k}:{salt}".encode()))


def learn(stats: dict, config, ops: list[dict], first: dict, swarm=None) -> None:
    """Record one finished example: ``first`` is {feature: op index of its first
    hit}; ``stats["steer"]`` maps key -> [examples that hit it, config, shortest
    prefix ops, the op mix (:class:`~harness.search.swarm.Swarm`) of the
    example that ran that prefix], and a frontier key (``towards:``) ->
    [examples that hit the broader feature but not this one where it was
    reachable, config, shortest prefix to the broader feature's first hit, its
    example's op mix]."""
    table = stats.setdefault("steer", {})
    reached = {key(f, config): i for f, i in first.items()}
    for f, broad in NARROWS.items():  # got as far as the broader feature, not to f
        if broad in first and f not in first and config.runner != "sglang" and NEEDS[f](config):
            reached[TOWARDS + key(f, config)] = first[broad]
    for k, i in reached.items():
        entry = table.get(k)
        if entry is None:
            entry = table[k] = [0, None, None, None]
        entry[0] += 1
        if i + 1 <= MAX_PREFIX_OPS and (entry[2] is None or len(entry[2]) > i + 1):
            entry[1], entry[2], entry[3] = config, [dict(op) for op in ops[:i + 1]], swarm


def learn_config(stats: dict, config) -> None:
    """Count one example under each of its config's trait pairs, and under each
    narrow feature it makes reachable (a frontier key, ``towards:``):
    ``stats["steer_configs"]`` maps key -> [examples, the first config with it]."""
    table = stats.setdefault("steer_configs", {})
    narrow = [] if config.runner == "sglang" else [f for f in NARROWS if NEEDS[f](config)]
    keys = config_keys(config) + [TOWARDS + key(f, config) for f in narrow]
    for k in keys:
        entry = table.setdefault(k, [0, config])
        entry[0] += 1


def rarest_configs(stats: dict) -> list[Trace]:
    """Configs of the :data:`RAREST` least-run trait pairs (ties by :func:`_order`), as
    traces without ops: an example that starts from one draws all its ops.  First
    up to :data:`FRONTIER` of them are configs where a narrow feature not hit yet
    is reachable (fewest examples first): a window hit with a drafter needs a
    config with both before it needs any op."""
    table, hit = stats.get("steer_configs", {}), stats.get("steer", {})
    order = _order(table, stats.get("examples", 0))
    frontier = sorted((k for k in table
                       if k.startswith(TOWARDS) and k[len(TOWARDS):] not in hit),
                      key=order)[:FRONTIER]
    keys = frontier + sorted((k for k in table if not k.startswith(TOWARDS)),
                             key=order)[:RAREST - len(frontier)]
    return [Trace(table[k][1], [], {"verdict": "pass"}, {"steer_key": k}) for k in keys]


def rarest(stats: dict) -> list[Trace]:
    """Prefixes of the :data:`RAREST` least-hit keys (ties by :func:`_order`), as traces:
    first up to :data:`FRONTIER` frontier prefixes of features not hit yet (fewest
    tries first), then the least-hit features' prefixes."""
    table = stats.get("steer", {})
    order = _order(table, stats.get("examples", 0))
    kept = [k for k, e in table.items() if e[2] is not None]
    frontier = sorted((k for k in kept
                       if k.startswith(TOWARDS) and k[len(TOWARDS):] not in table),
                      key=order)[:FRONTIER]
    keys = frontier + sorted((k for k in kept if not k.startswith(TOWARDS)),
                             key=order)[:RAREST - len(frontier)]
    return [Trace(table[k][1], table[k][2], {"verdict": "pass"},
                  {"steer_key": k, **({"swarm": table[k][3]} if k.startswith(TOWARDS) else {})})
            for k in keys]


def frontier(stats: dict) -> list[Trace]:
    """Up to :data:`FRONTIER` frontier entries of features not hit yet, fewest
    tries first: a frontier prefix (the shortest op prefix that reached the
    broader feature where the narrow one is reachable) where there is one, else
    a frontier config (one where it is reachable, all ops drawn).  While any is
    open, :data:`FRONTIER_EIGHTHS` of examples start from one of them, besides
    the frontier share of the rare pools: a narrow feature whose config is rare
    is otherwise tried in a few examples of a run.  The two kinds count tries
    apart (a config: examples where the feature was reachable; a prefix:
    examples that reached the broader feature), so a kept prefix, whose count
    starts later, tends to come before a bare config."""
    prefixes, configs = stats.get("steer", {}), stats.get("steer_configs", {})
    entries = {}
    for k, e in configs.items():
        if k.startswith(TOWARDS) and k[len(TOWARDS):] not in prefixes:
            entries[k] = (e[0], Trace(e[1], [], {"verdict": "pass"}, {"steer_key": k}))
    for k, e in prefixes.items():  # a prefix, where one is kept, over the bare config
        if k.startswith(TOWARDS) and k[len(TOWARDS):] not in prefixes and e[2] is not None:
            entries[k] = (e[0], Trace(e[1], e[2], {"verdict": "pass"},
                                      {"steer_key": k, "swarm": e[3]}))
    order = _order({k: v for k, v in entries.items()}, stats.get("examples", 0))
    return [entries[k][1] for k in sorted(entries, key=order)[:FRONTIER]]
