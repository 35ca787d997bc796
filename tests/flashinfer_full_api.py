"""flashinfer 0.7.2's FULL wrapper signatures over the lean stand-ins (a test helper; SGLang 0.5.23 pins 0.7.2).

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
import warnings
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


def _refuse_new_run_extras(**given: Any) -> None:
    """0.7.2's new run arguments (scale-factor / quantised caches, softmax skipping, sinks, fp16 softmax): all off."""
    for name, value in given.items():
        _refuse(value is not None, f"{name}={value!r}")


# 0.6.0's positional order after page_size, which 0.7.2 still maps (deprecated)
DECODE_PLAN_POSITIONAL = (
    "pos_encoding_mode window_left logits_soft_cap q_data_type kv_data_type o_data_type data_type sm_scale rope_scale "
    "rope_theta non_blocking block_tables seq_lens fixed_split_size disable_split_kv"
).split()
CSR_PLAN_NAMES = (
    "qo_indptr kv_indptr kv_indices kv_len_arr num_heads head_dim_ckv head_dim_kpe page_size causal sm_scale "
    "q_data_type kv_data_type"
).split()


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
            float_workspace_buffer,
            kv_layout,
            use_cuda_graph,
            use_tensor_cores,
            paged_kv_indptr_buffer,
            paged_kv_indices_buffer,
            paged_kv_last_page_len_buffer,
        )
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
        *deprecated_positional_args: Any,
        **kwargs: Any,
    ) -> None:
        """0.7.2: the optional arguments by keyword; positional ones (0.6.0's order) still map, with a warning."""
        if deprecated_positional_args:
            if len(deprecated_positional_args) > len(DECODE_PLAN_POSITIONAL):
                raise TypeError(f"plan() takes at most {7 + len(DECODE_PLAN_POSITIONAL)} positional arguments")
            given = dict(zip(DECODE_PLAN_POSITIONAL, deprecated_positional_args))
            if twice := given.keys() & kwargs.keys():
                raise TypeError(f"plan() got multiple values for {sorted(twice)}")
            warnings.warn("positional plan() arguments after page_size are deprecated", DeprecationWarning, 2)
            kwargs = given | kwargs
        heads = (num_qo_heads, num_kv_heads, head_dim, page_size)
        return self._plan_impl(indptr, indices, last_page_len, *heads, **kwargs)

    def _plan_impl(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *,
        pos_encoding_mode: str = "NONE",
        window_left: int = -1,
        window_right: int = 0,
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
        q_len_per_req: int = 1,
        is_causal: bool | None = None,
    ) -> None:
        _refuse_plan_features(pos_encoding_mode, window_left, logits_soft_cap)
        _refuse(window_right != 0, f"window_right={window_right} (cute-dsl)")
        _refuse(q_len_per_req != 1 or is_causal, f"q_len_per_req={q_len_per_req} / is_causal={is_causal}")
        trtllm = block_tables is not None or seq_lens is not None
        _refuse(trtllm, "block_tables / seq_lens (trtllm-gen)")
        if fixed_split_size is not None and not self.use_tensor_cores:  # as flashinfer
            raise ValueError("fixed_split_size is only supported by tensor core decode for now.")
        super().plan(
            indptr,
            indices,
            last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type,
            data_type=data_type,
            sm_scale=sm_scale,
            non_blocking=non_blocking,
        )
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
        q_len_per_req: int | None = None,
        skip_softmax_threshold_scale_factor: float | None = None,
        kv_cache_sf: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        _refuse_run_extras(args, lse, return_lse, sinks, window_left)
        _refuse(q_len_per_req not in (None, 1), f"q_len_per_req={q_len_per_req} (trtllm-gen)")
        _refuse_new_run_extras(skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor, kv_cache_sf=kv_cache_sf)
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
        variant_owns_mask: bool = False,
    ) -> None:
        _refuse(kv_layout == "HND", "kv_layout='HND'")
        _refuse(variant_owns_mask, "variant_owns_mask=True (a JIT variant's own mask)")
        jit = jit_args is not None or jit_kwargs is not None
        _refuse(jit, "jit_args / jit_kwargs (custom JIT attention variants)")
        _refuse(backend not in ("auto", "fa2", "fa3"), f"backend={backend!r}")
        super().__init__(
            float_workspace_buffer,
            kv_layout,
            use_cuda_graph,
            qo_indptr_buf,
            paged_kv_indptr_buf,
            paged_kv_indices_buf,
            paged_kv_last_page_len_buf,
            custom_mask_buf,
            mask_indptr_buf,
        )
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
        _refuse(
            any(x is not None for x in multi_item) or token_pos_in_items_len != 0,
            "multi-item scoring (prefix_len_ptr / token_pos_in_items_*)",
        )
        _refuse(
            any(x is not None for x in (seq_lens, seq_lens_q, block_tables)),
            "seq_lens / seq_lens_q / block_tables (cudnn / trtllm-gen)",
        )
        _refuse(
            max_token_per_sequence is not None or max_sequence_kv is not None, "max_token_per_sequence / max_sequence_kv (cudnn)"
        )
        super().plan(
            qo_indptr,
            paged_kv_indptr,
            paged_kv_indices,
            paged_kv_last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            page_size,
            custom_mask=custom_mask,
            causal=causal,
            sm_scale=sm_scale,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type,
            non_blocking=non_blocking,
        )
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
        lse_base: str = "log2",
        lse_layout: str = "NH",
        enable_pdl: bool | None = None,
        window_left: int | None = None,
        sinks: torch.Tensor | None = None,
        kv_cache_sf: torch.Tensor | None = None,
        skip_softmax_threshold_scale_factor: float | None = None,
        use_fp16_softmax: bool | None = None,
        uses_spcompress: bool | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        _refuse_run_extras(args, lse, return_lse, sinks, window_left)
        _refuse_new_run_extras(
            kv_cache_sf=kv_cache_sf,
            use_fp16_softmax=use_fp16_softmax,
            uses_spcompress=uses_spcompress,
            skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
        )
        lean_run = super().run
        return _run_scaled(self, lean_run, q, paged_kv_cache, q_scale, k_scale, v_scale, out)

    run_return_lse = functools.partialmethod(run, return_lse=True)


