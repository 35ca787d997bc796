"""The graph-path re-plan without a device-to-host copy (SGLang's ``fast_decode_plan`` and ``fast_mla_decode_plan``, our
way).

Every replay re-plans. The full ``plan`` (1) copies the indptr device -> host, a stream sync (for MLA it made graph
replay hang, SGLang #3987: https://github.com/sgl-project/sglang/pull/3987), (2) copies indptr / indices into the bound
buffers, (3) selects (first time: JIT-compiles) the kernel module, (4) writes the host-computed partition into the
workspace. The fast plans keep only (4), through ``wrapper._cached_module.plan(...)`` (real flashinfer 0.6.0 and 0.7.2
wrappers and the stand-ins, which follow 0.7.2; where the two versions differ, :func:`fa2_tail` and
:func:`fast_mla_decode_plan` say how). Contracts: (1) the host indptr describes the batch written on the device (unchecked: the kernel
silently reads wrong keys); (2) in cuda-graph mode the device tensors handed in *are* the bound buffers (checked by
address; without it decode rebinds them, MLA refuses; MLA's bound ``kv_indptr`` / ``kv_len_arr`` stay stale, SGLang
#37975: https://github.com/sgl-project/sglang/pull/37975); (3) q/kv dtypes and sliding window / soft cap on/off match
the first full plan's (they select ``_cached_module``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .standin import I32, _dtype


def _require_planned(wrapper: Any, what: str) -> Any:
    if getattr(wrapper, "_cached_module", None) is None:
        why = "wrapper._cached_module (the kernel module plan selects and JIT-compiles)"
        msg = f"{what} needs a wrapper planned once with its full plan(): it reuses {why}"
        raise RuntimeError(f"{msg}; {type(wrapper).__name__} has none yet")
    return wrapper._cached_module


def _require_host(**tensors: Any) -> None:
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu" or t.dim() != 1:
            why = "(the fast plan exists to avoid a device-to-host copy)"
            raise ValueError(f"{name} must be a CPU tensor, 1-D {why}, got device={t.device}, shape={tuple(t.shape)}")


def _require_alias(name: str, given: torch.Tensor | None, bound: torch.Tensor | None) -> None:
    """Contract (2): a device tensor handed in must BE the bound buffer (by address: no sync)."""
    if given is None or bound is None or (given.device, given.data_ptr()) == (bound.device, bound.data_ptr()):
        return
    have, want = f"{given.data_ptr():#x} on {given.device}", f"{bound.data_ptr():#x} on {bound.device}"
    fix = "the fast plan copies nothing, so write the bound buffer in place (or use the full plan)"
    raise ValueError(f"{name} is not the wrapper's bound buffer (data_ptr {have} vs {want}): {fix}")


def _require_fits(name: str, given: torch.Tensor | None, bound: torch.Tensor) -> None:
    if given is not None and len(given) > len(bound):
        raise ValueError(f"{name} has {len(given)} entries, more than the bound buffer holds ({len(bound)})")


def _check_same_kernel(wrapper: Any, q_dt, kv_dt, window_left: int, soft_cap: float) -> None:
    """Contract (3): the settings that select ``_cached_module`` match the full plan's."""
    for label, want in (("q_data_type", q_dt), ("kv_data_type", kv_dt)):
        have = getattr(wrapper, f"_cached_{label}", None) or getattr(wrapper, f"_{label}", None)  # 0.7.2's MLA backend
        if have is not None and have != want:
            raise ValueError(f"{label}={want} differs from the full plan's {have}: re-plan fully")
    old_window, old_cap = getattr(wrapper, "_window_left", None), getattr(wrapper, "_logits_soft_cap", None)
    if old_window is not None and (old_window != -1) != (window_left != -1):
        what = "sliding window on/off selects another kernel module; re-plan fully"
        raise ValueError(f"window_left={window_left} vs the full plan's {old_window}: {what}")
    if old_cap is not None and (old_cap > 0) != (soft_cap > 0):
        what = "soft cap on/off selects another kernel module; re-plan fully"
        raise ValueError(f"logits_soft_cap={soft_cap} vs the full plan's {old_cap}: {what}")


