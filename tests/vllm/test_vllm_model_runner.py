"""Runner mode of the ``vllm`` target: vLLM's own V1 ``GPUModelRunner`` under test
(``harness/targets/vllm_model_runner.py``).

Skips without vLLM (or without the runner's import chain); fails instead under
``$BLOCKFUZZ_REQUIRE_VLLM=1`` (CI installs both).  Each bug test switches the
fix on as a patch of vLLM's runner and watches the trace pass, so the verdict
is vLLM's code, not ours.
"""

from __future__ import annotations

import os

import pytest

from harness.core.session import replay
from harness.core.trace import load
from harness.targets import make_target
from harness.targets import vllm as vllm_target
from tests.conftest import CORPORA

STALE_COUNTERS = CORPORA / "vllm" / "v1-dummy-run-stale-prefilling-counters.json"
ONE_TOKEN = CORPORA / "vllm" / "v1-one-token-first-chunk-stale-decode-graph.json"
SPEC_REENTRY = CORPORA / "vllm" / "v1-spec-decode-reentry-count-reset.json"


@pytest.fixture(scope="module")
def gmr():
    """vLLM's ``gpu_model_runner`` module with runner mode prepared."""
    give_up = pytest.fail if os.environ.get("BLOCKFUZZ_REQUIRE_VLLM") == "1" else pytest.skip
    if vllm_target.installed_version() is None:
        give_up("vLLM not installed (scripts/install-vllm-target.sh RELEASE)")
    from harness.targets.vllm_engine import prepare, runner_missing

    missing = runner_missing()
    if missing is not None:
        give_up(missing)
    try:
        return prepare().gmr
    except vllm_target.TargetUnavailable as e:
        give_up(str(e))


def _counting(monkeypatch, cls, name: str) -> list:
    calls, original = [], getattr(cls, name)

    def counted(self, *args, **kwargs):
        calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, counted)
    return calls


def test_runner_mode_runs_vllms_own_runner_methods(gmr, monkeypatch):
    """The target is vLLM's ``GPUModelRunner``: every step goes through its
    ``_update_states`` and ``_prepare_inputs``, the dummy run is its
    ``_dummy_run``, and the FULL replays are the emulated wrapper's."""
    trace = load(STALE_COUNTERS)
    assert vllm_target.target_mode(trace.config) == ("runner", None)
    updates = _counting(monkeypatch, gmr.GPUModelRunner, "_update_states")
    prepares = _counting(monkeypatch, gmr.GPUModelRunner, "_prepare_inputs")
    dummies = _counting(monkeypatch, gmr.GPUModelRunner, "_dummy_run")
    target = make_target("vllm", trace.config)
    assert type(target.runner) is gmr.GPUModelRunner
    captures = len(dummies)  # capture_model's warm-ups and captures
    assert captures >= len(trace.config.cudagraph_capture_sizes)
    from harness.core.trace import apply_op

    for op in trace.ops:
        apply_op(target, op)
    steps = sum(op["op"] == "step" for op in trace.ops)
    assert len(prepares) == steps and len(updates) == steps + 1  # + the idle rank's step
    assert len(dummies) == captures + 1
    assert target.last_forward.dummy and target.last_forward.cudagraph_mode == "FULL"


def test_mode_setting_picks_the_adapter_and_names_what_runs(gmr, monkeypatch):
    trace = load(STALE_COUNTERS)
    assert "vLLM's GPUModelRunner" in vllm_target.mode_line(trace.config)
    monkeypatch.setenv(vllm_target.MODE_ENV, "adapter")
    assert vllm_target.target_mode(trace.config) == ("adapter", None)
    assert "component adapter" in vllm_target.mode_line(trace.config)
    assert replay(trace, (), "vllm").violation is None  # the fixed runner side
    monkeypatch.setenv(vllm_target.MODE_ENV, "runner")
    window = load(CORPORA / "vllm" / "v2-sliding-window-prefix-hit.json")
    with pytest.raises(vllm_target.TargetRefused, match="hybrid configs only"):
        vllm_target.target_mode(window.config)
    monkeypatch.setenv(vllm_target.MODE_ENV, "sometimes")
    with pytest.raises(vllm_target.TargetUnavailable, match="auto, runner or adapter"):
        vllm_target.target_mode(trace.config)


