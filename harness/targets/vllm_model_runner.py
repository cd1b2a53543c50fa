"""Runner mode of the ``vllm`` target: vLLM's own V1 ``GPUModelRunner`` under test.

A trace's ops become what vLLM's runner is handed by its worker
(``vllm/v1/worker/gpu_model_runner.py``): ``SchedulerOutput`` s through
``execute_model`` + ``sample_tokens``, and ``_dummy_run`` for dummy runs.
``_update_states``, ``_prepare_inputs``, the persistent batch, block tables,
metadata builders, ``_dummy_run`` and CUDA-graph dispatch are the release's;
the model (:mod:`harness.targets.vllm_model`) runs gpu_impl's kernels on what
the runner handed each layer.

How trace ops map — the one place runner mode departs from the reference's
op-by-op row layout, by design of vLLM's runner:

- ``add``: the request waits for its first scheduled step, where it arrives as
  ``NewRequestData`` (prompt ids ``req * 256 + position``, its blocks, its
  computed tokens — the prompt after a ``kv_load``, as a P/D decode instance's
  request whose prompt KV was loaded); ``append``: its blocks join that, or the
  next step's ``new_block_ids`` once vLLM knows it;
- ``step``: one ``SchedulerOutput`` — new requests, cached ones with their
  computed tokens and new blocks, the finished ids since the last one; the
  requested ``cudagraph_mode`` is not vLLM's to take (its dispatcher picks the
  runtime mode from the batch and the config's ``cudagraph_mode`` FULL, as vLLM
  lowered it for the model — FULL_DECODE_ONLY with Mamba2): what ran is in
  ``last_forward``;
- ``remove``: the request's id is in the next output's finished ids (if vLLM
  has seen it: a request never scheduled is simply dropped); its blocks are
  freed (poisoned) at once, as the scheduler frees them;
- ``dummy_run``: what an idle data-parallel rank's engine core does
  (``DPEngineCoreProc``: a step that scheduled nothing, then
  ``execute_dummy_batch``).  While its scheduler has requests — live ones none
  of which is scheduled (say, waiting on a remote KV load), or finished ones
  not yet reported (``EngineCore.step``: ``scheduler.has_requests()``) — it
  hands the runner an empty ``SchedulerOutput`` first, carrying the finished
  ids, and ``_update_states`` takes the unscheduled requests out of the batch;
  with neither it runs no step at all.  Then
  ``_dummy_run(num_tokens, uniform_decode=num_tokens == num_reqs * (1 + k))``
  (vLLM then runs ``num_tokens // (1 + k)`` rows of ``1 + k`` tokens) — with
  ``cudagraph_mode`` NONE the runtime mode NONE, else vLLM's dispatcher's pick,
  as ``execute_dummy_batch`` leaves it;
- ``condense`` / ``swap``: nothing — vLLM's runner condenses after every
  scheduler output's removals and orders rows itself (decode-first reorder);
- ``kv_load``: the connector writes the prompt's KV and final state into the
  model's caches.

Observations come from vLLM's objects: its persistent batch's rows and
counters (``rows_indexed_by`` :data:`~harness.core.observation.ROWS_BY_ENGINE`:
rows where vLLM put them, so ``MATCHES_REFERENCE`` compares what kernels left
— caches, and attention outputs by request — not rows), the committed block
tables, vLLM's slot-mapping buffers, the model's caches and what each forward ran.
"""

from __future__ import annotations

import inspect

import numpy as np
import torch

from gpu_impl.kv_transfer import ABORT, FAILED, STORE, KVTransferTracker

from harness.core.observation import ROWS_BY_ENGINE, Observation
from harness.targets.registry import TargetRefused
from reference.payload import mamba_state_of, token_payload
from reference.runner import ForwardInfo

MODE = "vLLM's GPUModelRunner"
MODE_V2 = "vLLM's V2 ModelRunner"
VOCAB_SIZE = 64  # sampled ids feed nothing (vllm_model.ModelKernels._payload)


