"""Runner configurations drawn by Hypothesis: the geometry is part of the input.

Draws the runner (unless pinned), the KV-cache groups (an attention group whose
kernel block size may split its allocation blocks, an optional Mamba group, an
optional second attention group with its own block size), pool size, batch
limits, CUDA-graph capture sizes, the attention backends' capabilities (a
backend's own slot buffer; FULL graphs for mixed batches) and speculative
decoding (``num_speculative_tokens``) the hybrid layout (``kv_sharing``) and per-group row widths (``max_model_len``),
within bounds a 2-core CPU running the
Triton interpreter can afford.  The simplest draw (what shrinking moves
towards) is the default hybrid config: one attention group, one Mamba group.
"""

from __future__ import annotations

import dataclasses
import math
import random
import zlib

from hypothesis import strategies as st

from reference import ATTENTION, MAMBA, GroupSpec, RunnerConfig, TokenSlotConfig
from reference.config import (ALL, ALWAYS, CONV_SIZE_MAX, MAX_NUM_BLOCKS_PER_REQ_MAX,
                              UNIFORM_BATCH,
                              hybrid_attention_block_size)

HEAD_SIZE = 4  # drawn configs keep RunnerConfig's default head_size


@st.composite
def runner_configs(draw, runner: str | None = None,
                   kernel_split: dict | None = None, dcp: dict | None = None,
                   spec: bool | dict = True, spec_dcp: bool = True,
                   engine: bool | str = True, sharing_ok: bool = True,
                   padding_ok: bool = True, uniform_pages: bool = False,
                   plain: bool = False, mamba_needed: dict | None = None,
                   spec_fits_graphs: bool = False, host_ok: bool = True,
                   narrow_ok: bool = True) -> RunnerConfig:
    """A valid :class:`RunnerConfig`; ``runner`` pins ``v1`` / ``v2``.

    kernel_split: {runner: bool} — False keeps ``kernel_block_size == block_size``
    for that runner (a target whose block tables cannot split blocks, see
    :func:`target_limits`); dcp: {runner: bool} — False keeps one DCP rank;
    spec: False keeps ``num_speculative_tokens`` 0 (a target without a drafter),
    or {runner: bool} per runner;
    spec_dcp: False keeps it 0 when ``dcp_world_size`` > 1; engine: False keeps
    ``allocator`` ``trace`` (a target without its own KV-cache manager);
    ``"single"`` draws ``engine`` configs with one attention group only (a
    target whose manager's groups share one pool, as vLLM's do); sharing_ok:
    False keeps ``kv_sharing`` off; padding_ok: False keeps ``mamba_padding``
    ``null``; uniform_pages: True keeps ``kv_sharing`` to configs whose
    attention groups have one block size (a target whose engine unifies page
    sizes before it lays its one pool, as vLLM's does); plain: True keeps to one
    attention group, no backend slot buffer, no conv state and a float32 KV cache
    (what the vllm target's runner mode drives; with ``engine``, ``spec``,
    ``kernel_split``, ``dcp``, ``sharing_ok`` and ``padding_ok`` off, the whole
    of it). False draws exactly as before it existed. mamba_needed: {runner:
    bool} — True always keeps the Mamba group for that runner (runner mode on
    V2, which needs one: ``harness.targets.vllm_model_runner.runner_refusal``).
    spec_fits_graphs: True keeps ``1 + num_speculative_tokens`` within the
    largest capture size (vLLM's own runner refuses FULL decode graphs smaller
    than a speculative row).  host_ok: False keeps ``host_blocks`` 0 (a target
    without a host tier).  narrow_ok: False keeps every attention row as wide
    as ``max_model_len`` (``GroupSpec.max_num_blocks`` 0).
    """
    runner = runner or draw(st.sampled_from(["v1", "v2"]))
    # Repeated entries weight the draw: most examples keep a Mamba group and
    # graph capture sizes (the seeds' bugs need both); geometry varies around them.
    block_size = draw(st.sampled_from([4, 8, 4, 2, 16]))
    split_ok = (kernel_split or {}).get(runner, True)
    split = draw(st.sampled_from([1, 2, 1, 4])) if split_ok else 1
    kernel_block_size = max(1, block_size // split)
    groups = [GroupSpec(ATTENTION, block_size, kernel_block_size)]
    if (mamba_needed or {}).get(runner) or draw(st.sampled_from([True, True, True, False])):
        groups.append(GroupSpec(MAMBA, 16, 16))
    if not plain and draw(st.sampled_from([False, False, True])):
        second = draw(st.sampled_from([8, 4]))
        groups.append(GroupSpec(ATTENTION, second, second))
    # Who picks block ids: the trace, or the target's own KV-cache manager (one
    # config in two; one in three until the scheduler faults' seed-0 misses
    # were measured, issue #16): two thirds of those with prefix caching (one
    # DCP rank) — a Mamba group kept (three times in four) means vLLM's align
    # mode, drawn without a drafter, its state blocks mostly larger than the
    # attention blocks (as hybrid models' are: where a column computed in the
    # wrong unit shows) — and mostly a sliding window on the first group.
    allocator, caching, align = "trace", False, False
    if engine and draw(st.sampled_from([False, True])):
        allocator = "engine"
        if draw(st.sampled_from([False, True, True])):
            caching = True
            if engine == "single" or draw(st.sampled_from([False, False, False, True])):
                groups = [g for g in groups if g.kind != MAMBA]
            align = any(g.kind == MAMBA for g in groups)
        if engine == "single":
            groups = groups[:1]
        if not align and draw(st.sampled_from([True, True, True, False])):
            # Sliding-window attention on the first group (three configs in
            # four; not with Mamba prefix caching): a window of about one or two
            # blocks, so requests outgrow it within a few steps and a prefix
            # hit can be longer than the window.
            g0 = groups[0]
            window = draw(st.sampled_from([g0.block_size, g0.block_size + 1,
                                           2 * g0.block_size, 3]))
            groups[0] = GroupSpec(ATTENTION, g0.block_size, g0.kernel_block_size,
                                  g0.slot_buffer, window)
    max_num_batched_tokens = draw(st.sampled_from([16, 8]))
    if align:
        # A state block of 2 attention blocks (or 1), within the token budget.
        max_num_batched_tokens = max(max_num_batched_tokens, block_size)
        bs_m = draw(st.sampled_from([2 * block_size, 2 * block_size, block_size]))
        bs_m = bs_m if bs_m <= max_num_batched_tokens else block_size
        groups = [GroupSpec(MAMBA, bs_m, bs_m) if g.kind == MAMBA else g for g in groups]
    sizes = draw(st.sampled_from([(1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4), (2, 8), (1,), ()]))
    world = draw(st.sampled_from([1, 1, 2, 4])) if (dcp or {}).get(runner, True) and not \
        caching and not groups[0].sliding_window \
        and not (allocator == "engine" and engine == "single") else 1
    rank = draw(st.integers(0, world - 1))
    interleave = draw(st.sampled_from([i for i in (1, 2, 4) if all(
        g.block_size % i == 0 for g in groups if g.kind == ATTENTION)]))
    # vLLM's Mamba builders ask V1 for a decode-first reorder (threshold 1; the
    # runner takes the least over its builders, so a Mamba group always
    # reorders); attention-only backends here do not.
    reorder = 1 if runner == "v1" and any(g.kind == MAMBA for g in groups) else 0
    # Attention backends: the first group's may keep its own slot buffer, and
    # without Mamba groups the backends may capture mixed batches in FULL graphs.
    if not plain and draw(st.sampled_from([False, False, True])):
        groups[0] = GroupSpec(ATTENTION, block_size, kernel_block_size, slot_buffer=True,
                              sliding_window=groups[0].sliding_window)
    mamba = any(g.kind == MAMBA for g in groups)
    support = ALWAYS if not mamba and draw(st.sampled_from([False, True])) else UNIFORM_BATCH
    # Speculative decoding (a drafter proposing k tokens) in half the examples;
    # vLLM's Mamba builders then treat up to 1 + k tokens as a decode.
    if isinstance(spec, dict):
        spec = spec.get(runner, True)
    k = draw(st.sampled_from([0, 0, 0, 2, 1, 3])) if spec and not align and not (
        caching and groups[0].sliding_window and len(groups) > 1) else 0
    if world > 1 and not spec_dcp:
        k = 0
    if spec_fits_graphs and sizes and 1 + k > max(sizes):
        k = max(sizes) - 1
    if reorder:
        reorder = 1 + k
    # The hybrid layout (kv_sharing: one block pool, attention and Mamba pages
    # aliased) in one hybrid config in two, where it is modelled (no drafter,
    # no prefix caching), unless the target cannot run it.
    sharing = mamba and sharing_ok and not caching and not k \
        and draw(st.sampled_from([False, True]))
    # Attention groups of different block sizes: in two configs in three each row is
    # sized from max_model_len and the group's own block size (vLLM's InputBatch),
    # so the larger blocks get narrower rows; else one width for every group.
    widths = draw(st.sampled_from([4, 2] if allocator == "trace" else [4])) \
        * (2 if align and block_size <= 8 else 1)
    per_block = {g.block_size * (world if g.kind == ATTENTION else 1)
                 for g in groups if g.kind == ATTENTION}
    model_len = min(widths * min(per_block), 256) \
        if len(per_block) > 1 and draw(st.sampled_from([False, True, True])) else 0
    if model_len:
        widths = max(-(-model_len // b) for b in per_block)
    num_blocks = draw(st.sampled_from([12, 8, 16]))
    max_num_reqs = draw(st.sampled_from([4, 4, 2, 3]))
    # Issue #12's cache layouts are chosen by a generator seeded from the draws
    # above, not drawn: so they take no bytes of the example's choice sequence,
    # and adding them moved no other draw (the geometry and ops a seed's
    # examples drew before they existed are the same; only the layout is new).
    rng = random.Random(zlib.crc32(repr((
        runner, groups, allocator, caching, k, world, rank, interleave, sizes, sharing,
        widths, model_len, num_blocks, max_num_reqs, max_num_batched_tokens, support,
        reorder)).encode()))
    # One in four (not with prefix caching, whose hits then need multiples of
    # every block size): a first attention block that is not a power of two
    # (x 3/2: 6, 12, 24), as hybrid models' groups get when sized to a page.
    g0 = groups[0]
    if rng.random() < 0.25 and not caching and g0.block_size >= 4 \
            and (3 * g0.block_size // 2) % interleave == 0:
        bs = 3 * g0.block_size // 2
        kbs = g0.kernel_block_size if split_ok and bs % g0.kernel_block_size == 0 else bs
        groups[0] = GroupSpec(ATTENTION, bs, kbs, g0.slot_buffer, g0.sliding_window)
    # A conv state before the SSM state in one Mamba group in two.
    conv = rng.choice([0, 0, 1, 3]) if mamba else 0
    conv = 0 if plain else conv
    groups = [GroupSpec(MAMBA, g.block_size, g.kernel_block_size, conv_size=conv)
              if g.kind == MAMBA else g for g in groups]
    sharing_map = ()
    if sharing:
        # Which attention group shares its tensor with the Mamba group: the first
        # (the default pairing), or in one config in two with a second attention
        # group that one (kv_sharing_map).
        attn = [i for i, g in enumerate(groups) if g.kind == ATTENTION]
        mi = next(i for i, g in enumerate(groups) if g.kind == MAMBA)
        ai = attn[1] if len(attn) > 1 and rng.random() < 0.5 else attn[0]
        sharing_map = ((ai, mi),) if ai != attn[0] else ()
        # The engine sizes the attention block from the Mamba state: the least
        # multiple of the kernel block size whose page holds it.
        ga = groups[ai]
        derived = hybrid_attention_block_size((groups[mi].conv_size + 1) * HEAD_SIZE,
                                              HEAD_SIZE, ga.kernel_block_size)
        if derived > ga.block_size and derived % interleave == 0:
            # A target that cannot split blocks gets kernel blocks of the derived size.
            groups[ai] = GroupSpec(ATTENTION, derived,
                                   ga.kernel_block_size if split_ok else derived,
                                   ga.slot_buffer, ga.sliding_window)
        elif derived > ga.block_size:
            sharing, sharing_map = False, ()
        if uniform_pages and len({g.block_size for g in groups if g.kind == ATTENTION}) > 1:
            sharing, sharing_map, groups[ai] = False, (), ga
    if caching:
        # A prefix hit is a multiple of the prefix unit (the least common multiple
        # of the cacheable groups' block sizes) and never the whole prompt: a hit
        # of one unit needs a prompt of a unit and a token (two units and a token
        # with a drafter, whose hit drops its last block), and a config whose rows
        # hold one unit (a 16-token Mamba state block beside 4-token attention
        # rows of 4 columns) could never hit. Rows get one unit more than that,
        # so hits can also span two units. With a sliding window, all of that
        # past the window: a window hit (its blocks before the window null)
        # needs a hit longer than the window by a block, and a window of two
        # blocks beside rows of three units could never have one with a drafter.
        unit = math.lcm(*(g.block_size for g in groups if g.kind == ATTENTION or align))
        window = max(g.sliding_window or 0 for g in groups)
        need = min(window + (2 + (k > 0)) * unit + 1, row_tokens_max(groups))
        if model_len:
            model_len = max(model_len, need)
        else:
            widths = max(widths, max(-(-need // g.block_size)
                                     for g in groups if g.kind == ATTENTION))
    if model_len:  # the rows of a group whose block size changed
        per_block = {g.block_size * world for g in groups if g.kind == ATTENTION}
        widths = max(-(-model_len // b) for b in per_block)
    # The Mamba groups' padding convention: PAD_SLOT_ID padding in one hybrid
    # config in two, half of those with block 0 an ordinary state block (not
    # with prefix caching or kv_sharing, which need the null block).
    padding = "null"
    if mamba and padding_ok:
        padding = rng.choice(["null", "pad_slot", "null", "pad_slot_no_null"])
        if padding == "pad_slot_no_null" and (caching or sharing):
            padding = "pad_slot"
    # A quantized KV cache (int8 payload, a scale and zero point per slot) in
    # one config in four, where modelled (not with kv_sharing).
    kv_dtype = "int8" if not sharing and rng.random() < 0.25 else "auto"
    kv_dtype = "auto" if plain else kv_dtype
    # A host tier of a few blocks (so that offloads evict) in two configs in
    # five where modelled (no sliding window, one DCP rank), four in five where
    # requests can be onboarded. Decided last, by the layout generator: the
    # Hypothesis draws before it are what they were.
    # Onboards need prompts that share an offloaded prefix and have no GPU hit:
    # the engine's allocator without prefix caching. Those configs were mostly
    # drawn with a sliding window; the tier replaces it there (a host tier is
    # not modelled with windows), so windows without prefix caching are now
    # drawn about a fifth as often as before (with prefix caching, as often).
    host = 0
    onboards = allocator == "engine" and not caching  # shared prefixes, no GPU hit
    if host_ok and world == 1 and rng.random() < (0.8 if onboards else 0.4):
        windowed = any(g.sliding_window for g in groups)
        if windowed and allocator == "engine" and not caching:
            groups = [dataclasses.replace(g, sliding_window=0) for g in groups]
            windowed = False
        if not windowed:  # small: offloads soon need room, and meet pinned blocks
            host = rng.choice([1, 1, 2, 2, 3])
    groups, widths = _narrowed(groups, host, caching, sharing, widths, model_len, world, narrow_ok,
                       random.Random(zlib.crc32(repr(("narrow", rng.random())).encode())))
    config = RunnerConfig(
        host_blocks=host,
        sharing_map=sharing_map,
        kv_cache_dtype=kv_dtype,
        mamba_padding=padding,
        model_len=model_len,
        kv_sharing=sharing,
        allocator=allocator,
        enable_prefix_caching=caching,
        num_speculative_tokens=k,
        cudagraph_support=support,
        reorder_batch_threshold=reorder,
        runner=runner,
        dcp_world_size=world,
        dcp_rank=rank,
        cp_kv_cache_interleave_size=interleave,
        groups=tuple(groups),
        num_blocks=num_blocks,
        max_num_reqs=max_num_reqs,
        # align mode: longer rows (8 attention blocks) so that prompts span
        # several state blocks.
        max_num_blocks_per_req=widths,
        max_num_batched_tokens=max_num_batched_tokens,
        cudagraph_capture_sizes=tuple(s for s in sizes if s <= max_num_batched_tokens),
    )
    return _mamba_mode(config, align, random.Random(
        zlib.crc32(repr(("mamba-mode", rng.random())).encode())),
        drafter=bool(spec) and not (spec_fits_graphs and sizes and max(sizes) < 2))


def _mamba_mode(config: RunnerConfig, align: bool, rng: random.Random,
                drafter: bool = True) -> RunnerConfig:
    """Which Mamba prefix caching a hybrid config with prefix caching runs:
    vLLM's all mode in one such config in two, else
    align mode — with a conv state of 3 tokens in one all-mode config in two
    (a prefill chunk shorter than the conv state takes the kernels' short
    branch), and a Mamba block twice as large in one in four where a request
    (``max_model_len`` tokens) still spans four of them (it may pass the token
    budget, which align mode's chunk rule forbids).  Chosen by a generator of
    its own, as :func:`_narrowed` is, so no other draw moved when it came.
    Align mode keeps a drafter of 1 or 2 tokens in one config in two
    (``drafter``: where the target runs one; the Mamba block at least ``1 +
    k`` tokens), decodes then verifying ``1 + k`` tokens, with a Mamba block
    as small as the attention block where that holds ``1 + k`` tokens.
    Returns ``config`` (align mode, maybe with a drafter) or its all-mode variant."""
    if not align:
        return config
    if rng.random() < 0.5:
        k = rng.choice([1, 2])
        if not drafter or rng.random() < 0.5 or any(
                g.block_size < 1 + k for g in config.groups if g.kind == MAMBA):
            return config
        groups = list(config.groups)
        # A Mamba block as small as the attention block where it holds 1 + k
        # tokens: decodes verifying drafts then cross state-block boundaries
        # within a few steps (where the running state moves and accepted tokens
        # complete a block), and a drafter's hit drops one block of each kind,
        # as vLLM's does (with larger Mamba blocks vLLM drops one attention
        # block and looks for finer hits, which the model does not: docs/scope.md).
        small = min(config.tokens_per_block(g) for g in config.attention_groups)
        if small >= 1 + k:
            groups = [dataclasses.replace(g, block_size=min(g.block_size, small),
                                          kernel_block_size=min(g.block_size, small))
                      if g.kind == MAMBA else g for g in groups]
        out = dataclasses.replace(
            config, groups=tuple(groups), num_speculative_tokens=k,
            reorder_batch_threshold=(1 + k) if config.reorder_batch_threshold else 0)
        # A drafter's hit drops a unit: rows hold three, or no hit is possible.
        return out if out.max_model_len > 3 * out.prefix_unit else config
    groups = list(config.groups)
    if rng.random() < 0.5:
        groups = [dataclasses.replace(g, conv_size=CONV_SIZE_MAX) if g.kind == MAMBA else g
                  for g in groups]
    if rng.random() < 0.25 and 4 * 2 * max(g.block_size for g in groups if g.kind == MAMBA) \
            <= config.max_model_len:  # all mode needs no chunk end on a boundary
        groups = [dataclasses.replace(g, block_size=2 * g.block_size,
                                      kernel_block_size=2 * g.kernel_block_size)
                  if g.kind == MAMBA else g for g in groups]
    return dataclasses.replace(config, groups=tuple(groups), mamba_prefix_mode=ALL)


def _narrowed(groups: list, host: int, caching: bool, sharing: bool, widths: int,
              model_len: int, world: int, narrow_ok: bool,
              rng: random.Random) -> tuple[list, int]:
    """A second attention group with a row narrower than a request (a cache-only
    or tail group, ``GroupSpec.max_num_blocks``) in every config that has one,
    where modelled (no prefix caching, host tier or ``kv_sharing``): about one
    config in twenty.
    Chosen by a generator of its own (seeded from the layout generator's next
    draw, which nothing else takes), so no other draw moved when it came.
    Returns the groups and ``max_num_blocks_per_req`` (with ``model_len``, the
    widest row left)."""
    attention = [i for i, g in enumerate(groups) if g.kind == ATTENTION]
    if not narrow_ok or len(attention) < 2 or host or caching or sharing:
        return groups, widths
    i, g0 = attention[1], groups[attention[0]]
    g = groups[i]
    model = min(model_len or widths * g0.block_size * world, 256)  # RunnerConfig.max_model_len
    full = -(-model // (g.block_size * world))  # the columns a full row would have
    if full < 2:
        return groups, widths
    out = list(groups)
    # Mostly one block: a request runs past it within a step or two.
    out[i] = dataclasses.replace(g, max_num_blocks=min(rng.choice([1, 1, 1, 2, 3]),
                                                       full - 1, MAX_NUM_BLOCKS_PER_REQ_MAX))
    if model_len:
        widths = max(-(-model_len // (b.block_size * world)) for b in out
                     if b.kind == ATTENTION and not b.max_num_blocks)
    return out, widths


def row_tokens_max(groups) -> int:
    """The longest rows a drawn config may get for prefix hits: 256 tokens, or what
    :data:`MAX_NUM_BLOCKS_PER_REQ_MAX` blocks of its smallest attention block hold."""
    return min(256, MAX_NUM_BLOCKS_PER_REQ_MAX * min(g.block_size for g in groups
                                                     if g.kind == ATTENTION))


def target_limits(target: str) -> dict:
    """Keyword arguments for :func:`runner_configs` that keep the drawn geometry
    within what ``target`` can express (its registered ``limits``; the vllm target
    asks the installed release)."""
    from harness.targets import target_spec

    return target_spec(target).limits()


@st.composite
def token_slot_configs(draw, mamba: bool = True) -> TokenSlotConfig:
    """A valid :class:`~reference.token_slots.TokenSlotConfig` (SGLang's shape):
    the token or the paged allocator, a pool small enough that eviction and
    slot reuse come within a few requests, up to four request rows, decode
    graphs captured at a few batch sizes (some batches padded, some eager), the
    radix cache mostly on; in one config in two with the token allocator, a
    hybrid model's Mamba pool (SGLang's Mamba component needs page size 1
    without its extra tracking buffer), sized for one to all request rows
    (:meth:`~reference.token_slots.TokenSlotConfig.mamba_slots_for`), so that
    the tree's states are evicted within a few requests (``mamba`` False: never,
    for a release whose hybrid-model code the target cannot drive).  The
    simplest draw is the default config."""
    page_size = draw(st.sampled_from([1, 4]))
    num_slots = draw(st.sampled_from([64, 32, 48, 96])) // page_size * page_size
    capture_bs = draw(st.sampled_from([(1, 2, 4), (4,), (1, 2), (2, 4), (1, 2, 3, 4)]))
    config = TokenSlotConfig(num_slots=num_slots, page_size=page_size,
                             max_num_reqs=draw(st.sampled_from([4, 2, 3])),
                             max_context_len=draw(st.sampled_from([32, 16, 24])),
                             capture_bs=capture_bs,
                             radix_cache=draw(st.sampled_from([True, True, True, False])))
    if mamba and page_size == 1 and draw(st.sampled_from([False, True])):
        fits = draw(st.integers(1, config.max_num_reqs))  # requests the pool holds at once
        config = dataclasses.replace(config, mamba_slots=config.mamba_slots_for(fits)
                                     + draw(st.sampled_from([0, 2])))
    return config


def configs_for(target: str, runner: str | None = None):
    """The strategy of configs a fuzz run against ``target`` draws: token-slot
    configs for a target that runs runner ``sglang`` only, else
    :func:`runner_configs` (``runner`` pins v1 / v2) within :func:`target_limits`."""
    from harness.targets import target_spec

    if target_spec(target).runners == ("sglang",):
        return token_slot_configs(**target_limits(target))
    return runner_configs(runner, **target_limits(target))
