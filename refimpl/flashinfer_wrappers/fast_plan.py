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

import functools
from typing import Any

import torch
import torch.nn.functional as F

I32 = torch.int32


def _dtype(dt):
    got = getattr(torch, dt, None) if isinstance(dt, str) else dt
    if not isinstance(got, torch.dtype):
        raise TypeError(f"not a dtype: {dt!r}")
    return got


# checks shared by the fast plans and the stand-ins' full plans
def _fits(name, given, buf_name, buf):
    if given is not None and given.numel() > len(buf):
        raise ValueError(f"{name} has {given.numel()} entries, more than the bound {buf_name} holds ({len(buf)})")


def _same_batch(bs, bound):
    if bs != bound:
        raise ValueError(f"batch_size={bs} differs from the batch size {bound} the wrapper was bound for")


def _require_planned(wrapper, what):
    if getattr(wrapper, "_cached_module", None) is None:
        raise RuntimeError(
            f"{what} needs a wrapper planned once with its full plan(): it reuses wrapper._cached_module (the kernel "
            f"module plan selects and JIT-compiles); {type(wrapper).__name__} has none yet"
        )


def _start(wrapper, what, **host):
    """A fast plan's first checks: the wrapper planned once, the ``host`` tensors 1-D on the CPU, the last one ``[bs]``, the
    indptrs before it ``[bs+1]``. Returns the batch size."""
    _require_planned(wrapper, what)
    for name, t in host.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu" or t.dim() != 1:
            raise ValueError(
                f"{name} must be a CPU tensor, 1-D (the fast plan exists to avoid a device-to-host copy), got "
                f"device={t.device}, shape={tuple(t.shape)}"
            )
    *indptrs, (last, lens) = host.items()
    for name, t in indptrs:
        if len(t) != len(lens) + 1:
            raise ValueError(f"{name} has {len(t)} entries: it must have {len(lens) + 1} entries ({last}: {len(lens)})")
    return len(lens)


def _require_alias(name, given, bound):
    """Contract (2): a device tensor handed in must BE the bound buffer (by address: no sync)."""
    if given is not None and bound is not None and (given.device, given.data_ptr()) != (bound.device, bound.data_ptr()):
        raise ValueError(
            f"{name} is not the wrapper's bound buffer (data_ptr {given.data_ptr():#x} on {given.device} vs "
            f"{bound.data_ptr():#x} on {bound.device}): the fast plan copies nothing, so write the bound buffer in "
            "place (or use the full plan)"
        )


def _same_kernel(wrapper, q_data_type, kv_data_type, window_left=-1, soft_cap=0.0):
    """Contract (3): the settings that select ``_cached_module`` match the full plan's. Returns the q / kv dtypes (kv:
    q's by default)."""
    q_dt = _dtype(q_data_type)
    dtypes = q_dt, q_dt if kv_data_type is None else _dtype(kv_data_type)
    # the dtypes must match; the sliding window / soft cap be on (not -1 / 0) or off alike
    news, offs = (*dtypes, window_left, soft_cap), (None, None, -1, 0)
    for label, new, off in zip("q_data_type kv_data_type window_left logits_soft_cap".split(), news, offs):
        old = getattr(wrapper, f"_cached_{label}", None) or getattr(wrapper, f"_{label}", None)  # 0.7.2's MLA backend
        if old is not None and (old != new if off is None else (old == off) != (new == off)):
            raise ValueError(
                f"{label}={new} differs from the full plan's {old}{'' if off is None else ' (on / off)'}: it selects "
                "the kernel module; re-plan fully"
            )
    return dtypes


# the kernel modules' scheduling calls, as flashinfer's plans make them (the stand-ins' full plans too)
def _ws(obj):
    return obj._float_workspace_buffer, obj._int_workspace_buffer, obj._pin_memory_int_workspace_buffer


@functools.cache
def _real_version():
    import flashinfer

    return tuple(int(x) for x in flashinfer.__version__.split("+")[0].split(".")[:2])


def fa2_tail(wrapper: Any, split=None, no_split: bool = False) -> list:
    """The fa2 prefill module plan's last arguments: fixed_split_size, disable_split_kv, num_colocated_ctas (0), and from
    flashinfer 0.7 uniform_q_len (0: rows per request vary; 0.7.2's plans pass 0 for prefill and for decode with one
    query row). The stand-ins follow 0.7.2."""
    tail = [-1 if split is None else split, no_split, 0]
    return tail + [0] if getattr(wrapper, "IS_STANDIN", False) or _real_version() >= (0, 7) else tail