def fast_decode_plan(
    wrapper: Any,
    indptr_cpu: torch.Tensor,
    last_page_len_cpu: torch.Tensor,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    *,
    q_data_type,
    kv_data_type=None,
    window_left: int = -1,
    logits_soft_cap=0.0,
    sm_scale=None,
    rope_scale=None,
    rope_theta=None,
    pos_encoding_mode: str = "NONE",
    fixed_split_size=None,
    disable_split_kv: bool = False,
    indptr=None,
    indices=None,
    last_page_len=None,
) -> None:
    """Re-plan a ``BatchDecodeWithPagedKVCacheWrapper`` from host ``indptr_cpu [bs+1]`` and ``last_page_len_cpu [bs]``; the
    device ``indptr`` / ``indices`` / ``last_page_len`` follow contract (2): the bound buffers in cuda-graph mode, else
    required and rebound."""
    module = _require_planned(wrapper, "fast_decode_plan")
    _require_host(indptr_cpu=indptr_cpu, last_page_len_cpu=last_page_len_cpu)
    batch_size = len(last_page_len_cpu)
    if len(indptr_cpu) != batch_size + 1:
        raise ValueError(f"indptr_cpu has {len(indptr_cpu)} entries, expected {batch_size + 1}")
    q_dt = _dtype(q_data_type)
    kv_dt = q_dt if kv_data_type is None else _dtype(kv_data_type)
    soft_cap = 0.0 if logits_soft_cap is None else float(logits_soft_cap)
    _check_same_kernel(wrapper, q_dt, kv_dt, window_left, soft_cap)
    graph = bool(wrapper.is_cuda_graph_enabled)
    if graph:
        if batch_size != wrapper._fixed_batch_size:
            bound = wrapper._fixed_batch_size
            raise ValueError(f"batch_size={batch_size} differs from the batch size {bound} the wrapper was bound for")
        _require_fits("indices", indices, wrapper._paged_kv_indices_buf)
        _require_alias("indptr", indptr, wrapper._paged_kv_indptr_buf)
        _require_alias("indices", indices, wrapper._paged_kv_indices_buf)
        _require_alias("last_page_len", last_page_len, wrapper._paged_kv_last_page_len_buf)
    else:
        bufs = (indptr, indices, last_page_len)
        if any(t is None for t in bufs):
            what = "the device indptr / indices / last_page_len to bind (run reads them)"
            raise ValueError(f"without cuda-graph mode the fast plan needs {what}")
        wrapper._paged_kv_indptr_buf, wrapper._paged_kv_indices_buf, wrapper._paged_kv_last_page_len_buf = bufs
        if wrapper.use_tensor_cores:
            wrapper._qo_indptr_buf = torch.arange(batch_size + 1, dtype=I32, device=wrapper.device)
    fws = wrapper._float_workspace_buffer
    ws = (fws, wrapper._int_workspace_buffer, wrapper._pin_memory_int_workspace_buffer)
    heads = (num_qo_heads, num_kv_heads, page_size, graph)
    if wrapper.use_tensor_cores:  # the prefill module, as flashinfer's decode.py plan calls it
        pages = indptr_cpu[1:] - indptr_cpu[:-1]
        kv_lens_cpu = torch.where(pages > 0, (pages - 1).clamp(min=0) * page_size + last_page_len_cpu, 0).to(I32)
        qo_indptr = torch.arange(batch_size + 1, dtype=I32, device="cpu")  # one row per request
        split = (fixed_split_size, disable_split_kv)
        plan_info = _prefill_module_plan(
            wrapper, qo_indptr, indptr_cpu, kv_lens_cpu, batch_size, heads, head_dim, False, window_left, *split
        )
        wrapper._max_kv_len = int(kv_lens_cpu.max()) if batch_size else 0
    else:  # the CUDA-core decode module; empty tensors carry the dtypes, as in the full plan
        empties = (torch.empty(0, dtype=q_dt, device="cpu"), torch.empty(0, dtype=kv_dt, device="cpu"))
        dims = (window_left, soft_cap, head_dim, head_dim)  # ..., head_dim_qk, head_dim_vo
        plan_info = module.plan(*ws, indptr_cpu, batch_size, *heads, *dims, *empties)
        if not graph and hasattr(wrapper, "_max_kv_len"):  # run's max kv length (a graph holds the capture's)
            wrapper._max_kv_len = int((indptr_cpu[1:] - indptr_cpu[:-1]).max()) * page_size if batch_size else 0
    wrapper._plan_info = plan_info
    wrapper._workspace_size = fws.numel() * fws.element_size()
    wrapper._cached_q_data_type, wrapper._cached_kv_data_type = q_dt, kv_dt
    if getattr(wrapper, "_cached_o_data_type", None) is None:
        wrapper._cached_o_data_type = q_dt
    wrapper._batch_size, wrapper._num_qo_heads = batch_size, num_qo_heads
    wrapper._num_kv_heads, wrapper._pos_encoding_mode = num_kv_heads, pos_encoding_mode
    wrapper._window_left, wrapper._logits_soft_cap = window_left, soft_cap
    wrapper._sm_scale, wrapper._rope_scale, wrapper._rope_theta = sm_scale, rope_scale, rope_theta
    if hasattr(wrapper, "_q_len_per_req"):  # flashinfer 0.7.2's decode plan keeps these too: one query row per request
        wrapper._q_len_per_req, wrapper._is_causal, wrapper._window_right = 1, False, 0