def test_vllms_config_validation_sends_a_geometry_to_the_adapter(gmr):
    """A geometry vLLM's own config refuses (a token budget below max_num_seqs)
    runs on the component adapter, with the reason on the mode line."""
    from reference import GroupSpec, RunnerConfig

    config = RunnerConfig(groups=(GroupSpec("attention", 8, 8),), max_num_reqs=2,
                          max_num_batched_tokens=1, cudagraph_capture_sizes=())
    mode, why = vllm_target.target_mode(config)
    assert mode == "adapter" and "max_num_seqs" in why, why


def _stale_counters_fix(gmr, monkeypatch):
    """The fix (docs/upstream/dummy-run-stale-prefilling-counters.md): rows the
    persistent batch does not hold keep no prefill counters."""
    original = gmr.GPUModelRunner._dummy_run

    def dummy_run(self, *args, **kwargs):
        batch, n = self.input_batch, self.input_batch.num_reqs
        batch.num_prompt_tokens[n:] = 0
        batch.num_computed_tokens_cpu[n:] = 0
        return original(self, *args, **kwargs)

    monkeypatch.setattr(gmr.GPUModelRunner, "_dummy_run", dummy_run)


def test_dummy_run_classifies_its_rows_from_stale_counters(gmr, monkeypatch):
    """The suspected upstream issue, on vLLM's own runner: after an idle step
    vacated a row that last held a prompt chunk, ``_dummy_run`` builds its
    metadata with ``num_reqs = num_reqs_padded``, the row's stale counters make
    it a prefill for the Mamba2 builder, the decode buffer is not refreshed and
    the FULL dummy replay writes NaN into request 0's live state block 5.  With
    the fix applied as a patch of vLLM's runner, the trace passes."""
    trace = load(STALE_COUNTERS)
    v = replay(trace, (), "vllm").violation
    assert v is not None and (v.invariant, trace.ops[v.op_index]["op"], v.group, v.block) == \
        ("NO_STALE_WRITE", "dummy_run", 1, 5), v
    assert "owned by req 0" in v.detail and "NaN" in v.detail
    _stale_counters_fix(gmr, monkeypatch)
    assert replay(trace, (), "vllm").violation is None


def test_one_token_first_chunk_replays_a_stale_decode_graph(gmr, monkeypatch):
    """Found by runner mode: a batch of one-token rows holding a stateless first
    chunk is dispatched as the uniform-decode FULL graph, the Mamba2 builder
    counts the chunk a prefill and leaves its decode buffer as the last decode
    batch staged it, and the replay writes the new request's first state into
    request 2's live block 7.  Not dispatching such a batch as a uniform decode
    (the fix, as a patch of vLLM's runner) passes."""
    trace = load(ONE_TOKEN)
    v = replay(trace, (), "vllm").violation
    assert v is not None and (v.invariant, v.op_index, v.group, v.block) == \
        ("NO_STALE_WRITE", 5, 1, 7), v
    assert "owned by req 2" in v.detail
    _one_token_fix(gmr, monkeypatch)
    assert replay(trace, (), "vllm").violation is None


def _one_token_fix(gmr, monkeypatch):
    """The fix (docs/upstream/one-token-first-chunk-stale-decode-graph.md): a batch
    holding a stateless first chunk is no uniform decode."""
    original = gmr.GPUModelRunner._determine_batch_execution_and_padding

    def determine(self, *args, **kwargs):
        n, batch = kwargs.get("num_reqs"), self.input_batch
        if n and ((batch.num_computed_tokens_cpu[:n] == 0)
                  & (batch.num_prompt_tokens[:n] > 0)).any():
            kwargs["force_uniform_decode"] = False
        return original(self, *args, **kwargs)

    monkeypatch.setattr(gmr.GPUModelRunner, "_determine_batch_execution_and_padding",
                        determine)


