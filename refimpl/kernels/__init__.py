"""Kernels as registered torch custom ops, their pure-torch references, and the dense oracle.

``indices`` (CSR kv indices, block tables), ``attention`` (dense paged MHA/GQA and MLA), ``oracle`` (float64 reference),
``triton_decode`` (split-KV decode, split counts), ``triton_extend`` (verify / draft extend), ``draft_indices``
(multi-step draft decode), ``fused_metadata`` (Triton graph metadata in one launch), ``mla_paged`` (Cutlass / TRTLLM
MLA), ``validation`` (batch checks), ``inputs`` (a batch into a graph's static inputs). Each op is one ``torch.library.custom_op``: a dispatch mode sees one
``refimpl.<name>.default`` (``KERNEL_OPS``) per launch.
"""

from .attention import dense_paged_attention, dense_paged_mla_attention
from .draft_indices import draft_decode_kv_indices, draft_decode_kv_indices_ref
from .fused_metadata import fused_graph_metadata, fused_graph_metadata_args, launch_fused_graph_metadata
from .indices import build_block_table, build_block_table_ref, build_kv_indices, build_kv_indices_ref
from .inputs import load_inputs
from .mla_paged import cutlass_mla_decode, mla_paged_attention, trtllm_batch_decode_with_kv_cache_mla, trtllm_mla_graph_metadata
from .oracle import attention_from_dense, csr_ref, mha_oracle, mla_oracle
from .triton_decode import decode_attention, get_num_kv_splits, get_num_kv_splits_ref
from .triton_extend import extend_attention
from .validation import batch_check, batch_check_ref

KERNEL_OPS = tuple(
    f"refimpl::{name}"
    for name in (
        "build_kv_indices build_block_table dense_paged_attention dense_paged_mla_attention decode_attention_stage1"
        " decode_attention_stage2 num_kv_splits extend_attention draft_decode_kv_indices mla_paged_attention"
        " trtllm_mla_graph_metadata fused_graph_metadata batch_check load_inputs"
    ).split()
)

__all__ = [
    "KERNEL_OPS",
    "attention_from_dense",
    "batch_check",
    "batch_check_ref",
    "build_block_table",
    "build_block_table_ref",
    "build_kv_indices",
    "build_kv_indices_ref",
    "csr_ref",
    "cutlass_mla_decode",
    "decode_attention",
    "draft_decode_kv_indices",
    "draft_decode_kv_indices_ref",
    "extend_attention",
    "fused_graph_metadata",
    "fused_graph_metadata_args",
    "get_num_kv_splits",
    "get_num_kv_splits_ref",
    "dense_paged_attention",
    "dense_paged_mla_attention",
    "mha_oracle",
    "mla_oracle",
    "mla_paged_attention",
    "launch_fused_graph_metadata",
    "load_inputs",
    "trtllm_batch_decode_with_kv_cache_mla",
    "trtllm_mla_graph_metadata",
]