def _plan_prefill(wrapper, qo_cpu, kv_cpu, kv_lens_cpu, rows, heads, head_dim, causal, window_left=-1, *split):
    """The prefill module's scheduling call; ``heads``: (q heads, kv heads, page size, cuda graph); ``split``: fa2's
    fixed_split_size, disable_split_kv."""
    # ..., total_num_rows, batch_size, heads, head_dim_qk, head_dim_vo, causal, window_left
    args = [qo_cpu, kv_cpu, kv_lens_cpu, rows, len(kv_lens_cpu), *heads, head_dim, head_dim, causal, window_left]
    if getattr(wrapper, "_backend", None) == "fa2":
        args += fa2_tail(wrapper, *split)
    return wrapper._cached_module.plan(*_ws(wrapper), *args)


def _plan_decode(wrapper, indptr_cpu, last_page_len_cpu, heads, head_dim, window_left=-1, soft_cap=0.0, *split):
    """A decode plan's scheduling call, for the wrapper's ``_cached_q_data_type`` / ``_cached_kv_data_type`` (``heads`` as
    :func:`_plan_prefill`'s): tensor cores plan the prefill module, one query row per request (eager: bound on the device
    too); CUDA cores the decode module, empty tensors carrying the dtypes. Keeps run's max kv length (a CUDA-core graph
    holds the capture's)."""
    bs, pages, (_, _, page_size, graph) = len(last_page_len_cpu), indptr_cpu.diff(), heads
    if not wrapper.use_tensor_cores:
        if not graph and hasattr(wrapper, "_max_kv_len"):
            wrapper._max_kv_len = int(pages.max()) * page_size if bs else 0
        dtypes = (wrapper._cached_q_data_type, wrapper._cached_kv_data_type)
        empties = (torch.empty(0, dtype=dt, device="cpu") for dt in dtypes)  # head_dims: qk, vo
        return wrapper._cached_module.plan(
            *_ws(wrapper), indptr_cpu, bs, *heads, window_left, soft_cap, head_dim, head_dim, *empties
        )
    kv_lens_cpu = torch.where(pages > 0, (pages - 1) * page_size + last_page_len_cpu, 0).to(I32)
    wrapper._max_kv_len = int(kv_lens_cpu.max()) if bs else 0
    qo_cpu = torch.arange(bs + 1, dtype=I32, device="cpu")
    if not graph:
        wrapper._qo_indptr_buf = qo_cpu.to(wrapper.device)
    return _plan_prefill(wrapper, qo_cpu, indptr_cpu, kv_lens_cpu, bs, heads, head_dim, False, window_left, *split)


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
    bs = _start(wrapper, "fast_decode_plan", indptr_cpu=indptr_cpu, last_page_len_cpu=last_page_len_cpu)
    soft_cap = float(logits_soft_cap or 0)
    dtypes = _same_kernel(wrapper, q_data_type, kv_data_type, window_left, soft_cap)
    graph = bool(wrapper.is_cuda_graph_enabled)
    if graph:
        _same_batch(bs, wrapper._fixed_batch_size)
        _fits("indices", indices, "paged_kv_indices_buffer", wrapper._paged_kv_indices_buf)
        _require_alias("indptr", indptr, wrapper._paged_kv_indptr_buf)
        _require_alias("indices", indices, wrapper._paged_kv_indices_buf)
        _require_alias("last_page_len", last_page_len, wrapper._paged_kv_last_page_len_buf)
    elif None in (indptr, indices, last_page_len):
        raise ValueError(
            "without cuda-graph mode the fast plan needs the device indptr / indices / last_page_len to bind (run reads them)"
        )
    else:
        wrapper._paged_kv_indptr_buf, wrapper._paged_kv_indices_buf = indptr, indices
        wrapper._paged_kv_last_page_len_buf = last_page_len
    wrapper._cached_q_data_type, wrapper._cached_kv_data_type = dtypes
    heads, split = (num_qo_heads, num_kv_heads, page_size, graph), (fixed_split_size, disable_split_kv)
    wrapper._plan_info = _plan_decode(wrapper, indptr_cpu, last_page_len_cpu, heads, head_dim, window_left, soft_cap, *split)
    wrapper._workspace_size = wrapper._float_workspace_buffer.nbytes
    if getattr(wrapper, "_cached_o_data_type", None) is None:
        wrapper._cached_o_data_type = dtypes[0]
    wrapper._batch_size, wrapper._num_qo_heads = bs, num_qo_heads
    wrapper._num_kv_heads, wrapper._pos_encoding_mode = num_kv_heads, pos_encoding_mode
    wrapper._window_left, wrapper._logits_soft_cap = window_left, soft_cap
    wrapper._sm_scale, wrapper._rope_scale, wrapper._rope_theta = sm_scale, rope_scale, rope_theta
    if hasattr(wrapper, "_q_len_per_req"):  # flashinfer 0.7.2's decode plan keeps these too: one query row per request
        wrapper._q_len_per_req, wrapper._is_causal, wrapper._window_right = 1, False, 0


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
    re-plans these wrappers fully. Contract (2): the caller writes the bound ``_paged_kv_indptr_buf`` and
    ``_paged_kv_indices_buf`` on the device before the kernel runs (before or after this plan, which reads only host
    data: a split hook writes them after it). This plan writes ``_qo_indptr_buf`` (one host-to-device copy); with a bound
    mask, ``custom_mask`` (device, ``q_len_i * kv_len_i`` entries per request) is packed into ``_custom_mask_buf`` as the
    full plan packs it and ``_mask_indptr_buf`` gets its offsets (host-computed); then the module's scheduling call."""
    host = dict(qo_indptr_cpu=qo_indptr_cpu, kv_indptr_cpu=kv_indptr_cpu, kv_lens_cpu=kv_lens_cpu)
    bs = _start(wrapper, "fast_prefill_plan", **host)
    if not wrapper.is_cuda_graph_enabled:
        raise ValueError("fast_prefill_plan needs a wrapper in cuda-graph mode (run reads the bound buffers)")
    _same_batch(bs, wrapper._fixed_batch_size)
    _same_kernel(wrapper, q_data_type, kv_data_type)
    qo_indptr_cpu, kv_indptr_cpu, kv_lens_cpu = (t.to(I32) for t in host.values())  # IdType
    rows, cap = int(qo_indptr_cpu[-1]), getattr(wrapper, "_max_total_num_rows", None)
    if cap is not None and rows > cap:
        raise ValueError(f"qo_indptr_cpu has {rows} rows, more than the {cap} of the wrapper's first plan")
    if (custom_mask is None) != (wrapper._custom_mask_buf is None):
        raise ValueError(
            f"{'no' if custom_mask is None else 'a'} custom_mask for a wrapper with "
            f"{'one' if custom_mask is None else 'none'} bound: a graph captured with a mask reads the bound mask "
            "buffer; one without has none to write"
        )
    wrapper._qo_indptr_buf.copy_(qo_indptr_cpu, non_blocking=True)
    if custom_mask is not None:
        _write_mask(wrapper, custom_mask, qo_indptr_cpu.diff().to(torch.int64) * kv_lens_cpu)
    heads = (num_qo_heads, num_kv_heads, page_size, True)  # rows: as the full plan
    wrapper._plan_info = _plan_prefill(wrapper, qo_indptr_cpu, kv_indptr_cpu, kv_lens_cpu, cap or rows, heads, head_dim, causal)
    wrapper._causal, wrapper._batch_size = causal, bs  # run's max q / kv lengths: the graph holds the capture's


