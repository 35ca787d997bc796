"""Extend attention in the SGLang Triton style ([facts#triton]): keys are the request's cached **prefix**
(``kv_indices[kv_indptr[i] : kv_indptr[i+1]]``: the CSR covers the prefix only, unlike FlashInfer) then its
**extend** rows of ``k_extend`` / ``v_extend``. ``custom_mask`` (row-major ``[q_i, p_i + q_i]`` at
``mask_indptr[i]``) wins, as in SGLang; else ``is_causal`` shows all prefix keys and extend keys ``c <= j``.

**Query rows ``j >= max_len_extend`` (a Python int frozen at capture) are never computed and their ``o_extend`` rows
keep what they held**: the post-#26665 Triton draft-extend v2 bug ([facts#triton-historical-bugs]: ``max_extend_len =
S + 1`` frozen while requests have ``N`` rows); the cut is exact (SGLang drops whole ``BLOCK_M`` blocks). Keys outside
a request's ranges are never loaded; a row with no visible key writes zeros (float32 online softmax, logit cap, GQA).
"""

import triton
import triton.language as tl
from torch import Tensor

from ._checks import FLOAT_DTYPES, INDEX_DTYPES, check, check_int, check_mask, check_paged_qkvo, check_tensor
from ._op import cdiv, kernel_op, next_power_of_2
from .bounds import guard_csr
from .triton_decode import check_kernel_args, csr_range, outer_strides

BLOCK_M = 16  # query rows per program (tl.dot needs >= 16)
BLOCK_N = 32  # keys per loop iteration


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
    mask_ptr,  # flattened custom mask, or None
    mask_indptr_ptr,  # [>= bs+1], or None (with mask_ptr)
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
    IS_CAUSAL: tl.constexpr,
    USE_CAP: tl.constexpr,
):
    i, h, mb = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # request, query head, block of query rows
    kvh = h // KV_GROUP  # its kv head
    q_start, q_len = csr_range(qo_indptr_ptr, i)
    kv_start, p_len = csr_range(kv_indptr_ptr, i)
    m = mb * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)  # [M] query row in the request
    rows = (m < tl.minimum(q_len, max_len_extend))[:, None]  # [M, 1]: rows >= max_len_extend are never computed
    tokens = (q_start + m)[:, None]  # [M, 1] rows of q / o
    d, dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    d_ok, dv_ok = d < D, dv < DV
    q = tl.load(q_ptr + tokens * stride_q0 + h * stride_q1 + d[None, :], mask=rows & d_ok[None, :], other=0.0).to(tl.float32)
    if mask_ptr is not None:  # [M, 1]: start of row j of request i's [q_len, p_len + q_len] mask block
        mask_rows = (tl.load(mask_indptr_ptr + i).to(tl.int64) + m * (p_len + q_len))[:, None]
    m_i, l_i = tl.full([BLOCK_M], float("-inf"), tl.float32), tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    # loop invariants, hoisted (the interpreter pays for every operation, every iteration)
    offs_n, last_key = tl.arange(0, BLOCK_N).to(tl.int64), p_len + m[:, None]
    k_cols, v_cols = kvh * stride_kb1 + d[:, None], kvh * stride_vb1 + dv[None, :]  # [D, 1], [1, DV] in the cache
    ke_cols, ve_cols = kvh * stride_ke1 + d[:, None], kvh * stride_ve1 + dv[None, :]  # in k_extend / v_extend
    d_ok2, dv_ok2 = d_ok[:, None], dv_ok[None, :]
    num_prefix_blocks = tl.cdiv(p_len, BLOCK_N)
    for nb in range(num_prefix_blocks + tl.cdiv(q_len, BLOCK_N)):  # one online-softmax step per key block
        if nb < num_prefix_blocks:  # stage 1: prefix keys from the paged cache
            n = nb * BLOCK_N + offs_n  # [N] prefix key position
            key_ok = n < p_len
            slot = tl.load(kv_indices_ptr + kv_start + n, mask=key_ok, other=0).to(tl.int64)
            k_ptrs = k_buf_ptr + slot[None, :] * stride_kb0 + k_cols  # [D, N]
            v_ptrs = v_buf_ptr + slot[:, None] * stride_vb0 + v_cols  # [N, DV]
            col = n  # [N] key column in the request's [p_len + q_len] keys
        else:  # stage 2: the request's own new keys, passed directly
            n = (nb - num_prefix_blocks) * BLOCK_N + offs_n  # [N] extend key position
            key_ok = n < q_len
            k_ptrs = k_ext_ptr + (q_start + n)[None, :] * stride_ke0 + ke_cols
            v_ptrs = v_ext_ptr + (q_start + n)[:, None] * stride_ve0 + ve_cols
            col = p_len + n
        visible = rows & key_ok[None, :]  # [M, N]
        if mask_ptr is not None:
            visible = visible & (tl.load(mask_ptr + mask_rows + col[None, :], mask=visible, other=0) != 0)
        elif IS_CAUSAL:  # row j sees key column c <= p_len + j: every prefix key, extend keys up to its own
            visible = visible & (col[None, :] <= last_key)
        k = tl.load(k_ptrs, mask=key_ok[None, :] & d_ok2, other=0.0).to(tl.float32)  # [D, N]
        qk = tl.dot(q, k, input_precision="ieee") * sm_scale  # [M, N]
        if USE_CAP:  # logit_cap * tanh(s / logit_cap), tanh(x) = 2 * sigmoid(2x) - 1 (no libdevice)
            qk = logit_cap * (2.0 * tl.sigmoid(2.0 * qk / logit_cap) - 1.0)
        v = tl.load(v_ptrs, mask=key_ok[:, None] & dv_ok2, other=0.0).to(tl.float32)  # [N, DV]
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))  # [M]
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        alpha = tl.exp(m_i - m_safe)  # m_i = -inf -> 0
        p = tl.where(visible, tl.exp(qk - m_safe[:, None]), 0.0)  # [M, N]
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # empty rows: acc = 0 -> zeros
    tl.store(o_ptr + tokens * stride_o0 + h * stride_o1 + dv[None, :], out, mask=rows & dv_ok2)  # cast to o's dtype


