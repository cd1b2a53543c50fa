"""Probe vLLM's speculative-decoding pieces on a CPU (groundwork for issue #14, not a target).

Calls, with tiny inputs, what a harness could drive: the Mamba2 metadata builder
with ``num_speculative_tokens`` = 2 and ``num_accepted_tokens`` (1 + k state
columns per decode row, its persistent ``decode_num_accepted_tokens``; modes
``none`` / ``align``, and ``all`` on 0.26.0), ``mamba_get_block_table_tensor``
in align mode, the EAGLE draft step's slot mapping
(``eagle_step_update_slot_mapping_and_metadata``, a Triton kernel that runs under
the interpreter), ``compute_new_slot_mapping`` (rejected tokens to -1) and the
proposer's ``_get_slot_mapping`` (its own ``_slot_mapping_buffer``, padded tail
-1).  Shims, as for the target's builders (``harness/targets/vllm_builders.py``),
plus a ``speculative_config`` stand-in and an ``einops`` stub for the proposer
module.  Run in a release's environment:
``TRITON_INTERPRET=1 .venv/bin/python scripts/probe_spec_decode.py``.
Found while probing (0.26.0 and 0.33.0): a 0-token CUDA-graph pad row counts as
a decode, so the builder's "pad the accepted count with 1" branch never reaches
it and the pad row's accepted count passes into ``decode_num_accepted_tokens``.
"""
import os
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
import inspect
from types import SimpleNamespace
import torch
import vllm
import vllm.utils.torch_utils as tu
import vllm.v1.attention.backends.utils as bu
tu.PIN_MEMORY = False
bu.PIN_MEMORY = False
print("vllm", vllm.__version__)

from vllm.config import CacheConfig, CompilationConfig, DeviceConfig, SchedulerConfig, VllmConfig
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.kv_cache_interface import MambaSpec
from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder

K = 2; MAXLEN = 64; BS = 4
def kw(cls, d):
    p = inspect.signature(cls).parameters
    return {k: v for k, v in d.items() if k in p}

def make_cfg(mode):
    sched = SchedulerConfig(**kw(SchedulerConfig, dict(max_num_seqs=8, max_num_batched_tokens=256,
                            max_model_len=MAXLEN, is_encoder_decoder=False)))
    cfg = VllmConfig(device_config=DeviceConfig(device="cpu"), scheduler_config=sched,
                     cache_config=CacheConfig(**kw(CacheConfig, dict(mamba_cache_mode=mode))),
                     compilation_config=CompilationConfig(max_cudagraph_capture_size=8))
    cc = cfg.compilation_config
    cc.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    cc.cudagraph_capture_sizes = [1, 2, 4, 8]; cc.max_cudagraph_capture_size = 8
    cfg.model_config = SimpleNamespace(max_model_len=MAXLEN, dtype=torch.float32, rswa_window=None,
                                       get_mamba_chunk_size=lambda: 8)
    # speculative_config stand-in: VllmConfig.num_speculative_tokens property and
    # _init_reorder_batch_threshold read num_speculative_tokens / parallel_drafting
    cfg.speculative_config = SimpleNamespace(num_speculative_tokens=K, parallel_drafting=False,
                                             method="mtp", use_eagle=lambda: False,
                                             use_eagle_block_drop=lambda: False)
    return cfg

def cam(qsl, seq_lens, table, prefilling):
    qsl = torch.tensor(qsl, dtype=torch.int32); lens = torch.tensor(seq_lens, dtype=torch.int32)
    n = int(qsl[-1])
    d = dict(query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=lens, seq_lens_cpu=lens,
             seq_lens_cpu_upper_bound=lens, num_computed_tokens_cpu=lens - torch.diff(qsl),
             num_reqs=len(lens), num_actual_tokens=n, max_query_len=int(torch.diff(qsl).max()),
             max_seq_len=int(lens.max()), block_table_tensor=table,
             slot_mapping=torch.full((n,), -1, dtype=torch.int64), causal=True,
             is_prefilling=torch.tensor(prefilling))
    return CommonAttentionMetadata(**kw(CommonAttentionMetadata, d))

def builder(mode, block_size):
    spec = MambaSpec(**kw(MambaSpec, dict(block_size=block_size, shapes=((3, 8), (2, 4, 4)),
                     dtypes=(torch.float32, torch.float32), mamba_cache_mode=mode,
                     num_speculative_blocks=K)))
    cfg = make_cfg(mode)
    b = Mamba2AttentionMetadataBuilder(spec, ["model.layers.0.mixer"], cfg, torch.device("cpu"))
    return b

print("\n== (b1) Mamba2 builder, mode=none, K=2: 3 decode rows of 1+K tokens + pad row ==")
b = builder("none", MAXLEN)
print("reorder_batch_threshold", b.reorder_batch_threshold, "state_indices_tensor_d", tuple(b.state_indices_tensor_d.shape),
      "decode_num_accepted_tokens", tuple(b.decode_num_accepted_tokens.shape))
