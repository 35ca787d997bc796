"""Stand-ins for flashinfer's three paged wrappers (0.7.2's API; calls valid on 0.6.0 too), for machines without
flashinfer/CUDA.

They model what a CUDA graph captured around ``wrapper.run`` depends on. **Binding**: with ``use_cuda_graph=True`` the
constructor keeps the buffers under flashinfer's attribute names and fixes ``_fixed_batch_size``; ``plan`` copies into
them (else keeps ``x.to(device)``). **Plan** reads the indptrs on the host (the copy ``fast_plan.py`` avoids), validates
them and selects ``_cached_module`` (a stand-in JIT module taking the real one's positional ``plan`` arguments), which
writes the *work partition* (int32 ``q_len[bs]`` ++ ``kv_len[bs]`` at byte 0 of ``_int_workspace_buffer``, staged in the
pinned buffer). **Run** (one dense op call, one request per query row: ``_Standin._per_row_csr``) reads both as
flashinfer's kernels do. The partition enumerates the work: flashinfer's tiles (``request_indices``, ``kv_tile_indices``,
``kv_chunk_size``, ``scheduler.cuh``) come from the planned lengths, so a request's keys are read at most up to its
planned kv length rounded up to a kv chunk (:data:`KV_CHUNK`, 128: flashinfer's smallest; it may pick larger). The bound
buffers say where the work lies: decode and prefill read each request's keys from the bound ``kv_indptr[b]``,
``paged_kv_t::get_length(b)`` of them (``page.cuh``: from the bound indptr and ``last_page_len``), prefill its query
rows from the bound ``qo_indptr``; MLA reads positions from its plan's work list and only the bound ``kv_indices``. So
for decode and prefill a stale bound indptr and a stale plan each give a wrong answer (MLA: only a stale plan): every
replay writes the buffers and re-plans. The kv window is the bound indices length in cuda-graph mode
(:func:`set_kv_window` lowers it), else the planned maximum. **Masks**: ``custom_mask`` wins over ``causal``, in
cuda-graph mode iff ``custom_mask_buf`` was bound; MLA: causal only. A byte per mask entry and element offsets
(flashinfer: bits, byte offsets). Page size 1, NHD, kv cache ``(k, v)`` of ``[slots, Hkv, D]``; the full signatures:
``tests/flashinfer_full_api.py``.
"""

import itertools
import math

import torch
import torch.nn.functional as F

from ..kernels.attention import dense_paged_attention, dense_paged_mla_attention
from .fast_plan import I32, _dtype, _fits, _mask_offsets, _plan_decode, _plan_prefill, _same_batch, _ws

INT_WORKSPACE_BYTES = 8 * 1024 * 1024  # what flashinfer's constructors allocate
# flashinfer's smallest kv chunk at page size 1 in cuda-graph mode (scheduler.cuh: ``128 / page_size`` pages; the binary
# search may pick a larger one): a plan's tiles cover each request's planned kv length rounded up to it
KV_CHUNK = 128


def _page_size_1(page_size):
    if page_size != 1:
        raise NotImplementedError(f"refimpl flashinfer stand-in: page_size={page_size} (only 1)")


def _lens(name, indptr_host, batch_size=None, indices=None):
    """Lengths from a host indptr: bs+1 entries, from 0, non-decreasing, within ``indices``."""
    v = indptr_host.tolist()
    if batch_size is not None and len(v) != batch_size + 1:
        raise ValueError(f"{name} has {len(v)} entries, expected batch_size + 1 = {batch_size + 1}")
    if not v or v[0] != 0:
        raise ValueError(f"{name}[0]={v[0] if v else None}: must be 0")
    lens = [b - a for a, b in itertools.pairwise(v)]
    for i, n in enumerate(lens):
        if n < 0:
            raise ValueError(f"{name} must be non-decreasing: {name}[{i}]={v[i]} > {name}[{i + 1}]={v[i + 1]}")
    if indices is not None and v[-1] > len(indices):
        raise ValueError(f"{name}[-1]={v[-1]} > len(indices)={len(indices)}")
    return lens


