"""flashinfer 0.6.0's FULL wrapper signatures over the lean stand-ins (a test helper).

``refimpl.flashinfer_wrappers.standin`` keeps only the parameters refimpl passes. The
subclasses here carry every parameter of the real ``__init__`` / ``plan`` / ``run`` (and
``forward`` / ``begin_forward`` / ``run_return_lse`` where the real class has them), with the
real names, order and defaults: ``tests/test_flashinfer_wrappers.py`` compares them with the
installed flashinfer. Each body refuses what the stand-ins do not model with a
``NotImplementedError`` naming the feature, and otherwise delegates to the lean class. Float
q/k/v scales and ``out=`` are modelled here (scaling / a copy around the lean ``run``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from refimpl.flashinfer_wrappers import standin as lean


def _refuse(cond: bool, feature: str) -> None:
    if cond:
        raise NotImplementedError(f"refimpl flashinfer stand-in: {feature} is not modelled")


def _refuse_plan_features(pos_encoding_mode: str, window_left: int, logits_soft_cap) -> None:
    _refuse(pos_encoding_mode != "NONE", f"pos_encoding_mode={pos_encoding_mode!r} (RoPE / ALiBi)")
    _refuse(window_left != -1, f"window_left={window_left} (sliding window)")
    cap = logits_soft_cap
    _refuse(cap not in (None, 0, 0.0), f"logits_soft_cap={cap} (soft capping)")


def _refuse_run_extras(args: tuple, lse, return_lse: bool, sinks, window_left) -> None:
    _refuse(bool(args), "extra positional kernel arguments (JIT variants / fp8 scale tensors)")
    _refuse(return_lse or lse is not None, "return_lse / lse (the dense op returns no log-sum-exp)")
    _refuse(sinks is not None, "sinks (attention sinks)")
    _refuse(window_left not in (None, -1), f"window_left={window_left} (sliding window)")


def _kv_tuple(kv: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """flashinfer's other NHD cache forms -> the lean ``(k, v)`` of ``[slots, Hkv, D]``: a tuple
    of ``[pages, 1, Hkv, D]``, or one ``[slots, 2, Hkv, D]`` / ``[pages, 2, 1, Hkv, D]`` tensor."""
    if isinstance(kv, torch.Tensor):
        if kv.dim() == 5:
            _refuse(kv.shape[2] != 1, f"page_size={kv.shape[2]}")
            kv = kv[:, :, 0]
        kv = (kv[:, 0], kv[:, 1])
    k, v = kv
    if k.dim() == 4:
        _refuse(k.shape[1] != 1, f"page_size={k.shape[1]}")
        k, v = k[:, 0], v[:, 0]
    return k, v


def _run_scaled(wrapper, lean_run, q, kv, q_scale, k_scale, v_scale, out):
    """flashinfer's float scales: softmax scale * q_scale * k_scale, output * v_scale."""
    scales = (q_scale, k_scale, v_scale)
    _refuse(any(isinstance(s, torch.Tensor) for s in scales), "tensor q/k/v scales (fp8)")
    saved = wrapper._sm_scale
    scale = 1 / math.sqrt(q.shape[-1]) if saved is None else saved
    for s in (q_scale, k_scale):
        scale *= 1.0 if s is None else s
    wrapper._sm_scale = scale
    try:
        res = lean_run(q, _kv_tuple(kv))
    finally:
        wrapper._sm_scale = saved
    if v_scale is not None:
        res *= v_scale
    return _into(out, res)


def _into(out: torch.Tensor | None, res: torch.Tensor) -> torch.Tensor:
    if out is None:
        return res
    if out.shape != res.shape or out.dtype != res.dtype or out.device != res.device:
        raise ValueError(
            f"Invalid out: expected {tuple(res.shape)} {res.dtype} on {res.device}, got "
            f"{tuple(out.shape)} {out.dtype} on {out.device}"
        )
    return out.copy_(res)