@kernel_op("refimpl::extend_attention", mutates_args=("o_extend",))
def _extend_attention_op(
    q_extend: Tensor,
    k_extend: Tensor,
    v_extend: Tensor,
    o_extend: Tensor,
    k_buffer: Tensor,
    v_buffer: Tensor,
    qo_indptr: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    custom_mask: Tensor | None,
    mask_indptr: Tensor | None,
    is_causal: bool,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
) -> None:
    (_, num_heads, head_dim), v_head_dim, bs = q_extend.shape, v_buffer.shape[2], qo_indptr.shape[0] - 1
    if bs == 0 or num_heads == 0:  # shapes, not data: nothing to launch
        return
    floats = (q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer)
    _extend_attention_kernel[(bs, num_heads, cdiv(max_len_extend, BLOCK_M))](
        *floats,
        qo_indptr,
        kv_indptr,
        kv_indices,
        custom_mask,
        mask_indptr,
        *outer_strides(*floats),
        sm_scale,
        logit_cap if logit_cap > 0 else 1.0,
        max_len_extend,
        num_heads // k_buffer.shape[1],  # KV_GROUP
        head_dim,
        v_head_dim,
        max(16, next_power_of_2(head_dim)),  # BLOCK_D
        max(16, next_power_of_2(v_head_dim)),  # BLOCK_DV
        BLOCK_M,
        BLOCK_N,
        is_causal,
        logit_cap > 0,  # USE_CAP
    )


def extend_attention(
    q_extend,
    k_extend,
    v_extend,
    o_extend,
    k_buffer,
    v_buffer,
    qo_indptr,
    kv_indptr,
    kv_indices,
    custom_mask,
    mask_indptr,
    is_causal,
    max_len_extend,
    sm_scale,
    logit_cap=0.0,
) -> None:
    """Write extend attention (cached prefix + new keys) into ``o_extend``: q_extend / o_extend [Tq, H, D / Dv], k_extend /
    v_extend [Tq, Hkv, D / Dv], k_buffer / v_buffer [slots, Hkv, D / Dv], qo_indptr [bs+1], kv_indptr [>= bs+1] (prefix
    CSR), custom_mask with mask_indptr [>= bs+1] or neither; rows ``j >= max_len_extend`` (a Python int >= 1) are not
    computed (module docstring); ``is_causal`` a bool, ``sm_scale`` / ``logit_cap`` (>= 0, 0 = off) Python floats."""
    tokens, _, num_kv_heads, head_dim, v_head_dim = check_paged_qkvo(
        q_extend, k_buffer, v_buffer, o_extend, ("q_extend", "k_buffer", "v_buffer", "o_extend")
    )
    device = q_extend.device
    for name, t, dim in (("k_extend", k_extend, head_dim), ("v_extend", v_extend, v_head_dim)):
        check_tensor(t, name, FLOAT_DTYPES, 3, device)
        check(t.shape == (tokens, num_kv_heads, dim), f"{name}.shape={tuple(t.shape)}: must be {(tokens, num_kv_heads, dim)}")
    floats = (q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer)
    check_kernel_args(sm_scale, logit_cap, "q_extend k_extend v_extend o_extend k_buffer v_buffer", *floats)
    check_tensor(qo_indptr, "qo_indptr", INDEX_DTYPES, 1, device, min_len=1)  # [bs + 1]
    bs = qo_indptr.shape[0] - 1
    check_tensor(kv_indptr, "kv_indptr", INDEX_DTYPES, 1, device, min_len=bs + 1)
    check_tensor(kv_indices, "kv_indices", INDEX_DTYPES, 1, device)
    check_mask(custom_mask, mask_indptr, bs, device)
    check_int(max_len_extend, "max_len_extend", 1)
    kv_indptr, kv_indices = guard_csr("extend_attention", kv_indptr, kv_indices, bs, k_buffer.shape[0])
    _extend_attention_op(
        *floats,
        qo_indptr,
        kv_indptr,
        kv_indices,
        custom_mask,
        mask_indptr,
        bool(is_causal),
        max_len_extend,
        float(sm_scale),
        float(logit_cap),
    )
