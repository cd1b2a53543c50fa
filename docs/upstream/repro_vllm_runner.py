"""Standalone reproducer: vLLM's V1 GPUModelRunner hands a Mamba2 decode kernel
the wrong state — a FULL decode graph replayed on stale state indices (a live
request's state read and written), or a speculative request's running state
column lost when it skipped a step.  Runs on a CPU (no GPU, no vllm._C) with
the regular vLLM wheel; needs only vllm and its runner's import chain.

    pip install einops loguru && pip install --no-deps compressed-tensors
    python repro_vllm_runner.py dummy-run-stale-counters   [--with-fix]
    python repro_vllm_runner.py one-token-first-chunk      [--with-fix]
    python repro_vllm_runner.py spec-decode-reentry        [--with-fix]

Exit status: 1 while the bug is present (a replayed decode row read a state
block it must not: the dummy's rows anything but the null block; a step's
rows another request's block, or a stateless first chunk ran as a decode; a
speculative request back from a skipped step started from the wrong state
column), 0
with the fix applied (``--with-fix``: the patch the matching report
describes, applied at run time), 2 when there is no verdict (the set-up
failed, vLLM raised on the schedule, or nothing was replayed).  Run against
vLLM 0.26.0 and 0.33.0 with a CPU build of torch 2.13.0; GPUs are hidden
(``CUDA_VISIBLE_DEVICES=""``), CUDA graphs emulated as described below.

How it runs vLLM's runner on a CPU — every shim below prevents an error a
CPU-only machine raises, none touches the runner's logic, InputBatch, the
block tables or the metadata builders: pinned memory off; the platform's
attention backend is vLLM's Triton backend (declaring any kernel block size
so a 16-token block needs no split), hybrid KV cache and static graphs as on
CUDA; CUDA events/streams host placeholders; CUDA graphs emulated: a FULL
"capture" runs the model and keeps the forward context's metadata objects, a
"replay" runs the model again on those objects — capture-time scalars,
persistent buffers with their current contents — which is what a replayed
graph reads.  The model is a tiny hybrid registered with vLLM whose layers
are vLLM's own MambaMixer2 and Attention; its forward records what the FULL
replay's Mamba decode kernel would read (``state_indices_tensor_d``) and the
column a speculative decode row starts from (``num_accepted_tokens - 1``).
The speculative case runs eagerly with a drafter that proposes nothing
(vLLM's ``custom_class`` hook): the script schedules the drafts, and the
model's logits make greedy sampling accept the ones it plans.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402

READS: list[dict] = []  # per FULL replay: what the Mamba decode kernel reads
STARTS: list[list] = []  # per forward with accepted counts: the state column each decode row starts from
PLAN: list[int] = []  # the token greedy sampling is to pick at each token of the next forward


class NoDrafter:
    """The drafter handed to vLLM's custom_class hook: the script schedules the drafts."""

    def __init__(self, vllm_config, *a, **k):
        pass

    def propose(self, sampled_token_ids, *a, **k):
        return [[] for _ in sampled_token_ids]
LAYER_M, LAYER_A = "model.layers.0.mixer", "model.layers.1.self_attn.attn"


def kw(fn, cand):
    params = inspect.signature(fn).parameters
    return {k: v for k, v in cand.items() if k in params}