def _mask_offsets(mask, sizes):
    """The element offset of each request's block of ``mask`` (``sizes[i]`` entries for request i: a host integer
    tensor), int64 ``[bs+1]``; the stand-ins' full plans share it."""
    offsets = F.pad(sizes.cumsum(0), (1, 0))
    if mask.numel() != offsets[-1]:
        raise ValueError(f"custom_mask has {mask.numel()} entries, expected sum(q_len_i * kv_len_i) = {int(offsets[-1])}")
    return offsets


def _write_mask(wrapper, mask, sizes):
    """``mask`` (``sizes[i]`` entries for request i, host sizes) into the bound mask buffers: flashinfer packs each
    request's block into bits (little bit order, whole bytes per request) at byte offsets; the stand-ins keep a byte per
    entry at element offsets."""
    elem = _mask_offsets(mask, sizes)
    real = not getattr(wrapper, "IS_STANDIN", False)
    offsets = F.pad(((sizes + 7) // 8).cumsum(0), (1, 0)) if real else elem
    used, buf = int(offsets[-1]), wrapper._custom_mask_buf
    if used > len(buf):
        raise ValueError(f"custom_mask needs {used} entries of the bound custom_mask_buf, which holds {len(buf)}")
    wrapper._mask_indptr_buf.copy_(offsets, non_blocking=True)
    flat = mask.reshape(-1)
    if not real:
        buf[:used].copy_(flat)
        return
    try:  # the kernel segment_packbits launches (0.7.2 moved it into a submodule)
        from flashinfer.quantization.packbits import get_quantization_module
    except ImportError:
        from flashinfer.quantization import get_quantization_module

    indptr = elem.to(flat.device, I32, non_blocking=True)  # the one input it needs on the device
    get_quantization_module().segment_packbits(flat.to(torch.bool), indptr, wrapper._mask_indptr_buf, "little", buf[:used])


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
    global_override_indptr_cpu=None,
):
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
        raise ValueError(
            "the fast decode plan needs the host indptr: pass global_override_indptr_cpu= (indptr is on "
            f"{getattr(indptr, 'device', type(indptr).__name__)})"
        )
    if last_page_len.device.type == "cpu":
        last_page_len_cpu = last_page_len
    elif page_size == 1:  # every page is full: no need to read the device tensor
        last_page_len_cpu = torch.ones(len(last_page_len), dtype=I32, device="cpu")
    else:
        raise ValueError(f"page_size={page_size}: the fast plan needs last_page_len on the host")
    on_device = lambda t: t if t.device == torch.device(wrapper.device) else None  # not a copy
    fast_decode_plan(
        wrapper,
        indptr_cpu,
        last_page_len_cpu,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        q_data_type=q_data_type or data_type or "float16",
        kv_data_type=kv_data_type or data_type,  # as plan()
        window_left=window_left,
        logits_soft_cap=logits_soft_cap,
        sm_scale=sm_scale,
        rope_scale=rope_scale,
        rope_theta=rope_theta,
        pos_encoding_mode=pos_encoding_mode,
        fixed_split_size=fixed_split_size,
        disable_split_kv=disable_split_kv,
        indptr=on_device(indptr),
        indices=indices,
        last_page_len=on_device(last_page_len),
    )


def _install(wrapper, what, entry, *names):
    _require_planned(wrapper, what)
    fast = functools.partial(entry, wrapper)
    for name in names:  # plan (and begin_forward: the same object)
        setattr(wrapper, name, fast)
    wrapper._refimpl_fast = True
    return wrapper


def install_fast_decode_plan(wrapper: Any) -> Any:
    """Route ``wrapper.plan`` and ``begin_forward`` (after the first full plan) to the fast plan: flashinfer's decode
    ``plan`` arguments plus ``global_override_indptr_cpu=`` (the host indptr; omit it only when ``indptr`` is on the
    CPU). Sets ``wrapper._refimpl_fast = True``; returns the wrapper."""
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
    host = dict(qo_indptr_cpu=qo_indptr_cpu, kv_indptr_cpu=kv_indptr_cpu, kv_len_arr_cpu=kv_len_arr_cpu)
    bs, module = _start(wrapper, "fast_mla_decode_plan", **host), wrapper._cached_module
    target = getattr(wrapper, "_planned_backend", None) or wrapper
    if not getattr(wrapper, "_use_cuda_graph", False):  # run reads the bound kv_indices
        raise ValueError("fast_mla_decode_plan needs a wrapper in cuda-graph mode")
    if wrapper._kv_len_arr_buf is not None:  # the bound batch size
        _same_batch(bs, len(wrapper._kv_len_arr_buf))
    _same_kernel(target, q_data_type, kv_data_type)
    if getattr(target, "_use_profiler", False):
        raise ValueError("the fast MLA plan does not re-plan a profiling wrapper")
    args = (*_ws(target), *host.values(), num_heads, head_dim_ckv, causal)  # head_dim_o = ckv
    if hasattr(module, "plan_with_staged_workspace_bytes"):  # 0.7.2
        target._plan_info, target._staged_int_workspace_bytes = module.plan_with_staged_workspace_bytes(*args)
    else:
        target._plan_info = module.plan(*args)
    for obj in (target, wrapper):
        obj._causal, obj._page_size, obj._sm_scale = causal, page_size, sm_scale
    if hasattr(wrapper, "_batch_size"):
        wrapper._batch_size = bs


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
):
    """``wrapper.plan`` after :func:`install_fast_mla_decode_plan`: flashinfer's names, ``qo_indptr`` / ``kv_indptr`` /
    ``kv_len_arr`` on the host."""
    if use_profiler:
        raise ValueError("the fast MLA plan does not plan with use_profiler=True")
    if getattr(wrapper, "_use_cuda_graph", False):
        _require_alias("kv_indices", kv_indices, wrapper._kv_indices_buf)
        _fits("kv_indices", kv_indices, "kv_indices", wrapper._kv_indices_buf)
    fast_mla_decode_plan(
        wrapper,
        qo_indptr,
        kv_indptr,
        kv_len_arr,
        num_heads,
        head_dim_ckv,
        head_dim_kpe,
        page_size,
        causal,
        sm_scale,
        q_data_type,
        kv_data_type,
    )


def install_fast_mla_decode_plan(wrapper: Any) -> Any:
    """Route ``wrapper.plan`` (after the first full plan) to the fast MLA plan: flashinfer's MLA ``plan`` arguments,
    ``qo_indptr`` / ``kv_indptr`` / ``kv_len_arr`` on the host and ``kv_indices`` the bound buffer, already written.
    Sets ``wrapper._refimpl_fast = True``; returns the wrapper."""
    return _install(wrapper, "install_fast_mla_decode_plan", _fast_mla_plan_entry, "plan")


def is_fast_plan_installed(wrapper: Any) -> bool:
    """Whether :func:`install_fast_decode_plan` / :func:`install_fast_mla_decode_plan` ran."""
    return bool(getattr(wrapper, "_refimpl_fast", False))
