"""Extend attention in the SGLang Triton style: paged prefix + new tokens passed directly.

The Triton backend runs TARGET_VERIFY and DRAFT_EXTEND through one extend kernel whose keys come
from two places ([facts#triton]):

- the **prefix**: cache rows ``kv_indices[kv_indptr[i] : kv_indptr[i+1]]`` of ``k_buffer`` /
  ``v_buffer`` (``p_i`` keys; the CSR covers the prefix only, unlike FlashInfer);
- the **extend** part: the request's own new rows of ``k_extend`` / ``v_extend``
  (``q_i = qo_indptr[i+1] - qo_indptr[i]`` keys, the same rows as its queries).

Masks (custom mask takes precedence, as in SGLang):

- ``custom_mask`` (bool / uint8, flattened) with ``mask_indptr``: request i's block is row-major
  ``[q_i, p_i + q_i]`` starting at ``mask_indptr[i]``; entry ``(j, c)`` says whether query row j
  sees key c, where ``c < p_i`` is prefix key c and ``c >= p_i`` is extend key ``c - p_i``.
  ``is_causal`` is ignored when a custom mask is given;
- no custom mask, ``is_causal``: all prefix keys visible, extend key c visible iff ``c <= j``;
- neither: every key visible.

Grid ``(bs, H, cdiv(max_len_extend, BLOCK_M))``. ``max_len_extend`` is a Python int, frozen when a
CUDA graph captures the launch. **Query rows ``j >= max_len_extend`` of a request are never
computed: their ``o_extend`` rows keep whatever they held.** This is the behaviour behind the
post-#26665 Triton draft-extend v2 bug ([facts#triton-historical-bugs]: ``max_extend_len = S + 1``
frozen while each request has ``N`` rows). SGLang's kernel drops whole ``BLOCK_M`` row blocks (rows up to the next multiple of
its BLOCK_M may still be computed); here the cut is exact at ``max_len_extend`` so the result does
not depend on the block size chosen for the device. Extend *keys* are not truncated: row j still
sees every visible extend key of its request, including keys ``>= max_len_extend``.

Compute: online softmax in float32 (inputs are up-cast, dots use IEEE fp32), scores
``s = (q . k) * sm_scale``, optionally capped ``logit_cap * tanh(s / logit_cap)`` when
``logit_cap > 0``. GQA: query head h reads kv head ``h // (H // Hkv)``. A row with no visible key
writes zeros. Keys outside a request's ranges are never loaded, so garbage (even NaN) in unused
cache slots or in ``kv_indices`` past ``kv_indptr[bs]`` cannot reach the result.
"""

import torch

from .. import _env  # noqa: F401  (sets TRITON_INTERPRET before any @triton.jit)

# isort: split
import triton
import triton.language as tl

from ._checks import FLOAT_DTYPES as _FLOAT_DTYPES
from ._checks import INDEX_DTYPES as _INDEX_DTYPES
from ._checks import check as _check
from ._checks import check_float, check_int, check_mask, check_paged_qkvo, check_tensor
from ._op import kernel_op

BLOCK_M = 16  # query rows per program (tl.dot needs >= 16)
BLOCK_N = 32  # keys per loop iteration


@triton.jit
def _cap(s, logit_cap):
    # logit_cap * tanh(s / logit_cap), with tanh(x) = 2 * sigmoid(2x) - 1 (no libdevice needed)
    return logit_cap * (2.0 * tl.sigmoid(2.0 * s / logit_cap) - 1.0)


@triton.jit
def _online_update(qk, visible, v, m_i, l_i, acc):
    """One online-softmax step: qk [M, N] fp32 scores, visible [M, N], v [N, DV] fp32."""
    qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))  # [M]
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
    alpha = tl.exp(m_i - m_safe)  # m_i = -inf -> 0
    p = tl.where(visible, tl.exp(qk - m_safe[:, None]), 0.0)  # [M, N]
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    return m_new, l_i, acc