def shim_process():
    import vllm.platforms.interface as pi

    pi.Platform.is_pin_memory_available = classmethod(lambda cls: False)
    import vllm.utils.torch_utils as tu
    import vllm.v1.attention.backends.utils as bu
    import vllm.v1.utils as v1u
    import vllm.v1.worker.block_table as bt
    import vllm.v1.worker.gpu_input_batch as gib
    import vllm.v1.worker.gpu_model_runner as gmr

    tu.is_pin_memory_available = lambda: False
    for m in (tu, gmr, gib, bt, v1u, bu):
        if getattr(m, "PIN_MEMORY", False):
            m.PIN_MEMORY = False
    defaults = v1u.CpuGpuBuffer.__init__.__kwdefaults__ or {}
    if defaults.get("pin_memory"):
        defaults["pin_memory"] = False
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends import triton_attn

    class AnyBlockTriton(triton_attn.TritonAttentionBackend):
        @staticmethod
        def get_supported_kernel_block_sizes(*spec):
            return [triton_attn.MultipleOf(1)]

    sys.modules[__name__].AnyBlockTriton = AnyBlockTriton
    p = type(current_platform)
    p.get_attn_backend_cls = classmethod(lambda cls, *a, **k: f"{__name__}.AnyBlockTriton")
    p.get_current_memory_usage = classmethod(lambda cls, device=None: 0)
    p.support_hybrid_kv_cache = classmethod(lambda cls: True)
    p.support_static_graph_mode = classmethod(lambda cls: True)
    if hasattr(p, "num_compute_units"):
        p.num_compute_units = classmethod(lambda cls, device_id=0: 1)
    torch.accelerator.synchronize = lambda *a, **k: None
    torch.accelerator.empty_cache = lambda *a, **k: None
    if hasattr(torch.accelerator, "get_memory_info"):
        torch.accelerator.get_memory_info = lambda *a, **k: (0, 0)

    class Event:
        def __init__(self, *a, **k): pass
        def record(self, *a, **k): pass
        def synchronize(self): pass
        def wait(self, *a, **k): pass
        def query(self): return True

    class Stream(Event):
        device = torch.device("cpu")
        def wait_stream(self, *a, **k): pass
        def __enter__(self): return self
        def __exit__(self, *a): return False

    torch.Event = torch.cuda.Event = Event
    torch.cuda.Stream = Stream
    gmr.CUDAGraphWrapper = GraphWrapper
    gmr.graph_capture = lambda device=None: contextlib.nullcontext()
    from vllm.v1.worker.workspace import init_workspace_manager

    init_workspace_manager(torch.device("cpu"))
    return gmr


class GraphWrapper:
    """CUDAGraphWrapper's dispatch with the graph emulated (module docstring)."""

    def __init__(self, runnable, vllm_config, runtime_mode, cudagraph_options=None):
        self.runnable, self.runtime_mode, self.entries = runnable, runtime_mode, {}

    def __getattr__(self, key):
        if key == "runnable":
            raise AttributeError(key)
        return getattr(self.runnable, key)

    def unwrap(self):
        return self.runnable

    def __call__(self, *args, **kwargs):
        from vllm.config import CUDAGraphMode
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not is_forward_context_available():
            return self.runnable(*args, **kwargs)
        ctx = get_forward_context()
        if ctx.cudagraph_runtime_mode in (CUDAGraphMode.NONE, None) or \
                ctx.cudagraph_runtime_mode != self.runtime_mode:
            return self.runnable(*args, **kwargs)
        desc = ctx.batch_descriptor
        if desc not in self.entries:  # capture
            out = self.runnable(*args, **kwargs)
            self.entries[desc] = (ctx.attn_metadata, args, kwargs)
            return out
        live, (ctx.attn_metadata, args, kwargs) = ctx.attn_metadata, self.entries[desc]
        ctx.replaying = True
        try:
            return self.runnable(*args, **kwargs)
        finally:
            ctx.attn_metadata, ctx.replaying = live, False


