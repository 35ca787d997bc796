"""Kernels as registered torch custom ops, their pure-torch references, and the dense oracle.

- ``indices``: CSR kv-index builder and paged block-table builder, Triton.
- ``attention``: graph-safe dense paged attention, MHA/GQA and MLA, plain torch.
- ``oracle``: float64 reference attention over ragged batches, for tests.
- ``triton_decode``: split-KV decode (stage 1 + merge) and the split-count heuristic.
- ``triton_extend``: extend attention for target verify / draft extend (prefix paged, new k/v direct).
- ``draft_indices``: multi-step draft-decode kv index generator.
- ``fused_metadata``: the Triton graph metadata (CSR, split counts / verify offsets) in one launch.
- ``validation``: the device half of batch validation (ranges, duplicates, KV ownership), one launch.

Every op is one ``torch.library.custom_op``: a ``TorchDispatchMode`` recorder sees exactly one
``refimpl.<name>.default`` per launch (names in ``KERNEL_OPS``).
"""

from .attention import dense_paged_attention, dense_paged_mla_attention
from .draft_indices import draft_decode_kv_indices, draft_decode_kv_indices_ref, draft_decode_used_len
from .fused_metadata import (
    fused_graph_metadata,
    fused_graph_metadata_args,
    fused_graph_metadata_ref,
    launch_fused_graph_metadata,
)
from .indices import (
    block_table_to_kv_indices,
    build_block_table,
    build_block_table_ref,
    build_kv_indices,
    build_kv_indices_ref,
)
from .mla_paged import (
    cutlass_mla_decode,
    mla_paged_attention,
    mla_paged_attention_ref,
    trtllm_batch_decode_with_kv_cache_mla,
    trtllm_mla_graph_metadata,
    trtllm_mla_graph_metadata_ref,
)
from .oracle import attention_from_dense, csr_ref, mha_oracle, mla_oracle, relative_error
from .triton_decode import decode_attention, get_num_kv_splits, get_num_kv_splits_ref
from .triton_extend import extend_attention
from .validation import batch_check, batch_check_ref

KERNEL_OPS = (
    "refimpl::build_kv_indices",
    "refimpl::build_block_table",
    "refimpl::dense_paged_attention",
    "refimpl::dense_paged_mla_attention",
    "refimpl::decode_attention_stage1",
    "refimpl::decode_attention_stage2",
    "refimpl::num_kv_splits",
    "refimpl::extend_attention",
    "refimpl::draft_decode_kv_indices",
    "refimpl::mla_paged_attention",
    "refimpl::trtllm_mla_graph_metadata",
    "refimpl::fused_graph_metadata",
    "refimpl::batch_check",
)

__all__ = [
    "KERNEL_OPS",
    "attention_from_dense",
    "batch_check",
    "batch_check_ref",
    "block_table_to_kv_indices",
    "build_block_table",
    "build_block_table_ref",
    "build_kv_indices",
    "build_kv_indices_ref",
    "csr_ref",
    "cutlass_mla_decode",
    "decode_attention",
    "draft_decode_kv_indices",
    "draft_decode_kv_indices_ref",
    "draft_decode_used_len",
    "extend_attention",
    "fused_graph_metadata",
    "fused_graph_metadata_args",
    "fused_graph_metadata_ref",
    "get_num_kv_splits",
    "get_num_kv_splits_ref",
    "dense_paged_attention",
    "dense_paged_mla_attention",
    "mha_oracle",
    "mla_oracle",
    "mla_paged_attention",
    "mla_paged_attention_ref",
    "launch_fused_graph_metadata",
    "relative_error",
    "trtllm_batch_decode_with_kv_cache_mla",
    "trtllm_mla_graph_metadata",
    "trtllm_mla_graph_metadata_ref",
]