@functools.cache
def _real_version() -> tuple[int, ...]:
    import flashinfer

    return tuple(int(x) for x in flashinfer.__version__.split("+")[0].split(".")[:2])


def fa2_tail(wrapper: Any, split=None, no_split: bool = False) -> list:
    """The fa2 prefill module plan's last arguments: fixed_split_size, disable_split_kv, num_colocated_ctas (0), and from
    flashinfer 0.7 uniform_q_len (0: rows per request vary; 0.7.2's plans pass 0 for prefill and for decode with one
    query row). The stand-ins follow 0.7.2."""
    tail = [-1 if split is None else split, no_split, 0]
    return tail + [0] if getattr(wrapper, "IS_STANDIN", False) or _real_version() >= (0, 7) else tail


def _prefill_module_plan(
    wrapper, qo_cpu, kv_cpu, kv_lens_cpu, rows, heads, head_dim, causal, window_left, split=None, no_split=False
):
    """The prefill module's scheduling call, flashinfer's positional arguments; ``heads``: (q heads, kv heads, page size,
    cuda graph)."""
    ws = (wrapper._float_workspace_buffer, wrapper._int_workspace_buffer, wrapper._pin_memory_int_workspace_buffer)
    # ..., total_num_rows, batch_size, heads, head_dim_qk, head_dim_vo, causal, window_left
    args = [*ws, qo_cpu, kv_cpu, kv_lens_cpu, rows, len(kv_lens_cpu), *heads, head_dim, head_dim, causal, window_left]
    if getattr(wrapper, "_backend", None) == "fa2":
        args += fa2_tail(wrapper, split, no_split)
    return wrapper._cached_module.plan(*args)


