"""The graph-path re-plan without a device-to-host copy (SGLang's fast decode plans, our way).

A captured decode step replays the kernel launch; the launch reads the wrapper's work
partition, which only ``plan`` writes. So every replay re-plans (digest §3.2, §3.4). The full
``plan`` would do, per replay:

1. copy the indptr (and ``kv_len_arr`` / ``qo_indptr`` for MLA) **device -> host**
   (``.to("cpu")``), a stream synchronisation in the middle of the serving loop; for MLA these
   CPU<->GPU transfers made graph replay hang (#3987);
2. copy indptr / indices / last_page_len into the wrapper's bound buffers;
3. pick (and on first use JIT-compile) the kernel module;
4. compute the partition on the host and write it into the workspace.

The fast plans here keep only step 4: they call ``wrapper._cached_module.plan(...)`` with a
**host indptr the caller already has** (SGLang builds it from ``seq_lens_cpu``) and set
``wrapper._plan_info`` plus the Python attributes ``run`` reads. Why each skip is safe:

* **No D2H copy (1):** the host indptr describes the same batch the caller wrote on the device.
  *Unsafe* if it does not: the partition then covers other lengths than the bound indptr /
  indices, and the kernel silently reads the wrong keys (nothing can check this without the
  very copy we avoid). The caller owns this invariant.
* **No copies into the bound buffers (2):** the caller passes the bound buffers themselves
  (SGLang's ``kv_indptr[:bs+1]`` and ``wrapper._paged_kv_indices_buf``, MLA's
  ``cuda_graph_kv_indices``) and has already written them in place, so a copy would be a
  self-copy. We check this by address (no sync) when device tensors are given, and refuse
  otherwise. Not safe for a wrapper without cuda-graph mode, whose buffers are whatever the
  last full plan bound: decode then *rebinds* the given device tensors (as a non-graph plan
  would), MLA refuses (its run reads ``_kv_indices_buf``, which only a full plan refreshes).
  MLA's bound ``kv_indptr`` / ``kv_len_arr`` are left stale: flashinfer's MLA decode reads only
  the partition and ``kv_indices`` (SGLang #37975 hides behind this).
* **No module selection / JIT (3):** ``_cached_module`` comes from the first full plan, which is
  why the fast plan refuses a wrapper never planned, and why the q/kv dtypes (and whether a
  sliding window / soft cap is used, which select the kernel variant) must match that plan.
* **No stream sync:** nothing here waits on the device; the module stages the host partition
  in the pinned buffer and copies it to the int workspace in stream order, before the replay
  that reads it (asynchronously in the real library; the CPU stand-in simply copies).

Both functions work on real flashinfer 0.6.0 wrappers (GPU) and on the stand-ins of
``refimpl.fi.standins`` (CPU): they touch only attributes both have.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = [
    "fast_decode_plan",
    "fast_mla_decode_plan",
    "install_fast_decode_plan",
    "install_fast_mla_decode_plan",
    "is_fast_plan_installed",
]


def _canon(dt: str | torch.dtype) -> torch.dtype:
    if isinstance(dt, str):
        got = getattr(torch, dt, None)
        if isinstance(got, torch.dtype):
            return got
        raise TypeError(f"unknown dtype name {dt!r}")
    if isinstance(dt, torch.dtype):
        return dt
    raise TypeError(f"dtype must be a string or torch.dtype, got {type(dt).__name__}")


def _require_planned(wrapper: Any, what: str) -> Any:
    module = getattr(wrapper, "_cached_module", None)
    if module is None:
        raise RuntimeError(
            f"{what} needs a wrapper planned once with its full plan(): it reuses "
            f"wrapper._cached_module (the kernel module that plan selects and JIT-compiles); "
            f"{type(wrapper).__name__} has none yet"
        )
    return module


def _require_host(name: str, t: Any) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(
            f"{name} must be a CPU tensor (the fast plan exists to avoid a device-to-host "
            f"copy), got device={t.device}"
        )
    if t.dim() != 1:
        raise ValueError(f"{name}.shape={tuple(t.shape)}: must be 1-D")
    return t


def _require_alias(name: str, given: torch.Tensor | None, bound: torch.Tensor | None) -> None:
    """In cuda-graph mode a device tensor handed to the fast plan must BE the bound buffer."""
    if given is None or bound is None:
        return
    if given.device != bound.device or given.data_ptr() != bound.data_ptr():
        raise ValueError(
            f"{name} is not the wrapper's bound buffer (data_ptr {given.data_ptr():#x} on "
            f"{given.device} vs {bound.data_ptr():#x} on {bound.device}): the fast plan copies "
            f"nothing, so write the bound buffer in place (or use the full plan)"
        )


def _check_same_kernel(wrapper: Any, q_dt, kv_dt, window_left: int, soft_cap: float) -> None:
    for attr, want, label in (
        ("_cached_q_data_type", q_dt, "q_data_type"),
        ("_cached_kv_data_type", kv_dt, "kv_data_type"),
    ):
        have = getattr(wrapper, attr, None)
        if have is not None and have != want:
            raise ValueError(
                f"{label}={want} differs from the full plan's {have}: _cached_module is "
                f"specialised on it; re-plan with the full plan"
            )
    old_window = getattr(wrapper, "_window_left", None)
    if old_window is not None and (old_window != -1) != (window_left != -1):
        raise ValueError(
            f"window_left={window_left} vs the full plan's {old_window}: sliding window on/off "
            "selects another kernel module; re-plan with the full plan"
        )
    old_cap = getattr(wrapper, "_logits_soft_cap", None)
    if old_cap is not None and (old_cap > 0) != (soft_cap > 0):
        raise ValueError(
            f"logits_soft_cap={soft_cap} vs the full plan's {old_cap}: soft cap on/off selects "
            "another kernel module; re-plan with the full plan"
        )


# ----------------------------------------------------------------------------------------------
# decode


def fast_decode_plan(
    wrapper: Any,
    indptr_cpu: torch.Tensor,
    last_page_len_cpu: torch.Tensor,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    *,
    q_data_type: str | torch.dtype,
    kv_data_type: str | torch.dtype | None = None,
    window_left: int = -1,
    logits_soft_cap: float | None = 0.0,
    sm_scale: float | None = None,
    rope_scale: float | None = None,
    rope_theta: float | None = None,
    pos_encoding_mode: str = "NONE",
    fixed_split_size: int | None = None,
    disable_split_kv: bool = False,
    indptr: torch.Tensor | None = None,
    indices: torch.Tensor | None = None,
    last_page_len: torch.Tensor | None = None,
) -> None:
    """Re-plan a ``BatchDecodeWithPagedKVCacheWrapper`` from a host indptr (see module doc).

    ``indptr_cpu`` ``[bs+1]`` and ``last_page_len_cpu`` ``[bs]`` must be CPU tensors describing
    the batch already written into the bound device buffers. ``indptr`` / ``indices`` /
    ``last_page_len`` (device, optional) are only checked to be the bound buffers in cuda-graph
    mode; without cuda-graph mode they are required and rebound. Handles both kernel paths of
    the real wrapper: CUDA-core decode (15-argument module plan) and tensor-core decode (the
    prefill module's 16 arguments, 19 for the fa2 backend).
    """
    module = _require_planned(wrapper, "fast_decode_plan")
    indptr_cpu = _require_host("indptr_cpu", indptr_cpu)
    last_page_len_cpu = _require_host("last_page_len_cpu", last_page_len_cpu)
    batch_size = len(last_page_len_cpu)
    if len(indptr_cpu) != batch_size + 1:
        raise ValueError(
            f"indptr_cpu has {len(indptr_cpu)} entries, expected len(last_page_len_cpu) + 1 = "
            f"{batch_size + 1}"
        )
    q_dt = _canon(q_data_type)
    kv_dt = q_dt if kv_data_type is None else _canon(kv_data_type)
    soft_cap = 0.0 if logits_soft_cap is None else float(logits_soft_cap)
    _check_same_kernel(wrapper, q_dt, kv_dt, window_left, soft_cap)
    graph = bool(wrapper.is_cuda_graph_enabled)
    if graph:
        fixed = wrapper._fixed_batch_size
        if batch_size != fixed:
            raise ValueError(
                f"batch_size={batch_size} differs from the batch size {fixed} the wrapper was "
                "bound for (cuda-graph mode fixes it at construction)"
            )
        bound_indices = wrapper._paged_kv_indices_buf
        if indices is not None and len(indices) > len(bound_indices):
            raise ValueError(
                f"indices has {len(indices)} entries, more than the bound "
                f"paged_kv_indices_buffer holds ({len(bound_indices)})"
            )
        _require_alias("indptr", indptr, wrapper._paged_kv_indptr_buf)
        _require_alias("indices", indices, bound_indices)
        _require_alias("last_page_len", last_page_len, wrapper._paged_kv_last_page_len_buf)
    else:
        if indptr is None or indices is None or last_page_len is None:
            raise ValueError(
                "without cuda-graph mode the fast plan needs the device indptr / indices / "
                "last_page_len to bind (run reads them); pass them or use the full plan"
            )
        wrapper._paged_kv_indptr_buf = indptr
        wrapper._paged_kv_indices_buf = indices
        wrapper._paged_kv_last_page_len_buf = last_page_len
        if wrapper.use_tensor_cores:
            wrapper._qo_indptr_buf = torch.arange(
                batch_size + 1, dtype=torch.int32, device=wrapper.device
            )

    workspaces = (
        wrapper._float_workspace_buffer,
        wrapper._int_workspace_buffer,
        wrapper._pin_memory_int_workspace_buffer,
    )
    if wrapper.use_tensor_cores:
        # kv lengths on the host, from host data only (page_size * full pages + last page)
        pages = indptr_cpu[1:] - indptr_cpu[:-1]
        kv_lens_cpu = ((pages - 1).clamp(min=0) * page_size + last_page_len_cpu).to(torch.int32)
        kv_lens_cpu = torch.where(pages > 0, kv_lens_cpu, 0).to(torch.int32)
        args = [
            *workspaces,
            torch.arange(batch_size + 1, dtype=torch.int32),  # qo_indptr: one row per request
            indptr_cpu,
            kv_lens_cpu,
            batch_size,  # total_num_rows
            batch_size,
            num_qo_heads,
            num_kv_heads,
            page_size,
            graph,
            head_dim,  # head_dim_qk
            head_dim,  # head_dim_vo
            False,  # causal
            window_left,
        ]
        if getattr(wrapper, "_backend", None) == "fa2":
            args += [-1 if fixed_split_size is None else fixed_split_size, disable_split_kv, 0]
        plan_info = module.plan(*args)
        wrapper._max_kv_len = int(kv_lens_cpu.max()) if batch_size else 0
    else:
        plan_info = module.plan(
            *workspaces,
            indptr_cpu,
            batch_size,
            num_qo_heads,
            num_kv_heads,
            page_size,
            graph,  # enable_cuda_graph
            window_left,
            soft_cap,
            head_dim,  # head_dim_qk
            head_dim,  # head_dim_vo
            torch.empty(0, dtype=q_dt),  # dtype carriers, as the full plan passes them
            torch.empty(0, dtype=kv_dt),
        )
        if hasattr(wrapper, "_max_kv_len"):  # stand-ins keep the planned max (host data)
            pages = indptr_cpu[1:] - indptr_cpu[:-1]
            wrapper._max_kv_len = int(pages.max()) * page_size if batch_size else 0

    wrapper._plan_info = plan_info
    wrapper._workspace_size = (
        wrapper._float_workspace_buffer.numel() * wrapper._float_workspace_buffer.element_size()
    )
    wrapper._cached_q_data_type = q_dt
    wrapper._cached_kv_data_type = kv_dt
    if getattr(wrapper, "_cached_o_data_type", None) is None:
        wrapper._cached_o_data_type = q_dt
    wrapper._batch_size = batch_size
    wrapper._num_qo_heads = num_qo_heads
    wrapper._num_kv_heads = num_kv_heads
    wrapper._pos_encoding_mode = pos_encoding_mode
    wrapper._window_left = window_left
    wrapper._logits_soft_cap = soft_cap
    wrapper._sm_scale = sm_scale
    wrapper._rope_scale = rope_scale
    wrapper._rope_theta = rope_theta


def _fast_decode_plan_entry(
    wrapper: Any,
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
    *,
    global_override_indptr_cpu: torch.Tensor | None = None,
) -> None:
    """``wrapper.plan`` / ``begin_forward`` after :func:`install_fast_decode_plan`."""
    if block_tables is not None or seq_lens is not None:
        raise ValueError("the fast decode plan takes no block_tables / seq_lens (trtllm-gen)")
    if o_data_type is not None:
        prev = getattr(wrapper, "_cached_o_data_type", None)
        if prev is not None and _canon(o_data_type) != prev:
            raise ValueError(f"o_data_type={o_data_type} differs from the full plan's {prev}")
    if global_override_indptr_cpu is not None:
        indptr_cpu = global_override_indptr_cpu
    elif isinstance(indptr, torch.Tensor) and indptr.device.type == "cpu":
        indptr_cpu = indptr
    else:
        raise ValueError(
            "the fast decode plan needs the host indptr: pass global_override_indptr_cpu= "
            f"(indptr is on {getattr(indptr, 'device', None)}; reading it would be the "
            "device-to-host copy this plan exists to avoid)"
        )
    if last_page_len.device.type == "cpu":
        last_page_len_cpu = last_page_len
    elif page_size == 1:  # every page is full: no need to read the device tensor
        last_page_len_cpu = torch.ones(len(last_page_len), dtype=torch.int32)
    else:
        raise ValueError(
            f"page_size={page_size}: the fast plan needs last_page_len on the host "
            f"(got device={last_page_len.device})"
        )
    if data_type is not None:  # the full plan's precedence: explicit q/kv types win
        q_data_type = data_type if q_data_type is None else q_data_type
        kv_data_type = data_type if kv_data_type is None else kv_data_type
    if q_data_type is None:
        q_data_type = "float16"
    fast_decode_plan(
        wrapper, indptr_cpu, last_page_len_cpu, num_qo_heads, num_kv_heads, head_dim, page_size,
        q_data_type=q_data_type, kv_data_type=kv_data_type, window_left=window_left,
        logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, rope_scale=rope_scale,
        rope_theta=rope_theta, pos_encoding_mode=pos_encoding_mode,
        fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
        indptr=_on_wrapper_device(wrapper, indptr), indices=indices,
        last_page_len=_on_wrapper_device(wrapper, last_page_len),
    )  # fmt: skip


def _on_wrapper_device(wrapper: Any, t: torch.Tensor) -> torch.Tensor | None:
    """``t`` when it lives where the wrapper's buffers do (a device tensor to check / bind), None
    when it is a host copy handed to a GPU wrapper."""
    return t if t.device == torch.device(wrapper.device) else None


def install_fast_decode_plan(wrapper: Any) -> Any:
    """Route ``wrapper.plan`` and ``wrapper.begin_forward`` to the fast decode plan.

    Call after the first full plan (it refuses a wrapper without ``_cached_module``). Afterwards
    ``wrapper.plan(...)`` takes the real ``plan``'s arguments (indptr, indices, last_page_len,
    num_qo_heads, num_kv_heads, head_dim, page_size, ..., disable_split_kv) plus the keyword
    ``global_override_indptr_cpu=`` (the host ``[bs+1]`` indptr; may be omitted only when
    ``indptr`` itself is a CPU tensor). Contract: the device ``indptr`` / ``indices`` /
    ``last_page_len`` already hold the batch and, in cuda-graph mode, *are* the bound buffers;
    the host indptr agrees with them. ``last_page_len`` is never read on the device (page size
    1: all ones). Sets ``wrapper._refimpl_fast = True``. Returns the wrapper.
    """
    _require_planned(wrapper, "install_fast_decode_plan")
    fast = functools.partial(_fast_decode_plan_entry, wrapper)
    wrapper.plan = fast
    wrapper.begin_forward = fast
    wrapper._refimpl_fast = True
    return wrapper


# ----------------------------------------------------------------------------------------------
# MLA


def fast_mla_decode_plan(
    wrapper: Any,
    qo_indptr_cpu: torch.Tensor,
    kv_indptr_cpu: torch.Tensor,
    kv_len_arr_cpu: torch.Tensor,
    num_heads: int,
    head_dim_ckv: int,
    head_dim_kpe: int,
    page_size: int,
    causal: bool,
    sm_scale: float,
    q_data_type: str | torch.dtype,
    kv_data_type: str | torch.dtype,
) -> None:
    """Re-plan a cuda-graph ``BatchMLAPagedAttentionWrapper`` from host indptrs (module doc).

    Calls ``_cached_module.plan(float_ws, int_ws, pinned_ws, qo_indptr_cpu, kv_indptr_cpu,
    kv_len_arr_cpu, num_heads, head_dim_ckv, causal)`` and sets ``_plan_info``, ``_causal``,
    ``_page_size``, ``_sm_scale``. Copies nothing into the bound qo/kv indptr, kv_len_arr or
    kv_indices buffers: the caller wrote ``kv_indices`` in place."""
    module = _require_planned(wrapper, "fast_mla_decode_plan")
    qo_indptr_cpu = _require_host("qo_indptr_cpu", qo_indptr_cpu)
    kv_indptr_cpu = _require_host("kv_indptr_cpu", kv_indptr_cpu)
    kv_len_arr_cpu = _require_host("kv_len_arr_cpu", kv_len_arr_cpu)
    if not getattr(wrapper, "_use_cuda_graph", False):
        raise ValueError(
            "fast_mla_decode_plan needs a wrapper in cuda-graph mode: run reads the bound "
            "kv_indices buffer, which without cuda-graph mode only the full plan refreshes"
        )
    batch_size = len(kv_len_arr_cpu)
    if len(qo_indptr_cpu) != batch_size + 1 or len(kv_indptr_cpu) != batch_size + 1:
        raise ValueError(
            f"qo_indptr_cpu ({len(qo_indptr_cpu)}) and kv_indptr_cpu ({len(kv_indptr_cpu)}) "
            f"must have len(kv_len_arr_cpu) + 1 = {batch_size + 1} entries"
        )
    bound = wrapper._kv_len_arr_buf
    if bound is not None and len(bound) != batch_size:
        raise ValueError(
            f"batch_size={batch_size} differs from the batch size {len(bound)} the wrapper was "
            "bound for (its kv_len_arr buffer)"
        )
    q_dt, kv_dt = _canon(q_data_type), _canon(kv_data_type)
    _check_same_kernel(wrapper, q_dt, kv_dt, -1, 0.0)
    if getattr(wrapper, "_use_profiler", False):
        raise ValueError("the fast MLA plan does not re-plan a profiling wrapper")
    plan_info = module.plan(
        wrapper._float_workspace_buffer,
        wrapper._int_workspace_buffer,
        wrapper._pin_memory_int_workspace_buffer,
        qo_indptr_cpu,
        kv_indptr_cpu,
        kv_len_arr_cpu,
        num_heads,
        head_dim_ckv,  # head_dim_o
        causal,
    )
    wrapper._plan_info = plan_info
    wrapper._causal = causal
    wrapper._page_size = page_size
    wrapper._sm_scale = sm_scale
    if hasattr(wrapper, "_batch_size"):
        wrapper._batch_size = batch_size


def _fast_mla_plan_entry(
    wrapper: Any,
    qo_indptr_cpu: torch.Tensor,
    kv_indptr_cpu: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_len_arr_cpu: torch.Tensor,
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
    """``wrapper.plan`` after :func:`install_fast_mla_decode_plan`."""
    if use_profiler:
        raise ValueError("the fast MLA plan does not plan with use_profiler=True")
    if getattr(wrapper, "_use_cuda_graph", False):
        _require_alias("kv_indices", kv_indices, wrapper._kv_indices_buf)
        if len(kv_indices) > len(wrapper._kv_indices_buf):
            raise ValueError(
                f"kv_indices has {len(kv_indices)} entries, more than the bound kv_indices "
                f"buffer holds ({len(wrapper._kv_indices_buf)})"
            )
    fast_mla_decode_plan(
        wrapper, qo_indptr_cpu, kv_indptr_cpu, kv_len_arr_cpu, num_heads, head_dim_ckv,
        head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type,
    )  # fmt: skip


def install_fast_mla_decode_plan(wrapper: Any) -> Any:
    """Route ``wrapper.plan`` to the fast MLA plan (after the first full plan).

    Afterwards ``wrapper.plan`` takes the real MLA ``plan``'s arguments in the same order, but
    ``qo_indptr``, ``kv_indptr`` and ``kv_len_arr`` must be **host** tensors (named
    ``qo_indptr_cpu``, ``kv_indptr_cpu``, ``kv_len_arr_cpu``) and ``kv_indices`` must be the
    bound ``kv_indices`` buffer, already written. Sets ``wrapper._refimpl_fast = True``.
    Returns the wrapper."""
    _require_planned(wrapper, "install_fast_mla_decode_plan")
    wrapper.plan = functools.partial(_fast_mla_plan_entry, wrapper)
    wrapper._refimpl_fast = True
    return wrapper


def is_fast_plan_installed(wrapper: Any) -> bool:
    """Whether :func:`install_fast_decode_plan` / :func:`install_fast_mla_decode_plan` ran."""
    return bool(getattr(wrapper, "_refimpl_fast", False))