def model_classes():
    from torch import nn
    from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid

    class TinyHybrid(nn.Module, HasInnerState, IsHybrid):
        supports_pp = False

        @classmethod
        def get_mamba_state_dtype_from_config(cls, vc):
            from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator
            c = vc.cache_config
            return MambaStateDtypeCalculator.mamba2_state_dtype(
                vc.model_config.dtype, c.mamba_cache_dtype, c.mamba_ssm_cache_dtype)

        @classmethod
        def get_mamba_state_shape_from_config(cls, vc):
            from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator
            hf = vc.model_config.hf_config
            return MambaStateShapeCalculator.mamba2_state_shape(
                intermediate_size=hf.mamba_expand * hf.hidden_size, tp_world_size=1,
                n_groups=hf.mamba_n_groups, num_heads=hf.mamba_n_heads,
                head_dim=hf.mamba_d_head, state_size=hf.mamba_d_state,
                conv_kernel=hf.mamba_d_conv)

        @classmethod
        def get_mamba_state_copy_func(cls):
            from vllm.model_executor.layers.mamba.mamba_utils import MambaStateCopyFuncCalculator
            return MambaStateCopyFuncCalculator.mamba2_state_copy_func()

        def __init__(self, *, vllm_config, prefix=""):
            super().__init__()
            from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
            try:
                from vllm.model_executor.layers.attention import Attention
            except ImportError:
                from vllm.attention.layer import Attention
            hf = vllm_config.model_config.hf_config
            self.vocab = hf.vocab_size
            self.mixer = MambaMixer2(
                hidden_size=hf.hidden_size, ssm_state_size=hf.mamba_d_state,
                conv_kernel_size=hf.mamba_d_conv,
                intermediate_size=hf.mamba_expand * hf.hidden_size, use_conv_bias=True,
                use_bias=False, n_groups=hf.mamba_n_groups, num_heads=hf.mamba_n_heads,
                head_dim=hf.mamba_d_head, rms_norm_eps=1e-5, activation="silu",
                model_config=vllm_config.model_config, cache_config=vllm_config.cache_config,
                prefix=LAYER_M)
            self.attn = Attention(num_heads=2, head_size=8, scale=8 ** -0.5, num_kv_heads=1,
                                  cache_config=vllm_config.cache_config, prefix=LAYER_A)
            self.dummy = nn.Parameter(torch.zeros(1))

        def embed_input_ids(self, input_ids):
            return torch.zeros(input_ids.shape[0], 16)

        def forward(self, input_ids=None, positions=None, intermediate_tensors=None,
                    inputs_embeds=None, **kwargs):
            from vllm.forward_context import get_forward_context
            ctx = get_forward_context()
            md = (ctx.attn_metadata or {}).get(LAYER_M)
            if getattr(ctx, "replaying", False) and md is not None and md.num_decodes:
                d = md.state_indices_tensor_d
                d = d if d.dim() == 1 else d[:, 0]
                READS.append({"decode_rows": md.num_decodes, "indices": d.tolist()})
            if md is not None and md.num_decodes and \
                    getattr(md, "num_accepted_tokens", None) is not None:
                # the Mamba decode kernel starts from column num_accepted - 1
                STARTS.append([int(a) - 1 for a in md.num_accepted_tokens[:md.num_decodes]])
            out = torch.zeros(input_ids.shape[0], 16)
            out[:len(PLAN), 0] = torch.tensor(PLAN[:input_ids.shape[0]], dtype=torch.float32)
            return out

        def compute_logits(self, hidden_states, *a, **k):
            # greedy sampling picks the token the forward's output names (PLAN)
            ids = hidden_states[:, 0].round().long().clamp(0, self.vocab - 1)
            logits = torch.zeros(hidden_states.shape[0], self.vocab)
            logits[torch.arange(ids.shape[0]), ids] = 1.0
            return logits

        def load_weights(self, weights):
            return set()

    return TinyHybrid


def build_runner(gmr, num_spec: int = 0):
    from vllm import ModelRegistry
    from vllm.config import (CacheConfig, CompilationConfig, DeviceConfig, LoadConfig,
                             ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig,
                             VllmConfig, set_current_vllm_config)
    from vllm.distributed.parallel_state import (init_distributed_environment,
                                                 initialize_model_parallel)

    ModelRegistry.register_model("ReproHybridForCausalLM", model_classes())
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["ReproHybridForCausalLM"], "model_type": "bamba",
                   "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
                   "num_hidden_layers": 2, "attn_layer_indices": [1],
                   "num_attention_heads": 2, "num_key_value_heads": 1, "mamba_n_heads": 2,
                   "mamba_d_head": 8, "mamba_n_groups": 1, "mamba_d_state": 2,
                   "mamba_d_conv": 2, "mamba_expand": 1, "mamba_chunk_size": 4,
                   "max_position_embeddings": 256, "torch_dtype": "float32"}, f)
    model = ModelConfig(**kw(ModelConfig, dict(
        model=d, skip_tokenizer_init=True, dtype="float32", max_model_len=64, seed=0)))
    spec = SpeculativeConfig(**kw(SpeculativeConfig, dict(
        method="custom_class", model=f"{__name__}.NoDrafter", num_speculative_tokens=num_spec,
        target_model_config=model, target_parallel_config=ParallelConfig()))) \
        if num_spec else None
    graphs = dict(cudagraph_mode="NONE") if num_spec else dict(
        cudagraph_mode="FULL", cudagraph_capture_sizes=[1, 2, 4], max_cudagraph_capture_size=4)
    vc = VllmConfig(
        model_config=model, speculative_config=spec,
        cache_config=CacheConfig(**kw(CacheConfig, dict(
            block_size=16, mamba_cache_mode="none", enable_prefix_caching=False,
            num_gpu_blocks_override=12))),
        scheduler_config=SchedulerConfig(**kw(SchedulerConfig, dict(
            max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
            is_encoder_decoder=False, enable_chunked_prefill=True,
            async_scheduling=False))),
        device_config=DeviceConfig(device="cpu"), load_config=LoadConfig(load_format="dummy"),
        parallel_config=ParallelConfig(), compilation_config=CompilationConfig(**kw(
            CompilationConfig, dict(mode=0, **graphs))))
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(29500 + os.getpid() % 20000))
    with set_current_vllm_config(vc):
        init_distributed_environment(**kw(init_distributed_environment, dict(
            world_size=1, rank=0, local_rank=0, distributed_init_method="env://",
            backend="gloo")))
        initialize_model_parallel(1, 1)
        runner = gmr.GPUModelRunner(vc, torch.device("cpu"))
        runner.load_model()
        init_kv_cache(runner, vc)
        if not num_spec:
            runner.capture_model()
    return runner, vc