def fast_prefill_plan(
    wrapper: Any,
    qo_indptr_cpu: torch.Tensor,
    kv_indptr_cpu: torch.Tensor,
    kv_lens_cpu: torch.Tensor,
    num_qo_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    *,
    causal: bool,
    q_data_type,
    kv_data_type=None,
    custom_mask: torch.Tensor | None = None,
) -> None:
    """Re-plan a cuda-graph ``BatchPrefillWithPagedKVCacheWrapper`` (verify, draft extend) from host ``qo_indptr_cpu`` /
    ``kv_indptr_cpu [bs+1]`` and ``kv_lens_cpu [bs]``: no device-to-host read, no per-element Python. refimpl's own: SGLang
    re-plans these wrappers fully. Contract (2): the caller has written the bound ``_paged_kv_indptr_buf`` and
    ``_paged_kv_indices_buf`` on the device. This plan writes ``_qo_indptr_buf`` (one host-to-device copy); with a bound
    mask, ``custom_mask`` (device, ``q_len_i * kv_len_i`` entries per request) is packed into ``_custom_mask_buf`` as the
    full plan packs it and ``_mask_indptr_buf`` gets its offsets (host-computed); then the module's scheduling call."""
    _require_planned(wrapper, "fast_prefill_plan")
    _require_host(qo_indptr_cpu=qo_indptr_cpu, kv_indptr_cpu=kv_indptr_cpu, kv_lens_cpu=kv_lens_cpu)
    if not wrapper.is_cuda_graph_enabled:
        raise ValueError("fast_prefill_plan needs a wrapper in cuda-graph mode (run reads the bound buffers)")
    bs = len(kv_lens_cpu)
    if len(qo_indptr_cpu) != bs + 1 or len(kv_indptr_cpu) != bs + 1:
        have = f"qo_indptr_cpu ({len(qo_indptr_cpu)}) and kv_indptr_cpu ({len(kv_indptr_cpu)})"
        raise ValueError(f"{have} must have {bs + 1} entries")
    if bs != wrapper._fixed_batch_size:
        raise ValueError(f"batch_size={bs} differs from the batch size {wrapper._fixed_batch_size} the wrapper was bound for")
    q_dt = _dtype(q_data_type)
    kv_dt = q_dt if kv_data_type is None else _dtype(kv_data_type)
    _check_same_kernel(wrapper, q_dt, kv_dt, -1, 0.0)
    qo_indptr_cpu, kv_indptr_cpu, kv_lens_cpu = (t.to(I32) for t in (qo_indptr_cpu, kv_indptr_cpu, kv_lens_cpu))  # IdType
    rows = int(qo_indptr_cpu[-1])
    cap = getattr(wrapper, "_max_total_num_rows", None)
    if cap is not None and rows > cap:
        raise ValueError(f"qo_indptr_cpu has {rows} rows, more than the {cap} of the wrapper's first plan")
    if (custom_mask is None) != (wrapper._custom_mask_buf is None):
        why = "a graph captured with a mask reads the bound mask buffer; one without has none to write"
        have = "no custom_mask" if custom_mask is None else "a custom_mask"
        bound = "one bound" if wrapper._custom_mask_buf is not None else "none bound"
        raise ValueError(f"{have} for a wrapper with {bound}: {why}")
    wrapper._qo_indptr_buf.copy_(qo_indptr_cpu, non_blocking=True)
    if custom_mask is not None:
        _write_mask(wrapper, custom_mask, (qo_indptr_cpu[1:] - qo_indptr_cpu[:-1]).to(torch.int64) * kv_lens_cpu)
    heads = (num_qo_heads, num_kv_heads, page_size, True)
    args = (qo_indptr_cpu, kv_indptr_cpu, kv_lens_cpu, cap or rows, heads, head_dim, causal, -1)  # rows: as the full plan
    wrapper._plan_info = _prefill_module_plan(wrapper, *args)
    wrapper._causal, wrapper._batch_size = causal, bs  # run's max q / kv lengths: the graph holds the capture's


