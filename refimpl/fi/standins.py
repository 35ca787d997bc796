"""Stand-ins for flashinfer 0.6.0's three paged wrappers, for machines without flashinfer/CUDA.

``BatchDecodeWithPagedKVCacheWrapper``, ``BatchPrefillWithPagedKVCacheWrapper`` and
``BatchMLAPagedAttentionWrapper`` here have the *same* ``__init__`` / ``plan`` / ``run`` signatures
as the real classes (names, order, defaults; ``tests/test_fi_standins.py`` checks them against
the installed flashinfer) and model the behaviour a CUDA graph depends on (digest §3.2, §3.4).
Page size 1 only; anything else they cannot model raises ``NotImplementedError`` naming the
feature (HND layout, RoPE / ALiBi, sliding window, logits soft cap, packed masks, lse, fp8
tensor scales, trtllm-gen / cudnn / cutlass backends, JIT variants...).

What is modelled
----------------
* **Binding.** ``use_cuda_graph=True``: the constructor keeps the given buffers
  (``_paged_kv_indptr_buf`` ... / MLA ``_qo_indptr_buf``, ``_kv_indptr_buf``, ``_kv_indices_buf``,
  ``_kv_len_arr_buf``) and fixes ``_fixed_batch_size``; missing buffers raise ``ValueError``.
  ``plan`` *copies* into them (``buf[:n].copy_(x)``) and never rebinds; a batch size other than
  the bound one, an ``indices`` / mask longer than its buffer, an indptr that does not start at
  0 or decreases, or a mask whose length is not ``sum(q_len_i * kv_len_i)`` raise ``ValueError``
  naming the value and the limit. Without cuda-graph mode ``plan`` keeps ``x.to(device)`` (an
  alias when ``x`` is already there), like the real one.
* **Plan state.** ``plan`` reads the indptr(s) **on the host** (``.to("cpu")``: the
  device-to-host copy the fast plan avoids), selects ``_cached_module`` (a small stand-in
  object whose ``plan`` takes the same positional arguments as the real JIT module's ``plan``)
  and calls it. The module computes the *work partition*, here simply ``q_len[bs]`` and
  ``kv_len[bs]`` as int32, fills the host staging buffer ``_pin_memory_int_workspace_buffer``
  and ``copy_``-es it into a fixed slice (byte offset 0) of ``_int_workspace_buffer`` (8 MiB
  uint8 per wrapper, as in the real constructor). It returns ``_plan_info``, a list of ints
  (partition offset, batch size, total rows, max q len, max kv len). Python-side facts use the
  real attribute names (``_batch_size``, ``_num_qo_heads``, ``_sm_scale``, ``_causal``,
  ``_cached_q_data_type``, ``_max_kv_len`` ...).
* **Run.** ``run`` reads only the bound buffers and the partition: per-request kv ranges come
  from a device ``cumsum`` of the *planned* lengths (never from the bound indptr), keys from the
  bound indices buffer, the mask from the bound mask buffers; then one call of
  ``refimpl.kernels.dense_paged_attention`` / ``dense_paged_mla_attention`` (a graph recorder
  sees one ``refimpl.*`` op per run). Decode gives the op one row per request. Prefill and MLA
  give it one row per *query row* (ragged ``qo_indptr`` allowed): row j of request i gets the
  request's kv range, cut to ``kv_len - q_len + j + 1`` keys when causal (bottom-right aligned),
  and its mask row at ``mask_indptr[i] + j * kv_len``; rows past ``qo_indptr[-1]`` get zeros.
  Consequence: editing the bound indptr by hand without re-planning changes nothing (the
  partition is stale), which is why every graph replay must re-plan.
* **Kv window** (the op's fixed ``max_kv_len``). cuda-graph mode: fixed at construction to the
  bound indices buffer length, valid for every later plan (plan refuses a request longer than
  it). Lower it with :func:`set_kv_window` when the buffer is much longer than any request
  (the op's work grows with it). Otherwise: the planned maximum.
* **Masks.** ``custom_mask`` wins over ``causal`` (as the real CUSTOM mask mode). In cuda-graph
  mode the mask is used iff ``custom_mask_buf`` was bound at construction, even for a plan
  without a mask (the real wrapper picks its mask mode the same way; SGLang binds the buffer
  only when the spec has a mask). MLA: ``causal`` only, no custom mask (as real flashinfer MLA).

The one representation difference
----------------------------------
The real prefill wrapper packs the boolean custom mask into **bits** (``segment_packbits``,
little bit order, each request padded to whole bytes) and rewrites ``mask_indptr`` in **packed
byte** offsets. The stand-in stores **one byte per mask entry** (uint8 0/1) in
``custom_mask_buf`` and **element** offsets (``cumsum(q_len_i * kv_len_i)``) in
``mask_indptr_buf``. A buffer sized for the unpacked mask (SGLang sizes it ``[T*L]``) fits
both. Code that reads the bound mask buffers back sees bytes here and bits on a GPU.

Other small differences: ``return_lse`` raises; ``out`` rows past ``qo_indptr[-1]`` are written
with zeros (real: left untouched); MLA checks its bound buffers at construction (real: fails
later in ``plan``); decode ``_max_kv_len`` holds the planned maximum on every path.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Literal, overload

import torch
import torch.nn.functional as F

from ..kernels.attention import dense_paged_attention, dense_paged_mla_attention

# Parity with the real constructors: an 8 MiB uint8 int workspace (+ its host staging twin).
INT_WORKSPACE_BYTES = 8 * 1024 * 1024
# The work partition lives at this byte offset of ``_int_workspace_buffer``: int32 q_len[bs]
# followed by int32 kv_len[bs].
PARTITION_OFFSET = 0

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchMLAPagedAttentionWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "INT_WORKSPACE_BYTES",
    "PARTITION_OFFSET",
    "is_standin",
    "read_partition",
    "set_kv_window",
]


# ----------------------------------------------------------------------------------------------
# small helpers


def _unsupported(feature: str) -> NotImplementedError:
    return NotImplementedError(f"refimpl flashinfer stand-in: {feature} is not modelled")


def _canon_dtype(dt: str | torch.dtype) -> torch.dtype:
    if isinstance(dt, str):
        got = getattr(torch, dt, None)
        if not isinstance(got, torch.dtype):
            raise TypeError(f"unknown dtype name {dt!r}")
        return got
    if isinstance(dt, torch.dtype):
        return dt
    raise TypeError(f"dtype must be a string or torch.dtype, got {type(dt).__name__}")


def _check_layout(kv_layout: str) -> None:
    if kv_layout not in ("NHD", "HND"):
        raise KeyError(f"Invalid kv_layout {kv_layout}")
    if kv_layout == "HND":
        raise _unsupported("kv_layout='HND'")


def _check_page_size(page_size: int) -> None:
    if page_size != 1:
        raise _unsupported(f"page_size={page_size} (only page size 1)")


def _check_plan_features(
    pos_encoding_mode: str, window_left: int, logits_soft_cap: float | None
) -> None:
    if pos_encoding_mode != "NONE":
        raise _unsupported(f"pos_encoding_mode={pos_encoding_mode!r} (RoPE / ALiBi in the kernel)")
    if window_left != -1:
        raise _unsupported(f"window_left={window_left} (sliding window)")
    if logits_soft_cap not in (None, 0, 0.0):
        raise _unsupported(f"logits_soft_cap={logits_soft_cap} (soft capping)")


def _host_ints(name: str, t: torch.Tensor) -> list[int]:
    """A host tensor's values (the caller already paid for the device-to-host copy)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be a host (CPU) tensor, got device={t.device}")
    if t.dim() != 1:
        raise ValueError(f"{name}.shape={tuple(t.shape)}: must be 1-D")
    return [int(x) for x in t.tolist()]