# the work partition, and the stand-in JIT modules that write it
def _write_partition(int_ws, pinned_ws, q_lens, kv_lens, rows):
    """Stage int32 ``q_len ++ kv_len`` in the pinned buffer, copy it into the int workspace (both uint8, at byte 0); the
    plan info: byte offset, batch size, rows, max kv_len."""
    n = 8 * len(kv_lens)
    pinned_ws[:n].view(I32).copy_(torch.tensor(q_lens + kv_lens, dtype=I32, device="cpu"))
    int_ws[:n].copy_(pinned_ws[:n])
    return [0, len(kv_lens), rows, max(kv_lens, default=0)]


def read_partition(wrapper):
    """The planned ``(q_len[bs], kv_len[bs])``: int32 views into a stand-in's int workspace (graph-safe)."""
    if not is_standin(wrapper):
        raise TypeError("read_partition reads the stand-ins' partition format only")
    if wrapper._plan_info is None:
        raise RuntimeError("the wrapper has not been planned yet: call plan() first")
    off, bs = wrapper._plan_info[:2]
    part = wrapper._int_workspace_buffer[off : off + 8 * bs].view(I32)
    return part[:bs], part[bs:]


def keys_read(wrapper):
    """Per planned request, where a stand-in's ``run`` starts reading its keys in the bound indices and how many it
    reads (int64 ``start[bs]``, ``count[bs]``): what the bound buffers say, within the plan's tiles (MLA: the
    plan's)."""
    q_len, kv_len = read_partition(wrapper)  # a TypeError for a real wrapper
    _, _, start, n, cover = wrapper._spans(q_len, kv_len)
    return start, torch.minimum(n, cover)


class _DecodeModule:
    """flashinfer's CUDA-core decode module (``get_batch_decode_module``): its 15-argument plan."""

    def plan(
        self,
        float_ws,
        int_ws,
        pinned_ws,
        indptr,
        batch_size,
        num_qo_heads,
        num_kv_heads,
        page_size,
        cuda_graph,
        window_left,
        soft_cap,
        head_dim_qk,
        head_dim_vo,
        q_empty,
        kv_empty,
    ):
        _page_size_1(page_size)
        return _write_partition(int_ws, pinned_ws, [1] * batch_size, _lens("indptr", indptr, batch_size), batch_size)


class _PrefillModule:
    """flashinfer's prefill module (``get_batch_prefill_module``, also tensor-core decode): 16-argument plan; fa2 appends
    fixed_split_size, disable_split_kv, num_colocated_ctas and (0.7.2) uniform_q_len (20)."""

    def plan(self, *args):
        if len(args) not in (16, 20):
            raise TypeError(f"prefill module plan takes 16 or 20 arguments (flashinfer 0.7.2), got {len(args)}")
        _, int_ws, pinned_ws, qo_indptr, kv_indptr, kv_len_arr, rows, batch_size = args[:8]
        _page_size_1(args[10])
        q_lens = _lens("qo_indptr", qo_indptr, batch_size)
        _lens("paged_kv_indptr", kv_indptr, batch_size)
        return _write_partition(int_ws, pinned_ws, q_lens, kv_len_arr.tolist(), rows)


class _MLAModule:
    """flashinfer's MLA module (``get_batch_mla_module``): 9-argument plan."""

    def plan(self, float_ws, int_ws, pinned_ws, qo_indptr, kv_indptr, kv_len_arr, num_heads, head_dim_o, causal):
        q_lens = _lens("qo_indptr", qo_indptr)
        pages, kv_lens = _lens("kv_indptr", kv_indptr, len(q_lens)), kv_len_arr.tolist()
        if kv_lens != pages:
            raise ValueError(
                f"kv_len_arr {kv_lens} disagrees with the page counts of kv_indptr {pages} (page size 1: they must be equal)"
            )
        return _write_partition(int_ws, pinned_ws, q_lens, kv_lens, sum(q_lens))