def test_fuzz_from_seed_0_finds_the_seed_stale_rows_through_vllms_runner(gmr, monkeypatch):
    """Seed 0, runner mode only, on a release that keeps stale rows: with the two
    runner bugs above fixed as patches (their first findings otherwise), the
    search finds the seed's stale block-table rows in vLLM's own runner —
    ``_update_states`` takes an unscheduled request out of the batch and the
    condense leaves the vacated row's block ids.  Speculative decoding is off for
    this search: its confirmed suspicions (corpora/vllm/v1-spec-decode-*: the
    draft-less step's column 0, the re-entry count) are found first otherwise."""
    from harness.search.fuzz import fuzz
    from harness.targets import vllm_model_runner
    from tests.vllm.test_vllm_target import _keeps_stale_rows

    if not _keeps_stale_rows(vllm_target.load(), "v1"):
        pytest.skip(f"vLLM {vllm_target.installed_version()} clears vacated rows")
    monkeypatch.setenv(vllm_target.MODE_ENV, "runner")
    monkeypatch.setattr(vllm_model_runner, "custom_drafter_hook", lambda: False)
    _stale_counters_fix(gmr, monkeypatch)
    _one_token_fix(gmr, monkeypatch)
    result = fuzz(None, 0, 200, (), "vllm", "cpu", runner="v1")
    assert result.violation is not None, "the stale rows were not found"
    assert result.violation.invariant in ("VACATED_ROWS_ZERO", "NO_STALE_WRITE"), \
        result.violation.line()
    assert len(result.trace.ops) <= 6 and vllm_target.target_mode(result.trace.config) == \
        ("runner", None)