def _check_indptr(name: str, t: torch.Tensor, batch_size: int | None = None) -> list[int]:
    """Validate a host indptr: length bs+1, starts at 0, non-decreasing. Returns its values."""
    vals = _host_ints(name, t)
    if batch_size is not None and len(vals) != batch_size + 1:
        raise ValueError(
            f"{name} has {len(vals)} entries, expected batch_size + 1 = {batch_size + 1}"
        )
    if not vals:
        raise ValueError(f"{name} is empty: it needs batch_size + 1 >= 1 entries")
    if vals[0] != 0:
        raise ValueError(f"{name}[0]={vals[0]}: must be 0")
    for i in range(len(vals) - 1):
        if vals[i + 1] < vals[i]:
            raise ValueError(
                f"{name} must be non-decreasing: {name}[{i}]={vals[i]} > {name}[{i + 1}]={vals[i + 1]}"
            )
    return vals


def _diff(vals: list[int]) -> list[int]:
    return [b - a for a, b in zip(vals[:-1], vals[1:])]


def _check_batch_size(batch_size: int) -> None:
    if batch_size < 0:
        raise ValueError(f"batch_size={batch_size}: must be >= 0")


def _check_fixed_batch(wrapper: Any, batch_size: int) -> None:
    fixed = wrapper._fixed_batch_size
    if batch_size != fixed:
        raise ValueError(
            f"batch_size={batch_size} differs from the batch size {fixed} the wrapper was bound "
            f"for (use_cuda_graph=True fixes it at construction; e.g. a batch larger than the "
            f"wrappers were bound for)"
        )


def _check_fits(name: str, n: int, buf_name: str, buf: torch.Tensor) -> None:
    if n > buf.shape[0]:
        raise ValueError(
            f"{name} has {n} entries, more than the bound {buf_name} holds ({buf.shape[0]})"
        )


def _check_window(kv_lens: list[int], window: int) -> None:
    for i, n in enumerate(kv_lens):
        if n > window:
            raise ValueError(
                f"request {i} has kv_len={n} > the wrapper's kv window {window} (fixed at "
                f"construction in cuda-graph mode: the bound indices buffer length or "
                f"set_kv_window())"
            )


def _host_staging(int_workspace: torch.Tensor) -> torch.Tensor:
    return torch.empty(
        int_workspace.shape,
        dtype=int_workspace.dtype,
        device="cpu",
        pin_memory=int_workspace.device.type == "cuda",
    )


# ----------------------------------------------------------------------------------------------
# the work partition (what the stand-in "kernel module" plans into the int workspace)


def _write_partition(
    int_workspace: torch.Tensor,
    staging: torch.Tensor,
    q_lens: list[int],
    kv_lens: list[int],
    total_num_rows: int,
) -> list[int]:
    bs = len(kv_lens)
    nbytes = 8 * bs
    end = PARTITION_OFFSET + nbytes
    ws = int_workspace.view(torch.uint8)
    if end > ws.numel():
        raise ValueError(f"batch_size={bs} needs {end} bytes of int workspace, it has {ws.numel()}")
    host = staging.view(torch.uint8)[PARTITION_OFFSET:end].view(torch.int32)
    host.copy_(torch.tensor(q_lens + kv_lens, dtype=torch.int32))
    ws[PARTITION_OFFSET:end].copy_(staging.view(torch.uint8)[PARTITION_OFFSET:end])
    max_q = max(q_lens) if q_lens else 0
    max_kv = max(kv_lens) if kv_lens else 0
    return [PARTITION_OFFSET, bs, total_num_rows, max_q, max_kv]


