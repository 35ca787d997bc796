"""``load_inputs``: a batch into a graph's static inputs in one launch (``refimpl.graphs.inputs.StaticInputs.load``).

One program copies the batch's ``input_ids`` / ``positions`` (``n`` rows), ``req_pool_indices`` / ``seq_lens``
(``raw_bs`` requests) and ``out_cache_loc`` (``steps`` blocks of ``n``: ``[step][row]``) into the first rows of the
static tensors, and writes rows ``raw_bs..bs`` (requests) and ``n..g`` (cache writes, ``g = bs * rows``) as padded
rows: request slot ``pad_req``, ``seq_len`` ``fill``, cache slot ``pad_slot`` (``refimpl.layout``). Rows past ``n`` of
``input_ids`` / ``positions`` keep what they held (a padded row's token and position are never written to a live slot).

Given a ``verdict`` (the device checks' per-program minima, ``refimpl.kernels.validation``: an entry below ``NONE``
is a bad batch) it reads the verdict first: a refused batch's rows are loaded as padded rows (request row
``pad_req``, every KV write to ``pad_slot``; its token ids and positions not copied), each of its requests keeping its
*host* length (``host_seq``: pinned host memory on CUDA, read in place; checked on the host: a plan made from the
host mirror, such as FlashInfer's, then agrees with the device), and ``record[0]`` is set to 1 (else 0). That is how a replay acts on its
device checks without waiting for them (``GraphRunner.validate``).

On CUDA it is launched directly (``_op.direct_launch``; ``benchmarks/copies_parts.py`` times it); on a CPU the same writes
run in torch (``load_inputs_ref``).
"""

import functools

import torch
import triton
import triton.language as tl

from ._op import direct_launch, kernel_op, next_power_of_2, no_specialisation
from .validation import NONE

VERDICT_BLOCK = 4096  # verdict entries one step of the load's reduction reads (a verdict is about 2,600 at most sizes)


# one compiled kernel per (STEPS, BLOCK, VBLOCK): no value of a batch may specialise it (a size equal to 1, a pointer's alignment)
@triton.jit(**no_specialisation(21, 13))  # the 13 pointers and 8 sizes
def _load_inputs_kernel(
    ids_src,  # [n] int64, the batch's
    pos_src,  # [n] int64
    rpi_src,  # [raw_bs] int64
    seq_src,  # [raw_bs] int32
    loc_src,  # [steps * n] int64, [step][row]
    ids_dst,  # [>= n] int64, the static inputs'
    pos_dst,  # [>= n] int64
    rpi_dst,  # [>= bs] int64
    seq_dst,  # [>= bs] int32
    loc_dst,  # [>= steps * g] int64, [step][graph row]
    verdict,  # [nv] int64, read when VERDICT
    record,  # [1] int32, written when VERDICT: 1 = refused
    host_seq,  # [raw_bs] int32, the batch's host lengths on the device (read when VERDICT, on a refusal)
    n,
    raw_bs,
    bs,
    g,
    fill,
    pad_req,
    pad_slot,
    nv,
    VERDICT: tl.constexpr,
    NONE_: tl.constexpr,
    STEPS: tl.constexpr,
    BLOCK: tl.constexpr,  # pow2 >= every row count
    VBLOCK: tl.constexpr,  # verdict entries per step: pow2, at most VERDICT_BLOCK
):
    r = tl.arange(0, BLOCK)
    live_req = r < raw_bs
    rpi = tl.load(rpi_src + r, mask=live_req, other=pad_req)
    seq = tl.load(seq_src + r, mask=live_req, other=fill)
    if VERDICT:  # a refused batch: padded rows, each request at its host length
        v = tl.arange(0, VBLOCK)  # the verdict in few, wide steps (its ~2,600 entries at BLOCK, 2 at bs 1: 125 µs)
        least = tl.full([VBLOCK], NONE_, tl.int64)
        for v0 in range(0, nv, VBLOCK):
            least = tl.minimum(least, tl.load(verdict + v0 + v, mask=v0 + v < nv, other=NONE_))
        refused = tl.min(least, 0) < NONE_
        tl.store(record, refused.to(tl.int32))
        n = tl.where(refused, 0, n)
        rpi = tl.where(refused, pad_req, rpi)
        seq = tl.where(refused, tl.load(host_seq + r, mask=live_req, other=fill), seq)
    live, req, rows = r < n, r < bs, r < g
    tl.store(ids_dst + r, tl.load(ids_src + r, mask=live), mask=live)
    tl.store(pos_dst + r, tl.load(pos_src + r, mask=live), mask=live)
    tl.store(rpi_dst + r, rpi, mask=req)
    tl.store(seq_dst + r, seq, mask=req)
    for s in tl.static_range(STEPS):
        tl.store(loc_dst + s * g + r, tl.load(loc_src + s * n + r, mask=live, other=pad_slot), mask=rows)