def init_kv_cache(runner, vc):
    import vllm.v1.attention.backends.utils as bu
    import vllm.v1.core.kv_cache_utils as kcu
    try:
        import vllm.v1.core.kv_cache_planning as kcp
    except ImportError:
        kcp = kcu
    spec = runner.get_kv_cache_spec()
    if hasattr(bu, "resolve_kv_cache_layout"):  # the engine core's step on 0.33
        from types import SimpleNamespace

        from vllm.v1.worker.worker_base import WorkerBase
        w = SimpleNamespace(vllm_config=vc)
        layout = bu.resolve_kv_cache_layout(
            vc, [WorkerBase.get_supported_kv_cache_layouts(w)], list(spec.values()))
        if len(inspect.signature(WorkerBase.set_kv_cache_layout).parameters) > 2:
            WorkerBase.set_kv_cache_layout(w, layout.name, 1)
        else:
            WorkerBase.set_kv_cache_layout(w, layout.name)
    if "global_kv_cache_groups" in inspect.signature(kcp.get_kv_cache_configs).parameters:
        groups = kcp.get_global_kv_cache_groups(vc, [spec])
        kv = kcp.get_kv_cache_configs(vc, [spec], [64 << 20], groups)[0]
    else:
        kv = kcu.get_kv_cache_configs(vc, [spec], [64 << 20])[0]
    runner.initialize_kv_cache(kv)
    runner.groups = {n: i for i, g in enumerate(kv.kv_cache_groups) for n in g.layer_names}


class Scheduler:
    """Hand-built SchedulerOutputs: block ids per request, what a scheduler hands out."""

    def __init__(self, runner, vc):
        self.runner, self.vc, self.known, self.computed = runner, vc, set(), {}
        self.computed_before: dict = {}  # computed tokens of the last step's requests
        self.prompt, self.blocks, self.finished = {}, {}, set()

    def add(self, req, prompt_len, attn_block, mamba_block):
        """mamba_block: a block id, or a list (one per state column with drafts)."""
        self.prompt[req], self.computed[req] = prompt_len, 0
        b = [None, None]
        b[self.runner.groups[LAYER_A]] = [attn_block]
        b[self.runner.groups[LAYER_M]] = mamba_block if isinstance(mamba_block, list) \
            else [mamba_block]
        self.blocks[req] = tuple(b)

    def step(self, tokens: dict, drafts: dict | None = None, kept: dict | None = None):
        """drafts: {req: draft token ids}; kept: {req: tokens the sampler keeps}
        (the scheduler advances a request by those, as it does after rejections)."""
        from vllm.config import set_current_vllm_config
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

        new = [r for r in tokens if r not in self.known]
        old = [r for r in tokens if r in self.known]
        new_data = [NewRequestData(**kw(NewRequestData, dict(
            req_id=r, prompt_token_ids=[1] * self.prompt[r], mm_features=[], mm_kwargs=[],
            mm_hashes=[], mm_positions=[], sampling_params=SamplingParams(temperature=0.0),
            pooling_params=None, block_ids=self.blocks[r], num_computed_tokens=self.computed[r],
            lora_request=None))) for r in new]
        cached = CachedRequestData(**kw(CachedRequestData, dict(
            req_ids=old, resumed_req_ids=set(), resumed_from_preemption=[False] * len(old),
            new_token_ids=[[] for _ in old], all_token_ids={}, new_block_ids=[None] * len(old),
            num_computed_tokens=[self.computed[r] for r in old],
            num_output_tokens=[max(0, self.computed[r] + 1 - self.prompt[r]) for r in old])))
        out = SchedulerOutput(**kw(SchedulerOutput, dict(
            scheduled_new_reqs=new_data, scheduled_cached_reqs=cached,
            num_scheduled_tokens=dict(tokens), total_num_scheduled_tokens=sum(tokens.values()),
            scheduled_spec_decode_tokens=dict(drafts or {}), scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0, 0], finished_req_ids=set(self.finished),
            free_encoder_mm_hashes=[], structured_output_request_ids={},
            grammar_bitmask=None)))
        self.finished.clear()
        self.known |= set(new)
        with set_current_vllm_config(self.vc):
            self.runner.execute_model(out)
            if tokens and hasattr(self.runner, "sample_tokens"):
                self.runner.sample_tokens(None)
        self.computed_before = {r: self.computed[r] for r in tokens}
        for r, n in tokens.items():
            self.computed[r] += (kept or {}).get(r, n)

    def finish(self, req):
        self.finished.add(req)
        self.known.discard(req)
        del self.blocks[req]

    def owner(self, mamba_block):
        g = self.runner.groups[LAYER_M]
        return next((r for r, b in self.blocks.items() if b[g] == [mamba_block]), None)


