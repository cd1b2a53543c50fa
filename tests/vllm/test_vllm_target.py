"""The ``vllm`` target: the installed vLLM's own block-table classes under test.

Tests that need vLLM skip with one line when it is not installed (install a
release with ``scripts/install-vllm-target.sh RELEASE``).  Verdicts that
depend on the release come from the corpus traces' ``meta.expect_by_release``
(what was measured on that release); a release with none recorded is skipped
there, not guessed.
"""

from __future__ import annotations

import json
from pathlib import Path
import os

import pytest

from harness.targets import vllm as vllm_target
from harness.cli import main
from harness.core.trace import load
from harness.core.invariants import structural_ids
from reference import GroupSpec, RunnerConfig
from tests.conftest import CORPORA, installed_engine

VLLM_TRACES = sorted((CORPORA / "vllm").glob("*.json"))


@pytest.fixture(scope="module")
def vllm():
    """The loaded vLLM; skips without one, fails instead when
    ``$BLOCKFUZZ_REQUIRE_VLLM=1`` (CI installs it: a broken install must not pass)."""
    return installed_engine("vllm")


@pytest.fixture
def adapter(monkeypatch):
    """The component adapter (vLLM's block tables, batch and builders in our
    runner shell), whatever runner mode would run: the tests that take it
    replace pieces of the adapter's path."""
    monkeypatch.setenv(vllm_target.MODE_ENV, "adapter")


def _expected(trace, version: str) -> dict:
    mode = vllm_target.target_mode(trace.config)[0]
    want = vllm_target.recorded_verdict(trace, version, mode)
    if want is None:
        pytest.skip(f"no verdict recorded for vLLM {version} in {mode} mode in this trace")
    return want