def runner_refusal(config, vllm) -> TargetRefused | None:
    """Why runner mode cannot run ``config`` (the component adapter then runs it);
    None when it can.  One line each, naming the field."""
    if config.runner == "v2" and not config.mamba_groups:
        return TargetRefused("groups", "runner mode drives vLLM's V2 ModelRunner for hybrid "
                             "configs only: without a Mamba group a trace may roll a step's "
                             "tokens back from the scheduler's side (rollback), and V2's "
                             "runner counts rejected tokens from its own sampler, so no "
                             "scheduler output expresses it; the component adapter runs it")
    attention = config.attention_groups
    if len(attention) != 1 or len(config.mamba_groups) > 1:
        return TargetRefused("groups", "runner mode models one attention group and at most "
                             "one Mamba group (vLLM unifies attention block sizes)")
    checks = (
        ("groups[*].kernel_block_size", any(
            s.kernel_block_size != s.block_size for s in config.groups), "kernel-block split"),
        ("groups[*].sliding_window", any(s.sliding_window for s in config.groups),
         "sliding-window layers"),
        ("groups[*].slot_buffer", any(s.slot_buffer for s in config.groups),
         "a backend slot buffer of its own"),
        ("groups[*].conv_size", any(s.conv_size for s in config.groups), "a conv state"),
        ("num_speculative_tokens", config.runner == "v2" and config.num_speculative_tokens,
         "a drafter on V2 (its runner takes EAGLE/MTP-style drafters only)"),
        ("allocator", config.allocator != "trace", "vLLM's KV-cache manager"),
        ("kv_sharing", config.kv_sharing, "pages shared between groups"),
        ("dcp_world_size", config.dcp_world_size > 1, "decode context parallelism"),
        ("kv_cache_dtype", config.kv_cache_dtype != "auto", "a quantized KV cache"),
        ("mamba_padding", config.mamba_padding != "null", "non-null Mamba padding"),
        ("host_blocks", config.host_blocks, "a host tier (the adapter drives vLLM's CPU "
         "offloading manager)"),
    )
    for field, present, what in checks:
        if present:
            return TargetRefused(field, f"runner mode does not model {what} yet; the "
                                 "component adapter runs it")
    k, sizes = config.num_speculative_tokens, config.cudagraph_capture_sizes
    if k and sizes and 1 + k > max(sizes):
        # vLLM rounds FULL decode graph sizes to multiples of 1 + k and refuses
        # a largest size below it when it resolves the graph modes
        # (CompilationConfig.adjust_cudagraph_sizes_for_spec_decode)
        return TargetRefused("cudagraph_capture_sizes", f"vLLM's FULL decode graphs with "
                             f"{k} speculative token(s) need a capture size of at least "
                             f"{1 + k} (it refuses {max(sizes)}); the component adapter "
                             "runs it")
    if config.num_speculative_tokens and not custom_drafter_hook():
        return TargetRefused("num_speculative_tokens", f"vLLM {vllm.version} has no "
                             "custom_class proposer hook to hand runner mode's drafter to; "
                             "the component adapter runs it")
    return _config_refusal(_key(config), config)


def custom_drafter_hook() -> bool:
    """Whether the installed vLLM takes a drafter class of ours
    (``speculative_config`` method ``custom_class``)."""
    import importlib.util

    return importlib.util.find_spec("vllm.v1.spec_decode.custom_class_proposer") is not None


_CONFIG_REFUSALS: dict[str, TargetRefused | None] = {}


def _key(config) -> str:
    import json

    return json.dumps(config.to_json(), sort_keys=True)


def _config_refusal(key: str, config) -> TargetRefused | None:
    """vLLM's own validation of the ``VllmConfig`` runner mode would build (its
    scheduler refuses a token budget below ``max_num_seqs``, say), once per config;
    or what vLLM refused when a runner was built for it (its KV-cache set-up
    refuses a pool too small for its checks: the target then ran on the
    component adapter, and says so from then on)."""
    if key not in _CONFIG_REFUSALS:
        from harness.targets.vllm_engine import prepare, vllm_config

        prepare()
        try:
            vllm_config(config, VOCAB_SIZE)
            _CONFIG_REFUSALS[key] = None
        except (ValueError, TypeError, AssertionError) as e:
            lines = [line.strip() for line in str(e).splitlines() if line.strip()]
            first = next((line.split(",", 1)[1].split("[type=")[0].strip() for line in lines
                          if line.startswith("Value error,")), lines[0] if lines else repr(e))
            _CONFIG_REFUSALS[key] = TargetRefused("vllm", f"vLLM's config validation refuses "
                                                  f"this geometry ({first[:200]})")
    return _CONFIG_REFUSALS[key]