class BatchMLAPagedAttentionWrapper(lean.BatchMLAPagedAttentionWrapper):
    # __init__: the lean class already has flashinfer's full constructor signature

    def plan(
        self,
        qo_indptr: torch.Tensor | None = None,
        kv_indptr: torch.Tensor | None = None,
        kv_indices: torch.Tensor | None = None,
        kv_len_arr: torch.Tensor | None = None,
        num_heads: int | None = None,
        head_dim_ckv: int | None = None,
        head_dim_kpe: int | None = None,
        page_size: int | None = None,
        causal: bool | None = None,
        sm_scale: float | None = None,
        q_data_type: torch.dtype | None = None,
        kv_data_type: torch.dtype | None = None,
        use_profiler: bool = False,
        *,
        metadata: Any = None,
        cum_seq_lens_q: torch.Tensor | None = None,
        block_tables: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        max_q_len: int | None = None,
        query_layout: str | None = None,
        kv_cache_layout: str | None = None,
        lse_mode: str = "none",
        output_dtype: torch.dtype | None = None,
        output_scale: str = "none",
        scale_mode: str = "default",
        skip_softmax: bool = False,
        enable_pdl: bool | None = None,
        use_sinks: bool = False,
    ) -> None:
        """0.7.2's CSR form (its canonical ``metadata=`` / block-table forms are refused)."""
        _refuse(use_profiler, "use_profiler=True")
        canonical = (metadata, cum_seq_lens_q, block_tables, seq_lens, max_q_len)
        _refuse(any(x is not None for x in canonical), "metadata= / block tables (0.7.2's canonical plan forms)")
        _refuse(query_layout not in (None, "split") or kv_cache_layout not in (None, "split"), "packed query / kv layouts")
        _refuse(lse_mode != "none" or output_scale != "none" or scale_mode != "default", "lse / output / kv scale modes")
        _refuse(skip_softmax or use_sinks, "skip_softmax / use_sinks")
        _refuse(output_dtype not in (None, q_data_type), f"output_dtype={output_dtype}")
        csr = (qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size, causal)
        if missing := [n for n, x in zip(CSR_PLAN_NAMES, (*csr, sm_scale, q_data_type, kv_data_type)) if x is None]:
            raise TypeError(f"plan() needs {', '.join(missing)} (the CSR form)")
        super().plan(*csr, sm_scale, q_data_type, kv_data_type)

    def run(
        self,
        q_nope: torch.Tensor | None = None,
        q_pe: torch.Tensor | None = None,
        ckv_cache: torch.Tensor | None = None,
        kpe_cache: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        profiler_buffer: torch.Tensor | None = None,
        kv_len: torch.Tensor | None = None,
        page_table: torch.Tensor | None = None,
        return_lse_base_on_e: bool = False,
        o_scale: float | None = None,
        *,
        query: torch.Tensor | None = None,
        kv_cache: torch.Tensor | None = None,
        ckv_scale: float | None = None,
        ckv_scale_arr: torch.Tensor | None = None,
        kpe_scale: float | None = None,
        sinks: torch.Tensor | None = None,
        skip_softmax_threshold_scale_factor: float | None = None,
        bmm1_scale: float | None = None,
        bmm2_scale: float | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``kv_len`` / ``page_table`` are cutlass-only: ignored, as on flashinfer's fa2/fa3."""
        _refuse(return_lse or lse is not None, "return_lse / lse (no log-sum-exp)")
        _refuse(profiler_buffer is not None, "profiler_buffer")
        _refuse(query is not None or kv_cache is not None, "query= / kv_cache= (packed inputs)")
        _refuse_new_run_extras(
            o_scale=o_scale,
            ckv_scale=ckv_scale,
            ckv_scale_arr=ckv_scale_arr,
            kpe_scale=kpe_scale,
            sinks=sinks,
            bmm1_scale=bmm1_scale,
            bmm2_scale=bmm2_scale,
            skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
        )
        if missing := [
            n for n, x in zip(("q_nope", "q_pe", "ckv_cache", "kpe_cache"), (q_nope, q_pe, ckv_cache, kpe_cache)) if x is None
        ]:
            raise TypeError(f"run() needs {', '.join(missing)}")
        return _into(out, super().run(q_nope, q_pe, ckv_cache, kpe_cache))
