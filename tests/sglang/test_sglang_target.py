"""The ``sglang`` target: SGLang's own pools, allocator, radix cache, scheduler
batches and decode-graph padding under the token-slot invariants.

Tests that need SGLang skip with one line when it is not installed (install a
release with ``scripts/install-sglang-target.sh RELEASE``); with
``$BLOCKFUZZ_REQUIRE_SGLANG=1`` they fail instead.  Each "is SGLang's" test
patches one installed SGLang class or function and watches the verdict of a
corpus trace change: proof that the component in the loop is SGLang's.
"""

from __future__ import annotations


import pytest

from harness.cli import main
from harness.core.session import replay
from harness.core.trace import load
from harness.targets import sglang_release
from tests.conftest import CORPORA, corpus_traces, installed_engine

TRACES = [p for p in sorted((CORPORA / "sglang").glob("*.json")) if not load(p).faults]
LIFE = CORPORA / "sglang" / "prefix-hit-padding-and-eviction.json"


@pytest.fixture(scope="module")
def sglang():
    """The loaded SGLang; skips without one (fails with ``$BLOCKFUZZ_REQUIRE_SGLANG=1``)."""
    return installed_engine("sglang")


def test_missing_sglang_is_one_line_exit_2(monkeypatch, capsys):
    """Without SGLang, --target sglang fails before any work: one line, exit 2."""
    monkeypatch.setattr(sglang_release, "installed_version", lambda: None)
    monkeypatch.setattr(sglang_release, "_LOADED", None)
    assert main(["replay", "--target", "sglang", str(LIFE)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "install-sglang-target.sh" in err[0], err


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_corpus_traces_pass_on_sglang(sglang, path):
    trace = load(path)
    verdict = replay(trace, target="sglang")
    assert verdict.violation is None, verdict.violation.line()
    assert verdict.ops_run == len(trace.ops)


def _verdict(path=LIFE):
    v = replay(load(path), target="sglang")
    return None if v.violation is None else v.violation


def test_the_allocator_is_sglangs(sglang, monkeypatch):
    """An allocator that hands out the reserved slot 0 (SGLang's own alloc, then
    its first slot swapped for 0) is caught: a live request reads the padding slot."""
    real = sglang.TokenToKVPoolAllocator.alloc

    def alloc(self, need_size):
        out = real(self, need_size)
        if out is not None and len(out):
            out = out.clone()
            out[0] = 0
        return out

    monkeypatch.setattr(sglang.TokenToKVPoolAllocator, "alloc", alloc)
    v = _verdict()
    assert v is not None and v.invariant == "SGL_RESERVED_UNREAD", v


def test_the_request_pool_is_sglangs(sglang, monkeypatch):
    """A request pool that hands out row 0 (the padding row) is caught."""
    real = sglang.ReqToTokenPool.alloc_rows

    def alloc_rows(self, need_size):
        rows = real(self, need_size)
        return None if rows is None else [0 for _ in rows]

    monkeypatch.setattr(sglang.ReqToTokenPool, "alloc_rows", alloc_rows)
    v = _verdict()
    assert v is not None and v.invariant == "SGL_RESERVED_UNREAD" and "row 0" in v.detail, v


def test_the_radix_cache_is_sglangs(sglang, monkeypatch):
    """The release's tree (its own factory's class) with a lock that lets go at
    once: eviction frees a live request's prefix, whose slots are then free
    while that request holds them."""
    from harness.targets.sglang import SglangTarget
    from reference.token_slots import TokenSlotConfig

    tree_class = type(SglangTarget(TokenSlotConfig()).tree)
    inc, dec = tree_class.inc_lock_ref, tree_class.dec_lock_ref

    def lock_released_at_once(self, node, *a, **kw):
        got = inc(self, node, *a, **kw)
        dec(self, node, got.to_dec_params())
        return got

    monkeypatch.setattr(tree_class, "inc_lock_ref", lock_released_at_once)
    monkeypatch.setattr(tree_class, "dec_lock_ref", lambda self, node, *a, **k: None)
    v = _verdict()
    assert v is not None and v.invariant == "SGL_SLOTS_ACCOUNTED" and "free while" in v.detail, v


def _registry_class(sglang):
    """The class of SGLang's decode padding registry (what the tests patch)."""
    import torch

    return type(sglang.build_decode_registry(device=torch.device("cpu"), max_bs=1,
                                             max_num_token=1, seq_len_fill_value=1,
                                             cache_loc_dtype=torch.int64))


def test_the_graph_padding_is_sglangs(sglang, monkeypatch):
    """Padding that repeats the last real row instead of pointing at slot 0 writes
    garbage into a live request's slot."""
    from sglang.srt.model_executor import cuda_graph_buffer_registry as reg_mod

    cls = _registry_class(sglang)
    real = cls.fill_from

    def fill_from(self, fb, *, raw_bs, padded_bs, **kw):
        real(self, fb, raw_bs=raw_bs, padded_bs=padded_bs, **kw)
        loc = self.get_slot("out_cache_loc").buffer
        if 0 < raw_bs < padded_bs:
            loc[raw_bs:padded_bs] = loc[raw_bs - 1]

    monkeypatch.setattr(cls, "fill_from", fill_from)
    v = _verdict(CORPORA / "sglang" / "no-radix-cache-three-padded.json")
    assert v is not None and v.invariant == "SGL_PADDING_RESERVED", v
    assert reg_mod is not None


SEEDS = [p for p in corpus_traces(token_slots=True) if load(p).faults]


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.stem)
def test_seed_traces_fail_with_their_fault_and_pass_without(sglang, path):
    """Each hand-written trace of an SGLang fault: its expect with the fault on
    (re-created in the installed SGLang's objects), a pass with it off."""
    trace = load(path)
    assert trace.faults and all(f.startswith("sgl-") for f in trace.faults)
    assert replay(trace, trace.faults, target="sglang").matches(trace.expect)
    assert replay(trace, [], target="sglang").violation is None


def test_sglang_faults_refused_on_block_table_targets(capsys):
    """An SGLang fault on gpu_impl, or a gpu_impl fault on sglang: one line, exit 2."""
    path = str(CORPORA / "sglang" / "sgl-lock-skips-matched-node.json")
    assert main(["replay", "--target", "gpu_impl", "--fault", "sgl-lock-skips-matched-node",
                 str(CORPORA / "seeds" / "vacated-row-not-cleared.json")]) == 2
    assert main(["replay", "--target", "sglang", "--fault", "vacated-row-not-cleared",
                 path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error:") for line in err), err


def test_corpus_traces_pass_through_sglangs_triton_writers(sglang, monkeypatch):
    """With SGLang's Triton paths on (the interpreter runs them): the
    ``req_to_token`` writer of ``alloc_for_extend`` and the paged allocator's
    extend / decode kernels give the same verdicts as its torch paths."""
    from sglang.srt.mem_cache import allocation

    monkeypatch.setattr(allocation, "support_triton", lambda backend: True)
    monkeypatch.setattr(sglang.PagedTokenToKVPoolAllocator, "use_triton_kernels", True,
                        raising=False)
    real_init = sglang.PagedTokenToKVPoolAllocator.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        self.use_triton_kernels = True

    monkeypatch.setattr(sglang.PagedTokenToKVPoolAllocator, "__init__", init)
    for path in TRACES:
        verdict = replay(load(path), target="sglang")
        assert verdict.violation is None, (path.name, verdict.violation.line())
    # and a fault is still caught on them
    seed = load(CORPORA / "sglang" / "sgl-checkpoint-row-not-remapped.json")
    assert replay(seed, seed.faults, target="sglang").matches(seed.expect)


@pytest.mark.parametrize("path", sorted((CORPORA / "scenarios").glob("*.json")),
                         ids=lambda p: p.stem)
def test_scenarios_on_sglang_as_recorded(sglang, path):
    """The cross-engine scenarios as token-slot traces on SGLang: the verdict their
    meta records for this release (skipped where none is recorded)."""
    from harness.core.scenario import load as load_scenario

    scenario = load_scenario(path)
    want = scenario.meta.get("verdicts", {}).get(f"sglang {sglang.version}")
    if want is None:
        pytest.skip(f"no verdict recorded for SGLang {sglang.version}")
    v = replay(scenario.trace_for("sglang"), target="sglang")
    assert v.verdict == want["verdict"]
    assert want.get("invariant") in (None, getattr(v.violation, "invariant", None))


def test_nightly_on_sglang_finds_a_fault_and_prints_runnable_commands(sglang, tmp_path, capsys):
    """A campaign against SGLang: token-slot coverage, a finding, and a rerun
    command the CLI accepts (the target implies its runner: no --runner)."""
    out = tmp_path / "n"
    code = main(["nightly", "--target", "sglang", "--fault", "sgl-lock-skips-matched-node",
                 "--time-budget", "120", "--workers", "1", "--out", str(out),
                 "--max-seeds", "1", "--examples-per-seed", "20"])
    text = capsys.readouterr().out
    assert code == 1 and "FINDING SGL_SLOTS_ACCOUNTED" in text, text
    rerun = next(line for line in text.splitlines() if "rerun:" in line)
    assert "--runner" not in rerun and "--target sglang" in rerun
    assert "reachable features hit" in text and "sgl-" in text


HYBRID = CORPORA / "sglang" / "hybrid-prefix-hit-state-copy-and-eviction.json"


def test_the_hit_state_copy_is_sglangs(sglang, monkeypatch):
    """A hybrid pool whose copy-on-write of a prefix hit's state does nothing
    (SGLang's HybridReqToTokenPool.copy_mamba_state patched out) is caught: the
    request's state does not continue from its hit's."""
    cls = sglang_release.load_mamba().HybridReqToTokenPool
    monkeypatch.setattr(cls, "copy_mamba_state", lambda self, src, dst: None)
    v = _verdict(HYBRID)
    assert v is not None and v.invariant == "SGL_STATE_MATCHES" and v.op_index == 3, v


def test_the_mamba_slot_allocator_is_sglangs(sglang, monkeypatch):
    """A Mamba slot allocator whose free list starts at 0 (SGLang's own
    MambaSlotAllocator.clear, then slot 0 put first) is caught."""
    from sglang.srt.mem_cache.allocator.mamba import MambaSlotAllocator

    real = MambaSlotAllocator.clear

    def clear(self):
        real(self)
        import torch

        self.free_slots = torch.cat([torch.zeros(1, dtype=self.free_slots.dtype),
                                     self.free_slots])

    monkeypatch.setattr(MambaSlotAllocator, "clear", clear)
    v = _verdict(HYBRID)
    assert v is not None and v.invariant == "SGL_STATE_RESERVED", v


def test_the_mamba_backends_padding_is_sglangs(sglang, monkeypatch):
    """A Mamba backend whose graph replay maps padded rows through the request map
    instead of PAD_SLOT_ID (SGLang's _replay_metadata, its padded rows then
    pointed at the first real row's slot) is caught."""
    cls = sglang_release.load_mamba().Mamba2AttnBackend
    real = cls._replay_metadata

    def replay_metadata(self, bs, req_pool_indices, *args, num_padding=None, **kw):
        out = real(self, bs, req_pool_indices, *args, num_padding=num_padding, **kw)
        if num_padding and bs > num_padding:
            buf = self.state_indices_list[bs - 1]
            buf[bs - num_padding:] = buf[0]
        return out

    monkeypatch.setattr(cls, "_replay_metadata", replay_metadata)
    v = _verdict(HYBRID)
    assert v is not None and v.invariant == "SGL_STATE_RESERVED", v


def test_hybrid_config_refused_where_sglang_cannot_drive_it(sglang, capsys):
    """A hybrid config with the paged allocator: one line, exit 2 (SGLang's Mamba
    component needs page size 1 without its extra tracking buffer)."""
    import json
    import tempfile

    trace = json.loads(HYBRID.read_text())
    trace["config"].update(page_size=4, num_slots=64)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(trace, f)
    assert main(["replay", "--target", "sglang", f.name]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "page size 1" in err[0], err


@pytest.mark.parametrize("verb", ["replay", "explain", "shrink"])
def test_a_page_size_the_target_does_not_drive_is_named_first(sglang, capsys, tmp_path, verb):
    """A page size the sglang target does not drive: its refusal, not the oracle's
    "no room" that the larger pages then cause (one line, exit 2)."""
    import json

    trace = json.loads(LIFE.read_text())
    trace["config"].update(page_size=16, num_slots=64)
    path = tmp_path / "p16.json"
    path.write_text(json.dumps(trace))
    assert main([verb, "--target", "sglang", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.page_size: 16" in err[0], err


def test_the_graph_inputs_the_decode_reads_are_sglangs(sglang, monkeypatch):
    """A padding registry that fills a real row's seq_lens one short (SGLang's own
    fill_from, then the last real row's length cut) is caught by the decode's
    attention read: the row reads fewer positions than its request has."""
    cls = _registry_class(sglang)
    real = cls.fill_from

    def fill_from(self, fb, *, raw_bs, padded_bs, **kw):
        real(self, fb, raw_bs=raw_bs, padded_bs=padded_bs, **kw)
        if raw_bs:
            self.get_slot("seq_lens").buffer[raw_bs - 1] -= 1

    monkeypatch.setattr(cls, "fill_from", fill_from)
    v = _verdict()
    assert v is not None and v.invariant == "SGL_DECODE_READS_OWN_KV", v


def test_the_conv_window_copy_is_sglangs(sglang, monkeypatch):
    """A Mamba pool whose state copies skip the conv window (SGLang's own
    MambaPool.copy_from, then the destination's conv put back) is caught: the
    tree's copy of a request's state after its prefill is the first such copy."""
    from sglang.srt.mem_cache.memory_pool import MambaPool

    real = MambaPool.copy_from

    def copy_from(self, src, dst):
        kept = [c[:, dst].clone() for c in self.mamba_cache.conv]
        real(self, src, dst)
        for c, k in zip(self.mamba_cache.conv, kept):
            c[:, dst] = k

    monkeypatch.setattr(MambaPool, "copy_from", copy_from)
    v = _verdict(HYBRID)
    assert v is not None and v.invariant == "SGL_STATE_TREE_CONTENT" and "conv" in v.detail, v