# the MLA run's cache (device ops only: nothing reads the host)
def _joined_mla_cache(ckv, kpe):
    """``[slots, 1, R + Rr]``: a zero-copy view when ``ckv`` / ``kpe`` are the two column ranges of one buffer (SGLang's
    ``kv[..., :R]`` / ``kv[..., R:]``), else a concatenated copy."""
    _page_size_1(ckv.shape[1])
    rank, s = ckv.shape[-1], ckv.stride()
    same_buffer = ckv.untyped_storage().data_ptr() == kpe.untyped_storage().data_ptr()
    if same_buffer and kpe.stride() == s and s[-1] == 1 and kpe.storage_offset() == ckv.storage_offset() + rank:
        return ckv.as_strided((*ckv.shape[:2], rank + kpe.shape[-1]), s)
    return torch.cat([ckv, kpe], dim=-1)


# the wrappers
def is_standin(wrapper_or_class) -> bool:
    """True for the stand-in classes and their instances (``IS_STANDIN = True``)."""
    return bool(getattr(wrapper_or_class, "IS_STANDIN", False))


def set_kv_window(wrapper, max_kv_len) -> bool:
    """Set a stand-in's kv window, the longest kv any later plan may have (before capture: the dense op's work grows with
    it). Returns False (no-op) for a real flashinfer wrapper."""
    if not is_standin(wrapper):
        return False
    if not isinstance(max_kv_len, int) or max_kv_len < 1:
        raise ValueError(f"max_kv_len={max_kv_len!r}: must be an int >= 1")
    wrapper._kv_window = max_kv_len
    return True