class VllmModelRunnerTarget:
    """The ``vllm`` target in runner mode for ``config`` (a ``reference.RunnerConfig``
    that :func:`runner_refusal` accepts).  Construction builds the runner,
    vLLM's KV-cache config (``num_blocks`` as the trace's) and, with capture
    sizes, captures its graphs (``capture_model``, emulated)."""

    name = "vllm"
    mode = MODE

    def __init__(self, config):
        from harness.targets import vllm_model
        from harness.targets.vllm_engine import init_distributed, vllm_config

        self.engine = self._prepare()
        vllm_model.register()
        from vllm.config import set_current_vllm_config

        self.config = config
        self.vc = vllm_config(config, VOCAB_SIZE)
        self._ctx = lambda: set_current_vllm_config(self.vc)
        init_distributed(self.vc)
        with self._ctx():
            self.runner = self._runner_class()(self.vc, torch.device("cpu"))
            self.runner.load_model()
        model = self.runner.get_model()
        self.kernels = model.kernels = vllm_model.ModelKernels(config)
        self.groups = self._init_kv_cache(vllm_model)
        self.requests: dict[int, dict] = {}
        self.transfers = KVTransferTracker(())  # asynchronous KV loads in flight
        self.in_flight: dict[int, tuple] = {}  # handle -> (req, columns per group)
        self.left: dict[int, dict] = {}  # requests that left with a transfer in flight
        self.kv_store: dict[tuple, dict] = {}  # the external store: prefix ids -> {g: KV}
        self.finished: set[str] = set()
        self.last_forward: ForwardInfo | None = None
        self._observe_runner()
        if self.vc.compilation_config.cudagraph_mode.name != "NONE":
            self._garbage(self.runner.capture_model)
        self.kernels.forwards.clear()

    def _prepare(self):
        from harness.targets.vllm_engine import prepare

        return prepare()

    def _runner_class(self):
        return self.engine.gmr.GPUModelRunner

    def _observe_runner(self) -> None:
        """Hooks that read what the runner hands on (none for V1)."""

    def _init_kv_cache(self, vllm_model) -> dict[int, int]:
        """vLLM's KV-cache config for the runner's specs (the engine core's
        steps), then ``initialize_kv_cache``; returns {trace group: vLLM group}."""
        import vllm.v1.core.kv_cache_utils as kcu

        try:
            import vllm.v1.core.kv_cache_planning as kcp
        except ImportError:
            kcp = kcu
        spec = self.runner.get_kv_cache_spec()
        memory = 64 << 20
        with self._ctx():
            self._resolve_layout(spec)
            try:
                if "global_kv_cache_groups" in inspect.signature(
                        kcp.get_kv_cache_configs).parameters:
                    groups = kcp.get_global_kv_cache_groups(self.vc, [spec])
                    kv = kcp.get_kv_cache_configs(self.vc, [spec], [memory], groups)[0]
                else:
                    kv = kcu.get_kv_cache_configs(self.vc, [spec], [memory])[0]
            except (ValueError, NotImplementedError) as e:
                # vLLM's planning refuses the pool (too few blocks for its
                # checks), or the model's pages (0.24: a Mamba page an attention
                # page's size does not divide); a failure of the runner's own
                # initialize_kv_cache below is no refusal and is raised
                what = (f"pool of {self.config.num_blocks} blocks" if isinstance(e, ValueError)
                        else "model's KV-cache pages")
                said = str(e).split(". ")[0][:200]
                said += ")" * max(0, said.count("(") - said.count(")"))
                refused = TargetRefused("num_blocks" if isinstance(e, ValueError) else "vllm",
                                        f"vLLM's KV-cache set-up refuses this {what} "
                                        f"for the registered model (vLLM: {said})")
                _CONFIG_REFUSALS[_key(self.config)] = refused
                raise refused from None
            self.runner.initialize_kv_cache(kv)
            self.kv_cache_config = kv  # what vLLM's scheduler would be built with
        where = {name: i for i, grp in enumerate(kv.kv_cache_groups) for name in grp.layer_names}
        return {g: where[vllm_model.layer_name(self.config, g)]
                for g in range(len(self.config.groups))}

    def _resolve_layout(self, spec) -> None:
        """0.33's engine core resolves one KV-cache layout before allocation."""
        utils = self.engine.backend_utils
        if not hasattr(utils, "resolve_kv_cache_layout"):
            return
        from types import SimpleNamespace

        from vllm.v1.worker.worker_base import WorkerBase

        worker = SimpleNamespace(vllm_config=self.vc)
        layouts = WorkerBase.get_supported_kv_cache_layouts(worker)
        layout = utils.resolve_kv_cache_layout(self.vc, [layouts], list(spec.values()))
        if len(inspect.signature(WorkerBase.set_kv_cache_layout).parameters) > 2:
            WorkerBase.set_kv_cache_layout(worker, layout.name,
                                           self.vc.parallel_config.cp_kv_cache_interleave_size)
        else:
            WorkerBase.set_kv_cache_layout(worker, layout.name)

    def _garbage(self, fn, *args, **kwargs):
        """Run ``fn`` with the model's payload NaN (a dummy run's garbage)."""
        self.kernels.garbage = True
        try:
            with self._ctx():
                return fn(*args, **kwargs)
        finally:
            self.kernels.garbage = False

    # -- ops ------------------------------------------------------------------
    def add(self, req, blocks, prompt_len):
        self.requests[req] = {"prompt_len": prompt_len, "blocks": [list(b) for b in blocks],
                              "computed": 0, "sent": False,
                              "new": [[] for _ in self.config.groups]}

    def append(self, req, blocks):
        r = self.requests[req]
        for g, ids in enumerate(blocks):
            (r["new"] if r["sent"] else r["blocks"])[g].extend(ids)

    def remove(self, req):
        self._leave(req, ABORT)

    def _leave(self, req, reason: str) -> None:
        """The request leaves; its blocks are poisoned now or, while a KV load
        into them is in flight, when its last transfer ends (blockfuzz's
        scheduler-side tracker, ``gpu_impl/kv_transfer.py``: vLLM's scheduler is
        not driven here)."""
        r = self.requests.pop(req)
        if self.transfers.finish(req, reason):
            for g, ids in enumerate(r["blocks"]):
                self.kernels.poison(g, ids)
        else:
            self.left[req] = r
        if r["sent"]:
            self.finished.add(str(req))

    def condense(self):
        """vLLM's runner condenses in ``_update_states`` itself (module docstring)."""

    def swap(self, i, j):
        """vLLM's runner orders its rows itself (module docstring)."""

    def kv_load(self, req):
        """The P/D connector's write: the prompt's KV and its final Mamba state."""
        r = self.requests[req]
        self._land(req, r, None)
        r["computed"] = r["prompt_len"]

    def _land(self, req, r, columns) -> None:
        """Write ``req``'s prompt KV into its blocks at ``columns`` per group (None:
        all) and its final Mamba state where a Mamba group's column 0 is among them."""
        cfg = self.config
        pos = np.arange(r["prompt_len"])
        values = token_payload(req * 256 + pos, cfg.head_size)
        for g in cfg.attention_groups:
            bs = cfg.groups[g].block_size
            keep = np.ones(len(pos), bool) if columns is None else np.isin(pos // bs, columns[g])
            blocks = np.asarray(r["blocks"][g])[pos[keep] // bs]
            self.kernels.kv_cache[g][torch.from_numpy(blocks),
                                     torch.from_numpy(pos[keep] % bs)] = \
                torch.from_numpy(values[keep])
        for g in cfg.mamba_groups:
            if columns is None or 0 in columns[g]:
                self.kernels.mamba_state[g][r["blocks"][g][0]] = torch.from_numpy(
                    mamba_state_of(values, cfg.groups[g].conv_size))

    # Asynchronous KV loads: the connector's worker side writes the KV (as
    # kv_load); the scheduler side is blockfuzz's tracker, not vLLM's.
    def kv_load_begin(self, req, handle, blocks):
        r = self.requests[req]
        self.transfers.begin(handle, req)
        self.in_flight[handle] = (req, [[r["blocks"][g].index(b) for b in ids]
                                        for g, ids in enumerate(blocks)])

    def kv_load_complete(self, req, handle):
        req, columns = self.in_flight.pop(handle)
        live = req in self.requests
        r = self.requests[req] if live else self.left[req]
        self._land(req, r, columns)
        landed = r.setdefault("landed", [[] for _ in self.config.groups])
        for g, cols in enumerate(columns):
            landed[g].extend(cols)
        _, free = self.transfers.end(handle)
        cfg = self.config
        if live and all(set(range(-(-r["prompt_len"] // cfg.groups[g].block_size)))
                        <= set(landed[g]) for g in cfg.attention_groups) \
                and all(0 in landed[g] for g in cfg.mamba_groups):
            r["computed"] = r["prompt_len"]
        if free:
            self._poison_left(req)

    def kv_load_fail(self, req, handle):
        req, _ = self.in_flight.pop(handle)
        _, free = self.transfers.end(handle)
        if req in self.requests:
            self._leave(req, FAILED)
        elif free:
            self._poison_left(req)

    def kv_store_begin(self, req, handle, num_tokens):
        """A connector starts saving the request's first ``num_tokens`` tokens' KV
        (the copy reads vLLM's caches when it completes)."""
        self.transfers.begin(handle, req, STORE)
        self.in_flight[handle] = (req, num_tokens)

    def kv_store_complete(self, req, handle):
        req, num_tokens = self.in_flight.pop(handle)
        r = self.requests.get(req) or self.left[req]
        pos = np.arange(num_tokens)
        saved = {}
        for g in self.config.attention_groups:
            bs = self.config.groups[g].block_size
            blocks = np.asarray(r["blocks"][g])[pos // bs]
            saved[g] = self.kernels.kv_cache[g][torch.from_numpy(blocks),
                                                torch.from_numpy(pos % bs)].numpy().copy()
        self.kv_store[tuple(int(t) for t in req * 256 + pos)] = saved
        _, free = self.transfers.end(handle)
        if free:
            self._poison_left(req)

    def _poison_left(self, req) -> None:
        for g, ids in enumerate(self.left.pop(req)["blocks"]):
            self.kernels.poison(g, ids)

    def rollback(self, req, num_tokens):
        """The scheduler lowers the request's computed tokens; vLLM's
        ``_update_states`` takes the lower count from the next output."""
        self.requests[req]["computed"] -= num_tokens

    # Ops runner mode does not drive yet: never drawn for it (the machine reads
    # this), refused with one line in a trace.
    refused_ops = frozenset({"preempt", "resume"})

    def preempt(self, req, *blocks):
        raise TargetRefused("op", "runner mode does not drive preemption yet (vLLM's "
                            "resumed_from_preemption path); the component adapter runs it "
                            "(BLOCKFUZZ_VLLM_MODE=adapter)")

    resume = preempt

    def step_complete(self):
        """vLLM's runner runs a dispatched step synchronously here (its async
        scheduling path is not driven): its results landed at dispatch."""

    def step(self, scheduled, cudagraph_mode, accepted=None, in_flight=False,
             placeholders=None):
        # placeholders: drafts like any other for vLLM's runner (its rejection
        # sampler rejects them); the accepted counts say so.
        decodes = {req: n for req, n in scheduled
                   if self.requests[req]["computed"] >= self.requests[req]["prompt_len"]}
        kept = {req: (n if accepted is None else a) for (req, n), a in
                zip(scheduled, accepted or [None] * len(scheduled)) if req in decodes}
        drafts = {req: n - 1 for req, n in decodes.items()
                  if n > 1 and self.config.num_speculative_tokens}
        output = self._scheduler_output(scheduled, drafts)
        self.kernels.forwards.clear()
        self.kernels.rows = self._batch_rows({str(req): n for req, n in scheduled})
        self.kernels.accepted = kept if drafts else {}
        try:
            with self._ctx():
                self.runner.execute_model(output)
                if hasattr(self.runner, "sample_tokens"):
                    self.runner.sample_tokens(None)
        finally:
            self.kernels.rows, self.kernels.accepted = None, {}
        for req, n in scheduled:  # vLLM's scheduler: scheduled tokens less rejected drafts
            self.requests[req]["computed"] += kept.get(req, n)
        self._record(False, len(scheduled), sum(n for _, n in scheduled),
                     tuple(int(r) for r in self._batch_order(len(scheduled))))

    def _batch_rows(self, tokens: dict):
        """() -> [(req, tokens)] per batch row of the forward being run: the
        persistent batch's rows (V1)."""
        batch = self.runner.input_batch
        return lambda: [(int(r), tokens[r]) for r in batch.req_ids[:len(tokens)]]

    def _batch_order(self, n: int) -> list:
        return self.runner.input_batch.req_ids[:n]

    def dummy_run(self, num_reqs, num_tokens, cudagraph_mode):
        if self.requests or self.finished:  # the idle rank's engine step (module docstring)
            with self._ctx():
                self.runner.execute_model(self._scheduler_output([]))
        self.kernels.forwards.clear()
        self._garbage(self.runner._dummy_run, num_tokens,
                      uniform_decode=num_tokens == num_reqs * self.config.uniform_query_len,
                      **self._dummy_mode(cudagraph_mode))
        self._record(True, 0, num_tokens, ())

    def _dummy_mode(self, cudagraph_mode: str) -> dict:
        """V1's ``_dummy_run`` takes the runtime mode: NONE when the trace asks for
        it, else vLLM's dispatcher's pick (as ``execute_dummy_batch`` leaves it)."""
        from vllm.config import CUDAGraphMode

        return {"cudagraph_runtime_mode": CUDAGraphMode.NONE if cudagraph_mode == "NONE"
                else None}

    def _record(self, dummy: bool, num_reqs: int, num_tokens: int, req_ids: tuple) -> None:
        """``last_forward`` from the model forward the runner just made (none: a
        step vLLM ran no forward for)."""
        runs = [f for f in self.kernels.forwards if f["metadata"]] or self.kernels.forwards
        if not runs:
            self.last_forward = ForwardInfo(dummy, "NONE", num_reqs, num_reqs, num_tokens,
                                            num_tokens, req_ids)
            return
        f = runs[-1]
        self.last_forward = ForwardInfo(dummy, f["mode"], num_reqs, f["rows"] or num_reqs,
                                        num_tokens, f["num_tokens"], req_ids)

    def _scheduler_output(self, scheduled, drafts: dict | None = None):
        """vLLM's ``SchedulerOutput`` for the step ``scheduled`` [(req, tokens)];
        ``drafts``: {req: draft tokens} of its speculative rows (their ids:
        ``vllm_model.draft_token_ids``)."""
        from harness.targets.vllm_model import draft_token_ids

        from vllm.sampling_params import SamplingParams
        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

        new, cached = [], []
        for req, _ in scheduled:
            (cached if self.requests[req]["sent"] else new).append(req)
        new_data = [NewRequestData(**_kw(NewRequestData, dict(
            req_id=str(req), prompt_token_ids=self._prompt(req), mm_features=[], mm_kwargs=[],
            mm_hashes=[], mm_positions=[], prefill_token_ids=self._prompt(req),
            sampling_params=SamplingParams(temperature=0.0, max_tokens=1 << 20),
            pooling_params=None, block_ids=self._vllm_blocks(self.requests[req]["blocks"]),
            num_computed_tokens=self.requests[req]["computed"], lora_request=None)))
            for req in new]
        cached_data = CachedRequestData(**_kw(CachedRequestData, dict(
            req_ids=[str(r) for r in cached], resumed_req_ids=set(),
            resumed_from_preemption=[False] * len(cached),
            new_token_ids=[[] for _ in cached], all_token_ids={},
            new_block_ids=[self._vllm_blocks(self.requests[r]["new"])
                           if any(self.requests[r]["new"]) else None for r in cached],
            num_computed_tokens=[self.requests[r]["computed"] for r in cached],
            num_output_tokens=[max(0, self.requests[r]["computed"] + 1
                                   - self.requests[r]["prompt_len"]) for r in cached])))
        for req in new:
            self.requests[req]["sent"] = True
        for req in cached:
            self.requests[req]["blocks"] = [a + b for a, b in zip(self.requests[req]["blocks"],
                                                                   self.requests[req]["new"])]
            self.requests[req]["new"] = [[] for _ in self.config.groups]
        tokens = {str(req): n for req, n in scheduled}
        finished, self.finished = self.finished, set()
        return SchedulerOutput(**_kw(SchedulerOutput, dict(
            scheduled_new_reqs=new_data, scheduled_cached_reqs=cached_data,
            num_scheduled_tokens=tokens, total_num_scheduled_tokens=sum(tokens.values()),
            scheduled_spec_decode_tokens={str(req): draft_token_ids(n)
                                          for req, n in (drafts or {}).items()},
            scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0] * len(self.groups), finished_req_ids=finished,
            free_encoder_mm_hashes=[], structured_output_request_ids={},
            grammar_bitmask=None)))

    def _prompt(self, req: int) -> list[int]:
        return [req * 256 + p for p in range(self.requests[req]["prompt_len"])]

    def _vllm_blocks(self, blocks: list[list[int]]) -> tuple:
        """Per-trace-group block ids in vLLM's group order."""
        out = [None] * len(blocks)
        for g, ids in enumerate(blocks):
            out[self.groups[g]] = list(ids)
        return tuple(out)

    # -- observation ----------------------------------------------------------
    def observe(self) -> Observation:
        cfg, batch = self.config, self.runner.input_batch
        n = cfg.max_num_reqs
        req_ids = np.full(n, -1, np.int64)
        for row, req in enumerate(batch._req_ids[:n]):
            if req is not None:
                req_ids[row] = int(req)
        tables, counts, device = [], [], []
        for g in range(len(cfg.groups)):
            table = batch.block_table[self.groups[g]]
            width = cfg.blocks_per_req_max(g)
            tables.append(table.block_table.np[:n, :width].astype(np.int32).copy())
            counts.append(np.asarray(table.num_blocks_per_row[:n], np.int32).copy())
            device.append(table.block_table.gpu[:n, :width].numpy().astype(np.int32).copy())
        k = self.kernels
        return Observation(
            runner="v1", rows_indexed_by=ROWS_BY_ENGINE, host_block_table=tables,
            host_num_blocks_per_row=counts, host_req_ids=req_ids,
            num_computed_tokens=batch.num_computed_tokens_cpu[:n].astype(np.int32).copy(),
            num_prompt_tokens=batch.num_prompt_tokens[:n].astype(np.int32).copy(),
            device_block_table=device,
            kv_cache={g: v.numpy().copy() for g, v in k.kv_cache.items()},
            mamba_state={g: v.numpy().copy() for g, v in k.mamba_state.items()},
            slot_mapping={g: batch.block_table[self.groups[g]].slot_mapping.gpu.numpy().copy()
                          for g in cfg.attention_groups},
            state_indices={g: k.mamba_read[g][:n].numpy().copy() for g in cfg.mamba_groups},
            attn_out={g: v[:n].numpy().copy() for g, v in k.attn_out.items()},
            last_forward=self.last_forward, kv_store=dict(self.kv_store))


class VllmModelRunnerV2Target(VllmModelRunnerTarget):
    """The ``vllm`` target in runner mode on vLLM's V2 ``ModelRunner``
    (``vllm/v1/worker/gpu/model_runner.py``): request states by state index
    (``RequestState``), block tables staged by state index and gathered into
    batch-ordered input tables (``BlockTables``), metadata from
    ``model_state.prepare_attn``, FULL graphs through its own graph manager
    (``CudaGraphManager``; emulated, :class:`~harness.targets.vllm_engine.`
    ``EmulatedCUDAGraph``).  Ops map as for V1 (module docstring), except:

    - vLLM's V2 runner keeps an unscheduled request's state (it has no
      persistent batch to take it out of);
    - ``dummy_run``: V2's ``_dummy_run`` takes no runtime mode; its graph
      manager dispatches the dummy batch as any other (a trace's NONE is not
      vLLM's to take).

    Observations: host rows by state index (``RequestState``'s
    ``req_id_to_index``, computed and prompt tokens; ``BlockTables``' staged
    rows), the input tables and slot mappings the last forward read, and
    ``dummy_tables`` — whether the tables the last dummy run's metadata was
    built from (``get_dummy_block_tables``) were zero views of the input tables.
    """

    mode = MODE_V2

    def _prepare(self):
        from harness.targets.vllm_engine import prepare_v2

        prepare_v2()
        return super()._prepare()

    def _runner_class(self):
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner

        return GPUModelRunner

    def _observe_runner(self) -> None:
        """Keep the input batch ``prepare_inputs`` returns (its row order) and the
        tables ``prepare_dummy_attn`` returns (observation only: vLLM's calls run
        unchanged)."""
        runner = self.runner
        self._batch, self._dummy_read = None, None
        prepare_inputs, prepare_dummy_attn = runner.prepare_inputs, runner.prepare_dummy_attn

        def kept_batch(*args, **kwargs):
            self._batch = prepare_inputs(*args, **kwargs)
            return self._batch

        def kept_dummy_tables(*args, **kwargs):
            out = prepare_dummy_attn(*args, **kwargs)
            self._dummy_read = out[0]
            return out

        runner.prepare_inputs = kept_batch
        runner.prepare_dummy_attn = kept_dummy_tables

    def _batch_rows(self, tokens: dict):
        def rows():
            batch = self._batch
            return [(int(r), int(n)) for r, n in
                    zip(batch.req_ids, batch.num_scheduled_tokens[:len(batch.req_ids)])]
        return rows

    def _batch_order(self, n: int) -> list:
        return list(self._batch.req_ids[:n]) if self._batch is not None else []

    def _dummy_mode(self, cudagraph_mode: str) -> dict:
        return {}

    def dummy_run(self, num_reqs, num_tokens, cudagraph_mode):
        self._dummy_read = None
        super().dummy_run(num_reqs, num_tokens, cudagraph_mode)

    def observe(self) -> Observation:
        from harness.targets.vllm_release import staged_rows

        cfg, runner = self.config, self.runner
        n = cfg.max_num_reqs
        states = runner.req_states
        req_ids = np.full(n, -1, np.int64)
        for req, index in states.req_id_to_index.items():
            req_ids[index] = int(req)
        staged, counts = staged_rows(runner.block_tables, n)
        tables, device, num_blocks = [], [], []
        for g in range(len(cfg.groups)):
            vg, width = self.groups[g], cfg.blocks_per_req_max(g)
            tables.append(staged[vg][:n, :width].astype(np.int32))
            num_blocks.append(counts[vg][:n])
            device.append(runner.block_tables.input_block_tables[vg][:n, :width]
                          .numpy().astype(np.int32).copy())
        computed = getattr(states, "num_computed_tokens_np", None)
        if computed is None:
            computed = states.num_computed_tokens.np
        k = self.kernels
        return Observation(
            runner="v2", rows_indexed_by=ROWS_BY_ENGINE, host_block_table=tables,
            host_num_blocks_per_row=num_blocks, host_req_ids=req_ids,
            num_computed_tokens=np.asarray(computed[:n], np.int32).copy(),
            num_prompt_tokens=np.asarray(states.prompt_len.np[:n], np.int32).copy(),
            device_block_table=device,
            kv_cache={g: v.numpy().copy() for g, v in k.kv_cache.items()},
            mamba_state={g: v.numpy().copy() for g, v in k.mamba_state.items()},
            slot_mapping={g: runner.block_tables.slot_mappings[self.groups[g]].numpy().copy()
                          for g in cfg.attention_groups},
            state_indices={g: k.mamba_read[g][:n].numpy().copy() for g in cfg.mamba_groups},
            attn_out={g: v[:n].numpy().copy() for g, v in k.attn_out.items()},
            last_forward=self.last_forward, dummy_tables=self._dummy_tables(),
            kv_store=dict(self.kv_store))

    def _dummy_tables(self) -> list | None:
        """Per trace group, (the rows the last dummy run's tables hold are all the
        group's empty entry, they view the input tables); None unless the last
        forward was a dummy run that built metadata."""
        last = self.last_forward
        if last is None or not last.dummy or self._dummy_read is None:
            return None
        rows = last.num_reqs_padded
        inputs = self.runner.block_tables.input_block_tables
        out = []
        for g in range(len(self.config.groups)):
            table = self._dummy_read[self.groups[g]]
            out.append((not bool((table[:rows] != self.config.empty_entry(g)).any()),
                        table.data_ptr() == inputs[self.groups[g]].data_ptr()))
        return out


def runner_target(config) -> VllmModelRunnerTarget:
    """Runner mode's target for ``config``: V1's ``GPUModelRunner`` or V2's ``ModelRunner``."""
    cls = VllmModelRunnerV2Target if config.runner == "v2" else VllmModelRunnerTarget
    return cls(config)


def _kw(fn, candidates: dict) -> dict:
    params = inspect.signature(fn).parameters
    return {key: v for key, v in candidates.items() if key in params}