def test_a_kernel_that_ignores_vllms_slot_mapping_is_caught(gmr, monkeypatch):
    """The model's KV write goes through the slot mapping vLLM's runner handed
    the layer: a runner whose slot mapping points one block over is a finding."""
    from harness.targets import vllm_model

    original = vllm_model.reshape_and_cache

    def shifted(hidden, slot, cache, n, *a, **k):
        block = cache.shape[1]
        return original(hidden, slot.where(slot < 0, slot + block), cache, n, *a, **k)

    from harness.core.trace import Trace

    full = load(ONE_TOKEN)  # its prefills and FULL decodes, before the bug's step
    trace = Trace(full.config, full.ops[:4], {"verdict": "pass"}, {})
    assert replay(trace, (), "vllm").violation is None
    monkeypatch.setattr(vllm_model, "reshape_and_cache", shifted)
    v = replay(trace, (), "vllm").violation
    assert v is not None and v.invariant in ("NO_STALE_WRITE", "MATCHES_REFERENCE",
                                             "NO_FOREIGN_READ"), v


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_runner_mode_draws_only_what_runner_mode_runs(gmr, monkeypatch, runner):
    """With ``$BLOCKFUZZ_VLLM_MODE=runner`` the vllm target's geometry limits keep
    every drawn config in runner mode (none would be refused mid-run): V1 with
    drafters that fit its graphs, V2 always with a Mamba group."""
    from hypothesis import HealthCheck, given, settings

    from harness.search.geometry import runner_configs, target_limits

    monkeypatch.setenv(vllm_target.MODE_ENV, "runner")
    limits = target_limits("vllm")

    @settings(max_examples=200, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(runner_configs(runner, **limits))
    def check(cfg):
        assert vllm_target.target_mode(cfg) == ("runner", None), cfg

    check()


# -- V2's ModelRunner ----------------------------------------------------------------

V2_ONE_TOKEN = CORPORA / "vllm" / "v2-one-token-first-chunk-stale-decode-graph.json"


@pytest.fixture(scope="module")
def mr2(gmr):
    """vLLM's V2 ``model_runner`` module with runner mode's V2 shims applied."""
    from harness.targets.vllm_engine import prepare_v2

    prepare_v2()
    import vllm.v1.worker.gpu.model_runner as mr2

    return mr2


def test_v2_runner_mode_runs_vllms_own_v2_runner(mr2, monkeypatch):
    """A V2 trace runs vLLM's V2 ``ModelRunner``: each step through its
    ``prepare_inputs``, FULL batches replayed by its own graph manager."""
    import vllm.v1.worker.gpu.cudagraph_utils as cudagraph_utils

    trace = load(V2_ONE_TOKEN)
    assert vllm_target.target_mode(trace.config) == ("runner", None)
    assert "V2 ModelRunner" in vllm_target.mode_line(trace.config)
    prepares = _counting(monkeypatch, mr2.GPUModelRunner, "prepare_inputs")
    replays = _counting(monkeypatch, cudagraph_utils.CudaGraphManager, "run_fullgraph")
    target = make_target("vllm", trace.config)
    assert type(target.runner) is mr2.GPUModelRunner
    from harness.core.trace import apply_op

    for op in trace.ops[:4]:  # two prefills, then their decodes in a FULL graph
        apply_op(target, op)
    assert len(prepares) == 2 and len(replays) == 1
    assert target.last_forward.cudagraph_mode == "FULL"
    assert target.last_forward.req_ids in ((0, 2), (2, 0))


def _v2_one_token_fix(mr2, monkeypatch) -> bool:
    """The fix on V2 releases that dispatch by shape alone: a scheduler output
    holding a stateless first chunk is no uniform batch.  False where the
    release has no such dispatch (nothing to patch)."""
    if not hasattr(mr2, "get_uniform_token_count"):
        return False
    original_execute, original_uniform = mr2.GPUModelRunner.execute_model, \
        mr2.get_uniform_token_count

    def execute_model(self, output, *args, **kwargs):
        first = any(r.num_computed_tokens == 0 for r in output.scheduled_new_reqs)
        monkeypatch.setattr(mr2, "get_uniform_token_count",
                            (lambda *a: None) if first else original_uniform)
        return original_execute(self, output, *args, **kwargs)

    monkeypatch.setattr(mr2.GPUModelRunner, "execute_model", execute_model)
    return True


def test_v2_one_token_first_chunk_replays_a_stale_decode_graph(mr2, monkeypatch):
    """The one-token bug on V2's own runner: where the release dispatches the
    uniform-decode graph by shape, request 1's first state lands in request 2's
    live block 7; with the fix as a patch the trace passes.  A release whose V2
    runner keeps batches with a prefill off decode graphs passes as it is (the
    verdict bisect recorded for it says so)."""
    trace = load(V2_ONE_TOKEN)
    v = replay(trace, (), "vllm").violation
    recorded = vllm_target.recorded_verdict(trace, vllm_target.installed_version(), "runner")
    if v is None:
        assert recorded is None or recorded["verdict"] == "pass", recorded
        return
    assert (v.invariant, v.op_index, v.group, v.block) == ("NO_STALE_WRITE", 5, 1, 7), v
    assert "owned by req 2" in v.detail
    assert _v2_one_token_fix(mr2, monkeypatch), "the bug is present but nothing was patched"
    assert replay(trace, (), "vllm").violation is None


def test_v2_fuzz_from_seed_0_finds_the_seed_stale_dummy_tables(mr2, monkeypatch):
    """Seed 0, runner mode, V2, on a release whose ``get_dummy_block_tables``
    returns the last batch's rows: with the one-token bug fixed as a patch (its
    finding otherwise comes first), the search finds the seed's stale dummy
    tables in vLLM's own V2 runner."""
    from harness.search.fuzz import fuzz
    from tests.vllm.test_vllm_target import _keeps_stale_rows

    if not _keeps_stale_rows(vllm_target.load(), "v2"):
        pytest.skip(f"vLLM {vllm_target.installed_version()} zeroes V2 dummy tables")
    monkeypatch.setenv(vllm_target.MODE_ENV, "runner")
    _v2_one_token_fix(mr2, monkeypatch)
    result = fuzz(None, 0, 200, (), "vllm", "cpu", runner="v2")
    assert result.violation is not None, "the stale dummy tables were not found"
    assert result.violation.invariant in ("DUMMY_TABLES_ZERO", "NO_STALE_WRITE"), \
        result.violation.line()
    assert vllm_target.target_mode(result.trace.config) == ("runner", None)


def _reentry_count_fix(monkeypatch):
    """The fix (docs/upstream/spec-decode-reentry-count-reset.md): a request taken
    out of the persistent batch keeps its accepted count, and gets it back when
    it returns (vLLM's ``add_request`` sets 1)."""
    from vllm.v1.worker.gpu_input_batch import InputBatch

    kept: dict = {}
    remove, add = InputBatch.remove_request, InputBatch.add_request

    def remove_request(self, req_id):
        index = self.req_id_to_index.get(req_id)
        if index is not None:
            kept[req_id] = int(self.num_accepted_tokens_cpu[index])
        return remove(self, req_id)

    def add_request(self, request, *args, **kwargs):
        index = add(self, request, *args, **kwargs)
        row = self.req_id_to_index[request.req_id] if index is None else index
        if request.req_id in kept:
            self.num_accepted_tokens_cpu[row] = kept.pop(request.req_id)
        return index

    monkeypatch.setattr(InputBatch, "remove_request", remove_request)
    monkeypatch.setattr(InputBatch, "add_request", add_request)


def test_a_request_that_skips_a_step_restarts_from_state_column_0(gmr, monkeypatch):
    """The spec-decode suspicion on vLLM's own runner, with a drafter through its
    custom-class hook: request 0 keeps all 3 tokens of a speculative step
    (running state: column 2), a step leaves it out (``_update_states`` takes it
    out of the batch), and when it comes back with a draft, ``add_request`` has
    reset its accepted count to 1 — the Mamba kernel starts from column 0.
    The same schedule without the skipped step passes, and so does the trace
    with the fix as a patch."""
    from harness.core.trace import Trace

    trace = load(SPEC_REENTRY)
    assert vllm_target.target_mode(trace.config) == ("runner", None)
    v = replay(trace, (), "vllm").violation
    assert v is not None and (v.invariant, v.op_index) == ("MATCHES_REFERENCE", 5), v
    assert "mamba_state[1] block 1" in v.detail, v.detail
    unskipped = Trace(trace.config, trace.ops[:3] + trace.ops[5:], {"verdict": "pass"}, {})
    assert replay(unskipped, (), "vllm").violation is None
    _reentry_count_fix(monkeypatch)
    assert replay(trace, (), "vllm").violation is None


DRAFTLESS = CORPORA / "vllm" / "v1-spec-decode-draftless-step-column-0.json"


def test_vllms_own_scheduler_makes_the_draftless_step(gmr, monkeypatch):
    """The draft-less step is one vLLM's own ``Scheduler`` makes: built over runner
    mode's runner (as ``EngineCore`` builds it, from the runner's KV-cache config),
    with a drafter proposing k drafts every step and a model whose target accepts
    them all, a one-token prompt runs a prefill, two speculative steps keeping
    3 tokens each, then — one position from ``max_model_len`` — one token and no
    draft.  The decode kernel there starts from column 2 (count 3) where the
    release passes counts whenever a drafter is configured, and from column 0
    where it passes them only with a scheduled draft (vLLM hands the builder no
    counts; the model reads that as 1: the bug) — whichever the trace's
    recorded verdict for the release says."""
    import math

    from vllm.config import set_current_vllm_config
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from harness.targets import vllm_model
    from harness.targets.vllm_model_runner import VllmModelRunnerTarget, _kw

    trace = load(DRAFTLESS)
    k = trace.config.num_speculative_tokens
    monkeypatch.setattr(vllm_model.BlockfuzzProposer, "propose",
                        lambda self, sampled, *a, **kw: [vllm_model.draft_token_ids(k)
                                                         for _ in sampled])
    target = VllmModelRunnerTarget(trace.config)
    kv = target.kv_cache_config
    target.vc.cache_config.num_gpu_blocks = kv.num_blocks
    with set_current_vllm_config(target.vc):
        scheduler = Scheduler(**_kw(Scheduler.__init__, dict(
            vllm_config=target.vc, kv_cache_config=kv,
            structured_output_manager=StructuredOutputManager(target.vc),
            block_size=math.lcm(*[g.kv_cache_spec.block_size for g in kv.kv_cache_groups]),
            hash_block_size=trace.config.groups[0].block_size, log_stats=False)))
        scheduler.add_request(Request(**_kw(Request.__init__, dict(
            request_id="0", prompt_token_ids=[0], pooling_params=None, eos_token_id=None,
            sampling_params=SamplingParams(temperature=0.0, max_tokens=100),
            arrival_time=0.0, client_index=0))))
        steps = []
        while True:
            output = scheduler.schedule()
            if not output.num_scheduled_tokens:
                break
            tokens = dict(output.num_scheduled_tokens)
            target.kernels.rows = target._batch_rows(tokens)
            target.kernels.accepted = {int(r): n for r, n in tokens.items()}  # accept all
            target.kernels.forwards.clear()
            target.runner.execute_model(output)
            result = target.runner.sample_tokens(None)
            mamba = trace.config.mamba_groups[0]
            steps.append((tokens["0"], len(output.scheduled_spec_decode_tokens.get("0", ())),
                          target.kernels.forwards[-1]["accepted"][mamba][0]))
            scheduler.update_from_output(output, result)
            drafts = target.runner.take_draft_token_ids()
            if drafts is not None:
                scheduler.update_draft_token_ids(drafts)
    # (tokens, drafts scheduled, the count the Mamba kernel starts from) per step
    assert [s[:2] for s in steps] == [(1, 0), (3, 2), (3, 2), (1, 0)], steps
    recorded = vllm_target.recorded_verdict(trace, vllm_target.installed_version(), "runner")
    if recorded is None:
        pytest.skip(f"no verdict recorded for vLLM {vllm_target.installed_version()}")
    assert steps[3][2] == (1 if recorded["verdict"] == "fail" else 3), (steps, recorded)