def dummy_run_stale_counters(runner, vc, s):
    """An idle DP rank's FULL dummy run after a prompt chunk vacated row 0."""
    from vllm.config import set_current_vllm_config

    s.add("A", 2, 1, 5)
    s.step({"A": 2})            # A prefills
    s.step({"A": 1})            # A decodes (FULL): the decode buffer holds block 5
    s.add("B", 3, 2, 6)
    s.step({"B": 1})            # A not scheduled; B's 1-token first chunk, in row 0
    s.finish("B")
    s.step({})                  # the idle rank's engine step: row 0 vacated, counters stay
    READS.clear()
    with set_current_vllm_config(vc):
        runner._dummy_run(1, uniform_decode=True)  # what execute_dummy_batch calls
    # A dummy row has no state: a correct re-staging leaves only the null block (0).
    bad = [(i, f"request {s.owner(i)}'s" if s.owner(i) else "no live request's")
           for r in READS for i in r["indices"][:r["decode_rows"]] if i > 0]
    return bad, "the dummy run's replayed decode kernel read state blocks other than the null block"


def one_token_first_chunk(runner, vc, s):
    """A uniform 1-token batch holding a stateless first chunk replays the decode graph."""
    s.add("A", 2, 1, 5)
    s.add("C", 2, 3, 7)
    s.step({"A": 2, "C": 2})
    s.step({"A": 1, "C": 1})    # FULL decode: the decode buffer holds [5, 7]
    s.add("B", 1, 2, 6)
    READS.clear()
    s.step({"A": 1, "B": 1})    # C not scheduled (live); B's first (only) prompt token
    rows = s.runner.input_batch.req_ids
    bad = []
    for r in READS:
        for row, i in enumerate(r["indices"][:r["decode_rows"]]):
            req = rows[row] if row < len(rows) else None
            owner = s.owner(i)
            other = owner is not None and owner != req
            if req is not None and s.computed_before.get(req) == 0:
                bad.append((i, f"request {req}'s stateless first chunk"
                               + (f", request {owner}'s block" if other else "")))
            elif other:
                bad.append((i, f"request {owner}'s block, read by row {row}"))
    return bad, ("the step's replayed decode kernel ran a stateless first chunk, or read "
                 "another request's state block")


def spec_decode_reentry(runner, vc, s):
    """A speculative request that skipped a step comes back starting from column 0."""
    s.add("A", 1, 1, [1, 2, 3])
    s.add("B", 1, 2, [4, 5, 6])
    s.step({"A": 1})                # A prefills its one-token prompt
    PLAN[:] = [1, 2, 0]             # the target predicts both drafts: 3 tokens kept
    s.step({"A": 3}, drafts={"A": [1, 2]}, kept={"A": 3})
    PLAN[:] = []
    s.step({"B": 1})                # A not scheduled: _update_states takes it out of the batch
    STARTS.clear()
    s.step({"A": 2}, drafts={"A": [1]}, kept={"A": 1})  # A is back, with a draft
    # After keeping 3 tokens, A's state after its last kept token is column 2.
    bad = [(col, "request A's running state is column 2") for r in STARTS[:1]
           for col in r[:1] if col != 2]
    if not STARTS:
        raise RuntimeError("no decode row got accepted counts")
    return [(f"column {c}", why) for c, why in bad], (
        "request A, back from a skipped step, started its Mamba update from")