class _Standin:
    """What the three stand-ins share: binding (``_BUFS``: the attributes a plan's tensors bind, in its order, among them
    the indices buffer ``_INDICES``), the plan bookkeeping, run."""

    IS_STANDIN = True
    # a prefill wrapper binds / plans a custom mask, decode never; decode binds no qo_indptr (tensor cores, eager: its plan
    # binds 0, 1, ..., bs)
    _custom_mask_buf = _mask_indptr_buf = _qo_indptr_buf = None
    # before the first plan (flashinfer's names: the fast plans read them)
    _cached_module = _plan_info = _sm_scale = _max_total_num_rows = None
    _window_left, _logits_soft_cap, _causal, _backend = -1, 0.0, False, "auto"

    def _setup(self, float_ws, use_cuda_graph, names, bufs, kv_layout="NHD"):
        """Check the arguments, bind ``bufs`` (the parameters ``names``) as ``_BUFS``."""
        if kv_layout != "NHD":
            raise NotImplementedError(f"refimpl flashinfer stand-in: kv_layout={kv_layout!r}")
        for name, attr, buf in zip(names.split(), self._BUFS, bufs):
            if use_cuda_graph and not torch.is_tensor(buf):  # cuda graph mode: tensors to bind
                raise ValueError(f"{name} should be a torch.Tensor in cuda graph mode")
            setattr(self, attr, buf)
        self._float_workspace_buffer, self.device, self._use_cuda_graph = float_ws, float_ws.device, use_cuda_graph
        n = INT_WORKSPACE_BYTES
        self._int_workspace_buffer = float_ws.new_empty(n, dtype=torch.uint8)
        self._pin_memory_int_workspace_buffer = torch.empty(
            n, dtype=torch.uint8, pin_memory=self.device.type == "cuda", device="cpu"
        )
        if use_cuda_graph:  # the bound batch size (decode binds no qo_indptr: its last_page_len's) and kv window
            qo = self._qo_indptr_buf
            self._fixed_batch_size = len(self._paged_kv_last_page_len_buf) if qo is None else len(qo) - 1
            self._kv_window = max(1, len(getattr(self, self._INDICES)))

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def _kv_lens(self, page_size, kv_indptr, bs, indices, names):
        """A full plan's checks, before it writes anything: page size 1, the kv indptr read on the host (the
        device-to-host copy the fast plans avoid) and, in cuda-graph mode, the bound batch size, indices buffer and kv
        window. ``names``: the plan's kv indptr and indices, the constructor's indices buffer. Returns the host indptr
        and the kv lengths."""
        indptr_name, name, buf_name = names.split()
        _page_size_1(page_size)
        host = kv_indptr.to("cpu")
        kv_lens = _lens(indptr_name, host, bs, indices)
        if self._use_cuda_graph:
            _same_batch(bs, self._fixed_batch_size)
            _fits(name, indices, buf_name, getattr(self, self._INDICES))
            for i, n in enumerate(kv_lens):
                if n > self._kv_window:
                    raise ValueError(
                        f"request {i} has kv_len={n} > the wrapper's kv window {self._kv_window} (see set_kv_window)"
                    )
        return host, kv_lens

    def _keep(self, tensors, module, kv_lens, sm_scale, q_data_type, kv_data_type, causal=False, non_blocking=True):
        """What a plan keeps: ``tensors`` bound as ``_BUFS`` (copied into the bound buffers, else ``x.to``), the kernel
        module it selects (real: JIT-compiles; backend ``auto`` is fa2), dtypes (o = q), batch size, max kv_len, scale,
        causal."""
        for attr, x in zip(self._BUFS, tensors):
            if self._use_cuda_graph:
                getattr(self, attr)[: len(x)].copy_(x, non_blocking=non_blocking)
            else:
                setattr(self, attr, x.to(self.device, non_blocking=non_blocking))
        q = _dtype(q_data_type or "float16")
        self._cached_module, self._backend = module, "fa2" if self._backend == "auto" else self._backend
        self._cached_q_data_type = self._cached_o_data_type = q
        self._cached_kv_data_type = q if kv_data_type is None else _dtype(kv_data_type)
        self._batch_size, self._max_kv_len = len(kv_lens), max(kv_lens, default=0)
        self._sm_scale, self._causal = sm_scale, causal

    def _window(self):
        return self._kv_window if self._use_cuda_graph else max(1, self._plan_info[3])

    def _spans(self, q_len, kv_len):
        """Per request, ``(q_start, q_len, kv_start, kv_len, kv_cover)`` as the decode / prefill kernels read them:
        keys from the bound ``kv_indptr[b]``, as many as ``paged_kv_t::get_length`` gives (page size 1: ``pages - 1 +
        last_page_len[b]``, 0 without pages); query rows from the bound ``qo_indptr`` (decode: row ``b``); ``kv_cover``,
        the keys the plan's tiles reach: the planned ``kv_len`` rounded up to :data:`KV_CHUNK`. (MLA overrides.)"""
        bs = len(kv_len)
        ptr = self._paged_kv_indptr_buf[: bs + 1].long()
        pages = ptr.diff()
        n_kv = torch.where(pages > 0, pages - 1 + self._paged_kv_last_page_len_buf[:bs], 0)
        cover = (kv_len.clamp(min=1) + KV_CHUNK - 1) // KV_CHUNK * KV_CHUNK
        qo = self._qo_indptr_buf  # decode: row b
        qo = torch.arange(bs + 1, device=ptr.device) if qo is None else qo[: bs + 1]
        return qo[:-1], qo.diff().clamp(min=0), ptr[:-1], n_kv, cover

    def _per_row_csr(self, q_len, kv_len, num_rows, window):
        """The batch as ``num_rows`` one-row requests, from device ops only (nothing reads the host). The partition
        (planned ``q_len``) enumerates the work: output row ``r`` is query row ``j`` of request ``b``. :meth:`_spans` say
        where it lies: the query row read, the keys ``indices[kv_start + t]`` for ``t < min(kv_len, kv_cover)``, rows
        ``j >= q_len`` left empty; causal alignment and the mask's row stride use the spans' lengths. Returns ``row_indptr
        [T+1]``, ``row_indices [T*window]``, ``row_mask [T+1]`` (None without a mask), ``q_rows [T]``."""
        indices = getattr(self, self._INDICES)
        dev = indices.device
        indices = indices if indices.numel() else indices.new_zeros(1)  # the op needs >= 1 entry
        bs, q_end = len(q_len), q_len.cumsum(0)  # int64
        r = torch.arange(num_rows, device=dev)
        req = torch.searchsorted(q_end, r, right=True)  # bs for rows past the batch
        inside, req = req < bs, req.clamp(max=bs - 1)
        q0, n_q, k0, n_kv, cover = (s[req] for s in self._spans(q_len, kv_len))  # per output row
        j, no_mask = r - (q_end - q_len)[req], self._custom_mask_buf is None
        causal = self._causal and no_mask  # a custom mask wins (see _attend)
        row_len = (n_kv - n_q + j + 1).clamp(min=0) if causal else n_kv  # bottom-right aligned
        reach = torch.minimum(n_kv, cover).clamp(max=window)  # the planned tiles reach no further
        row_len = torch.where(inside & (j < n_q), torch.minimum(row_len, reach), 0)
        row_indptr = F.pad(row_len.cumsum(0), (1, 0))
        p = torch.arange(num_rows * window, device=dev)
        row_of_p = torch.searchsorted(row_indptr[1:], p, right=True).clamp(max=num_rows - 1)
        src = k0[row_of_p] + (p - row_indptr[row_of_p])
        row_indices = indices[src.clamp(0, len(indices) - 1)]
        row_mask = None if no_mask else F.pad(self._mask_indptr_buf[:bs][req] + j * n_kv, (0, 1))
        return row_indptr, row_indices, row_mask, (q0 + j).clamp(0, num_rows - 1)

    def _attend(self, kernel, qs, caches, dv):
        """A run: check the inputs against the plan, then ``kernel`` over the per-row CSR into a zeroed ``[T, H, dv]``
        (an idle batch: no launch). A custom mask, bound or planned (flashinfer's CUSTOM mode), governs, else
        ``causal`` (always False for decode; MLA: causal only)."""
        q, (q_len, kv_len) = qs[0], read_partition(self)
        if (q.dtype, caches[0].dtype) != (self._cached_q_data_type, self._cached_kv_data_type):
            raise ValueError(
                f"q / kv dtypes {q.dtype} / {caches[0].dtype} do not match the q_data_type "
                f"{self._cached_q_data_type} / kv_data_type {self._cached_kv_data_type} of plan()"
            )
        _, bs, rows = self._plan_info[:3]
        if q.dim() != 3 or len(q) < rows:
            raise ValueError(f"q.shape={tuple(q.shape)}: expected [>= {rows} rows, H, D]")
        out = q.new_zeros(*q.shape[:-1], dv, dtype=self._cached_o_data_type)
        if bs and len(q):
            window = self._window()
            row_indptr, row_indices, row_mask, q_rows = self._per_row_csr(q_len, kv_len, len(q), window)
            sm_scale = float(1 / math.sqrt(q.shape[-1]) if self._sm_scale is None else self._sm_scale)
            kernel(
                *(x[q_rows] for x in qs),
                *caches,
                row_indptr,
                row_indices,
                out,
                sm_scale=sm_scale,
                max_kv_len=window,
                q_per_req=1,
                custom_mask=self._custom_mask_buf,
                mask_indptr=row_mask,
            )
        return out

    def run(self, q, paged_kv_cache):
        """Decode and prefill (MLA has its own)."""
        if not isinstance(paged_kv_cache, tuple):
            raise TypeError("the stand-ins take the kv cache as a tuple (k, v), [slots, Hkv, D]")
        return self._attend(dense_paged_attention, (q,), paged_kv_cache, paged_kv_cache[1].shape[-1])