def _write_mask(wrapper: Any, mask: torch.Tensor, sizes: torch.Tensor) -> None:
    """``mask`` (``sizes[i]`` entries for request i, host sizes) into the bound mask buffers: flashinfer packs each
    request's block into bits (little bit order, whole bytes per request) at byte offsets; the stand-ins keep a byte per
    entry at element offsets."""
    elem = torch.zeros(len(sizes) + 1, dtype=torch.int64, device="cpu")
    elem[1:] = torch.cumsum(sizes, 0)
    if mask.numel() != int(elem[-1]):
        raise ValueError(f"custom_mask has {mask.numel()} entries, expected sum(q_len_i * kv_len_i) = {int(elem[-1])}")
    real = not getattr(wrapper, "IS_STANDIN", False)
    offsets = elem.clone()
    if real:
        offsets[1:] = torch.cumsum((sizes + 7) // 8, 0)
    if int(offsets[-1]) > len(wrapper._custom_mask_buf):
        have, cap = int(offsets[-1]), len(wrapper._custom_mask_buf)
        raise ValueError(f"custom_mask needs {have} entries of the bound custom_mask_buf, which holds {cap}")
    wrapper._mask_indptr_buf.copy_(offsets.to(wrapper._mask_indptr_buf.dtype), non_blocking=True)
    flat = mask.reshape(-1)
    if not real:
        wrapper._custom_mask_buf[: flat.numel()].copy_(flat)
        return
    try:  # the kernel segment_packbits launches (0.7.2 moved it into a submodule)
        from flashinfer.quantization.packbits import get_quantization_module
    except ImportError:
        from flashinfer.quantization import get_quantization_module

    indptr = elem.to(torch.int32).to(flat.device, non_blocking=True)  # the one input it needs on the device
    out = wrapper._custom_mask_buf[: int(offsets[-1])]
    get_quantization_module().segment_packbits(flat.to(torch.bool), indptr, wrapper._mask_indptr_buf, "little", out)


def _fast_decode_plan_entry(
    wrapper,
    indptr,
    indices,
    last_page_len,
    num_qo_heads,
    num_kv_heads,
    head_dim,
    page_size,
    pos_encoding_mode="NONE",
    window_left=-1,
    logits_soft_cap=None,
    q_data_type="float16",
    kv_data_type=None,
    o_data_type=None,
    data_type=None,
    sm_scale=None,
    rope_scale=None,
    rope_theta=None,
    non_blocking=True,
    block_tables=None,
    seq_lens=None,
    fixed_split_size=None,
    disable_split_kv=False,
    *,
    global_override_indptr_cpu: torch.Tensor | None = None,
) -> None:
    """``wrapper.plan`` / ``begin_forward`` after :func:`install_fast_decode_plan`."""
    if block_tables is not None or seq_lens is not None:
        raise ValueError("the fast decode plan takes no block_tables / seq_lens (trtllm-gen)")
    prev_o = getattr(wrapper, "_cached_o_data_type", None)
    if o_data_type is not None and prev_o is not None and _dtype(o_data_type) != prev_o:
        raise ValueError(f"o_data_type={o_data_type} differs from the full plan's {prev_o}")
    indptr_cpu = global_override_indptr_cpu
    if indptr_cpu is None and isinstance(indptr, torch.Tensor) and indptr.device.type == "cpu":
        indptr_cpu = indptr
    if indptr_cpu is None:  # reading the device indptr is the copy this plan exists to avoid
        where = getattr(indptr, "device", type(indptr).__name__)
        fix = "pass global_override_indptr_cpu="
        raise ValueError(f"the fast decode plan needs the host indptr: {fix} (indptr is on {where})")
    if last_page_len.device.type == "cpu":
        last_page_len_cpu = last_page_len
    elif page_size == 1:  # every page is full: no need to read the device tensor
        last_page_len_cpu = torch.ones(len(last_page_len), dtype=torch.int32, device="cpu")
    else:
        raise ValueError(f"page_size={page_size}: the fast plan needs last_page_len on the host")
    q_data_type, kv_data_type = (data_type if t is None else t for t in (q_data_type, kv_data_type))  # as plan()
    on_device = lambda t: t if t.device == torch.device(wrapper.device) else None  # not a copy
    kw = dict(window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, rope_scale=rope_scale)
    kw.update(rope_theta=rope_theta, pos_encoding_mode=pos_encoding_mode, fixed_split_size=fixed_split_size)
    kw.update(disable_split_kv=disable_split_kv)
    kw.update(indptr=on_device(indptr), indices=indices, last_page_len=on_device(last_page_len))
    q_dt = "float16" if q_data_type is None else q_data_type
    heads = (num_qo_heads, num_kv_heads, head_dim, page_size)
    fast_decode_plan(wrapper, indptr_cpu, last_page_len_cpu, *heads, q_data_type=q_dt, kv_data_type=kv_data_type, **kw)


def _install(wrapper: Any, what: str, entry, *names: str) -> Any:
    _require_planned(wrapper, what)
    fast = functools.partial(entry, wrapper)
    for name in names:  # plan (and begin_forward: the same object)
        setattr(wrapper, name, fast)
    wrapper._refimpl_fast = True
    return wrapper


def install_fast_decode_plan(wrapper: Any) -> Any:
    """Route ``wrapper.plan`` and ``begin_forward`` (after the first full plan) to the fast plan: flashinfer's decode
    ``plan`` arguments plus ``global_override_indptr_cpu=`` (the host indptr; omit it only when ``indptr`` is on the
    CPU). Sets ``wrapper._refimpl_fast = True``."""
    return _install(wrapper, "install_fast_decode_plan", _fast_decode_plan_entry, "plan", "begin_forward")


def fast_mla_decode_plan(
    wrapper: Any,
    qo_indptr_cpu,
    kv_indptr_cpu,
    kv_len_arr_cpu,
    num_heads: int,
    head_dim_ckv: int,
    head_dim_kpe: int,
    page_size: int,
    causal: bool,
    sm_scale: float,
    q_data_type,
    kv_data_type,
) -> None:
    """Re-plan a cuda-graph ``BatchMLAPagedAttentionWrapper`` from host tensors, copying nothing. flashinfer 0.7.2 keeps
    the plan on the backend object its full plan chose (``wrapper._planned_backend``; the wrapper mirrors its module and
    workspaces), and its modules schedule through ``plan_with_staged_workspace_bytes``: the plan lands there."""
    module = _require_planned(wrapper, "fast_mla_decode_plan")
    target = getattr(wrapper, "_planned_backend", None) or wrapper
    _require_host(qo_indptr_cpu=qo_indptr_cpu, kv_indptr_cpu=kv_indptr_cpu, kv_len_arr_cpu=kv_len_arr_cpu)
    if not getattr(wrapper, "_use_cuda_graph", False):  # run reads the bound kv_indices
        raise ValueError("fast_mla_decode_plan needs a wrapper in cuda-graph mode")
    batch_size = len(kv_len_arr_cpu)
    if len(qo_indptr_cpu) != batch_size + 1 or len(kv_indptr_cpu) != batch_size + 1:
        have = f"qo_indptr_cpu ({len(qo_indptr_cpu)}) and kv_indptr_cpu ({len(kv_indptr_cpu)})"
        raise ValueError(f"{have} must have {batch_size + 1} entries")
    bound = wrapper._kv_len_arr_buf
    if bound is not None and len(bound) != batch_size:
        why = f"the batch size {len(bound)} the wrapper was bound for (its kv_len_arr buffer)"
        raise ValueError(f"batch_size={batch_size} differs from {why}")
    q_dt, kv_dt = _dtype(q_data_type), _dtype(kv_data_type)
    _check_same_kernel(target, q_dt, kv_dt, -1, 0.0)
    if getattr(target, "_use_profiler", False):
        raise ValueError("the fast MLA plan does not re-plan a profiling wrapper")
    ws = (target._float_workspace_buffer, target._int_workspace_buffer, target._pin_memory_int_workspace_buffer)
    args = (*ws, qo_indptr_cpu, kv_indptr_cpu, kv_len_arr_cpu, num_heads, head_dim_ckv, causal)  # head_dim_o = ckv
    if hasattr(module, "plan_with_staged_workspace_bytes"):  # 0.7.2
        target._plan_info, target._staged_int_workspace_bytes = module.plan_with_staged_workspace_bytes(*args)
    else:
        target._plan_info = module.plan(*args)
    for obj in {id(target): target, id(wrapper): wrapper}.values():
        obj._causal, obj._page_size, obj._sm_scale = causal, page_size, sm_scale
    if hasattr(wrapper, "_batch_size"):
        wrapper._batch_size = batch_size


def _fast_mla_plan_entry(
    wrapper,
    qo_indptr,
    kv_indptr,
    kv_indices,
    kv_len_arr,
    num_heads,
    head_dim_ckv,
    head_dim_kpe,
    page_size,
    causal,
    sm_scale,
    q_data_type,
    kv_data_type,
    use_profiler=False,
) -> None:
    """``wrapper.plan`` after :func:`install_fast_mla_decode_plan`: flashinfer's names, ``qo_indptr`` / ``kv_indptr`` /
    ``kv_len_arr`` on the host."""
    if use_profiler:
        raise ValueError("the fast MLA plan does not plan with use_profiler=True")
    if getattr(wrapper, "_use_cuda_graph", False):
        _require_alias("kv_indices", kv_indices, wrapper._kv_indices_buf)
        _require_fits("kv_indices", kv_indices, wrapper._kv_indices_buf)
    args = (num_heads, head_dim_ckv, head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type)
    fast_mla_decode_plan(wrapper, qo_indptr, kv_indptr, kv_len_arr, *args)


def install_fast_mla_decode_plan(wrapper: Any) -> Any:
    """Route ``wrapper.plan`` (after the first full plan) to the fast MLA plan: flashinfer's MLA ``plan`` arguments,
    ``qo_indptr`` / ``kv_indptr`` / ``kv_len_arr`` on the host and ``kv_indices`` the bound buffer, already written.
    Sets ``wrapper._refimpl_fast = True``."""
    return _install(wrapper, "install_fast_mla_decode_plan", _fast_mla_plan_entry, "plan")


def is_fast_plan_installed(wrapper: Any) -> bool:
    """Whether :func:`install_fast_decode_plan` / :func:`install_fast_mla_decode_plan` ran."""
    return bool(getattr(wrapper, "_refimpl_fast", False))