def test_missing_vllm_is_one_line_exit_2(monkeypatch, capsys):
    """Without vLLM, --target vllm fails before any work: one line, exit 2."""
    from harness.targets import vllm_release

    monkeypatch.setattr(vllm_release, "installed_version", lambda: None)
    monkeypatch.setattr(vllm_release, "_LOADED", None)
    trace = str(CORPORA / "seeds" / "vacated-row-not-cleared.json")
    assert main(["replay", trace, "--target", "vllm"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "install-vllm-target.sh" in err, err


def test_cuda_device_refused_for_vllm_target(capsys):
    trace = str(CORPORA / "seeds" / "vacated-row-not-cleared.json")
    assert main(["replay", trace, "--target", "vllm", "--device", "cuda"]) == 2
    assert "--device cuda" in capsys.readouterr().err


def test_faults_refused_for_vllm_target(capsys):
    trace = str(CORPORA / "seeds" / "vacated-row-not-cleared.json")
    assert main(["replay", trace, "--target", "vllm", "--fault",
                 "vacated-row-not-cleared"]) == 2
    assert "faults live in gpu_impl" in capsys.readouterr().err


def test_kernel_split_refused_only_where_the_release_cannot_express_it(vllm):
    for runner, can in (("v1", vllm.v1_kernel_blocks), ("v2", vllm.v2_kernel_blocks)):
        config = RunnerConfig(runner=runner, groups=(GroupSpec("attention", 8, 4),))
        refused = vllm_target.refusal(config, vllm)
        if can:
            assert refused is None
            vllm_target.make_vllm_runner(config)  # constructs
        else:
            assert refused is not None and refused.field == "groups[0].kernel_block_size"
            with pytest.raises(vllm_target.TargetRefused):
                vllm_target.make_vllm_runner(config)


def test_mamba_padding_conventions_refused_on_the_vllm_target(vllm):
    """vLLM's tables fill empty entries with the null block and its Mamba
    builders pad rows themselves: only the default convention runs there."""
    assert vllm_target.refusal(RunnerConfig(), vllm) is None
    for padding in ("pad_slot", "pad_slot_no_null"):
        refused = vllm_target.refusal(RunnerConfig(mamba_padding=padding), vllm)
        assert refused is not None and refused.field == "mamba_padding"


def test_shared_layout_checked_by_vllms_page_size_unification(vllm):
    """kv_sharing on the vllm target: vLLM's own unify_kv_cache_spec_page_size
    keeps the config's pages (conv + SSM state padded to the attention page), and
    a second attention group with a larger page is refused: vLLM would grow the
    first group's blocks to lay one pool."""
    shared = RunnerConfig(kv_sharing=True, groups=(GroupSpec("attention", 4, 4),
                                                   GroupSpec("mamba", 16, 16, conv_size=3)))
    assert vllm_target.refusal(shared, vllm) is None
    mixed = RunnerConfig(kv_sharing=True, num_blocks=16, groups=(
        GroupSpec("attention", 4, 4), GroupSpec("mamba", 16, 16), GroupSpec("attention", 8, 8)))
    refused = vllm_target.refusal(mixed, vllm)
    assert refused is not None and refused.field == "kv_sharing"
    assert "8-token blocks, not 4" in str(refused)


def test_refused_trace_is_one_line_exit_2(vllm, tmp_path, capsys):
    trace = json.loads((CORPORA / "seeds" / "kernel-block-size-ignored.json").read_text())
    if vllm.v1_kernel_blocks if trace["config"]["runner"] == "v1" else vllm.v2_kernel_blocks:
        pytest.skip(f"vLLM {vllm.version} splits kernel blocks: nothing to refuse")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    assert main(["replay", str(path), "--target", "vllm"]) == 2
    err = capsys.readouterr().err.strip()
    assert str(path) in err and "kernel_block_size" in err and "\n" not in err


@pytest.mark.parametrize("path", VLLM_TRACES, ids=lambda p: p.stem)
def test_corpus_verdict_on_installed_release(vllm, path):
    """Each vllm corpus trace gives the verdict recorded for this release."""
    from harness.core.session import replay

    trace = load(path)
    if vllm_target.refusal(trace.config, vllm) is None:
        verdict = replay(trace, (), "vllm")
        # the mode after the run: a runner vLLM's KV-cache set-up refused ran on
        # the adapter, and the verdict recorded for that mode is the one to meet
        want = _expected(trace, vllm.version)
        if want["verdict"] != "n/a":
            assert verdict.matches(want), (verdict.violation and verdict.violation.line(), want)
            return
    want = _expected(trace, vllm.version)
    assert want["verdict"] == "n/a", want
    # refused here, or its bug's code path is not vLLM's
    assert vllm_target.refusal(trace.config, vllm) is not None \
        or vllm_target.unexercised(trace) is not None, want


@pytest.mark.parametrize("path", sorted((CORPORA / "seeds").glob("seed000*.json")),
                         ids=lambda p: p.stem)
def test_seed_traces_agree_with_the_release_behaviour(vllm, adapter, path):
    """The hand-written seed traces fail on vLLM exactly when the release keeps
    stale rows (measured directly on its classes), and pass otherwise."""
    from harness.core.session import replay

    trace = load(path)
    if vllm_target.refusal(trace.config, vllm) is not None:
        pytest.skip("geometry this release cannot express")
    stale = _keeps_stale_rows(vllm, trace.config.runner)
    verdict = replay(trace, (), "vllm")
    if stale:
        structural = {"v1": "VACATED_ROWS_ZERO", "v2": "DUMMY_TABLES_ZERO"}[trace.config.runner]
        assert verdict.violation is not None and verdict.violation.invariant == structural
        # ... and its consequence, the upstream bug: the dummy run writes NaN
        # Mamba state into a block since handed to a request whose state loaded.
        consequence = replay(trace, (), "vllm", skip=set(structural_ids()) | {"MATCHES_REFERENCE"})
        assert consequence.violation.invariant == "NO_STALE_WRITE", consequence.violation
        assert "changed to NaN" in consequence.violation.detail
    else:
        assert verdict.violation is None, verdict.violation.line()


def _keeps_stale_rows(vllm, runner: str) -> bool:
    """Ask the release's classes directly (no harness in between)."""
    import torch

    if runner == "v1":
        t = vllm.MultiGroupBlockTable(**vllm_target._kwargs_for(
            vllm.MultiGroupBlockTable.__init__,
            dict(max_num_reqs=2, max_num_batched_tokens=4, pin_memory=False,
                 device=torch.device("cpu"), block_sizes=[4], kernel_block_sizes=[4],
                 max_num_blocks=[2])))
        t.add_row(([1, 2],), 0)
        t.add_row(([3],), 1)
        t.move_row(1, 0)
        return bool(t[0].block_table.np[1].any())
    t = vllm.BlockTables(**vllm_target._kwargs_for(
        vllm.BlockTables.__init__,
        dict(block_sizes=[4], max_num_reqs=2, max_num_batched_tokens=4,
             max_num_blocks_per_group=[2], device=torch.device("cpu"), kernel_block_sizes=[4])))
    t.append_block_ids(0, ([1, 2],), overwrite=True)
    t.apply_staged_writes()
    t.gather_block_tables(torch.zeros(1, dtype=torch.int32), 1)
    return bool(t.get_dummy_block_tables(1)[0].any())


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_fuzz_from_seed_0_finds_the_stale_row_bug_or_passes(vllm, runner, monkeypatch):
    """The issue's acceptance check, per runner: seed 0 finds the stale-row bug
    within 200 examples on a release that has it (shrunk to a short trace), and
    a bounded search finds nothing on a release without it."""
    from harness.search.fuzz import fuzz

    if _keeps_stale_rows(vllm, runner):
        result = fuzz(None, 0, 200, (), "vllm", "cpu", runner=runner)  # the CLI default
        assert result.violation is not None, "the pre-fix release was not caught"
        want = {"v1": ("VACATED_ROWS_ZERO", "NO_STALE_WRITE"),
                "v2": ("DUMMY_TABLES_ZERO", "NO_STALE_WRITE")}
        assert result.violation.invariant in want[runner]
        assert len(result.trace.ops) <= 6
        if runner == "v2" and result.violation.invariant == "NO_STALE_WRITE":
            # The release's other V2 bug, found first by the swarmed search: DCP
            # slots dealt in kernel blocks (corpora/vllm/v2-dcp-kernel-split-slot-layout.json).
            cfg = result.trace.config
            assert cfg.dcp_world_size > 1 and any(
                g.kernel_block_size < g.block_size for g in cfg.groups), result.trace.dumps()
    else:  # the component adapter: runner mode finds vLLM's runner bugs on every release
        monkeypatch.setenv(vllm_target.MODE_ENV, "adapter")
        result = fuzz(None, 0, 25, (), "vllm", "cpu", profile="ci", runner=runner)
        # Where the stale rows are fixed they are not found; another finding may be
        # (0.33.0: the spec-decode re-entry count, corpora/vllm/v1-spec-decode-*).
        stale = {"v1": "VACATED_ROWS_ZERO", "v2": "DUMMY_TABLES_ZERO"}[runner]
        assert result.violation is None or result.violation.invariant != stale, \
            result.violation.line()


def test_check_expect_uses_the_installed_release_verdicts(vllm, capsys, tmp_path):
    """`replay --check-expect --target vllm` checks meta.expect_by_release of the
    installed release (no faults), and lists traces with none as SKIP."""
    bare = json.loads((CORPORA / "seeds" / "vacated-row-not-cleared.json").read_text())
    del bare["meta"]["expect_by_release"]
    (tmp_path / "bare.json").write_text(json.dumps(bare))
    paths = [str(p) for p in VLLM_TRACES] + [str(tmp_path / "bare.json")]  # nothing recorded
    recorded = [vllm_target.recorded_verdict(load(p), vllm.version,
                                             vllm_target.target_mode(load(p).config)[0])
                for p in paths]
    rc = main(["replay", "--check-expect", "--target", "vllm", *paths])
    out = capsys.readouterr().out
    assert f"SKIP {paths[-1]}" in out
    if any(recorded):
        assert rc == 0 and "0 mismatched" in out, out


def test_check_expect_reports_paths_that_are_ours_as_not_applicable(vllm, capsys):
    """A seed whose bug lives in code the vllm adapter supplies itself (here the
    Mamba state view over shared pages: gpu_model_runner.py, which runner mode
    would run as vLLM's, but shared pages run on the adapter's runner shell)
    records ``n/a`` for every release, and `replay --check-expect --target vllm`
    lists it as N/A, neither matched nor mismatched."""
    path = str(CORPORA / "seeds" / "mamba-state-view-unpadded-stride.json")
    recorded = load(path).meta["expect_by_release"].get(vllm.version)
    if recorded is None:
        pytest.skip(f"no verdict recorded for vLLM {vllm.version}")
    assert recorded["verdict"] == "n/a" and "gpu_model_runner.py" in recorded["reason"]
    assert vllm_target.unexercised(load(path)) == recorded["reason"]
    other = str(VLLM_TRACES[0])
    assert main(["replay", "--check-expect", "--target", "vllm", path, other]) in (0, 1)
    out = capsys.readouterr().out
    assert f"N/A {path}: not applicable" in out and "1 not applicable (N/A)" in out
    assert main(["replay", "--check-expect", "--target", "vllm", path]) == 2  # nothing checked


def test_persistent_batch_is_vllms_own_input_batch(vllm, adapter, monkeypatch):
    """V1 request removal and condense are vLLM's ``InputBatch`` code: put the
    pre-#37728 ``remove_request`` (no ``clear_row``) into the installed class and
    the removed-row seed fails; make its ``condense`` a no-op and the rows differ
    from the reference's."""
    from harness.core.session import replay

    trace = load(CORPORA / "seeds" / "removed-row-not-cleared.json")
    assert replay(trace, (), "vllm").violation is None
    original = vllm.InputBatch.remove_request

    def remove_without_clearing(self, req_id):
        tables = self.block_table
        tables.clear_row = lambda row: None  # the row keeps its ids, as before #37728
        try:
            return original(self, req_id)
        finally:
            del tables.clear_row

    monkeypatch.setattr(vllm.InputBatch, "remove_request", remove_without_clearing)
    verdict = replay(trace, (), "vllm")
    assert verdict.violation is not None and verdict.violation.invariant == "VACATED_ROWS_ZERO"
    monkeypatch.setattr(vllm.InputBatch, "remove_request", original)
    monkeypatch.setattr(vllm.InputBatch, "condense", lambda self: None)
    verdict = replay(load(CORPORA / "seeds" / "vacated-row-not-cleared.json"), (), "vllm")
    assert verdict.violation is not None
    assert verdict.violation.invariant == "MATCHES_REFERENCE", verdict.violation.line()
    assert "req_ids" in verdict.violation.detail


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_mamba_metadata_is_vllms_own_builder(vllm, adapter, monkeypatch, runner):
    """The Mamba decode/prefill split and persistent decode buffer are vLLM's
    ``Mamba2AttentionMetadataBuilder``: the FULL graphs read its buffer (so a
    builder that never refreshes it sends the decodes' state into the null
    block), and every forward that builds metadata goes through its ``build``."""
    from vllm.v1.attention.backends import mamba_attn

    from harness.core.session import replay

    trace = load(CORPORA / "vllm" / f"{runner}-mamba-builder-decode-buffer.json")
    assert replay(trace, (), "vllm").violation is None
    base = mamba_attn.BaseMambaAttentionMetadataBuilder
    if not hasattr(base, "_update_metadata_for_cudagraph_capture"):
        pytest.skip(f"vLLM {vllm.version} refreshes its decode buffer elsewhere")
    monkeypatch.setattr(base, "_update_metadata_for_cudagraph_capture", lambda self, md: md)
    verdict = replay(trace, (), "vllm")
    assert verdict.violation is not None, "the FULL replays did not read vLLM's buffer"
    assert trace.ops[verdict.violation.op_index]["cudagraph_mode"] == "FULL"
    monkeypatch.undo()
    monkeypatch.setenv(vllm_target.MODE_ENV, "adapter")  # undo() reverted it too
    from harness.targets.vllm_builders import VllmMambaBuilders

    built, original = [], VllmMambaBuilders.build

    def counting(self, *args):
        built.append(args[0])
        return original(self, *args)

    monkeypatch.setattr(VllmMambaBuilders, "build", counting)
    assert replay(trace, (), "vllm").violation is None
    assert built, "no forward went through vLLM's builder"


def test_attention_metadata_is_vllms_own_builder(vllm, adapter, monkeypatch):
    """The attention layers read what vLLM's ``TritonAttentionMetadataBuilder``
    hands them, and it builds before every forward with metadata, FULL replays
    included: a builder that says every row has no context changes the
    outputs; one that hands over a fresh tensor for any of slot mapping, block
    table or ``seq_lens`` leaves the captured graphs reading a tensor nothing
    stages into."""
    from vllm.v1.attention.backends import triton_attn

    from gpu_impl.runner_shell import RunnerShell
    from harness.core.session import replay

    trace = load(CORPORA / "vllm" / "v1-mamba-builder-decode-buffer.json")
    builder = triton_attn.TritonAttentionMetadataBuilder
    original, run_forward = builder.build, RunnerShell._run_forward
    events = []

    def counted(self, *args, **kwargs):
        events.append("build")
        return original(self, *args, **kwargs)

    def forward(self, mode, *args, **kwargs):
        events.append(mode)
        return run_forward(self, mode, *args, **kwargs)

    monkeypatch.setattr(builder, "build", counted)
    monkeypatch.setattr(RunnerShell, "_run_forward", forward)
    assert replay(trace, (), "vllm").violation is None
    forwards = [i for i, e in enumerate(events) if e != "build"]
    assert [events[i] for i in forwards].count("FULL") == 2
    for i in forwards:
        assert events[i - 1] == "build", f"forward {events[i]} without a build before it"
    monkeypatch.undo()
    monkeypatch.setenv(vllm_target.MODE_ENV, "adapter")  # undo() reverted it too

    def no_context(self, *args, **kwargs):
        md = original(self, *args, **kwargs)
        md.seq_lens.zero_()  # in the runner's buffer: the graphs' addresses hold
        return md

    monkeypatch.setattr(builder, "build", no_context)
    verdict = replay(trace, (), "vllm")
    assert verdict.violation is not None, "the attention read did not use vLLM's metadata"
    assert verdict.violation.invariant in ("MATCHES_REFERENCE", "NO_FOREIGN_READ"), \
        verdict.violation.line()
    for field, param in (("slot_mapping", "slot_mapping"), ("block_table", "block_table"),
                         ("seq_lens", "seq_lens")):
        def fresh(self, *args, _field=field, **kwargs):
            md = original(self, *args, **kwargs)
            setattr(md, _field, getattr(md, _field).clone())
            return md

        monkeypatch.setattr(builder, "build", fresh)
        verdict = replay(trace, (), "vllm")
        assert verdict.violation is not None, field
        assert verdict.violation.invariant == "GRAPH_ADDRESSES_STABLE", verdict.violation.line()
        assert param in verdict.violation.detail, (field, verdict.violation.detail)


def test_suspected_dummy_run_prefilling_reaches_vllms_builder(vllm, adapter, monkeypatch):
    """The first suspected upstream issue (docs/upstream/), half run on vLLM's code: with
    the dummy rows' ``is_prefilling`` computed as vLLM's ``_dummy_run`` computes
    it (from the persistent batch's stale counters — our transcription of the
    runner side, which the vllm target does not run as vLLM's), the release's
    own Mamba builder skips refreshing its decode buffer and the FULL dummy
    replay writes NaN into a live request's state.  With the fixed runner side
    the trace passes (it is a corpus trace)."""
    from harness.core.session import replay
    from harness.targets.vllm_runners import VllmV1Runner

    trace = load(CORPORA / "vllm" / "v1-dummy-run-stale-prefilling-counters.json")
    assert replay(trace, (), "vllm").violation is None
    original = VllmV1Runner._stage_dummy_state_indices

    def as_vllm_dummy_run(self, tables, num_reqs, reqs_padded, mode, warmup):
        if not warmup:  # is_prefilling[num_reqs:] = False with num_reqs = num_reqs_padded
            computed, prompt = self._row_counters(reqs_padded)
            self.is_prefilling[:reqs_padded] = computed < prompt
        return original(self, tables, num_reqs, reqs_padded, mode, warmup)

    monkeypatch.setattr(VllmV1Runner, "_stage_dummy_state_indices", as_vllm_dummy_run)
    verdict = replay(trace, (), "vllm")
    assert verdict.violation is not None
    v = verdict.violation
    assert (v.invariant, trace.ops[v.op_index]["op"], v.group) == ("NO_STALE_WRITE", "dummy_run", 1)
    assert "owned by req 0" in v.detail, v.detail


@pytest.mark.slow  # installs up to four vLLM releases (cached after): nightly-sized
def test_real_bisect_names_the_release_that_cleared_the_stale_row(vllm, capsys):
    """The issue's acceptance command, for real: 0.26.0 fails, a later release
    passes, and the change point agrees with the recorded verdicts."""
    import shutil
    import tempfile

    from harness.cli import main

    trace = CORPORA / "vllm" / "v1-vacated-row-stale-after-condense.json"
    with tempfile.TemporaryDirectory() as d:
        copy = Path(d) / trace.name
        shutil.copy(trace, copy)
        rc = main(["bisect", str(copy), "--releases", "0.26.0..0.33.0", "--json"])
    out = capsys.readouterr().out
    report = json.loads(out)  # --json: stdout is the one JSON document
    assert rc == 0 and len(report["installed"]) <= 4
    old, new = report["change"]
    recorded = load(trace).meta["expect_by_release"]
    assert recorded[old]["verdict"] == "fail" and recorded[new]["verdict"] == "pass"


def test_reference_reorder_is_vllms_reorder(vllm):
    """The reference's decode-first order is what the installed vLLM's own
    reorder_batch_to_split_decodes_and_prefills leaves, for every mix of the four
    regions up to four rows (a stand-in batch with vLLM's swap semantics)."""
    import itertools
    from types import SimpleNamespace

    import numpy as np

    from reference.runner import reorder_decode_first

    if vllm.reorder_batch is None:
        pytest.skip(f"vLLM {vllm.version} has no reorder_batch_to_split_decodes_and_prefills")
    kinds = [(1, 3, 2), (1, 1, 4), (3, 2, 8), (2, 0, 2)]  # decode, short, long, first
    for n in range(1, 5):
        for rows in itertools.product(kinds, repeat=n):
            sched, comp, prompt = (list(x) for x in zip(*rows))
            batch = SimpleNamespace(req_ids=[str(i) for i in range(n)],
                                    num_computed_tokens_cpu=np.array(comp),
                                    num_prompt_tokens=np.array(prompt))

            def swap(i, j, b=batch):
                b.req_ids[i], b.req_ids[j] = b.req_ids[j], b.req_ids[i]
                for arr in (b.num_computed_tokens_cpu, b.num_prompt_tokens):
                    arr[[i, j]] = arr[[j, i]]
            batch.swap_states = swap
            out = SimpleNamespace(num_scheduled_tokens={str(i): s for i, s in enumerate(sched)})
            vllm.reorder_batch(batch, out, decode_threshold=1)
            assert [int(r) for r in batch.req_ids] == reorder_decode_first(
                sched, comp, prompt, 1), rows


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_drawn_geometry_is_never_refused_by_the_installed_release(vllm, runner):
    """What the fuzzer may draw for the vllm target (its ``limits``) is what the
    installed release can run: a refusal mid-run would be a crash, not a finding."""
    from hypothesis import HealthCheck, given, settings

    from harness.search.geometry import runner_configs, target_limits

    @settings(max_examples=300, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(runner_configs(runner, **target_limits("vllm")))
    def check(cfg):
        assert vllm_target.refusal(cfg, vllm) is None, cfg

    check()


def test_host_tier_is_vllms_cpu_offloading_manager(vllm, monkeypatch):
    """With a host tier the vllm target keeps its host blocks in the installed
    vLLM's CPUOffloadingManager: the seed of the protected-hash bug passes, and
    fails once vLLM's own LRU policy is patched to drop the protection."""
    from harness.core.session import replay
    from harness.targets.vllm_offload import missing

    if missing() is not None:
        pytest.skip(missing())
    from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

    trace = load(CORPORA / "seeds" / "host-store-evicts-its-own-blocks.json")
    assert replay(trace, target="vllm").violation is None
    evict = LRUCachePolicy.evict
    monkeypatch.setattr(LRUCachePolicy, "evict",
                        lambda self, n, protected: evict(self, n, set()))
    found = replay(trace, target="vllm").violation
    assert (found.invariant, found.op_index) == ("STORE_PROVENANCE", 6), found


@pytest.mark.parametrize("path", sorted((CORPORA / "scenarios").glob("*.json")),
                         ids=lambda p: p.stem)
@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_scenarios_on_vllm_as_recorded(vllm, path, runner):
    """A cross-engine scenario as a block-table trace on the installed vLLM: the
    verdict its meta records for this release and runner (skipped where none is)."""
    from harness.core.scenario import load as load_scenario
    from harness.core.session import replay

    scenario = load_scenario(path)
    want = scenario.meta.get("verdicts", {}).get(f"vllm {vllm.version} {runner}")
    if want is None:
        pytest.skip(f"no verdict recorded for vLLM {vllm.version} on {runner}")
    v = replay(scenario.trace_for("vllm", runner), target="vllm")
    assert v.verdict == want["verdict"]
    assert want.get("invariant") in (None, getattr(v.violation, "invariant", None))