class BatchDecodeWithPagedKVCacheWrapper(_Standin):
    """Stand-in for ``flashinfer.BatchDecodeWithPagedKVCacheWrapper`` (one query row/request)."""

    _INDICES = "_paged_kv_indices_buf"
    _BUFS = ("_paged_kv_indptr_buf", _INDICES, "_paged_kv_last_page_len_buf")

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        use_tensor_cores=False,
        paged_kv_indptr_buffer=None,
        paged_kv_indices_buffer=None,
        paged_kv_last_page_len_buffer=None,
    ):
        self._setup(
            float_workspace_buffer,
            use_cuda_graph,
            "paged_kv_indptr_buffer paged_kv_indices_buffer paged_kv_last_page_len_buffer",
            (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer),
            kv_layout,
        )
        self.use_tensor_cores = use_tensor_cores

    def plan(
        self,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        *,
        q_data_type="float16",
        kv_data_type=None,
        data_type=None,
        sm_scale=None,
        non_blocking=True,
    ):
        indptr_host, kv_lens = self._kv_lens(
            page_size, indptr, len(last_page_len), indices, "indptr indices paged_kv_indices_buffer"
        )
        # flashinfer plans tensor-core decode with the prefill module; explicit q / kv dtypes win over data_type
        module = _PrefillModule() if self.use_tensor_cores else _DecodeModule()
        dtypes = q_data_type or data_type, kv_data_type or data_type
        self._keep((indptr, indices, last_page_len), module, kv_lens, sm_scale, *dtypes, non_blocking=non_blocking)
        heads = (num_qo_heads, num_kv_heads, 1, self._use_cuda_graph)
        last_page_len_host = torch.ones(len(kv_lens), dtype=I32, device="cpu")  # page size 1: every page full
        self._plan_info = _plan_decode(self, indptr_host, last_page_len_host, heads, head_dim)

    begin_forward = plan