# rows: 3 real spec-decode rows (3 tokens each), 1 cudagraph-padded row (0 tokens; null block 0)
table = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [0, 0, 0]], dtype=torch.int32)
c = cam([0, 3, 6, 9, 9], [10, 20, 30, 0], table, [False] * 4)
acc = torch.tensor([1, 3, 2, 7], dtype=torch.int32)   # last = garbage for pad row
md = b.build(0, c, num_accepted_tokens=acc)
print("num_decodes", md.num_decodes, "num_prefills", md.num_prefills)
print("state_indices_tensor_d\n", md.state_indices_tensor_d)
print("num_accepted_tokens", md.num_accepted_tokens, "query_start_loc_d", md.query_start_loc_d)
print("persistent buf is view:", md.state_indices_tensor_d.data_ptr() == b.state_indices_tensor_d.data_ptr())
print("decode_num_accepted_tokens buf[:4]", b.decode_num_accepted_tokens[:4])
# emulate running column (kernel side): src col = num_accepted-1, dst col 0..K
na = md.num_accepted_tokens
print("NOTE: 0-token pad row counts as a decode (num_decodes == num_reqs), so the builder's "
      "'pad with 1' branch never touches it; its accepted count passes through:", int(na[-1]))
ok = (na >= 1) & (na <= md.state_indices_tensor_d.shape[1])
print("kernel src column = num_accepted-1 (valid rows):",
      md.state_indices_tensor_d[torch.arange(md.num_decodes)[ok], (na[ok] - 1).long()].tolist(),
      "out-of-range rows:", torch.nonzero(~ok).flatten().tolist())

print("\n== (b2) mode=align: mamba_get_block_table_tensor picks last 1+K pages ==")
from vllm.v1.attention.backends.utils import mamba_get_block_table_tensor
bs = 4
b2 = builder("align", bs)
tab = torch.arange(1, 1 + 3 * 16, dtype=torch.int32).view(3, 16)
print("gather (seq_lens 5,9,0):\n", mamba_get_block_table_tensor(tab, torch.tensor([5, 9, 0], dtype=torch.int32), b2.kv_cache_spec, "align"))
c = cam([0, 3, 6, 6], [7, 12, 0], tab, [False] * 3)
md = b2.build(0, c, num_accepted_tokens=torch.tensor([2, 1, 5], dtype=torch.int32))
print("num_decodes", md.num_decodes, "state_indices_tensor_d\n", md.state_indices_tensor_d, "\nnum_accepted", md.num_accepted_tokens)

print("\n== (b3) mode=all with prev_last_scheduled_idx ==")
try:
    b3 = builder("all", bs)
    tab18 = torch.arange(1, 1 + 3 * 18, dtype=torch.int32).view(3, 18)  # cdiv(64,4)+K cols
    c = cam([0, 3, 6, 6], [7, 12, 0], tab18, [False] * 3)
    md = b3.build(0, c, num_accepted_tokens=torch.tensor([2, 1, 1], dtype=torch.int32),
                  prev_last_scheduled_idx=torch.tensor([0, -1, -1], dtype=torch.int32))
    print("state_indices_tensor_d shape", tuple(md.state_indices_tensor_d.shape))
    print("block_idx_last_scheduled", md.block_idx_last_scheduled_token, "last_computed", md.block_idx_last_computed_token,
          "prev_step", md.block_idx_last_scheduled_token_prev_step)
except Exception as e:
    print("mode=all FAILED:", type(e).__name__, e)

print("\n== (a) eagle_step_update_slot_mapping_and_metadata (Triton, interpreter) padded ==")
from vllm.v1.spec_decode.utils import eagle_step_update_slot_mapping_and_metadata, compute_new_slot_mapping
from vllm.v1.spec_decode import utils as su; PADDING_SLOT_ID = su.PADDING_SLOT_ID
slot_buf = torch.full((8,), 12345, dtype=torch.int64)     # stands for drafter _slot_mapping_buffer
pos_buf = torch.zeros(8, dtype=torch.int64)
positions = torch.tensor([5, 62, 63], dtype=torch.int64)  # 63+1 exceeds max_model_len=64
btab = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13, 14]], dtype=torch.int32)
seq_lens = torch.tensor([6, 63, 64], dtype=torch.int32)
eagle_step_update_slot_mapping_and_metadata(positions, btab, seq_lens, block_size=16, max_model_len=64,
    out_clamped_positions=pos_buf[:3], out_slot_mapping=slot_buf[:5], input_batch_size=5)
print("PADDING_SLOT_ID", PADDING_SLOT_ID)
print("slot_buf", slot_buf.tolist(), "\npositions", pos_buf[:3].tolist(), "seq_lens", seq_lens.tolist())

print("\n== (a2) compute_new_slot_mapping (pure torch; parallel drafting) ==")
c = cam([0, 2, 4], [10, 20], btab[:2], [False, False])
newpos = torch.tensor([8, 9, 10, 11, 18, 19, 20, 21], dtype=torch.int64)
rej = torch.tensor([0, 0, 0, 0, 0, 1, 0, 0], dtype=torch.bool)
print(compute_new_slot_mapping(c, newpos, rej, block_size=16, num_new_tokens=2, max_model_len=64).tolist())

print("\n== (a3) LLMBaseProposer._get_slot_mapping on a bare object (no __init__) ==")
import sys, types
try:
    import einops  # noqa
except ImportError:  # shim: stub module so llm_base_proposer imports (model code is never run)
    m = types.ModuleType("einops"); m.rearrange = m.repeat = m.reduce = m.einsum = None
    sys.modules["einops"] = m
try:
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer as P
except Exception as e:
    print("import llm_base_proposer FAILED:", type(e).__name__, e); raise SystemExit
p = object.__new__(P)
p._slot_mapping_buffer = torch.zeros(8, dtype=torch.int64); p._draft_attn_layer_names = ["d.0"]
out = P._get_slot_mapping(p, 6, torch.tensor([40, 41, 42], dtype=torch.int64))
print(out["d.0"].tolist())
