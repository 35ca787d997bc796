"""Kernels as registered torch custom ops, their pure-torch references, and the dense oracle.

- ``indices``: CSR kv-index builder (digest §4.2) and paged block-table builder (§4.3), Triton.
- ``attention``: graph-safe dense paged attention, MHA/GQA and MLA, plain torch (§4.1, §4.6).
- ``oracle``: float64 reference attention over ragged batches, for tests.

Every op is one ``torch.library.custom_op``: a ``TorchDispatchMode`` recorder sees exactly one
``refimpl.<name>.default`` per launch (names in ``KERNEL_OPS``).
"""

from .attention import dense_paged_attention, dense_paged_mla_attention
from .indices import (
    block_table_to_kv_indices,
    build_block_table,
    build_block_table_ref,
    build_kv_indices,
    build_kv_indices_ref,
)
from .oracle import attention_from_dense, mha_oracle, mla_oracle, relative_error

KERNEL_OPS = (
    "refimpl::build_kv_indices",
    "refimpl::build_block_table",
    "refimpl::dense_paged_attention",
    "refimpl::dense_paged_mla_attention",
)

__all__ = [
    "KERNEL_OPS",
    "attention_from_dense",
    "block_table_to_kv_indices",
    "build_block_table",
    "build_block_table_ref",
    "build_kv_indices",
    "build_kv_indices_ref",
    "dense_paged_attention",
    "dense_paged_mla_attention",
    "mha_oracle",
    "mla_oracle",
    "relative_error",
]