class BatchPrefillWithPagedKVCacheWrapper(_Standin):
    """Stand-in for ``flashinfer.BatchPrefillWithPagedKVCacheWrapper`` (ragged queries)."""

    _INDICES = "_paged_kv_indices_buf"
    _BUFS = (  # then the planned mask's two (bound or not)
        "_qo_indptr_buf",
        "_paged_kv_indptr_buf",
        _INDICES,
        "_paged_kv_last_page_len_buf",
        "_custom_mask_buf",
        "_mask_indptr_buf",
    )

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf=None,
        paged_kv_indptr_buf=None,
        paged_kv_indices_buf=None,
        paged_kv_last_page_len_buf=None,
        custom_mask_buf=None,
        mask_indptr_buf=None,
    ):
        self._setup(
            float_workspace_buffer,
            use_cuda_graph,
            "qo_indptr_buf paged_kv_indptr_buf paged_kv_indices_buf paged_kv_last_page_len_buf",
            (qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf),
            kv_layout,
        )
        if use_cuda_graph and (custom_mask_buf is None) != (mask_indptr_buf is None):
            raise ValueError("custom_mask_buf and mask_indptr_buf are bound together or not")
        self._custom_mask_buf, self._mask_indptr_buf = custom_mask_buf, mask_indptr_buf

    def plan(
        self,
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        page_size,
        *,
        custom_mask=None,
        causal=False,
        sm_scale=None,
        q_data_type="float16",
        kv_data_type=None,
        non_blocking=True,
    ):
        bs, qo_host = len(qo_indptr) - 1, qo_indptr.to("cpu")
        kv_host, kv_lens = self._kv_lens(
            page_size, paged_kv_indptr, bs, paged_kv_indices, "paged_kv_indptr paged_kv_indices paged_kv_indices_buf"
        )
        rows = sum(_lens("qo_indptr", qo_host))
        if self._use_cuda_graph:  # flashinfer's rule: the first plan's rows are the graph's most
            if self._max_total_num_rows is None:
                self._max_total_num_rows = rows
            elif rows > self._max_total_num_rows:
                raise ValueError(f"qo_indptr has {rows} rows, more than the {self._max_total_num_rows} of the first plan")
        tensors = [qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len]
        if custom_mask is not None:
            offsets = _mask_offsets(custom_mask, qo_host.diff() * kv_host.diff()).to(I32)
            if self._use_cuda_graph:
                if self._custom_mask_buf is None:
                    raise ValueError("a custom mask in cuda graph mode needs custom_mask_buf")
                _fits("custom_mask", custom_mask, "custom_mask_buf", self._custom_mask_buf)
            tensors += [custom_mask.reshape(-1).to(torch.uint8), offsets]  # a byte per entry (flashinfer: bits, byte offsets)
        if not self._use_cuda_graph:  # a plan without a mask unbinds the last one
            self._custom_mask_buf = self._mask_indptr_buf = None
        self._keep(tensors, _PrefillModule(), kv_lens, sm_scale, q_data_type, kv_data_type, causal, non_blocking)
        heads = (num_qo_heads, num_kv_heads, 1, self._use_cuda_graph)
        self._plan_info = _plan_prefill(self, qo_host, kv_host, kv_host.diff(), rows, heads, head_dim_qk, causal)

    begin_forward = plan


