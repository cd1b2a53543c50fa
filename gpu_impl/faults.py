"""The fault catalogue: switchable re-introductions of historical bugs.

Every fault is off by default.  A runner receives a :class:`FaultSet` at
construction and consults it at the exact place the upstream bug lived, so the
code path with the fault off is the fixed engine code.
"""

from __future__ import annotations

from dataclasses import dataclass


# Catalogue groupings (Fault.family), one place: docs and tests iterate this.
FAMILIES = ("core", "metadata", "spec-decode", "scheduler", "layout", "async")


@dataclass(frozen=True)
class Fault:
    """One fault: id, runners it applies to, what it does, where it came from,
    and the invariant expected to catch it first (``also``: others that do on
    some traces — e.g. a wrong slot that lands in a cell the owner may write is
    only visible as a value the reference does not have); ``family`` groups the
    catalogue (``core``: the block-table / dummy-run / graph bugs; ``metadata``:
    the metadata-build phase between block tables and kernels; ``layout``: how
    the caches lie in memory — a pool shared by groups, pages aliased across
    layers); ``sites``:
    the upstream files the bug lived in, as engine paths (vLLM's; SGLang's for runner
    ``sglang``) — a target that drives
    the engine's own code says which of them it runs (the vllm target's
    ``ENGINE_SITES``), so a trace's verdict there is real or ``n/a``; ``needs``:
    config fields without which the fault's code path never runs (a Mamba
    pool's fault on a config with no Mamba pool), refused in one line."""

    id: str
    runners: tuple[str, ...]
    description: str
    source: str
    invariant: str
    also: tuple[str, ...] = ()  # invariants that catch it first on some traces
    family: str = "core"  # catalogue grouping: core, metadata, spec-decode, scheduler, layout, async
    sites: tuple[str, ...] = ()  # the upstream files the bug lived in (vLLM paths)
    needs: tuple[str, ...] = ()  # config fields that must be set for it to fire at all

    def __post_init__(self):
        assert self.family in FAMILIES, (self.id, self.family)

    def to_json(self) -> dict:
        return {"id": self.id, "family": self.family, "runners": list(self.runners),
                "description": self.description, "source": self.source,
                "invariant": self.invariant, "also": list(self.also),
                "sites": list(self.sites)}

    def caught_by(self, invariant: str) -> bool:
        return invariant == self.invariant or invariant in self.also