def apply_fix(gmr, case):
    """The fix described in the matching report, as a run-time patch."""
    runner_cls = gmr.GPUModelRunner
    if case == "spec-decode-reentry":
        from vllm.v1.worker.gpu_input_batch import InputBatch

        kept: dict = {}
        remove, add = InputBatch.remove_request, InputBatch.add_request

        def remove_request(self, req_id):
            # A request leaving the batch keeps its accepted count ...
            if req_id in self.req_id_to_index:
                kept[req_id] = int(self.num_accepted_tokens_cpu[self.req_id_to_index[req_id]])
            return remove(self, req_id)

        def add_request(self, request, *a, **k):
            # ... and gets it back when it returns.
            out = add(self, request, *a, **k)
            if request.req_id in kept:
                self.num_accepted_tokens_cpu[self.req_id_to_index[request.req_id]] = \
                    kept.pop(request.req_id)
            return out

        InputBatch.remove_request, InputBatch.add_request = remove_request, add_request
        return
    if case == "dummy-run-stale-counters":
        original = runner_cls._dummy_run

        def dummy_run(self, *a, **k):
            # A row the persistent batch does not hold keeps no prefill counters.
            ib, n = self.input_batch, self.input_batch.num_reqs
            ib.num_prompt_tokens[n:] = 0
            ib.num_computed_tokens_cpu[n:] = 0
            return original(self, *a, **k)

        runner_cls._dummy_run = dummy_run
    else:
        original = runner_cls._determine_batch_execution_and_padding

        def determine(self, *a, **k):
            # A stateless first chunk is no decode: the batch is not uniform-decode.
            n, ib = k.get("num_reqs"), self.input_batch
            if n and ((ib.num_computed_tokens_cpu[:n] == 0)
                      & (ib.num_prompt_tokens[:n] > 0)).any():
                k["force_uniform_decode"] = False
            return original(self, *a, **k)

        runner_cls._determine_batch_execution_and_padding = determine


CASES = {"dummy-run-stale-counters": dummy_run_stale_counters,
         "spec-decode-reentry": spec_decode_reentry,
         "one-token-first-chunk": one_token_first_chunk}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--with-fix", action="store_true")
    args = ap.parse_args()
    try:
        import vllm
        gmr = shim_process()
        if args.with_fix:
            apply_fix(gmr, args.case)
        runner, vc = build_runner(gmr, 2 if args.case == "spec-decode-reentry" else 0)
    except Exception as e:  # noqa: BLE001 - the set-up failed: no verdict
        print(f"set-up failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    try:
        bad, what = CASES[args.case](runner, vc, Scheduler(runner, vc))
    except Exception as e:  # noqa: BLE001 - vLLM raised on the schedule: no verdict either
        print(f"vLLM {vllm.__version__} raised during the schedule (a guard, or a set-up "
              f"this script does not make): {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    fix = " (fix applied)" if args.with_fix else ""
    if bad:
        print(f"vLLM {vllm.__version__}{fix}: BUG: {what}: "
              + ", ".join(f"{b if isinstance(b, str) else f'block {b}'} ({r})" for b, r in bad))
        return 1
    if args.case == "spec-decode-reentry":
        print(f"vLLM {vllm.__version__}{fix}: OK: request A started from its running "
              "state column 2")
        return 0
    # The dummy run replays FULL whether or not the fix is in; the fixed one-token
    # step runs eagerly (no replay), so there only the bug's presence needs a replay.
    if not READS and (args.case == "dummy-run-stale-counters" or not args.with_fix):
        print(f"vLLM {vllm.__version__}{fix}: nothing replayed: no verdict", file=sys.stderr)
        return 2
    print(f"vLLM {vllm.__version__}{fix}: OK: every replayed decode row read its own state "
          f"or the null block ({len(READS)} FULL replay(s) checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