class BatchDecodeWithPagedKVCacheWrapper(lean.BatchDecodeWithPagedKVCacheWrapper):
    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: torch.Tensor | None = None,
        paged_kv_indices_buffer: torch.Tensor | None = None,
        paged_kv_last_page_len_buffer: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: list[Any] | None = None,
    ) -> None:
        _refuse(kv_layout == "HND", "kv_layout='HND'")
        _refuse(jit_args is not None, "jit_args (custom JIT attention variants)")
        _refuse(backend not in ("auto", "fa2", "fa3"), f"backend={backend!r}")
        super().__init__(
            float_workspace_buffer, kv_layout, use_cuda_graph, use_tensor_cores,
            paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer,
        )  # fmt: skip
        self._backend = backend

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        pos_encoding_mode: str = "NONE",
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        q_data_type: str | torch.dtype | None = "float16",
        kv_data_type: str | torch.dtype | None = None,
        o_data_type: str | torch.dtype | None = None,
        data_type: str | torch.dtype | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        non_blocking: bool = True,
        block_tables: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        fixed_split_size: int | None = None,
        disable_split_kv: bool = False,
    ) -> None:
        _refuse_plan_features(pos_encoding_mode, window_left, logits_soft_cap)
        trtllm = block_tables is not None or seq_lens is not None
        _refuse(trtllm, "block_tables / seq_lens (trtllm-gen)")
        if fixed_split_size is not None and not self.use_tensor_cores:  # as flashinfer
            raise ValueError("fixed_split_size is only supported by tensor core decode for now.")
        super().plan(
            indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
            q_data_type=q_data_type, kv_data_type=kv_data_type, data_type=data_type,
            sm_scale=sm_scale, non_blocking=non_blocking,
        )  # fmt: skip
        if o_data_type is not None:
            self._cached_o_data_type = lean._dtype(o_data_type)

    begin_forward = plan

    def forward(
        self,
        q: torch.Tensor,
        paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        pos_encoding_mode: str = "NONE",
        q_scale: float | None = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
    ) -> torch.Tensor:
        """Deprecated flashinfer entry point: overrides the planned scalars, then ``run``."""
        _refuse_plan_features(pos_encoding_mode, window_left, logits_soft_cap)
        self._sm_scale = sm_scale
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        *args,
        q_scale: float | None = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        enable_pdl: bool | None = None,
        window_left: int | None = None,
        sinks: torch.Tensor | None = None,
        q_len_per_req: int | None = 1,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        _refuse_run_extras(args, lse, return_lse, sinks, window_left)
        _refuse(q_len_per_req not in (None, 1), f"q_len_per_req={q_len_per_req} (trtllm-gen)")
        lean_run = super().run
        return _run_scaled(self, lean_run, q, paged_kv_cache, q_scale, k_scale, v_scale, out)

    run_return_lse = functools.partialmethod(run, return_lse=True)