@triton.jit
def _extend_attention_kernel(
    q_ptr,  # [Tq, H, D]
    k_ext_ptr,  # [Tq, Hkv, D]
    v_ext_ptr,  # [Tq, Hkv, Dv]
    o_ptr,  # [Tq, H, Dv], written
    k_buf_ptr,  # [slots, Hkv, D]
    v_buf_ptr,  # [slots, Hkv, Dv]
    qo_indptr_ptr,  # [bs+1]
    kv_indptr_ptr,  # [>= bs+1]
    kv_indices_ptr,  # [>= kv_indptr[bs]]
    mask_ptr,  # flattened custom mask (ignored unless USE_MASK)
    mask_indptr_ptr,  # [>= bs+1] (ignored unless USE_MASK)
    stride_q0,
    stride_q1,
    stride_ke0,
    stride_ke1,
    stride_ve0,
    stride_ve1,
    stride_o0,
    stride_o1,
    stride_kb0,
    stride_kb1,
    stride_vb0,
    stride_vb1,
    sm_scale,
    logit_cap,
    max_len_extend,
    KV_GROUP: tl.constexpr,  # H // Hkv
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_MASK: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    USE_CAP: tl.constexpr,
):
    i = tl.program_id(0)  # request
    h = tl.program_id(1)  # query head
    mb = tl.program_id(2)  # block of query rows
    kvh = h // KV_GROUP

    q_start = tl.load(qo_indptr_ptr + i).to(tl.int64)
    q_len = tl.load(qo_indptr_ptr + i + 1).to(tl.int64) - q_start
    kv_start = tl.load(kv_indptr_ptr + i).to(tl.int64)
    p_len = tl.load(kv_indptr_ptr + i + 1).to(tl.int64) - kv_start
    n_rows = tl.minimum(q_len, max_len_extend)  # rows >= max_len_extend are never computed

    m = mb * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)  # [M] query row in the request
    row_ok = m < n_rows
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    d_ok = d < D
    dv_ok = dv < DV

    q_rows = q_ptr + (q_start + m)[:, None] * stride_q0 + h * stride_q1 + d[None, :]
    q = tl.load(q_rows, mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)  # [M, D]

    # start of row j of request i's [q_len, p_len + q_len] mask block (a dummy when no mask)
    mask_row = tl.load(mask_indptr_ptr + i).to(tl.int64) + m * (p_len + q_len)  # [M]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)

    # ---- stage 1: prefix keys from the paged cache
    for nb in range(tl.cdiv(p_len, BLOCK_N)):
        n = nb * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)  # [N] prefix key position
        key_ok = n < p_len
        slot = tl.load(kv_indices_ptr + kv_start + n, mask=key_ok, other=0).to(tl.int64)
        k = tl.load(
            k_buf_ptr + slot[None, :] * stride_kb0 + kvh * stride_kb1 + d[:, None],
            mask=key_ok[None, :] & d_ok[:, None],
            other=0.0,
        ).to(tl.float32)  # [D, N]
        qk = tl.dot(q, k, input_precision="ieee") * sm_scale  # [M, N]
        if USE_CAP:
            qk = _cap(qk, logit_cap)
        visible = row_ok[:, None] & key_ok[None, :]
        if USE_MASK:
            bits = tl.load(mask_ptr + mask_row[:, None] + n[None, :], mask=visible, other=0)
            visible = visible & (bits != 0)
        v = tl.load(
            v_buf_ptr + slot[:, None] * stride_vb0 + kvh * stride_vb1 + dv[None, :],
            mask=key_ok[:, None] & dv_ok[None, :],
            other=0.0,
        ).to(tl.float32)  # [N, DV]
        m_i, l_i, acc = _online_update(qk, visible, v, m_i, l_i, acc)

    # ---- stage 2: the request's own new keys, passed directly
    for nb in range(tl.cdiv(q_len, BLOCK_N)):
        n = nb * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)  # [N] extend key position
        key_ok = n < q_len
        k = tl.load(
            k_ext_ptr + (q_start + n)[None, :] * stride_ke0 + kvh * stride_ke1 + d[:, None],
            mask=key_ok[None, :] & d_ok[:, None],
            other=0.0,
        ).to(tl.float32)  # [D, N]
        qk = tl.dot(q, k, input_precision="ieee") * sm_scale  # [M, N]
        if USE_CAP:
            qk = _cap(qk, logit_cap)
        visible = row_ok[:, None] & key_ok[None, :]
        if USE_MASK:
            bits = tl.load(mask_ptr + mask_row[:, None] + p_len + n[None, :], mask=visible, other=0)
            visible = visible & (bits != 0)
        elif IS_CAUSAL:
            visible = visible & (n[None, :] <= m[:, None])
        v = tl.load(
            v_ext_ptr + (q_start + n)[:, None] * stride_ve0 + kvh * stride_ve1 + dv[None, :],
            mask=key_ok[:, None] & dv_ok[None, :],
            other=0.0,
        ).to(tl.float32)  # [N, DV]
        m_i, l_i, acc = _online_update(qk, visible, v, m_i, l_i, acc)

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # empty rows: acc = 0 -> zeros
    o_rows = o_ptr + (q_start + m)[:, None] * stride_o0 + h * stride_o1 + dv[None, :]
    tl.store(o_rows, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])