@kernel_op(
    "refimpl::load_inputs", mutates_args=("input_ids", "positions", "req_pool_indices", "seq_lens", "out_cache_loc", "record")
)
def load_inputs(
    src_input_ids: torch.Tensor,
    src_positions: torch.Tensor,
    src_req_pool_indices: torch.Tensor,
    src_seq_lens: torch.Tensor,
    src_out_cache_loc: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    bs: int,
    rows: int,
    steps: int,
    fill: int,
    pad_req: int,
    pad_slot: int,
    verdict: torch.Tensor,
    record: torch.Tensor,
    host_seq_lens: torch.Tensor,
) -> None:
    """The batch (``src_*``: ``raw_bs = src_seq_lens.numel()`` requests, ``n = src_input_ids.numel()`` rows) into the
    static tensors' first ``bs`` requests (``rows`` query rows each; ``steps`` cache-write blocks), the rest of them
    padded rows (module docstring). The caller (``StaticInputs.load``) has checked sizes and dtypes
    (``refimpl.validate``); the static tensors are whole (their sizes set the block). ``verdict`` / ``record`` /
    ``host_seq_lens``: the module docstring (an empty verdict: nothing to act on, ``record`` untouched; all three always
    given, since torch 2.11's custom op cannot mark a mutated argument that is None)."""
    src = (src_input_ids, src_positions, src_req_pool_indices, src_seq_lens, src_out_cache_loc)
    dst = (input_ids, positions, req_pool_indices, seq_lens, out_cache_loc)
    load = launch_load_inputs if input_ids.is_cuda else load_inputs_ref
    judged = (verdict, record, host_seq_lens) if verdict.numel() else ()
    load(src, dst, bs, rows, steps, fill, pad_req, pad_slot, *judged)


@functools.lru_cache(256)  # a few sizes per runner: host µs
def _load_blocks(rows: int, requests: int, verdict: int) -> tuple[int, int]:
    """The load's block (every static row and request in one) and its verdict step."""
    return next_power_of_2(max(rows, requests)), min(next_power_of_2(max(verdict, 1)), VERDICT_BLOCK)


def launch_load_inputs(src: tuple, dst: tuple, bs, rows, steps, fill, pad_req, pad_slot, verdict=None, record=None, host=None):
    """The Triton kernel over ``load_inputs``' sources and destinations (CUDA; on a CPU the interpreter takes about 9 ms
    a call, so ``load_inputs`` runs ``load_inputs_ref`` there, and a test holds this kernel to it)."""
    n, raw_bs, dev = src[0].numel(), src[3].numel(), dst[0].device
    src = dst if raw_bs == 0 else src  # an idle batch's sources are empty and never read (every mask is off)
    judged = verdict is not None
    nv = verdict.numel() if judged else 0
    block, vblock = _load_blocks(dst[0].numel(), dst[2].numel(), nv)
    verdict = (verdict, record, host if raw_bs else dst[3]) if judged else dst[:3]  # (dst: never read)
    # in the kernel's order: the pointers, the sizes, the constexprs
    args = (*src, *dst, *verdict, n, raw_bs, bs, bs * rows, fill, pad_req, pad_slot, nv, judged, NONE, steps, block, vblock)
    direct_launch(_load_inputs_kernel, (1,), args, (_load_inputs_kernel, dev, judged, steps, block, vblock), dev)


def load_inputs_ref(src: tuple, dst: tuple, bs, rows, steps, fill, pad_req, pad_slot, verdict=None, record=None, host=None):
    """The same writes in torch: copies of the batch's rows, fills of the padded rows."""
    if verdict is not None:
        refused = bool((verdict < NONE).any())
        record.fill_(int(refused))
        if refused:  # no ids, positions or KV writes; the reserved request row at each request's host length
            src = (src[0][:0], src[1][:0], torch.full_like(src[2], pad_req), host, src[4][:0])
    n, raw_bs, g = src[0].numel(), src[3].numel(), bs * rows
    for s, d in zip(src[:2], dst[:2]):
        d[:n].copy_(s)
    for s, d, pad in zip(src[2:4], dst[2:4], (pad_req, fill)):
        d[:raw_bs].copy_(s)
        d[raw_bs:bs].fill_(pad)
    loc = dst[4][: steps * g].view(steps, g)
    loc[:, :n].copy_(src[4].view(steps, n))
    loc[:, n:].fill_(pad_slot)