class BatchPrefillWithPagedKVCacheWrapper(lean.BatchPrefillWithPagedKVCacheWrapper):
    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: torch.Tensor | None = None,
        paged_kv_indptr_buf: torch.Tensor | None = None,
        paged_kv_indices_buf: torch.Tensor | None = None,
        paged_kv_last_page_len_buf: torch.Tensor | None = None,
        custom_mask_buf: torch.Tensor | None = None,
        mask_indptr_buf: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: list[Any] | None = None,
        jit_kwargs: dict[str, Any] | None = None,
    ) -> None:
        _refuse(kv_layout == "HND", "kv_layout='HND'")
        jit = jit_args is not None or jit_kwargs is not None
        _refuse(jit, "jit_args / jit_kwargs (custom JIT attention variants)")
        _refuse(backend not in ("auto", "fa2", "fa3"), f"backend={backend!r}")
        super().__init__(
            float_workspace_buffer, kv_layout, use_cuda_graph, qo_indptr_buf, paged_kv_indptr_buf,
            paged_kv_indices_buf, paged_kv_last_page_len_buf, custom_mask_buf, mask_indptr_buf,
        )  # fmt: skip
        self._backend = backend

    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        head_dim_vo: int | None = None,
        custom_mask: torch.Tensor | None = None,
        packed_custom_mask: torch.Tensor | None = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        q_data_type: str | torch.dtype = "float16",
        kv_data_type: str | torch.dtype | None = None,
        o_data_type: str | torch.dtype | None = None,
        non_blocking: bool = True,
        prefix_len_ptr: torch.Tensor | None = None,
        token_pos_in_items_ptr: torch.Tensor | None = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        seq_lens_q: torch.Tensor | None = None,
        block_tables: torch.Tensor | None = None,
        max_token_per_sequence: int | None = None,
        max_sequence_kv: int | None = None,
        fixed_split_size: int | None = None,
        disable_split_kv: bool = False,
    ) -> None:
        """``head_dim_vo``, ``fixed_split_size`` and ``disable_split_kv`` do not change what the
        stand-in computes (it reads Dv from the cache); they are accepted and ignored."""
        _refuse_plan_features(pos_encoding_mode, window_left, logits_soft_cap)
        _refuse(packed_custom_mask is not None, "packed_custom_mask (the stand-in stores bytes)")
        _refuse(use_fp16_qk_reduction, "use_fp16_qk_reduction=True")
        multi_item = (prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr)
        _refuse(any(x is not None for x in multi_item) or token_pos_in_items_len != 0,
                "multi-item scoring (prefix_len_ptr / token_pos_in_items_*)")  # fmt: skip
        _refuse(any(x is not None for x in (seq_lens, seq_lens_q, block_tables)),
                "seq_lens / seq_lens_q / block_tables (cudnn / trtllm-gen)")  # fmt: skip
        _refuse(max_token_per_sequence is not None or max_sequence_kv is not None,
                "max_token_per_sequence / max_sequence_kv (cudnn)")  # fmt: skip
        super().plan(
            qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
            num_kv_heads, head_dim_qk, page_size, custom_mask=custom_mask, causal=causal,
            sm_scale=sm_scale, q_data_type=q_data_type, kv_data_type=kv_data_type,
            non_blocking=non_blocking,
        )  # fmt: skip
        if o_data_type is not None:
            self._cached_o_data_type = lean._dtype(o_data_type)

    begin_forward = plan

    def forward(
        self,
        q: torch.Tensor,
        paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        k_scale: float | None = None,
        v_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
    ) -> torch.Tensor:
        """Deprecated flashinfer entry point: overrides the planned scalars (``causal`` too),
        then ``run``."""
        _refuse_plan_features(pos_encoding_mode, window_left, logits_soft_cap)
        _refuse(use_fp16_qk_reduction, "use_fp16_qk_reduction=True")
        self._causal, self._sm_scale = causal, sm_scale
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale)

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        *args,
        q_scale: float | torch.Tensor | None = None,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        enable_pdl: bool | None = None,
        window_left: int | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        _refuse_run_extras(args, lse, return_lse, sinks, window_left)
        lean_run = super().run
        return _run_scaled(self, lean_run, q, paged_kv_cache, q_scale, k_scale, v_scale, out)

    run_return_lse = functools.partialmethod(run, return_lse=True)


class BatchMLAPagedAttentionWrapper(lean.BatchMLAPagedAttentionWrapper):
    # __init__: the lean class already has flashinfer's full constructor signature

    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_len_arr: torch.Tensor,
        num_heads: int,
        head_dim_ckv: int,
        head_dim_kpe: int,
        page_size: int,
        causal: bool,
        sm_scale: float,
        q_data_type: torch.dtype,
        kv_data_type: torch.dtype,
        use_profiler: bool = False,
    ) -> None:
        _refuse(use_profiler, "use_profiler=True")
        super().plan(
            qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe,
            page_size, causal, sm_scale, q_data_type, kv_data_type,
        )  # fmt: skip

    def run(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv_cache: torch.Tensor,
        kpe_cache: torch.Tensor,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        profiler_buffer: torch.Tensor | None = None,
        kv_len: torch.Tensor | None = None,
        page_table: torch.Tensor | None = None,
        return_lse_base_on_e: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``kv_len`` / ``page_table`` are cutlass-only: ignored, as on flashinfer's fa2/fa3."""
        _refuse(return_lse or lse is not None, "return_lse / lse (no log-sum-exp)")
        _refuse(profiler_buffer is not None, "profiler_buffer")
        return _into(out, super().run(q_nope, q_pe, ckv_cache, kpe_cache))