@kernel_op("refimpl::extend_attention", mutates_args=("o_extend",))
def _extend_attention_op(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    is_causal: bool,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
) -> None:
    bs = qo_indptr.shape[0] - 1
    num_heads, head_dim = q_extend.shape[1], q_extend.shape[2]
    num_kv_heads, v_head_dim = k_buffer.shape[1], v_buffer.shape[2]
    if bs == 0 or num_heads == 0:  # shapes, not data: nothing to launch
        return
    use_mask = custom_mask is not None
    grid = (bs, num_heads, triton.cdiv(max_len_extend, BLOCK_M))
    _extend_attention_kernel[grid](
        q_extend,
        k_extend,
        v_extend,
        o_extend,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        custom_mask if use_mask else qo_indptr,  # dummy pointers, never read
        mask_indptr if use_mask else qo_indptr,
        q_extend.stride(0),
        q_extend.stride(1),
        k_extend.stride(0),
        k_extend.stride(1),
        v_extend.stride(0),
        v_extend.stride(1),
        o_extend.stride(0),
        o_extend.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        sm_scale,
        logit_cap if logit_cap > 0 else 1.0,
        max_len_extend,
        KV_GROUP=num_heads // num_kv_heads,
        D=head_dim,
        DV=v_head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_DV=max(16, triton.next_power_of_2(v_head_dim)),
        BLOCK_M=BLOCK_M,
        BLOCK_N=BLOCK_N,
        USE_MASK=use_mask,
        IS_CAUSAL=bool(is_causal),
        USE_CAP=logit_cap > 0,
    )


# ----------------------------------------------------------------------------------------------
# validation (shapes / dtypes / devices only: never tensor values, so graph-safe)


def extend_attention(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor | None,
    mask_indptr: torch.Tensor | None,
    is_causal: bool,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float = 0.0,
) -> None:
    """Write extend attention (prefix from the cache + new keys passed directly) into ``o_extend``.

    Shapes: q_extend [Tq, H, D], k_extend [Tq, Hkv, D], v_extend [Tq, Hkv, Dv],
    o_extend [Tq, H, Dv], k_buffer [slots, Hkv, D], v_buffer [slots, Hkv, Dv];
    qo_indptr [bs+1] (bs = qo_indptr.numel() - 1: pass the ``[:bs+1]`` view),
    kv_indptr [>= bs+1] (prefix CSR), kv_indices [>= kv_indptr[bs]] (int32 / int64),
    custom_mask flattened bool / uint8 with mask_indptr [>= bs+1], or both None.

    Request i's query rows are ``qo_indptr[i]:qo_indptr[i+1]``; its keys are its prefix (cache rows
    ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]``) followed by its own rows of k_extend / v_extend.
    Mask semantics, GQA and logit cap: see the module docstring.

    ``max_len_extend`` (a Python int >= 1, frozen in a graph) sets the grid's row-block dimension
    ``cdiv(max_len_extend, BLOCK_M)``; **query rows j >= max_len_extend of any request are not
    computed and their o_extend rows are left untouched** ([facts#triton-historical-bugs]). The caller
    guarantees the index values are in range (they cannot be checked without a host sync).
    """
    names = ("q_extend", "k_buffer", "v_buffer", "o_extend")
    tokens, _, num_kv_heads, head_dim, v_head_dim = check_paged_qkvo(q_extend, k_buffer, v_buffer, o_extend, names)
    device = q_extend.device
    for name, t, want in (
        ("k_extend", k_extend, (tokens, num_kv_heads, head_dim)),
        ("v_extend", v_extend, (tokens, num_kv_heads, v_head_dim)),
    ):
        check_tensor(t, name, _FLOAT_DTYPES, 3, device)
        _check(tuple(t.shape) == want, f"{name}.shape={tuple(t.shape)}: must be {want}")
    for name, t in (
        ("q_extend", q_extend),
        ("k_extend", k_extend),
        ("v_extend", v_extend),
        ("o_extend", o_extend),
        ("k_buffer", k_buffer),
        ("v_buffer", v_buffer),
    ):
        _env.check_cpu_dtype(t, name)
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
        check_tensor(t, name, _INDEX_DTYPES, 1, device)
    _check(qo_indptr.shape[0] >= 1, "qo_indptr.shape[0]=0: must be >= 1 (bs + 1)")
    bs = qo_indptr.shape[0] - 1
    _check(
        kv_indptr.shape[0] >= bs + 1,
        f"kv_indptr.shape[0]={kv_indptr.shape[0]}: must be >= bs + 1 = {bs + 1} (bs = qo_indptr.numel() - 1)",
    )
    check_mask(custom_mask, mask_indptr, bs, device)
    check_int(max_len_extend, "max_len_extend", 1)
    check_float(sm_scale, "sm_scale")
    _check(
        isinstance(logit_cap, (int, float)) and logit_cap >= 0,
        f"logit_cap={logit_cap!r}: must be a float >= 0 (0 = off)",
    )
    _extend_attention_op(
        q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr, kv_indptr,
        kv_indices, custom_mask, mask_indptr, bool(is_causal), max_len_extend, float(sm_scale),
        float(logit_cap),
    )  # fmt: skip