class BatchMLAPagedAttentionWrapper(_Standin):
    """Stand-in for ``flashinfer.BatchMLAPagedAttentionWrapper`` (absorbed MLA, no custom mask)."""

    _INDICES = "_kv_indices_buf"
    _BUFS = ("_qo_indptr_buf", "_kv_indptr_buf", _INDICES, "_kv_len_arr_buf")

    def __init__(
        self,
        float_workspace_buffer,
        use_cuda_graph=False,
        qo_indptr=None,
        kv_indptr=None,
        kv_indices=None,
        kv_len_arr=None,
        backend="auto",
    ):
        if backend not in ("auto", "fa2", "fa3"):
            raise NotImplementedError(f"refimpl flashinfer stand-in: backend={backend!r}")
        bufs = (qo_indptr, kv_indptr, kv_indices, kv_len_arr)  # flashinfer checks them later
        self._setup(float_workspace_buffer, use_cuda_graph, "qo_indptr kv_indptr kv_indices kv_len_arr", bufs)
        self._backend = "fa2" if backend == "auto" else backend

    def _spans(self, q_len, kv_len):
        """The MLA kernel takes its query and kv positions from the plan's work list, not the bound indptrs: it covers
        exactly the planned keys."""
        ql, kl = q_len.long(), kv_len.long()
        return ql.cumsum(0) - ql, ql, kl.cumsum(0) - kl, kl, kl

    def plan(
        self,
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
    ):
        # the host reads (in a graph replay they hung: SGLang #3987, see fast_plan.py)
        kv_host, kv_lens = self._kv_lens(page_size, kv_indptr, len(qo_indptr) - 1, kv_indices, "kv_indptr kv_indices kv_indices")
        module = _MLAModule()  # it validates qo_indptr and kv_len_arr before anything is copied
        host = (qo_indptr.to("cpu"), kv_host, kv_len_arr.to("cpu"))
        self._plan_info = module.plan(*_ws(self), *host, num_heads, head_dim_ckv, causal)
        self._keep((qo_indptr, kv_indptr, kv_indices, kv_len_arr), module, kv_lens, sm_scale, q_data_type, kv_data_type, causal)

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache):
        kv_cache = _joined_mla_cache(ckv_cache, kpe_cache)
        return self._attend(dense_paged_mla_attention, (q_nope, q_pe), (kv_cache,), q_nope.shape[-1])
