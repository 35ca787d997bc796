"""``load_inputs``: a batch into a graph's static inputs in one launch (``refimpl.graphs.inputs.StaticInputs.load``).

One program copies the batch's ``input_ids`` / ``positions`` (``n`` rows), ``req_pool_indices`` / ``seq_lens``
(``raw_bs`` requests) and ``out_cache_loc`` (``steps`` blocks of ``n``: ``[step][row]``) into the first rows of the
static tensors, and writes rows ``raw_bs..bs`` (requests) and ``n..g`` (cache writes, ``g = bs * rows``) as padded
rows: request slot ``pad_req``, ``seq_len`` ``fill``, cache slot ``pad_slot`` (``refimpl.layout``). Rows past ``n`` of
``input_ids`` / ``positions`` keep what they held (a padded row's token and position are never written to a live slot).

On CUDA it is launched directly (``_op.direct_launch``; ``benchmarks/copies_parts.py`` times it); on a CPU the same writes
run in torch (``load_inputs_ref``).
"""

import torch
import triton
import triton.language as tl

from ._op import direct_launch, kernel_op, no_specialisation


# one compiled kernel per (STEPS, BLOCK): no value of a batch may specialise it (a size equal to 1, a pointer's alignment)
@triton.jit(**no_specialisation(17, 10))  # the 10 pointers and 7 sizes
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
    n,
    raw_bs,
    bs,
    g,
    fill,
    pad_req,
    pad_slot,
    STEPS: tl.constexpr,
    BLOCK: tl.constexpr,  # pow2 >= every row count
):
    r = tl.arange(0, BLOCK)
    live, live_req, req, rows = r < n, r < raw_bs, r < bs, r < g
    tl.store(ids_dst + r, tl.load(ids_src + r, mask=live), mask=live)
    tl.store(pos_dst + r, tl.load(pos_src + r, mask=live), mask=live)
    tl.store(rpi_dst + r, tl.load(rpi_src + r, mask=live_req, other=pad_req), mask=req)
    tl.store(seq_dst + r, tl.load(seq_src + r, mask=live_req, other=fill), mask=req)
    for s in tl.static_range(STEPS):
        tl.store(loc_dst + s * g + r, tl.load(loc_src + s * n + r, mask=live, other=pad_slot), mask=rows)


@kernel_op("refimpl::load_inputs", mutates_args=("input_ids", "positions", "req_pool_indices", "seq_lens", "out_cache_loc"))
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
) -> None:
    """The batch (``src_*``: ``raw_bs = src_seq_lens.numel()`` requests, ``n = src_input_ids.numel()`` rows) into the
    static tensors' first ``bs`` requests (``rows`` query rows each; ``steps`` cache-write blocks), the rest of them
    padded rows (module docstring). The caller (``StaticInputs.load``) has checked sizes and dtypes
    (``refimpl.validate``); the static tensors are whole (their sizes set the block)."""
    src = (src_input_ids, src_positions, src_req_pool_indices, src_seq_lens, src_out_cache_loc)
    dst = (input_ids, positions, req_pool_indices, seq_lens, out_cache_loc)
    (launch_load_inputs if input_ids.is_cuda else load_inputs_ref)(src, dst, bs, rows, steps, fill, pad_req, pad_slot)


def launch_load_inputs(src: tuple, dst: tuple, bs: int, rows: int, steps: int, fill: int, pad_req: int, pad_slot: int):
    """The Triton kernel over ``load_inputs``' sources and destinations (CUDA; on a CPU the interpreter takes about 9 ms
    a call, so ``load_inputs`` runs ``load_inputs_ref`` there, and a test holds this kernel to it)."""
    n, raw_bs, dev = src[0].numel(), src[3].numel(), dst[0].device
    block = triton.next_power_of_2(max(dst[0].numel(), dst[2].numel()))
    src = dst if raw_bs == 0 else src  # an idle batch's sources are empty and never read (every mask is off)
    sizes = (n, raw_bs, bs, bs * rows, fill, pad_req, pad_slot, steps, block)
    direct_launch(_load_inputs_kernel, (1,), (*src, *dst, *sizes), (_load_inputs_kernel, dev, steps, block), dev)


def load_inputs_ref(src: tuple, dst: tuple, bs: int, rows: int, steps: int, fill: int, pad_req: int, pad_slot: int):
    """The same writes in torch: copies of the batch's rows, fills of the padded rows."""
    n, raw_bs, g = src[0].numel(), src[3].numel(), bs * rows
    for s, d in zip(src[:2], dst[:2]):
        d[:n].copy_(s)
    for s, d, pad in zip(src[2:4], dst[2:4], (pad_req, fill)):
        d[:raw_bs].copy_(s)
        d[raw_bs:bs].fill_(pad)
    loc = dst[4][: steps * g].view(steps, g)
    loc[:, :n].copy_(src[4].view(steps, n))
    loc[:, n:].fill_(pad_slot)
