"""``StaticInputs``: the six tensors a captured graph reads its batch from.

Allocated once for the runner's largest batch; at rest every row is a padded row (``refimpl.layout``: request slot
``PAD_REQ_SLOT``, ``seq_len`` the fill value, cache slot ``PAD_CACHE_SLOT``). ``load`` is the one writer of a batch into
them (SGLang's ``CudaGraphRunner.replay_prepare`` copies, [facts#the-graph-runner]); ``views(bs)`` is what the graph of
size ``bs`` and its hooks read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .. import layout
from ..batch import ForwardBatch
from ..config import SpecConfig
from ..kernels.inputs import load_inputs


@dataclass(eq=False)
class StaticInputs:
    kind: layout.GraphKind
    spec: SpecConfig | None
    bs: int  # requests they hold
    fill: int  # a padded row's seq_len (the backend's fill value)
    device: torch.device

    def __post_init__(self):
        # the six tensors, of rows = bs * kind.rows(spec) query rows and steps = kind.cache_writes(spec) (multi-step
        # draft decode: S, else 1) KV writes per row
        self.rows, self.steps = self.kind.rows(self.spec), self.kind.cache_writes(self.spec)  # (rows: per request)
        n, i64 = self.bs * self.rows, dict(dtype=torch.int64, device=self.device)
        self.input_ids, self.positions = torch.zeros(n, **i64), torch.zeros(n, **i64)  # [rows] int64
        self.req_pool_indices = torch.empty(self.bs, **i64)  # [bs] int64
        self.seq_lens = torch.empty(self.bs, dtype=torch.int32, device=self.device)  # [bs] int32
        self.seq_lens_cpu = torch.empty(self.bs, dtype=torch.int32, device="cpu")  # [bs] int32, host mirror
        self.out_cache_loc = torch.empty(self.steps * n, **i64)  # [steps * rows] int64, [step][row]
        self._whole = (self.input_ids, self.positions, self.req_pool_indices, self.seq_lens, self.out_cache_loc)
        self._mirror = self.seq_lens_cpu.numpy()  # the host mirror's memory, as numpy
        # no verdict: an empty one, a record and host lengths never read
        self._unjudged = torch.empty(0, **i64), torch.zeros(1, dtype=torch.int32, device=self.device), self.seq_lens
        self._views = {}  # views by bs, made once each
        self.rest()

    def at_rest(self, bs: int) -> StaticInputs:
        """Fresh inputs for ``bs`` requests, every row a padded row."""
        return dataclasses.replace(self, bs=bs)

    def rest(self):
        """In place: every row becomes a padded row."""
        self.req_pool_indices.fill_(layout.PAD_REQ_SLOT)
        self.seq_lens.fill_(self.fill)
        self.seq_lens_cpu.fill_(self.fill)
        self.out_cache_loc.fill_(layout.PAD_CACHE_SLOT)

    def views(self, bs: int | None = None) -> dict[str, torch.Tensor]:
        """The first ``bs`` requests' views by name (default: all): what the graph of size ``bs`` reads."""
        bs = self.bs if bs is None else bs
        if bs not in self._views:  # the first entries of each; out_cache_loc: this graph's block per step, [step][row]
            n = bs * self.rows
            sizes = dict(
                input_ids=n, positions=n, req_pool_indices=bs, seq_lens=bs, seq_lens_cpu=bs, out_cache_loc=self.steps * n
            )
            self._views[bs] = {name: getattr(self, name)[:size] for name, size in sizes.items()}
        return self._views[bs]

    def batch(self, bs: int, mode, seq_lens_sum: int, spec_info, world) -> ForwardBatch:
        """A batch of views of the first ``bs`` requests (fresh each call; the views are made once)."""
        return ForwardBatch(mode, bs, **self.views(bs), seq_lens_sum=seq_lens_sum, world=world, spec_info=spec_info)

    def load(self, fb: ForwardBatch, bs: int, verdict=None, record=None, host_seq_lens=None):
        """``fb`` into the first ``bs`` requests, rows ``fb.batch_size..bs`` reset to padded rows, in one launch on CUDA
        (``refimpl.kernels.inputs``; under a device-check ``verdict``, a refused batch as padded rows only, ``record``
        set; its requests at their host lengths ``host_seq_lens``), plus the host mirror. Dtypes are
        ``refimpl.validate``'s to check."""
        src = (fb.input_ids, fb.positions, fb.req_pool_indices, fb.seq_lens, fb.out_cache_loc)
        pads = (layout.PAD_REQ_SLOT, layout.PAD_CACHE_SLOT)
        judged = self._unjudged if verdict is None else (verdict, record, host_seq_lens)
        load_inputs(*src, *self._whole, bs, self.rows, self.steps, self.fill, *pads, *judged)
        mirror, raw_bs = self._mirror, fb.batch_size  # numpy: 4.6 µs against 11.1 for torch's copy + fill (H200)
        mirror[:raw_bs] = fb.seq_lens_cpu.numpy()
        mirror[raw_bs:bs] = self.fill