def read_partition(wrapper: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The planned ``(q_len[bs], kv_len[bs])`` int32 device views inside the int workspace.

    Graph-safe (views only). Works on stand-ins after a plan; the real library's partition has
    another format."""
    if not is_standin(wrapper):
        raise TypeError("read_partition reads the stand-ins' partition format only")
    info = wrapper._plan_info
    if info is None:
        raise RuntimeError("the wrapper has not been planned yet: call plan() first")
    off, bs = info[0], info[1]
    part = wrapper._int_workspace_buffer.view(torch.uint8)[off : off + 8 * bs].view(torch.int32)
    return part[:bs], part[bs:]


class _StandinDecodeModule:
    """Stands in for the JIT module of the CUDA-core decode path (``get_batch_decode_module``).

    ``plan`` takes the real module's 15 positional arguments and writes the partition."""

    kind = "decode"

    def plan(
        self,
        float_workspace_buffer: torch.Tensor,
        int_workspace_buffer: torch.Tensor,
        pin_memory_int_workspace_buffer: torch.Tensor,
        indptr_host: torch.Tensor,
        batch_size: int,
        num_qo_heads: int,
        num_kv_heads: int,
        page_size: int,
        enable_cuda_graph: bool,
        window_left: int,
        logits_soft_cap: float,
        head_dim_qk: int,
        head_dim_vo: int,
        empty_q_data: torch.Tensor,
        empty_kv_data: torch.Tensor,
    ) -> list[int]:
        _check_page_size(page_size)
        _check_plan_features("NONE", window_left, logits_soft_cap)
        _check_batch_size(batch_size)
        kv_lens = _diff(_check_indptr("indptr", indptr_host, batch_size))  # page size 1
        return _write_partition(
            int_workspace_buffer, pin_memory_int_workspace_buffer, [1] * batch_size, kv_lens,
            batch_size,
        )  # fmt: skip


class _StandinPrefillModule:
    """Stands in for the batch-prefill JIT module (also the tensor-core decode path).

    ``plan`` takes the real module's 16 positional arguments, or 19 for the fa2 backend
    (``fixed_split_size, disable_split_kv, num_colocated_ctas`` appended)."""

    kind = "prefill"

    def plan(self, *args: Any) -> list[int]:
        if len(args) not in (16, 19):
            raise TypeError(f"prefill module plan takes 16 or 19 arguments, got {len(args)}")
        (
            _float_ws, int_ws, staging, qo_indptr_host, kv_indptr_host, kv_lens_host,
            total_num_rows, batch_size, _hq, _hkv, page_size, _graph, _dqk, _dvo, _causal,
            window_left,
        ) = args[:16]  # fmt: skip
        _check_page_size(page_size)
        _check_plan_features("NONE", window_left, None)
        _check_batch_size(batch_size)
        q_lens = _diff(_check_indptr("qo_indptr", qo_indptr_host, batch_size))
        pages = _diff(_check_indptr("paged_kv_indptr", kv_indptr_host, batch_size))
        kv_lens = _host_ints("kv_lens_arr", kv_lens_host)
        if kv_lens != pages:
            raise ValueError(
                f"kv lengths {kv_lens} disagree with the page counts of paged_kv_indptr "
                f"{pages} (page size 1: they must be equal)"
            )
        total = sum(q_lens)
        if total_num_rows < total:
            raise ValueError(f"total_num_rows={total_num_rows} < qo_indptr[-1]={total}")
        return _write_partition(int_ws, staging, q_lens, kv_lens, total_num_rows)


class _StandinMLAModule:
    """Stands in for the MLA JIT module (``get_batch_mla_module``): ``plan`` takes the real
    module's 9 positional arguments."""

    kind = "mla"

    def plan(
        self,
        float_workspace_buffer: torch.Tensor,
        int_workspace_buffer: torch.Tensor,
        pin_memory_int_workspace_buffer: torch.Tensor,
        qo_indptr_host: torch.Tensor,
        kv_indptr_host: torch.Tensor,
        kv_len_arr_host: torch.Tensor,
        num_heads: int,
        head_dim_o: int,
        causal: bool,
    ) -> list[int]:
        q_vals = _check_indptr("qo_indptr", qo_indptr_host)
        bs = len(q_vals) - 1
        _check_batch_size(bs)
        pages = _diff(_check_indptr("kv_indptr", kv_indptr_host, bs))
        kv_lens = _host_ints("kv_len_arr", kv_len_arr_host)
        if len(kv_lens) != bs:
            raise ValueError(f"kv_len_arr has {len(kv_lens)} entries, expected batch_size={bs}")
        if kv_lens != pages:
            raise ValueError(
                f"kv_len_arr {kv_lens} disagrees with the page counts of kv_indptr {pages} "
                f"(page size 1: they must be equal)"
            )
        q_lens = _diff(q_vals)
        return _write_partition(
            int_workspace_buffer, pin_memory_int_workspace_buffer, q_lens, kv_lens, sum(q_lens)
        )


# ----------------------------------------------------------------------------------------------
# run helpers (graph-safe: device ops only, no host reads)


def _unpack_kv(paged_kv_cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """NHD kv cache -> (k [slots, Hkv, D], v [slots, Hkv, Dv]) views, page size 1.

    Accepts what the real wrappers accept: a tuple ``(k, v)`` of 3-D ``[slots, Hkv, D]`` or 4-D
    ``[pages, page_size, Hkv, D]`` tensors, or one 4-D ``[slots, 2, Hkv, D]`` / 5-D
    ``[pages, 2, page_size, Hkv, D]`` tensor (``[:, 0]`` keys, ``[:, 1]`` values)."""
    if isinstance(paged_kv_cache, tuple):
        k, v = paged_kv_cache
        out = []
        for name, x in (("k_cache", k), ("v_cache", v)):
            if x.dim() == 4:
                _check_page_size(x.shape[1])
                x = x[:, 0]
            elif x.dim() != 3:
                raise ValueError(f"{name} must be 3-D or 4-D, got shape {tuple(x.shape)}")
            out.append(x)
        return out[0], out[1]
    if isinstance(paged_kv_cache, torch.Tensor):
        x = paged_kv_cache
        if x.dim() == 5:
            _check_page_size(x.shape[2])
            x = x[:, :, 0]
        elif x.dim() != 4:
            raise ValueError(f"paged_kv_cache must be 4-D or 5-D, got shape {tuple(x.shape)}")
        if x.shape[1] != 2:
            raise ValueError(f"paged_kv_cache.shape[1]={x.shape[1]}: must be 2 (k, v)")
        return x[:, 0], x[:, 1]
    raise KeyError(
        f"Unrecognized paged_kv_cache type {type(paged_kv_cache)}, expect a single tensor or a "
        "tuple of tensor."
    )


def _scaled_sm_scale(sm_scale: float | None, head_dim: int, *scales: Any) -> float:
    s = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    for x in scales:
        if x is None:
            continue
        if isinstance(x, torch.Tensor):
            raise _unsupported("a tensor q_scale / k_scale (fp8 device scales)")
        s *= float(x)
    return s


def _apply_v_scale(out: torch.Tensor, v_scale: Any) -> torch.Tensor:
    if v_scale is None or (isinstance(v_scale, float) and v_scale == 1.0):
        return out
    out *= v_scale
    return out


def _check_run_extras(args: tuple, return_lse: bool, sinks: Any) -> None:
    if args:
        raise _unsupported("extra positional kernel arguments (JIT variants / fp8 scale tensors)")
    if return_lse:
        raise _unsupported("return_lse=True (the dense op returns no log-sum-exp)")
    if sinks is not None:
        raise _unsupported("sinks (attention sinks)")


def _nonempty(indices: torch.Tensor) -> torch.Tensor:
    """The dense op needs >= 1 index entry; an empty one (all kv lengths 0) gets a dummy."""
    return indices if indices.numel() else indices.new_zeros(1)


def _per_row_csr(
    q_len: torch.Tensor,  # [bs] int32, planned
    kv_len: torch.Tensor,  # [bs] int32, planned
    num_rows: int,  # T = q.shape[0]
    window: int,  # the kv window M
    causal: bool,
    indices: torch.Tensor,  # the bound indices buffer
    mask_indptr: torch.Tensor | None,  # the bound mask indptr (element offsets) or None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Recast a ragged batch as T one-row requests for the dense op, on the device.

    Returns ``row_indptr [T+1]`` (int64), ``row_indices [T*M]`` (the keys of row r at
    ``row_indptr[r]:row_indptr[r+1]``, gathered from the request's range of ``indices``) and,
    with a mask, ``row_mask_indptr [T+1]`` (row r's mask row start)."""
    dev = indices.device
    indices = _nonempty(indices)
    ql, kl = q_len.to(torch.int64), kv_len.to(torch.int64)
    bs = ql.shape[0]
    q_end = torch.cumsum(ql, 0)  # [bs]
    q_start = q_end - ql
    kv_start = torch.cumsum(kl, 0) - kl  # [bs]
    r = torch.arange(num_rows, device=dev)  # [T]
    req = torch.searchsorted(q_end, r, right=True)  # [T], bs for rows past the batch
    inside = req < bs
    req = req.clamp(max=bs - 1)
    j = r - q_start[req]  # row within its request
    n_kv = kl[req]  # [T]
    row_len = n_kv
    if causal:  # bottom-right aligned: row j of n_q sees kv_len - n_q + j + 1 keys
        row_len = torch.minimum((n_kv - ql[req] + j + 1).clamp(min=0), n_kv)
    row_len = torch.where(inside, row_len.clamp(max=window), 0)  # [T]
    row_indptr = F.pad(torch.cumsum(row_len, 0), (1, 0))  # [T+1]
    p = torch.arange(num_rows * window, device=dev)  # [T*M] positions of the row CSR
    row_of_p = torch.searchsorted(row_indptr[1:], p, right=True).clamp(max=num_rows - 1)
    src = kv_start[req[row_of_p]] + (p - row_indptr[row_of_p])
    row_indices = indices[src.clamp(0, indices.shape[0] - 1)]  # [T*M]
    row_mask = None
    if mask_indptr is not None:
        m = mask_indptr[:bs].to(torch.int64)[req] + j * n_kv  # [T]
        row_mask = F.pad(m, (0, 1))  # [T+1] (the op reads [:T])
    return row_indptr, row_indices, row_mask


def _joined_mla_cache(ckv: torch.Tensor, kpe: torch.Tensor) -> torch.Tensor:
    """``[slots, 1, R + Rr]`` from ``ckv [slots, 1, R]`` and ``kpe [slots, 1, Rr]``: a zero-copy
    view when they are the two column ranges of one buffer (SGLang's ``kv[..., :R]`` /
    ``kv[..., R:]``), else a concatenated copy."""
    for name, x in (("ckv_cache", ckv), ("kpe_cache", kpe)):
        if x.dim() != 3:
            raise ValueError(f"{name} must be [num_pages, page_size, dim], got {tuple(x.shape)}")
        _check_page_size(x.shape[1])
    if ckv.shape[0] != kpe.shape[0] or ckv.dtype != kpe.dtype or ckv.device != kpe.device:
        raise ValueError(
            f"ckv_cache {tuple(ckv.shape)} {ckv.dtype} and kpe_cache {tuple(kpe.shape)} "
            f"{kpe.dtype} must have the same number of pages, dtype and device"
        )
    rank = ckv.shape[-1]
    adjacent = (
        ckv.stride() == kpe.stride()
        and ckv.stride(-1) == 1
        and ckv.untyped_storage().data_ptr() == kpe.untyped_storage().data_ptr()
        and kpe.storage_offset() == ckv.storage_offset() + rank
    )
    if adjacent:
        shape = (ckv.shape[0], ckv.shape[1], rank + kpe.shape[-1])
        return torch.as_strided(ckv, shape, ckv.stride(), ckv.storage_offset())
    return torch.cat([ckv, kpe], dim=-1)


# ----------------------------------------------------------------------------------------------
# shared wrapper plumbing


class _StandinWrapper:
    IS_STANDIN = True

    _use_cuda_graph: bool
    _plan_info: list[int] | None
    _kv_window: int

    def _init_workspaces(self, float_workspace_buffer: torch.Tensor) -> None:
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        self._int_workspace_buffer = torch.empty(
            (INT_WORKSPACE_BYTES,), dtype=torch.uint8, device=self.device
        )
        self._pin_memory_int_workspace_buffer = _host_staging(self._int_workspace_buffer)
        self._plan_info = None
        self._cached_module = None

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(
        self, float_workspace_buffer: torch.Tensor, int_workspace_buffer: torch.Tensor
    ) -> None:
        """Swap the workspaces (a later plan writes its partition into the new int buffer)."""
        self._float_workspace_buffer = float_workspace_buffer
        self._int_workspace_buffer = int_workspace_buffer
        self._pin_memory_int_workspace_buffer = _host_staging(int_workspace_buffer)

    def end_forward(self) -> None:
        """Deprecated in flashinfer; no effect."""

    def _require_plan(self) -> list[int]:
        if self._plan_info is None or self._cached_module is None:
            raise RuntimeError(f"{type(self).__name__}: call plan() before run()")
        return self._plan_info

    def _window(self, plan_info: list[int]) -> int:
        """The op's fixed ``max_kv_len``: construction-time in cuda-graph mode, else planned."""
        if self._use_cuda_graph:
            return self._kv_window
        return max(1, plan_info[4])

    def _partition(self, plan_info: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        off, bs = plan_info[0], plan_info[1]
        part = self._int_workspace_buffer.view(torch.uint8)[off : off + 8 * bs]
        part = part.view(torch.int32)
        return part[:bs], part[bs:]


def set_kv_window(wrapper: Any, max_kv_len: int) -> bool:
    """Lower (or raise) a stand-in's kv window: the longest kv any later plan may have.

    In cuda-graph mode the window defaults to the bound indices buffer length, always valid but
    often far above any request (SGLang binds ``[T * L]``), and the dense op's work grows with
    it. Set it **before** capturing. Returns False (no-op) for real flashinfer wrappers."""
    if not is_standin(wrapper):
        return False
    if not isinstance(max_kv_len, int) or max_kv_len < 1:
        raise ValueError(f"max_kv_len={max_kv_len!r}: must be an int >= 1")
    wrapper._kv_window = max_kv_len
    return True


def is_standin(wrapper_or_class: Any) -> bool:
    """True for the stand-in classes and their instances (they carry ``IS_STANDIN = True``)."""
    return bool(getattr(wrapper_or_class, "IS_STANDIN", False))


def _resolve_dtypes(q_data_type, kv_data_type, o_data_type, data_type=None):
    if data_type is not None:
        if q_data_type is None:
            q_data_type = data_type
        if kv_data_type is None:
            kv_data_type = data_type
    q = _canon_dtype(q_data_type if q_data_type is not None else "float16")
    kv = q if kv_data_type is None else _canon_dtype(kv_data_type)
    o = q if o_data_type is None else _canon_dtype(o_data_type)
    return q, kv, o


def _check_qkv_dtypes(q: torch.Tensor, k: torch.Tensor, want_q, want_kv) -> None:
    if q.dtype != want_q:
        raise ValueError(
            f"The dtype of q {q.dtype} does not match the q_data_type {want_q} specified in plan "
            "function."
        )
    if k.dtype != want_kv:
        raise ValueError(
            f"The dtype of k {k.dtype} does not match the kv_data_type {want_kv} specified in "
            "plan function."
        )


def _check_out(out: torch.Tensor, shape, dtype, device, name: str = "out") -> None:
    if tuple(out.shape) != tuple(shape):
        raise ValueError(
            f"Invalid shape of {name}: expected {tuple(shape)}, got {tuple(out.shape)}"
        )
    if out.dtype != dtype:
        raise ValueError(f"Invalid dtype of {name}: expected {dtype}, got {out.dtype}")
    if out.device != device:
        raise ValueError(f"Invalid device of {name}: expected {device}, got {out.device}")


# ----------------------------------------------------------------------------------------------
# decode


class BatchDecodeWithPagedKVCacheWrapper(_StandinWrapper):
    """Stand-in for ``flashinfer.BatchDecodeWithPagedKVCacheWrapper`` (page size 1, NHD)."""

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
        _check_layout(kv_layout)
        if jit_args is not None:
            raise _unsupported("jit_args (custom JIT attention variants)")
        if backend not in ("auto", "fa2", "fa3"):
            raise _unsupported(f"backend={backend!r}")
        self._kv_layout = kv_layout
        self._init_workspaces(float_workspace_buffer)
        if use_cuda_graph:
            for name, buf in (
                ("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer),
            ):
                if not torch.is_tensor(buf):
                    raise ValueError(f"{name} should be a torch.Tensor in cudagraph mode")
            self._fixed_batch_size = len(paged_kv_last_page_len_buffer)
            if len(paged_kv_indptr_buffer) != self._fixed_batch_size + 1:
                raise ValueError(
                    f"The size of paged_kv_indptr_buffer ({len(paged_kv_indptr_buffer)}) should "
                    f"be batch_size + 1 = {self._fixed_batch_size + 1}"
                )
            self._kv_window = max(1, len(paged_kv_indices_buffer))
        else:
            self._fixed_batch_size = 0
            self._kv_window = 0
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self._use_tensor_cores = use_tensor_cores
        self._use_cuda_graph = use_cuda_graph
        if use_tensor_cores and use_cuda_graph:
            self._qo_indptr_buf = torch.arange(
                self._fixed_batch_size + 1, dtype=torch.int32, device=self.device
            )
        self._backend = backend

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

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
        """Validate on the host, copy into the bound buffers, plan the partition."""
        _check_page_size(page_size)
        _check_plan_features(pos_encoding_mode, window_left, logits_soft_cap)
        if block_tables is not None or seq_lens is not None:
            raise _unsupported("block_tables / seq_lens (trtllm-gen decode)")
        if fixed_split_size is not None and not self.use_tensor_cores:
            raise ValueError("fixed_split_size is only supported by tensor core decode for now.")
        if num_qo_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_qo_heads={num_qo_heads} must be a multiple of num_kv_heads={num_kv_heads}"
            )
        batch_size = len(last_page_len)
        _check_batch_size(batch_size)
        # the host reads a full plan pays (the fast plan takes these from the caller instead)
        indptr_host = indptr.to("cpu")
        last_page_len_host = last_page_len.to("cpu")
        kv_vals = _check_indptr("indptr", indptr_host, batch_size)
        kv_lens = _diff(kv_vals)
        lpl = _host_ints("last_page_len", last_page_len_host)
        for i, (n, x) in enumerate(zip(kv_lens, lpl)):
            if n > 0 and x != 1:
                raise ValueError(f"last_page_len[{i}]={x}: must be 1 with page size 1")
        if kv_vals[-1] > len(indices):
            raise ValueError(f"indptr[-1]={kv_vals[-1]} > len(indices)={len(indices)}")
        if self.is_cuda_graph_enabled:
            _check_fixed_batch(self, batch_size)
            _check_fits(
                "indices", len(indices), "paged_kv_indices_buffer", self._paged_kv_indices_buf
            )
            _check_window(kv_lens, self._kv_window)
            self._paged_kv_indptr_buf[: batch_size + 1].copy_(indptr, non_blocking=non_blocking)
            self._paged_kv_last_page_len_buf[:batch_size].copy_(
                last_page_len, non_blocking=non_blocking
            )
            self._paged_kv_indices_buf[: len(indices)].copy_(indices, non_blocking=non_blocking)
        else:
            self._paged_kv_indptr_buf = indptr.to(self.device, non_blocking=non_blocking)
            self._paged_kv_indices_buf = indices.to(self.device, non_blocking=non_blocking)
            self._paged_kv_last_page_len_buf = last_page_len.to(
                self.device, non_blocking=non_blocking
            )
            if self.use_tensor_cores:
                self._qo_indptr_buf = torch.arange(
                    batch_size + 1, dtype=torch.int32, device=self.device
                )
        q_dt, kv_dt, o_dt = _resolve_dtypes(q_data_type, kv_data_type, o_data_type, data_type)
        logits_soft_cap = 0.0 if logits_soft_cap is None else logits_soft_cap
        self._workspace_size = (
            self._float_workspace_buffer.numel() * self._float_workspace_buffer.element_size()
        )
        self._cached_q_data_type, self._cached_kv_data_type = q_dt, kv_dt
        self._cached_o_data_type = o_dt
        self._batch_size = batch_size
        self._num_qo_heads, self._num_kv_heads = num_qo_heads, num_kv_heads
        self._block_tables = None
        self._max_kv_len = max(kv_lens, default=0)
        self._page_size = page_size
        if self.use_tensor_cores:
            if self._backend == "auto":
                self._backend = "fa2"
            self._cached_module = _StandinPrefillModule()
            args = [
                self._float_workspace_buffer, self._int_workspace_buffer,
                self._pin_memory_int_workspace_buffer,
                torch.arange(batch_size + 1, dtype=torch.int32), indptr_host,
                torch.tensor(kv_lens, dtype=torch.int32), batch_size, batch_size,
                num_qo_heads, num_kv_heads, page_size, self.is_cuda_graph_enabled,
                head_dim, head_dim, False, window_left,
            ]  # fmt: skip
            if self._backend == "fa2":
                args += [-1 if fixed_split_size is None else fixed_split_size, disable_split_kv, 0]
            self._plan_info = self._cached_module.plan(*args)
        else:
            self._cached_module = _StandinDecodeModule()
            self._plan_info = self._cached_module.plan(
                self._float_workspace_buffer, self._int_workspace_buffer,
                self._pin_memory_int_workspace_buffer, indptr_host, batch_size, num_qo_heads,
                num_kv_heads, page_size, self.is_cuda_graph_enabled, window_left,
                logits_soft_cap, head_dim, head_dim, torch.empty(0, dtype=q_dt),
                torch.empty(0, dtype=kv_dt),
            )  # fmt: skip
        self._pos_encoding_mode = pos_encoding_mode
        self._window_left = window_left
        self._logits_soft_cap = logits_soft_cap
        self._sm_scale = sm_scale
        self._rope_scale = rope_scale
        self._rope_theta = rope_theta

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
        _check_plan_features(pos_encoding_mode, window_left, logits_soft_cap)
        self._pos_encoding_mode = pos_encoding_mode
        self._window_left = window_left
        self._logits_soft_cap = logits_soft_cap
        self._sm_scale = sm_scale
        self._rope_scale = rope_scale
        self._rope_theta = rope_theta
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)

    @overload
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
        return_lse: Literal[False] = False,
        enable_pdl: bool | None = None,
        window_left: int | None = None,
        sinks: torch.Tensor | None = None,
        q_len_per_req: int | None = 1,
    ) -> torch.Tensor: ...

    @overload
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
        return_lse: Literal[True] = True,
        enable_pdl: bool | None = None,
        window_left: int | None = None,
        sinks: torch.Tensor | None = None,
        q_len_per_req: int | None = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

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
        """One query row per request; reads the partition + the bound indices buffer only."""
        info = self._require_plan()
        _check_run_extras(args, return_lse, sinks)
        if q_len_per_req not in (None, 1):
            raise _unsupported(f"q_len_per_req={q_len_per_req} (trtllm-gen multi-token decode)")
        k_cache, v_cache = _unpack_kv(paged_kv_cache)
        _check_qkv_dtypes(q, k_cache, self._cached_q_data_type, self._cached_kv_data_type)
        window_left = self._window_left if window_left is None else window_left
        assert window_left == self._window_left, "window_left must match the planned one"
        _check_plan_features(self._pos_encoding_mode, window_left, self._logits_soft_cap)
        bs = info[1]
        if q.dim() != 3 or q.shape[0] != bs:
            raise ValueError(f"q.shape={tuple(q.shape)}: decode expects [batch_size={bs}, H, D]")
        sm_scale = _scaled_sm_scale(self._sm_scale, q.shape[-1], q_scale, k_scale)
        out_dtype = getattr(self, "_cached_o_data_type", None) or q.dtype
        if out is None:
            out = torch.empty(q.shape[:-1] + v_cache.shape[-1:], dtype=out_dtype, device=q.device)
        else:
            _check_out(out, q.shape, out_dtype, q.device)
        if bs == 0:  # an idle batch: nothing to attend
            return _apply_v_scale(out, v_scale)
        _, kv_len = self._partition(info)
        kv_indptr = F.pad(torch.cumsum(kv_len.to(torch.int64), 0), (1, 0))  # [bs+1], device
        dense_paged_attention(
            q, k_cache, v_cache, kv_indptr, _nonempty(self._paged_kv_indices_buf), out,
            sm_scale=sm_scale, max_kv_len=self._window(info), q_per_req=1,
        )  # fmt: skip
        return _apply_v_scale(out, v_scale)

    run_return_lse = functools.partialmethod(run, return_lse=True)


# ----------------------------------------------------------------------------------------------
# prefill


class BatchPrefillWithPagedKVCacheWrapper(_StandinWrapper):
    """Stand-in for ``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` (page size 1, NHD)."""

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
        _check_layout(kv_layout)
        if jit_args is not None or jit_kwargs is not None:
            raise _unsupported("jit_args / jit_kwargs (custom JIT attention variants)")
        if backend not in ("auto", "fa2", "fa3"):
            raise _unsupported(f"backend={backend!r}")
        self._kv_layout = kv_layout
        self._init_workspaces(float_workspace_buffer)
        self._workspace_size = (
            float_workspace_buffer.numel() * float_workspace_buffer.element_size()
        )
        self._use_cuda_graph = use_cuda_graph
        if use_cuda_graph:
            for name, buf in (
                ("qo_indptr_buf", qo_indptr_buf),
                ("paged_kv_indptr_buf", paged_kv_indptr_buf),
                ("paged_kv_indices_buf", paged_kv_indices_buf),
                ("paged_kv_last_page_len_buf", paged_kv_last_page_len_buf),
            ):
                if not torch.is_tensor(buf):
                    raise ValueError(f"{name} should be a torch.Tensor in CUDA graph mode")
            self._fixed_batch_size = len(qo_indptr_buf) - 1
            if len(paged_kv_indptr_buf) != self._fixed_batch_size + 1:
                raise ValueError(
                    f"The length of paged_kv_indptr_buf ({len(paged_kv_indptr_buf)}) should be "
                    f"batch_size + 1 = {self._fixed_batch_size + 1}."
                )
            if len(paged_kv_last_page_len_buf) != self._fixed_batch_size:
                raise ValueError(
                    f"The length of paged_kv_last_page_len_buf ({len(paged_kv_last_page_len_buf)})"
                    f" should be batch_size = {self._fixed_batch_size}."
                )
            if (custom_mask_buf is None) != (mask_indptr_buf is None):
                raise ValueError(
                    "custom_mask_buf and mask_indptr_buf are bound together or not at all"
                )
            if mask_indptr_buf is not None and len(mask_indptr_buf) < self._fixed_batch_size + 1:
                raise ValueError(
                    f"mask_indptr_buf has {len(mask_indptr_buf)} entries, needs batch_size + 1 "
                    f"= {self._fixed_batch_size + 1}"
                )
            self._kv_window = max(1, len(paged_kv_indices_buf))
        else:
            self._fixed_batch_size = 0
            self._kv_window = 0
        self._qo_indptr_buf = qo_indptr_buf
        self._paged_kv_indptr_buf = paged_kv_indptr_buf
        self._paged_kv_indices_buf = paged_kv_indices_buf
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buf
        self._custom_mask_buf = custom_mask_buf
        self._mask_indptr_buf = mask_indptr_buf
        self._max_total_num_rows: int | None = None
        self._backend = backend
        self._seq_lens_kv = None
        self._seq_lens_q = None
        self._block_tables = None

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
        """Validate on the host, copy into the bound buffers (mask as bytes), plan the partition."""
        _check_page_size(page_size)
        _check_plan_features(pos_encoding_mode, window_left, logits_soft_cap)
        if packed_custom_mask is not None:
            raise _unsupported("packed_custom_mask (the stand-in stores one byte per mask entry)")
        if use_fp16_qk_reduction:
            raise _unsupported("use_fp16_qk_reduction=True")
        if any(x is not None for x in (prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr)):
            raise _unsupported("multi-item scoring (prefix_len_ptr / token_pos_in_items_ptr)")
        if any(x is not None for x in (seq_lens, seq_lens_q, block_tables)):
            raise _unsupported("seq_lens / seq_lens_q / block_tables (cudnn / trtllm-gen)")
        if max_token_per_sequence is not None or max_sequence_kv is not None:
            raise _unsupported("max_token_per_sequence / max_sequence_kv (cudnn)")
        if num_qo_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_qo_heads={num_qo_heads} must be a multiple of num_kv_heads={num_kv_heads}"
            )
        q_dt, kv_dt, o_dt = _resolve_dtypes(q_data_type, kv_data_type, o_data_type)
        logits_soft_cap = 0.0 if logits_soft_cap is None else logits_soft_cap
        head_dim_vo = head_dim_qk if head_dim_vo is None else head_dim_vo
        batch_size = len(qo_indptr) - 1
        _check_batch_size(batch_size)
        # the host reads a full plan pays
        qo_indptr_host = qo_indptr.to("cpu")
        kv_indptr_host = paged_kv_indptr.to("cpu")
        lpl_host = paged_kv_last_page_len.to("cpu")
        q_vals = _check_indptr("qo_indptr", qo_indptr_host, batch_size)
        kv_vals = _check_indptr("paged_kv_indptr", kv_indptr_host, batch_size)
        q_lens, kv_lens = _diff(q_vals), _diff(kv_vals)
        lpl = _host_ints("paged_kv_last_page_len", lpl_host)
        if len(lpl) != batch_size:
            raise ValueError(
                f"paged_kv_last_page_len has {len(lpl)} entries, expected batch_size={batch_size}"
            )
        for i, (n, x) in enumerate(zip(kv_lens, lpl)):
            if n > 0 and x != 1:
                raise ValueError(f"paged_kv_last_page_len[{i}]={x}: must be 1 with page size 1")
        if kv_vals[-1] > len(paged_kv_indices):
            raise ValueError(
                f"paged_kv_indptr[-1]={kv_vals[-1]} > len(paged_kv_indices)={len(paged_kv_indices)}"
            )
        mask_u8 = mask_indptr_host = None
        if custom_mask is not None:
            mask_u8 = custom_mask.contiguous().view(-1)
            want = sum(a * b for a, b in zip(q_lens, kv_lens))
            if mask_u8.numel() != want:
                raise ValueError(
                    f"custom_mask has {mask_u8.numel()} entries, expected sum(q_len_i * kv_len_i)"
                    f" = {want} for q_len={q_lens}, kv_len={kv_lens}"
                )
            mask_u8 = mask_u8.to(torch.uint8)
            offs = [0]
            for a, b in zip(q_lens, kv_lens):
                offs.append(offs[-1] + a * b)
            mask_indptr_host = torch.tensor(offs, dtype=torch.int32)  # element offsets
        total_num_rows = q_vals[-1]
        if self.is_cuda_graph_enabled:
            if self._max_total_num_rows is not None and total_num_rows > self._max_total_num_rows:
                raise ValueError(
                    f"qo_indptr[-1]={total_num_rows} rows exceed the {self._max_total_num_rows} "
                    "rows of the first plan (fixed in cuda graph mode)"
                )
            _check_fixed_batch(self, batch_size)
            _check_fits(
                "paged_kv_indices", len(paged_kv_indices), "paged_kv_indices_buf",
                self._paged_kv_indices_buf,
            )  # fmt: skip
            _check_window(kv_lens, self._kv_window)
            if mask_u8 is not None:
                if not torch.is_tensor(self._custom_mask_buf):
                    raise ValueError(
                        "custom_mask_buf must be initialized with a torch.Tensor in cuda graph "
                        "mode if we use custom mask in attention computation."
                    )
                _check_fits(
                    "custom_mask", mask_u8.numel(), "custom_mask_buf", self._custom_mask_buf
                )
            if self._max_total_num_rows is None:
                self._max_total_num_rows = total_num_rows
            n = batch_size + 1
            self._qo_indptr_buf[:n].copy_(qo_indptr, non_blocking=non_blocking)
            self._paged_kv_indptr_buf[:n].copy_(paged_kv_indptr, non_blocking=non_blocking)
            self._paged_kv_last_page_len_buf[:batch_size].copy_(
                paged_kv_last_page_len, non_blocking=non_blocking
            )
            self._paged_kv_indices_buf[: len(paged_kv_indices)].copy_(
                paged_kv_indices, non_blocking=non_blocking
            )
            if mask_u8 is not None:
                self._custom_mask_buf[: mask_u8.numel()].copy_(mask_u8, non_blocking=non_blocking)
                self._mask_indptr_buf[:n].copy_(mask_indptr_host, non_blocking=non_blocking)
        else:
            self._qo_indptr_buf = qo_indptr.to(self.device, non_blocking=non_blocking)
            self._paged_kv_indptr_buf = paged_kv_indptr.to(self.device, non_blocking=non_blocking)
            self._paged_kv_indices_buf = paged_kv_indices.to(self.device, non_blocking=non_blocking)
            self._paged_kv_last_page_len_buf = paged_kv_last_page_len.to(
                self.device, non_blocking=non_blocking
            )
            if mask_u8 is not None:
                self._custom_mask_buf = mask_u8.to(self.device, non_blocking=non_blocking)
                self._mask_indptr_buf = mask_indptr_host.to(self.device, non_blocking=non_blocking)
            else:
                self._custom_mask_buf = None
                self._mask_indptr_buf = None
        self._batch_size = batch_size
        self._num_qo_heads, self._num_kv_heads = num_qo_heads, num_kv_heads
        self._max_q_len = max(q_lens, default=0)
        self._max_kv_len = max(kv_lens, default=0)
        self._cached_q_data_type, self._cached_kv_data_type = q_dt, kv_dt
        self._cached_o_data_type = o_dt
        if self._backend == "auto":
            self._backend = "fa2"
        self._cached_module = _StandinPrefillModule()
        args = [
            self._float_workspace_buffer, self._int_workspace_buffer,
            self._pin_memory_int_workspace_buffer, qo_indptr_host, kv_indptr_host,
            torch.tensor(kv_lens, dtype=torch.int32), self._max_total_num_rows or total_num_rows,
            batch_size, num_qo_heads, num_kv_heads, page_size, self.is_cuda_graph_enabled,
            head_dim_qk, head_dim_vo, causal, window_left,
        ]  # fmt: skip
        if self._backend == "fa2":
            args += [-1 if fixed_split_size is None else fixed_split_size, disable_split_kv, 0]
        self._plan_info = self._cached_module.plan(*args)
        self._page_size = page_size
        self._causal = causal
        self._pos_encoding_mode = pos_encoding_mode
        self._use_fp16_qk_reduction = use_fp16_qk_reduction
        self._window_left = window_left
        self._logits_soft_cap = logits_soft_cap
        self._sm_scale = sm_scale
        self._rope_scale = rope_scale
        self._rope_theta = rope_theta
        self._seq_lens_kv = None
        self._seq_lens_q = None

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
        _check_plan_features(pos_encoding_mode, window_left, logits_soft_cap)
        if use_fp16_qk_reduction:
            raise _unsupported("use_fp16_qk_reduction=True")
        self._causal = causal
        self._pos_encoding_mode = pos_encoding_mode
        self._use_fp16_qk_reduction = use_fp16_qk_reduction
        self._window_left = window_left
        self._logits_soft_cap = logits_soft_cap
        self._sm_scale = sm_scale
        self._rope_scale = rope_scale
        self._rope_theta = rope_theta
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale)

    @overload
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
        return_lse: Literal[False] = False,
        enable_pdl: bool | None = None,
        window_left: int | None = None,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

    @overload
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
        return_lse: Literal[True] = True,
        enable_pdl: bool | None = None,
        window_left: int | None = None,
        sinks: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

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
        """Ragged queries over the bound buffers: reads the partition, indices and mask only."""
        info = self._require_plan()
        _check_run_extras(args, return_lse, sinks)
        k_cache, v_cache = _unpack_kv(paged_kv_cache)
        _check_qkv_dtypes(q, k_cache, self._cached_q_data_type, self._cached_kv_data_type)
        o_dtype = self._cached_o_data_type
        if out is not None and out.dtype != o_dtype:
            raise ValueError(
                f"The dtype of out {out.dtype} does not match the o_data_type {o_dtype} "
                "specified in plan function."
            )
        window_left = self._window_left if window_left is None else window_left
        assert window_left == self._window_left, "window_left must match the planned one"
        _check_plan_features(self._pos_encoding_mode, window_left, self._logits_soft_cap)
        if q.dim() != 3:
            raise ValueError(f"q.shape={tuple(q.shape)}: expected [qo_indptr[-1], H, D]")
        if q.shape[0] < info[2]:
            raise ValueError(f"q has {q.shape[0]} rows, the plan has qo_indptr[-1]={info[2]}")
        sm_scale = _scaled_sm_scale(self._sm_scale, q.shape[-1], q_scale, k_scale)
        out_shape = q.shape[:-1] + v_cache.shape[-1:]
        if out is None:
            out = torch.zeros(out_shape, dtype=o_dtype, device=q.device)
        else:
            _check_out(out, out_shape, o_dtype, q.device)
        if info[1] == 0 or q.shape[0] == 0:  # an idle batch: nothing to attend
            return out
        q_len, kv_len = self._partition(info)
        use_mask = self._custom_mask_buf is not None  # CUSTOM mode: the mask governs
        window = self._window(info)
        row_indptr, row_indices, row_mask = _per_row_csr(
            q_len, kv_len, q.shape[0], window, (not use_mask) and bool(self._causal),
            self._paged_kv_indices_buf, self._mask_indptr_buf if use_mask else None,
        )  # fmt: skip
        dense_paged_attention(
            q, k_cache, v_cache, row_indptr, row_indices, out,
            sm_scale=sm_scale, max_kv_len=window, q_per_req=1,
            custom_mask=self._custom_mask_buf if use_mask else None, mask_indptr=row_mask,
        )  # fmt: skip
        return _apply_v_scale(out, v_scale)

    run_return_lse = functools.partialmethod(run, return_lse=True)


# ----------------------------------------------------------------------------------------------
# MLA


class BatchMLAPagedAttentionWrapper(_StandinWrapper):
    """Stand-in for ``flashinfer.BatchMLAPagedAttentionWrapper`` (page size 1, no custom mask)."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        use_cuda_graph: bool = False,
        qo_indptr: torch.Tensor | None = None,
        kv_indptr: torch.Tensor | None = None,
        kv_indices: torch.Tensor | None = None,
        kv_len_arr: torch.Tensor | None = None,
        backend: str = "auto",
    ) -> None:
        if backend not in ("auto", "fa2", "fa3"):
            raise _unsupported(f"backend={backend!r}")
        self._init_workspaces(float_workspace_buffer)
        self._use_cuda_graph = use_cuda_graph
        if use_cuda_graph:  # stricter than the real one, which fails later in plan
            for name, buf in (
                ("qo_indptr", qo_indptr),
                ("kv_indptr", kv_indptr),
                ("kv_indices", kv_indices),
                ("kv_len_arr", kv_len_arr),
            ):
                if not torch.is_tensor(buf):
                    raise ValueError(f"{name} should be a torch.Tensor in cuda graph mode")
            self._fixed_batch_size = len(qo_indptr) - 1
            if (
                len(kv_indptr) != self._fixed_batch_size + 1
                or len(kv_len_arr) != self._fixed_batch_size
            ):
                raise ValueError(
                    f"bound buffers disagree on the batch size: qo_indptr has {len(qo_indptr)} "
                    f"entries (bs={self._fixed_batch_size}), kv_indptr {len(kv_indptr)} "
                    f"(needs bs + 1), kv_len_arr {len(kv_len_arr)} (needs bs)"
                )
            self._kv_window = max(1, len(kv_indices))
        else:
            self._fixed_batch_size = 0
            self._kv_window = 0
        self._qo_indptr_buf = qo_indptr
        self._kv_indptr_buf = kv_indptr
        self._kv_indices_buf = kv_indices
        self._kv_len_arr_buf = kv_len_arr
        self._backend = "fa2" if backend == "auto" else backend

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
        """Validate on the host, copy into the bound buffers, plan the partition."""
        _check_page_size(page_size)
        if use_profiler:
            raise _unsupported("use_profiler=True")
        batch_size = len(qo_indptr) - 1
        _check_batch_size(batch_size)
        # the host reads a full plan pays (#3987: these transfers hung graph replay)
        qo_indptr_host = qo_indptr.to("cpu")
        kv_indptr_host = kv_indptr.to("cpu")
        kv_len_arr_host = kv_len_arr.to("cpu")
        _check_indptr("qo_indptr", qo_indptr_host, batch_size)
        kv_vals = _check_indptr("kv_indptr", kv_indptr_host, batch_size)
        kv_lens = _host_ints("kv_len_arr", kv_len_arr_host)
        if kv_vals[-1] > len(kv_indices):
            raise ValueError(f"kv_indptr[-1]={kv_vals[-1]} > len(kv_indices)={len(kv_indices)}")
        if self._use_cuda_graph:
            _check_fixed_batch(self, batch_size)
            _check_fits("kv_indices", len(kv_indices), "kv_indices", self._kv_indices_buf)
            _check_window(kv_lens, self._kv_window)
        self._cached_module = _StandinMLAModule()
        # validate fully (the module does) before anything is copied
        self._plan_info = self._cached_module.plan(
            self._float_workspace_buffer, self._int_workspace_buffer,
            self._pin_memory_int_workspace_buffer, qo_indptr_host, kv_indptr_host,
            kv_len_arr_host, num_heads, head_dim_ckv, causal,
        )  # fmt: skip
        if self._use_cuda_graph:
            n = batch_size + 1
            self._qo_indptr_buf[:n].copy_(qo_indptr, non_blocking=True)
            self._kv_indptr_buf[:n].copy_(kv_indptr, non_blocking=True)
            self._kv_indices_buf[: len(kv_indices)].copy_(kv_indices, non_blocking=True)
            self._kv_len_arr_buf[:batch_size].copy_(kv_len_arr, non_blocking=True)
        else:
            self._qo_indptr_buf = qo_indptr.to(self.device, non_blocking=True)
            self._kv_indptr_buf = kv_indptr.to(self.device, non_blocking=True)
            self._kv_indices_buf = kv_indices.to(self.device, non_blocking=True)
            self._kv_len_arr_buf = kv_len_arr.to(self.device, non_blocking=True)
        self._cached_q_data_type = _canon_dtype(q_data_type)
        self._cached_kv_data_type = _canon_dtype(kv_data_type)
        self._batch_size = batch_size
        self._num_heads = num_heads
        self._causal = causal
        self._page_size = page_size
        self._sm_scale = sm_scale
        self._use_profiler = use_profiler

    @overload
    def run(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv_cache: torch.Tensor,
        kpe_cache: torch.Tensor,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: Literal[False] = False,
        profiler_buffer: torch.Tensor | None = None,
        kv_len: torch.Tensor | None = None,
        page_table: torch.Tensor | None = None,
        return_lse_base_on_e: bool = False,
    ) -> torch.Tensor: ...

    @overload
    def run(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv_cache: torch.Tensor,
        kpe_cache: torch.Tensor,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: Literal[True] = True,
        profiler_buffer: torch.Tensor | None = None,
        kv_len: torch.Tensor | None = None,
        page_table: torch.Tensor | None = None,
        return_lse_base_on_e: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

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
        """Absorbed MLA over the bound ``kv_indices`` and the partition (``kv_len`` /
        ``page_table`` are cutlass-only and ignored, as in the real non-cutlass path)."""
        info = self._require_plan()
        _check_run_extras((), return_lse, None)
        if profiler_buffer is not None:
            raise _unsupported("profiler_buffer")
        _check_page_size(self._page_size)
        if q_nope.dtype != self._cached_q_data_type or ckv_cache.dtype != self._cached_kv_data_type:
            raise ValueError(
                f"q_nope.dtype={q_nope.dtype} / ckv_cache.dtype={ckv_cache.dtype} do not match the "
                f"planned q_data_type={self._cached_q_data_type} / "
                f"kv_data_type={self._cached_kv_data_type}"
            )
        if q_nope.dim() != 3 or q_nope.shape[0] < info[2]:
            raise ValueError(
                f"q_nope.shape={tuple(q_nope.shape)}: expected [>= qo_indptr[-1]={info[2]}, H, R]"
            )
        if out is None:
            out = torch.empty_like(q_nope)
        else:
            _check_out(out, q_nope.shape, q_nope.dtype, q_nope.device)
        kv_cache = _joined_mla_cache(ckv_cache, kpe_cache)
        if info[1] == 0 or q_nope.shape[0] == 0:  # an idle batch: nothing to attend
            return out.zero_()
        q_len, kv_len_planned = self._partition(info)
        window = self._window(info)
        row_indptr, row_indices, _ = _per_row_csr(
            q_len, kv_len_planned, q_nope.shape[0], window, bool(self._causal),
            self._kv_indices_buf, None,
        )  # fmt: skip
        dense_paged_mla_attention(
            q_nope, q_pe, kv_cache, row_indptr, row_indices, out,
            sm_scale=float(self._sm_scale), max_kv_len=window, q_per_req=1,
        )  # fmt: skip
        return out