CATALOGUE: dict[str, Fault] = {f.id: f for f in (
    Fault("removed-row-not-cleared", ("v1",),
          "remove_request leaves the removed row's block ids and num_blocks_per_row in place",
          "vLLM PR #37728 'Clear block-table rows in remove_request' "
          "(vllm/v1/worker/gpu_input_batch.py; the row was not cleared before it)",
          "VACATED_ROWS_ZERO",
          sites=("vllm/v1/worker/gpu_input_batch.py",)),
    Fault("vacated-row-not-cleared", ("v1",),
          "BlockTable.move_row copies the row into the hole but leaves the vacated source "
          "row's block ids and count (stale rows after condense)",
          "seed 000: fix to BlockTable.move_row in vllm/v1/worker/block_table.py "
          "(dummy runs wrote Mamba state into freed blocks)",
          "VACATED_ROWS_ZERO",
          sites=("vllm/v1/worker/block_table.py",)),
    Fault("full-replay-not-restaged", ("v1", "v2"),
          "a FULL-cudagraph dummy replay reuses the persistent state indices staged by the "
          "previous real batch instead of re-staging them from the dummy rows",
          "seed 000: _dummy_run in vllm/v1/worker/gpu_model_runner.py (V1) and execute_model "
          "in vllm/v1/worker/gpu/model_runner.py (V2) now re-stage metadata for FULL dummy "
          "replays (for_cudagraph_capture / for_capture)",
          "NO_STALE_WRITE",
          sites=("vllm/v1/worker/gpu_model_runner.py", "vllm/v1/worker/gpu/model_runner.py")),
    Fault("dummy-slots-not-padded", ("v1",),
          "dummy runs leave slot mappings as a zero-initialised buffer, so every dummy token "
          "maps to slot 0 of the null block",
          "seed 001: _dummy_run in vllm/v1/worker/gpu_model_runner.py now fills dummy slot "
          "mappings with PAD_SLOT_ID (-1)",
          "NULL_BLOCK_FINITE",
          sites=("vllm/v1/worker/gpu_model_runner.py",)),
    Fault("dummy-slots-unpadded-count", ("v1",),
          "dummy runs PAD-fill only the unpadded token count; the padded tail keeps the "
          "previous batch's slots, so padded dummy tokens write into other requests' blocks",
          "seed 001: _get_slot_mappings was called with num_tokens instead of "
          "num_tokens_padded in _dummy_run (vllm/v1/worker/gpu_model_runner.py)",
          "NO_STALE_WRITE",
          sites=("vllm/v1/worker/gpu_model_runner.py",)),
    Fault("dummy-tables-not-zeroed", ("v2",),
          "BlockTables.get_dummy_block_tables returns the persistent input block tables as "
          "the previous real batch left them, so dummy Mamba writes follow stale block ids",
          "seed 000: get_dummy_block_tables in vllm/v1/worker/gpu/block_table.py now zeroes "
          "the rows (keeping the persistent address); vLLM 0.26.0 still has the bug",
          "DUMMY_TABLES_ZERO",
          sites=("vllm/v1/worker/gpu/block_table.py",)),
    Fault("dummy-slots-partial-fill", ("v2",),
          "get_dummy_slot_mappings PAD-fills only the first num_tokens entries; the padded "
          "tail of the persistent buffer keeps the previous batch's slots",
          "seed 001: the V1 fix aligned _dummy_run with V2's get_dummy_slot_mappings, which "
          "fills the whole persistent buffer (vllm/v1/worker/gpu/block_table.py)",
          "MATCHES_REFERENCE", ("NO_STALE_WRITE",),
          sites=("vllm/v1/worker/gpu/block_table.py",)),
    Fault("kernel-block-size-ignored", ("v1", "v2"),
          "slot mapping picks the block-table column with the allocation block size "
          "(pos // block_size) although the table holds kernel blocks",
          "vLLM #24486 (kernel block size decoupled from the KV page size) and its follow-ups "
          "#31540 (EAGLE slot mapping used the wrong block size) and #38831 (V2 block table "
          "and slot mapping switched to kernel block sizes)",
          "NO_STALE_WRITE", ("MATCHES_REFERENCE",),
          sites=("vllm/v1/worker/block_table.py", "vllm/v1/worker/gpu/block_table.py")),
    Fault("kernel-blocks-count-unscaled", ("v1", "v2"),
          "num_blocks_per_row counts allocation blocks after they were expanded into k kernel "
          "blocks, so copies of the row (move_row, the V2 gather) and appends use a short count",
          "vLLM #24486 (map_to_kernel_blocks: a row's capacity is multiplied by "
          "block_size // kernel_block_size) and #38831 (V2 gather with per-group widths)",
          "MATCHES_REFERENCE",
          sites=("vllm/v1/worker/block_table.py", "vllm/v1/worker/gpu/block_table.py")),
    Fault("captured-buffer-rebound", ("v1", "v2"),
          "after start-up graph capture the runner re-allocates a persistent slot-mapping "
          "buffer instead of writing it in place: eager steps stage into the new tensor, "
          "captured FULL graphs keep reading the old one (seen at start-up)",
          "vllm/v1/worker/gpu_model_runner.py allocates its input and metadata buffers once "
          "('Persistent buffers for CUDA graphs') and fills them in place, because a captured "
          "graph replays the addresses it recorded; vllm-project/vllm PR #5074 (cudagraph "
          "input/output buffers shared across capture sizes)",
          "GRAPH_ADDRESSES_STABLE",
          sites=("vllm/v1/worker/gpu_model_runner.py", "vllm/v1/worker/gpu/model_runner.py")),
    Fault("padded-rows-classified-as-prefill", ("v1",),
          "is_prefilling of rows padded for a FULL graph is read from the persistent batch's "
          "counters, which a vacated row keeps after remove/condense; a padded row whose last "
          "request was mid-prompt makes the batch 'mixed', the Mamba builder skips refreshing "
          "the persistent decode state-index buffer, and the FULL replay updates the state "
          "blocks the previous all-decode FULL batch's rows held",
          "vllm-project/vllm issue #41841 'Stale padded request metadata can misclassify "
          "Mamba CUDA graph rows' and PR #42947 (clear is_prefilling for padded rows in "
          "GPUModelRunner._build_attention_metadata; vllm/v1/worker/gpu_model_runner.py now "
          "has 'is_prefilling[num_reqs:] = False'); the consumer is the Mamba builder's "
          "decode/prefill split and FULL-graph buffer update "
          "(vllm/v1/attention/backends/mamba_attn.py)",
          "PADDED_ROWS_NEUTRAL", ("NO_STALE_WRITE", "MATCHES_REFERENCE"), family="metadata",
          sites=("vllm/v1/worker/gpu_model_runner.py",)),
    Fault("padded-rows-metadata-stale", ("v1", "v2"),
          "rows padded for a FULL graph keep the previous batch's query_start_loc, seq_lens "
          "and initial-state flags: the replay's attention for a padded row reads "
          "(and its query start points into) what an earlier, larger batch staged there",
          "vllm/v1/worker/gpu_model_runner.py _prepare_inputs pads query_start_loc to be "
          "non-decreasing ('as kernels like FlashAttention requires that') and fills the "
          "seq_lens of rows past num_reqs with 0 ('for full cuda graph mode'); V2's "
          "vllm/v1/worker/gpu/model_runner.py pads its input batch the same way",
          "PADDED_ROWS_NEUTRAL", ("MATCHES_REFERENCE",), family="metadata",
          sites=("vllm/v1/worker/gpu_model_runner.py", "vllm/v1/worker/gpu/model_runner.py")),
    Fault("backend-slot-tail-stale", ("v1", "v2"),
          "an attention backend that keeps its own slot buffer copies only the batch's real "
          "tokens from the generic slot mapping and leaves the padded tail as an earlier, "
          "larger batch left it: a FULL replay (which runs the whole padded extent) writes "
          "the padding tokens' garbage into blocks those earlier slots pointed at",
          "vllm-project/vllm PR #33503 (vllm/v1/spec_decode/eagle.py: the proposer's own "
          "_slot_mapping_buffer is padded with PAD_SLOT_ID over the CUDA-graph padding range "
          "'so that _get_slot_mapping doesn't need to be called later'); the bug class: "
          "lightseekorg/tokenspeed PR #1218 ('a larger prior iteration leaves stale token ids, "
          "cache locations ... where the captured graph still reads'), InternLM/lmdeploy PR "
          "#4569 ('kv cache would be polluted if block_offsets contain data from previous step')",
          "NO_STALE_WRITE", ("MATCHES_REFERENCE", "NO_FOREIGN_READ", "NULL_BLOCK_FINITE"),
          family="metadata", sites=("vllm/v1/spec_decode/eagle.py",)),
    Fault("pad-slot-wraps-to-last-slot", ("v1", "v2"),
          "an attention backend's own cache write indexes the cache with the slot as a "
          "Python/torch index instead of skipping PAD_SLOT_ID: every padding token (-1) "
          "lands in the last slot of the last block, whoever owns it",
          "vllm-project/vllm issue #43810 (vllm/model_executor/models/extract_hidden_states.py "
          "basic_cache indexed its cache with the slot: -1 // block_size = -1, -1 % block_size "
          "= block_size - 1, the last slot); vLLM 0.26.0's basic_cache instead clamps -1 to "
          "slot 0 of its own cache-only group's null block (scratch there), and PR #43869 "
          "proposes skipping negative slots as reshape_and_cache does — the model's fixed "
          "path (here the backend writes the shared KV cache, whose null block is not "
          "scratch); the same class in NVIDIA/TensorRT-LLM PR #18673 (an FP8 indexer's own "
          "cache write with the -1 sentinel tail)",
          "NO_STALE_WRITE", ("MATCHES_REFERENCE", "NO_FOREIGN_READ"), family="metadata",
          sites=("vllm/model_executor/models/extract_hidden_states.py",)),
    Fault("decode-slots-sliced-prefill-first", ("v1", "v2"),
          "a Mamba-style mixer slices its state indices as if prefills came first while the "
          "batch is ordered decode-first: in a mixed batch decode row i updates the state "
          "slot of row num_prefills + i and the prefills take the decodes' slots — the "
          "reorder permuted the rows, the layer's view of the derived buffer did not follow",
          "vllm-project/vllm PR #40766 '[Bugfix] fix bailing_moe_linear decode index err' "
          "(vllm/model_executor/models/bailing_moe_linear.py: _decode_infer was ported from "
          "SGLang's prefill-first layout; decode requests in mixed batches read the wrong "
          "positions and 'update incorrect KV cache state slots'; fixed by slicing decodes "
          "from 0: slot_start=0, slot_end=num_decodes)",
          "NO_FOREIGN_READ", ("MATCHES_REFERENCE", "NO_STALE_WRITE", "LOADED_BLOCKS_INTACT"),
          family="metadata", sites=("vllm/model_executor/models/bailing_moe_linear.py",)),
    Fault("swap-rows-aliased", ("v1",),
          "swap_states swaps a 2-D per-row buffer (here the block-table rows) with a tuple "
          "of row views, so both rows end up holding the second row's block ids; the "
          "decode-first reorder follows swap cycles and spreads the damage over rows",
          "vllm-project/vllm PR #48419 '[Bugfix] V1: fix allowed_token_ids_mask aliasing in "
          "InputBatch.swap_states' (vllm/v1/worker/gpu_input_batch.py: the tuple-of-views "
          "swap left both rows with row i2's contents, and "
          "reorder_batch_to_split_decodes_and_prefills calls swap_states along swap cycles); "
          "the same idiom on the block-table rows here",
          "NO_STALE_WRITE", ("MATCHES_REFERENCE", "NO_FOREIGN_READ"), family="metadata",
          sites=("vllm/v1/worker/gpu_input_batch.py", "vllm/v1/worker/block_table.py")),
    Fault("dummy-rows-not-committed", ("v1",),
          "an idle rank's dummy run removes the unscheduled requests from the persistent batch "
          "(host rows cleared) but builds its attention metadata without committing the rows "
          "to the device table: the Mamba builder reads the rows the last real batch "
          "committed, and the FULL dummy replay writes NaN state into those requests' blocks",
          "vllm/v1/worker/gpu_model_runner.py _dummy_run commits the block table before "
          "building metadata ('Sync block table CPU->GPU so cleared rows from remove_request() "
          "are visible to the attention metadata builder. Without this, stale block IDs from "
          "finished requests can corrupt Mamba state'), the companion of remove_request's "
          "clear_row (vLLM PR #37728)",
          "DUMMY_TABLES_ZERO", ("NO_STALE_WRITE", "MATCHES_REFERENCE"), family="metadata",
          sites=("vllm/v1/worker/gpu_model_runner.py",)),
    Fault("draft-slots-tail-stale", ("v1", "v2"),
          "the drafter's single-token passes compute their slot mapping for the real rows "
          "only: rows padded for the drafter's FULL graph keep the slots an earlier, larger "
          "draft batch left there, so the replay writes draft KV (or a dummy run's NaN) into "
          "blocks of requests that have since finished or moved",
          "sgl-project/sglang PR #22958 ('add padding handling in multi-layer EAGLE draft "
          "extend CUDA graph runner': padded rows [raw_bs:bs] kept stale req_pool_indices and "
          "out_cache_loc from earlier calls); vllm-project/vllm PR #33503 "
          "(vllm/v1/spec_decode/eagle.py fills the proposer's _slot_mapping_buffer with "
          "PAD_SLOT_ID over the CUDA-graph padding range) and PR #43682 (padded rows of the "
          "EAGLE draft-step kernel eagle_step_slot_mapping_metadata_kernel)",
          "PADDED_ROWS_NEUTRAL", ("NO_STALE_WRITE", "MATCHES_REFERENCE", "NULL_BLOCK_FINITE"),
          family="spec-decode",
          sites=("vllm/v1/spec_decode/eagle.py", "vllm/v1/spec_decode/utils.py")),
    Fault("accepted-column-unbounded", ("v1", "v2"),
          "the spec-decode Mamba kernel computes the running state column as "
          "num_accepted_tokens - 1 with no lower bound: a row whose count is 0 (a partial "
          "prefill's discarded sample) reads its initial state through the previous row's "
          "last column — another request's state block (row 0: before the tensor)",
          "vllm-project/vllm PR #48475 '[Bugfix] Clamp spec-decode state index load for zero "
          "num_accepted_tokens in GDN kernels' (issue #41190; "
          "vllm/model_executor/layers/fla/ops/fused_recurrent.py computes i_t = "
          "num_accepted - 1 and loads ssm_state_indices[i_n * stride + i_t]; the fix clamps to "
          "0 as vllm/v1/worker/mamba_utils.py already did); also PR #50021",
          "NO_FOREIGN_READ", ("MATCHES_REFERENCE",), family="spec-decode",
          sites=("vllm/model_executor/layers/fla/ops/fused_recurrent.py",)),
    Fault("accepted-counts-land-after-condense", ("v1",),
          "the sampler's accepted counts are copied into the persistent batch by batch row "
          "only after the next step's _update_states removed, condensed and reordered the "
          "rows: a count lands on whichever request now holds that row, and the Mamba kernel "
          "starts that request from the wrong state column",
          "vllm-project/vllm PR #45100 '[Bugfix] Avoid racy accepted counts in async spec "
          "decode' (vllm/v1/worker/gpu_model_runner.py: the non-blocking copy into "
          "input_batch.num_accepted_tokens_cpu_tensor landed around swap_states()/condense(), "
          "so the GDN builder saw another row's count)",
          "ROW_RESULTS_FOLLOW_REQUESTS", ("MATCHES_REFERENCE", "NO_STALE_WRITE"),
          family="spec-decode", sites=("vllm/v1/worker/gpu_model_runner.py",)),
    Fault("draft-slots-allocation-block-size", ("v1", "v2"),
          "the drafter computes its slot mapping with the KV-cache group's allocation block "
          "size although the block table holds kernel blocks: column pos // block_size of a "
          "kernel-block row, times block_size — draft KV lands in other blocks, or past them",
          "vllm-project/vllm PR #31540 '[Bugfix] Fix block size used in EAGLE slot mapping' and "
          "PR #36036 '[Bugfix] Fix block_size for hybrid model MTP' (issue #35926; "
          "vllm/v1/spec_decode/eagle.py: 'use the attention block size and not the KV cache "
          "block size')",
          "NO_STALE_WRITE", ("MATCHES_REFERENCE",), family="spec-decode",
          sites=("vllm/v1/spec_decode/eagle.py",)),
    Fault("touch-leaves-block-in-free-queue", ("v1", "v2"),
          "a prefix hit counts its holder on a cached block with no holders but leaves it in "
          "the free queue, so the pool counts it free and a later allocation hands it to "
          "another request while the hitting request still reads it",
          "the touch / free-queue removal on a prefix hit in vllm/v1/core/block_pool.py "
          "(BlockPool.touch); vLLM PR #44409 (hit blocks evicted and handed out before "
          "they were touched: one block twice, bad ref_cnt), mini-sglang #52 (a matched "
          "radix node left unlocked, evictable while in use)",
          "POOL_ACCOUNTING", ("ONE_OWNER_PER_BLOCK",), family="scheduler",
          sites=("vllm/v1/core/block_pool.py",)),
    Fault("cache-blocks-before-compute", ("v1", "v2"),
          "allocation registers a request's blocks in the prefix cache for the tokens it is "
          "about to compute, so a request admitted before they are computed hits blocks "
          "that hold no KV yet",
          "allocate_slots calls cache_blocks for num_computed + num_new_tokens before the "
          "forward (vllm/v1/core/kv_cache_manager.py); vLLM issue #37152 / PR #38715 (a "
          "same-step hit on blocks registered but not yet written)",
          "PREFIX_CONTENT", ("ONE_OWNER_PER_BLOCK", "MATCHES_REFERENCE"), family="scheduler",
          sites=("vllm/v1/core/kv_cache_manager.py",
                 "vllm/v1/core/single_type_kv_cache_manager.py")),
    Fault("sliding-window-boundary-early", ("v1", "v2"),
          "the first position a sliding window still needs is computed one token late "
          "(num_computed - window + 2), so the block holding the oldest position the next "
          "token attends to is freed and its entry nulled while it is still read",
          "SlidingWindowManager.remove_skipped_blocks / get_num_skipped_tokens in "
          "vllm/v1/core/single_type_kv_cache_manager.py (last useful token = num_computed - "
          "sliding_window + 1); vLLM PR #23480's review of that boundary and PR #34568 (an "
          "off-by-one early return in remove_skipped_blocks), #14097 (sliding-window hits "
          "need cdiv(sliding_window - 1, block_size) blocks)",
          "POOL_ACCOUNTING", ("NO_FOREIGN_READ",), family="scheduler",
          sites=("vllm/v1/core/single_type_kv_cache_manager.py",)),
    Fault("hit-not-capped-below-prompt", ("v1", "v2"),
          "the prefix-cache lookup may cover the whole prompt, so a prompt that is all "
          "cached skips its last token (whose logits the first sample needs) and the "
          "request's hit disagrees with the cache's rule",
          "get_computed_blocks' max_cache_hit_length = num_tokens - 1 in "
          "vllm/v1/core/kv_cache_manager.py; vLLM PRs #11186 and #17999 (recompute the "
          "last token of a fully cached prompt)",
          "PREFIX_CONTENT", family="scheduler",
          sites=("vllm/v1/core/kv_cache_manager.py",)),
    Fault("sliding-window-eagle-drop-unextended", ("v1", "v2"),
          "with a drafter, the sliding-window prefix-cache lookup drops the last matched "
          "block (the drafter recomputes it) after finding a run of only cdiv(window - 1, "
          "block_size) cached blocks, so the hit keeps one block less than its window "
          "needs: the first block the next token attends to is the null block",
          "vllm-project/vllm PR #17398 '[v1][Spec Decode] Make sliding window compatible "
          "with eagle prefix caching' (vllm/v1/core/specialized_manager.py, now "
          "single_type_kv_cache_manager.py SlidingWindowManager: window 4, block 2 needs 2 "
          "blocks, [NULL, NULL, A, B] became [NULL, NULL, A]; the fix searches one more "
          "contiguous block before dropping)",
          "POOL_ACCOUNTING", ("PREFIX_CONTENT", "NO_FOREIGN_READ", "MATCHES_REFERENCE"),
          family="scheduler", sites=("vllm/v1/core/single_type_kv_cache_manager.py",)),
    Fault("mamba-align-seed-attention-block-size", ("v2",),
          "with Mamba prefix caching (align mode) the V2 runner seeds a new request's "
          "running Mamba column as (num_computed_tokens - 1) // block_size with the least "
          "block size over the prefix-cacheable groups instead of the Mamba block size: on "
          "a prefix hit whose attention blocks are smaller than the Mamba state blocks, the "
          "first step copies the state from the wrong column (a null pad, a stale id, past "
          "the row) or none at all, and the request continues from a wrong recurrent state",
          "vllm-project/vllm issue #55600 / PR #55601 '[Bugfix] Seed hybrid mamba state "
          "index with mamba_block_size on prefix-cache hits' "
          "(vllm/v1/worker/gpu/model_states/mamba_hybrid.py MambaHybridModelState."
          "add_request divided by cache_config.block_size, which the engine sets to the "
          "min over prefix-cacheable groups; preprocess then copied block_table[src_col]); "
          "issue #53142 (wrong Mamba state restored on hits in hybrid models)",
          "MATCHES_REFERENCE", ("NO_FOREIGN_READ", "NULL_BLOCK_FINITE"), family="scheduler",
          sites=("vllm/v1/worker/gpu/model_states/mamba_hybrid.py",)),
    Fault("mamba-all-boundary-on-chunk-grid", ("v1", "v2"),
          "with Mamba prefix caching in all mode, the Mamba kernel writes a chunk's "
          "intermediate states at its own chunks of block_size tokens counted from the "
          "chunk's start (the i-th into column block_idx_first_scheduled_token + i) and the "
          "final state into block_idx_last_scheduled_token: a chunk that starts inside a "
          "state block and crosses its end never writes that block's end state, so the "
          "block keeps the state at the previous chunk's end and is registered in the "
          "prefix cache as if it held its whole prefix",
          "vllm-project/vllm PR #34587 '[Bugfix] - Fix Mamba prefix caching corruption with "
          "chunked prefill' (mamba_cache_mode='all': chunks of 1866 then 1160 tokens over "
          "2048-token state blocks left block 0 at 1866 tokens, cached as if complete; the "
          "kernel wrote intermediate chunks at block_idx_first_scheduled + chunk_idx)",
          "MATCHES_REFERENCE", ("PREFIX_CONTENT",), family="metadata",
          sites=("vllm/model_executor/layers/mamba/ops/mamba_ssm.py",)),
    Fault("mamba-short-chunk-conv-to-source", ("v1", "v2"),
          "with Mamba prefix caching in all mode, a prefill chunk shorter than the conv "
          "state stores its new conv state through the block it read its initial state "
          "from (block_idx_last_computed_token) instead of its own last scheduled block: "
          "the request's block keeps a stale conv state, and the block it read — a shared "
          "prefix-cache block on a hit — is overwritten",
          "vllm-project/vllm PR #56196 '[Bugfix][Kernel] Mamba: store a short prefill "
          "chunk's conv state in its own block' (_causal_conv1d_fwd_kernel's shift-left "
          "branches stored through conv_states_base, the initial state's pointer, not "
          "block_idx_last_scheduled_token's)",
          "MATCHES_REFERENCE", ("CACHED_BLOCKS_IMMUTABLE", "NO_STALE_WRITE", "PREFIX_CONTENT"),
          family="metadata",
          sites=("vllm/model_executor/layers/mamba/ops/causal_conv1d.py",)),
    Fault("mamba-state-view-unpadded-stride", ("v1", "v2"),
          "with KV-cache tensors shared by attention and Mamba layers (kv_sharing), the Mamba "
          "state tensor is laid over the shared buffer with the state's own size as its block "
          "stride instead of the page size: block b's state lands b * state_size elements "
          "into the buffer — inside another block's page, which an attention group (or the "
          "null block) holds",
          "vllm-project/vllm-ascend PR #15408 (an attention block size that no longer matched "
          "the page: its KV scatter overwrote the Mamba state sharing the allocation) and PR "
          "#15152 (equal padded page sizes, different block strides: one group's write "
          "overlapped a live block of another group); vLLM PR #45207 (the hybrid allocator's "
          "page-size unification: the Mamba state-tensor "
          "builder in gpu_model_runner derives the page stride from page_size_bytes, padded "
          "to the shared page, and lays the state components inside each page by offset; "
          "issue #43626) and vllm-project/vllm-ascend PR #14543 (a state slot sized against "
          "a K-only page while the padding used the K+V page) — the class of bug where a "
          "state view's block stride disagrees with the page the groups share",
          "MATCHES_REFERENCE", ("NO_STALE_WRITE", "NULL_BLOCK_FINITE", "NO_FOREIGN_READ"),
          family="layout", sites=("vllm/v1/worker/gpu_model_runner.py",)),
    Fault("mamba-writes-shared-null-block", ("v1", "v2"),
          "with pages shared by attention and Mamba layers (kv_sharing), the Mamba kernel "
          "still treats block 0 as scratch, as it may with a Mamba pool of its own: dummy "
          "rows (zeroed tables) and rows padded with the null block write their (garbage) "
          "state into the null page — which is also the attention null block that masked "
          "reads gather (0 * NaN = NaN)",
          "vllm-project/vllm issue #57156 / PR #57158 (dummy capture batches with all-zero "
          "block tables poison the null KV block; kernels that gather block 0 for masked "
          "entries then turn every row NaN; the fix re-zeroes block 0 after capture) and PR "
          "#36939 (the same mitigation); PR #39810 (hybrid Mamba + attention models under FULL "
          "CUDA graphs: capture-time NaN in KV-cache blocks) — the class where block 0's page "
          "is scratch for one layer and read by another",
          "NULL_BLOCK_FINITE", ("NO_STALE_WRITE", "MATCHES_REFERENCE", "ATTENTION_FINITE"),
          family="layout", sites=("vllm/model_executor/layers/mamba/ops/mamba_ssm.py",)),
    Fault("row-width-first-group-block-size", ("v1", "v2"),
          "with a max_model_len and attention groups of different block sizes, every "
          "attention group's block-table row is sized cdiv(max_model_len, block_size) with "
          "the first group's block size: a group of smaller blocks gets a row too narrow for "
          "the blocks a long request holds (the append overflows the row), a group of larger "
          "blocks one wider than the engine's",
          "vllm-project/vllm-ascend PR #11466 / #11659 ('Resolve block table overflow': a "
          "hybrid model's per-request block count was computed before the Mamba groups' "
          "speculative blocks were accounted, so the table was too narrow) — the class of a "
          "row width computed from the wrong group's quantities; vLLM's InputBatch and V2 "
          "BlockTables size each KV-cache group's row from max_model_len and that group's own "
          "block size",
          "MATCHES_REFERENCE", ("IMPL_CRASH",), family="layout",
          sites=("vllm/v1/worker/gpu_input_batch.py", "vllm/v1/worker/gpu/block_table.py")),
    Fault("mamba-pad-index-clamped-to-zero", ("v1", "v2"),
          "the Mamba kernel's wrapper clamps the state indices to >= 0 before the kernel "
          "(a gather that cannot take -1), so every PAD_SLOT_ID row (rows padded to a capture "
          "size, empty dummy rows) reads and writes block 0: harmless where block 0 is a "
          "reserved null block, a live request's state where it is not (mamba_padding "
          "pad_slot_no_null)",
          "lightseekorg/tokenspeed PR #700 (MTP CUDA-graph padding: -1 state indices were "
          "clamped to 0, and Mamba slot 0 is allocatable in the radix cache, so padded rows "
          "overwrote a live request's SSM state; the fix keeps -1 and lets the kernel skip "
          "it); NVIDIA/Megatron-LM PR #6499 (a read-side clamp of -1 batch indices, writes "
          "masked) — the class of a PAD_SLOT_ID sentinel turned into a real index",
          "PADDED_ROWS_NEUTRAL", ("NO_STALE_WRITE", "MATCHES_REFERENCE", "NO_FOREIGN_READ",
                                  "NULL_BLOCK_FINITE"),
          family="layout", sites=("vllm/model_executor/layers/mamba/ops/mamba_ssm.py",)),
    Fault("mamba-pad-index-to-last-slot", ("v1", "v2"),
          "the Mamba kernel's wrapper redirects PAD_SLOT_ID rows to the pool's last block "
          "(num_blocks - 1), taken for a trailing sentinel; with PAD_SLOT_ID padding that "
          "block is an ordinary one, so padded and empty dummy rows write their state into "
          "whichever request holds it",
          "sgl-project/sglang PR #38997 (the NVIDIA KDA wrapper remapped cache_indices == -1 "
          "to ssm_states.shape[0] - 1, described as the pool's trailing sentinel, but the "
          "Mamba pool reserves slot 0 and hands out the last slot, so a padded row could "
          "overwrite a live request's or a radix checkpoint's SSM state) — the class of a "
          "sentinel mapped to the wrong reserved slot",
          "PADDED_ROWS_NEUTRAL", ("NO_STALE_WRITE", "MATCHES_REFERENCE", "NO_FOREIGN_READ"),
          family="layout", sites=("vllm/model_executor/layers/mamba/ops/mamba_ssm.py",)),
    Fault("kv-params-store-unguarded", ("v1", "v2"),
          "with a quantized KV cache (kv_cache_dtype int8), the write kernel skips "
          "PAD_SLOT_ID for the payload store but not for the parameter (scale, zero point) "
          "store, which indexes the parameter buffer as torch would: every padding token "
          "(-1) writes its parameters into the cache's last slot — a dummy run's NaN "
          "parameters, or a padded token's, under whatever token holds that slot",
          "alibaba/rtp-llm PR #1256 (FP8 KV writes repaired: the quantize-and-store kernel "
          "now ignores the -1 padding sentinel), local-inference-lab/b12x PR #37 (a packed "
          "payload + scales KV writer shipped with negative-slot guard tests), "
          "sgl-project/sglang PR #14482 (per-token k/v scale buffers beside the pages, "
          "written by slot index) — the class of a quantized KV write whose scale store "
          "misses the guard its payload store has",
          "NO_STALE_WRITE", ("MATCHES_REFERENCE", "ATTENTION_FINITE", "LOADED_BLOCKS_INTACT",
                             "NULL_BLOCK_FINITE"),
          family="layout", sites=("vllm/_custom_ops.py",)),  # reshape_and_cache_flash
    Fault("completed-counts-land-by-row", ("v1",),
          "async scheduling: when a dispatched step completes, its accepted counts are "
          "copied into the persistent batch by the batch rows the step had at dispatch; a "
          "remove, condense or the next dispatch in between moved the rows, so a count lands "
          "on another request, which then starts its next spec step from the wrong Mamba "
          "state column",
          "vllm-project/vllm PR #51599 '[Bugfix][MRv1] Decouple async Mamba align D2H counts "
          "from InputBatch row shifts' (issue #51571; vllm/v1/worker/gpu_model_runner.py: "
          "condense() moved rows while the copy into num_accepted_tokens_cpu_tensor was in "
          "flight; the fix copies into a runner-owned buffer and remaps by request after the "
          "event sync); the same bug in vllm-project/vllm-ascend PR #13864 (issue #13863 'Async "
          "MTP can reuse stale accepted-token counts after batch condense')",
          "ROW_RESULTS_FOLLOW_REQUESTS", ("MATCHES_REFERENCE", "NO_STALE_WRITE",
                                          "NO_FOREIGN_READ"),
          family="async", sites=("vllm/v1/worker/gpu_model_runner.py",)),
    Fault("finished-request-frees-blocks-mid-store", ("v1", "v2"),
          "a request that finishes while a connector is still saving its KV to an external "
          "store has its blocks freed at once: the store's copy reads blocks the pool may "
          "already have handed to another request, and saves that request's KV (or the "
          "allocator's garbage) under the first request's prefix",
          "vllm-project/vllm PR #39186 '[KV Offload] Per-job store completion for CPU "
          "offloading connector' (request_finished returned False too early, so the blocks "
          "were freed before the worker reported finished_sending); vllm-project/vllm issue "
          "#52360 '[MooncakeStoreConnector]: Preemption frees GPU blocks while async store "
          "jobs are still reading them, storing KV that does not belong to the key'",
          "NO_FREE_WHILE_PENDING", ("STORE_PROVENANCE", "MATCHES_REFERENCE", "POOL_ACCOUNTING",
                                    "ONE_OWNER_PER_BLOCK"),
          family="async",
          sites=("vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py",
                 "vllm/v1/core/sched/scheduler.py")),
    Fault("resumed-blocks-appended", ("v1", "v2"),
          "a request resumed after preemption (recompute) gets its new block ids appended "
          "to the ones it held before, instead of replacing them: its row starts with "
          "blocks it gave back, and its recomputed KV lands in blocks another request may "
          "hold now",
          "vllm-project/vllm PR #46595 '[Bugfix][MooncakeStore] track resumed requests via "
          "scheduler's resumed_req_ids' (the connector appended a resumed request's "
          "new_block_ids to its old ones because its own preempted set drifted); the "
          "runner's branch is vllm/v1/worker/gpu_model_runner.py _update_states "
          "(resumed_from_preemption: replace, else append), revised in vllm-project/vllm PR "
          "#26385 '[BugFix] Fix async scheduling + request preemption'",
          "MATCHES_REFERENCE", ("NO_STALE_WRITE", "NO_FOREIGN_READ", "LOADED_BLOCKS_INTACT",
                                "VACATED_ROWS_ZERO"),
          family="async", sites=("vllm/v1/worker/gpu_model_runner.py",)),
    Fault("abort-frees-blocks-mid-load", ("v1", "v2"),
          "a request removed (aborted) while a KV load into its blocks is in flight has its "
          "blocks freed at once instead of when the last load ends: the connector's late "
          "write lands in blocks the pool may already have handed to another request",
          "vllm-project/vllm PR #32255 '[BugFix] scheduler: Delay freeing blocks of aborted "
          "async loads' (vllm/v1/core/sched/scheduler.py, finish_requests / "
          "_update_from_kv_xfer_finished); the same class in sgl-project/sglang PR #35049 "
          "'[PD] Deferred decode-side KV release for aborts mid-transfer' (issue #24527: "
          "decode reused KV pages before the prefill writer finished)",
          "NO_FREE_WHILE_PENDING", ("MATCHES_REFERENCE", "POOL_ACCOUNTING",
                                    "ONE_OWNER_PER_BLOCK", "NO_STALE_WRITE"),
          family="async", sites=("vllm/v1/core/sched/scheduler.py",)),
    Fault("failed-load-frees-before-siblings", ("v1", "v2"),
          "when one of a request's several KV-load handles fails, the request is failed and "
          "its blocks freed while its sibling handles are still writing into them",
          "vllm-project/vllm PR #56104 '[Bugfix][NIXL] Fix multiple handles xfer race' "
          "(vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py: the first handle "
          "in error reported the request failed before the others had stopped; a request "
          "given the blocks next could be corrupted)",
          "NO_FREE_WHILE_PENDING", ("MATCHES_REFERENCE", "POOL_ACCOUNTING",
                                    "ONE_OWNER_PER_BLOCK", "NO_STALE_WRITE"),
          family="async",
          sites=("vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py",)),
    Fault("onboard-leaves-host-blocks-evictable", ("v1", "v2"),
          "a load from the host tier does not take its host blocks out of the eviction "
          "order: an offload that needs room evicts a host block the load is still reading, "
          "writes another prefix's KV into its slot, and the load lands that KV in the new "
          "request's blocks",
          "sgl-project/sglang PR #27444 '[UnifiedTree]: Pin host buffers across async H->D "
          "in UnifiedRadixCache.load_back' (python/sglang/srt/mem_cache/"
          "unified_radix_cache.py: load_back held only the device lock while host eviction "
          "is gated by host_lock_ref, so a host page was evicted, reused and overwritten "
          "while the H2D copy read it); the same in HiRadixCache, sgl-project/sglang PR "
          "#31427 'Protect HiRadix host KV until load-back ack'",
          "NO_FREE_WHILE_PENDING", ("STORE_PROVENANCE", "MATCHES_REFERENCE",
                                    "LOADED_BLOCKS_INTACT"),
          family="async", sites=("vllm/v1/kv_offload/cpu/manager.py",)),
    Fault("host-store-evicts-its-own-blocks", ("v1", "v2"),
          "the host tier, making room for an offload, may evict a block whose hash the same "
          "offload names and the tier already holds: that prefix silently leaves the host "
          "tier although it was just offloaded again",
          "vllm-project/vllm PR #35846 '[Bugfix][CPUOffloadingManager] Prevent eviction of "
          "already-stored blocks in LRU/ARC prepare_store()' (vllm/v1/kv_offload/"
          "lru_manager.py, arc_manager.py: the eviction candidates were not checked against "
          "the hashes being stored)",
          "STORE_PROVENANCE", (), family="async",
          sites=("vllm/v1/kv_offload/cpu/manager.py",)),
    Fault("offload-copy-skips-compute-wait", ("v1", "v2"),
          "async scheduling: a GPU -> host copy (an offload to the host tier, or a save to "
          "the external store) is launched on its own stream without waiting for the compute "
          "stream; while the step that writes the copied blocks is still in flight, the copy "
          "reads them as they were before that step, and the tier keeps that stale content "
          "under the prefix's hash",
          "vllm-project/vllm PR #46278 '[Bugfix][KVConnector] Fix SimpleCPUOffloadConnector "
          "GPU->CPU store race' (issue #45704: the store copy had no event or wait_stream on "
          "the compute stream, so under overlapped execution it read blocks whose KV-write "
          "kernels had not retired); the same hazard fixed for OffloadingConnector in "
          "vllm-project/vllm PR #31341 '[BugFix] Wait for compute before offloading KV to CPU'",
          "STORE_PROVENANCE", ("MATCHES_REFERENCE",), family="async",
          sites=("vllm/v1/kv_offload/worker/cpu_gpu.py", "vllm/v1/simple_kv_offload/worker.py",
                 "vllm/distributed/kv_transfer/kv_connector/v1/simple_cpu_offload/worker.py")),
    Fault("spec-decodes-split-as-prefills", ("v1", "v2"),
          "with speculative decoding the Mamba metadata builder still splits decodes from "
          "prefills at one token, so a decode verifying its drafts (1 + k tokens) counts "
          "as a prefill: a uniform 1 + k batch dispatched to its FULL graph never "
          "refreshes the persistent decode state-index buffer the graph reads, and the "
          "replay runs on the indices of an earlier batch",
          "vllm-project/vllm PR #33726 (Mamba speculative decoding: decode state indices "
          "with 1 + k columns and num_accepted_tokens; the builder's decode threshold is the "
          "reorder threshold 1 + k when accepted counts are passed, mamba_attn.py) and "
          "vllm-project/vllm-ascend PR #15461 (garbled output with MTP k=2 under FULL / "
          "FULL_DECODE_ONLY: the persistent state metadata was not refreshed before a uniform "
          "decode graph's replay)",
          "NO_STALE_WRITE", ("MATCHES_REFERENCE", "NO_FOREIGN_READ"), family="spec-decode",
          sites=("vllm/v1/attention/backends/mamba_attn.py",)),
    Fault("mamba-align-spec-accepted-not-reset", ("v1", "v2"),
          "with Mamba prefix caching in align mode and a drafter, the copy before the "
          "forward moves a request's running state (the column accepted - 1 past its old "
          "running column) to the new running column, but leaves the accepted count as it "
          "was: the kernel then reads its initial state accepted - 1 columns past the new "
          "running column, a speculative block the previous step never wrote",
          "vllm-project/vllm PR #42792 (Model Runner V2 support for spec decode with Mamba "
          "align prefix caching; its review: after a block boundary is crossed, the kernel "
          "read its initial state from a staging column the previous step never wrote, "
          "fixed by resetting num_accepted_tokens to 1 when the state moves, as V1's "
          "preprocess_mamba does and V2's preprocess_mamba_align_fused_kernel now does)",
          "MATCHES_REFERENCE", family="spec-decode", sites=("vllm/v1/worker/mamba_utils.py",)),
    Fault("mamba-align-spec-postprocess-bias-dropped", ("v1", "v2"),
          "with Mamba prefix caching in align mode and a drafter, when a step's accepted "
          "tokens complete a Mamba block, the copy after the forward fills that block from "
          "the running column itself instead of the column of the token that completes it "
          "(the accepted-token bias dropped): the block is registered holding the state "
          "after the step's first token, not the state at its end",
          "vllm-project/vllm PR #45682 ('[Bugfix][Mamba] Fix DS conv state copy in fused "
          "postprocess kernel': the fused postprocess copied the wrong slice of the state "
          "whenever speculative decoding accepted more than one token, silently corrupting "
          "the cached state; issue #38898) — modelled as the whole state taken from the "
          "wrong column",
          "MATCHES_REFERENCE", family="spec-decode", sites=("vllm/v1/worker/mamba_utils.py",)),
    Fault("slot-mapping-row-unguarded", ("v1", "v2"),
          "the slot-mapping kernel bounds its block-table load by token validity and DCP "
          "ownership but not by the row's width: for a group whose row is narrower than the "
          "request (a cache-only or tail group), a position past the row reads the next "
          "row's entries — another request's block, or block 0 where the row is empty — "
          "and past the table's end whatever lies there, so the KV write lands outside the "
          "request's own blocks instead of being dropped (PAD_SLOT_ID)",
          "vllm-project/vllm issue #53982 '_compute_slot_mapping_kernel reads block_table "
          "out of bounds for cache groups whose block table is narrower than the sequence' "
          "(GPU memory faults on MI325X) and PR #54296 'Guard slot mapping block table loads' "
          "(the load masked by column < block_table_stride and PAD_SLOT_ID emitted, in V1's "
          "kernel and V2's _compute_slot_mappings_kernel)",
          "NO_STALE_WRITE", ("MATCHES_REFERENCE",), family="core",
          sites=("vllm/v1/worker/block_table.py", "vllm/v1/worker/gpu/block_table.py")),
    # -- SGLang's history (runner "sglang": the sglang target re-creates each bug in the
    # installed SGLang's own code, at the place it lived: harness/targets/sglang_faults.py)
    Fault("sgl-padding-keeps-stale-cache-loc", ("sglang",),
          "the decode CUDA graph's padding fills the real rows of its out_cache_loc buffer "
          "but leaves the padded rows as the previous replay left them, so a padded row's "
          "garbage KV lands in a slot an earlier batch's request wrote (its own, or one "
          "freed and handed out again) instead of the reserved slot 0",
          "sgl-project/sglang PR #24743 'fix(cuda_graph): zero out_cache_loc_swa on pad' "
          "(the hybrid-SWA buffer was not zeroed on pad, so padded tokens wrote junk KV "
          "into live SWA slots of previously active requests; re-created on the one "
          "out_cache_loc buffer this model has)",
          "SGL_PADDING_RESERVED", ("SGL_NO_STALE_WRITE", "SGL_KV_MATCHES"), family="core",
          sites=("sglang/srt/model_executor/cuda_graph_runner.py",
                 "sglang/srt/model_executor/cuda_graph_buffer_registry.py")),
    Fault("sgl-request-row-0-handed-out", ("sglang",),
          "ReqToTokenPool hands out request row 0 like any other, while padded graph rows "
          "point their req_pool_indices at 0: a live request shares the padding row",
          "sgl-project/sglang PR #24243 'Reserve slot 0 as padding in all req pools' "
          "(before it, free_slots started at 0 and padded batches' req_pool_indices, "
          "zero-initialised, aliased a real request's row)",
          "SGL_RESERVED_UNREAD", family="core",
          sites=("sglang/srt/mem_cache/memory_pool.py",)),
    Fault("sgl-checkpoint-row-not-remapped", ("sglang",),
          "publishing a running request's KV into the radix tree frees the slots the tree "
          "already held for the same tokens (duplicates) but leaves the request's "
          "req_to_token row pointing at them instead of at the tree's slots: the request "
          "holds freed slots, which the allocator hands out again",
          "sgl-project/mini-sglang PR #142 'Fix radix cache duplicate prefix remapping' "
          "(SGLang's minimal engine: the unfinished request's page table kept the freed "
          "duplicates); SGLang's trees remap in checkpoint (cache_unfinished_req in 0.5.20) "
          "after their insert",
          "SGL_SLOTS_ACCOUNTED", ("SGL_KV_MATCHES",), family="scheduler",
          sites=("sglang/srt/mem_cache/unified_radix_cache.py",
                 "sglang/srt/mem_cache/radix_cache.py")),
    Fault("sgl-lock-skips-matched-node", ("sglang",),
          "locking a prefix hit walks from the matched node's parent, so the matched node "
          "itself stays unlocked: eviction may free the slots a live request's hit reads",
          "sgl-project/mini-sglang PR #52 'Fix: Missed lock/unlock of current node in "
          "RadixCacheManager when using lock_handle' (the walk moved to the parent before "
          "locking; SGLang's inc_lock_ref / dec_lock_ref walk from the node itself)",
          "SGL_SLOTS_ACCOUNTED", ("SGL_KV_MATCHES", "SGL_TREE_CONTENT"), family="scheduler",
          sites=("sglang/srt/mem_cache/unified_cache/unified_tree_core.py",
                 "sglang/srt/mem_cache/radix_cache.py")),
    Fault("sgl-mamba-slot-0-handed-out", ("sglang",),
          "a hybrid model's Mamba slot allocator hands out slot 0 like any other, while "
          "the decode graphs' capture writes its dummy rows' state there: a request, or the "
          "radix tree's copy of a prefix's state, holds the padding slot",
          "sgl-project/sglang PR #17404 '[BUGFIX] Skip Mamba Cache Slot 0 to Avoid Using "
          "Dummy Cache' (the Mamba pool's free slots started at 0; graph capture's dummy "
          "state in slot 0 could be used by the prefix cache)",
          "SGL_STATE_RESERVED", ("SGL_STATE_ACCOUNTED",), family="core",
          sites=("sglang/srt/mem_cache/allocator/mamba.py",
                 "sglang/srt/mem_cache/memory_pool.py"), needs=("mamba_slots",)),
    Fault("sgl-mamba-padding-keeps-stale-state-index", ("sglang",),
          "a decode graph replay refreshes the state indices of its real rows only: a "
          "padded row keeps the index an earlier, larger batch left in the captured "
          "buffer — a finished request's slot, now free or the radix tree's — and the "
          "padded row's garbage state is written there",
          "xLLM-AI/xllm PR #1904 'bugfix: fix mlu graph linear state padding.' (the graph's "
          "padded rows kept an old linear-state id and the GDN decode kernel polluted a "
          "real request's state; SGLang's Mamba backend points padded rows at PAD_SLOT_ID "
          "in _replay_metadata, re-created there without that step) — the seed bug's "
          "shape (stale rows let padded runs write Mamba state into freed blocks) in "
          "SGLang's Mamba pool",
          "SGL_STATE_RESERVED", ("SGL_STATE_NO_STALE_WRITE", "SGL_STATE_TREE_CONTENT",
                                 "SGL_STATE_MATCHES"), family="core",
          sites=("sglang/srt/layers/attention/hybrid_linear_attn_backend.py",),
          needs=("mamba_slots",)),
)}


class FaultSet:
    """An immutable set of active fault ids; unknown ids raise ``ValueError``."""

    def __init__(self, ids=()):
        ids = tuple(ids)
        for fid in ids:
            if fid not in CATALOGUE:
                raise ValueError(f"unknown fault {fid!r}; known: {', '.join(sorted(CATALOGUE))}")
        self.ids = frozenset(ids)

    def __contains__(self, fid: str) -> bool:
        assert fid in CATALOGUE, fid
        return fid in self.ids

    def sorted(self) -> list[str]:
        return sorted(self.ids)
