"""The dense oracle as a backend: what every backend's output must equal.

Eager only: each request's query rows, key range and mask come straight from the batch and the request table, per mode
(``refimpl.layout``), then ``kernels.oracle`` runs in float64:

| mode                    | query rows of request i | keys                              | mask                 |
|-------------------------|-------------------------|-----------------------------------|----------------------|
| EXTEND, DRAFT_EXTEND v1 | ``extend_seq_lens[i]``  | ``req_to_token[r, :seq_len]``     | causal               |
| DECODE / IDLE           | 1                       | ``req_to_token[r, :seq_len]``     | none                 |
| TARGET_VERIFY           | N                       | ``req_to_token[r, :seq_len + N]`` | rebuilt from ``spec.parents`` (chains without) |
| DRAFT_EXTEND_V2         | N                       | ``req_to_token[r, :seq_len]``     | causal               |

Multi-step draft decode (``OracleMultiStep``): step i, row (r, k) attends ``req_to_token[r, :seq_len]`` plus the i+1
draft slots of branch k at columns ``seq_len + k*S + j`` (``layout.draft_column``).
"""

from __future__ import annotations

import torch

from .. import layout
from ..batch import ForwardBatch
from ..kernels import mha_oracle, mla_oracle
from ..spec import DraftTree, build_custom_mask
from .base import AttentionBackend, dense_forward


class OracleBackend(AttentionBackend):
    name = "oracle"
    variant = "reference"
    pattern = "-"
    graph_modes = frozenset()

    def __init__(self, world, spec=None, step: int | None = None):
        super().__init__(world, spec)
        self.step = step  # multi-step draft decode: which step this oracle computes

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        mode, bs, spec, r2t = fb.forward_mode, fb.batch_size, fb.spec_info, self.world.req_to_token
        seq, rpi = fb.seq_lens_cpu.tolist(), fb.req_pool_indices.tolist()
        indptr = lambda lens: torch.tensor([0, *lens], device="cpu").cumsum(0)  # noqa: E731 (int64 [0, cumsum(lens)])
        mask = mask_indptr = None
        causal = mode.is_extend() or mode.is_any_draft_extend()  # over the new rows; never in draft decode (a DECODE)
        if fb.kind.multi_step:
            # multi-step draft decode, step i: row (r, k) = prefix + the i+1 drafts of branch k
            if self.step is None:
                raise ValueError("oracle: draft decode needs the step index (OracleMultiStep)")
            i = self.step
            row = lambda r, n, c: torch.cat([r2t[r, :n], r2t[r, c : c + i + 1]])  # noqa: E731 (c: the branch's step 0)
            ranges = [row(r, n, layout.draft_column(n, k, 0, spec)) for r, n in zip(rpi, seq) for k in range(spec.topk)]
            q_rows = [1] * len(ranges)
        else:
            q_rows, kv_lens = [1] * bs, seq  # decode / idle
            if mode.is_target_verify():  # the mask rebuilt from the draft trees, never taken from the batch
                n = spec.draft_token_num
                q_rows, kv_lens = [n] * bs, [s + n for s in seq]
                mask, mask_indptr = build_custom_mask(seq, self._trees(spec, bs)), indptr(n * k for k in kv_lens)
            elif causal:
                q_rows = (fb.extend_seq_lens if mode.is_extend() else spec.extend_seq_lens).tolist()
            elif not mode.is_decode_or_idle():
                raise ValueError(f"oracle: unknown mode {mode}")
            ranges = [r2t[r, :n] for r, n in zip(rpi, kv_lens)]
        kv_indices = torch.cat([r2t.new_zeros(0), *ranges]).to(torch.int64)
        # mha_oracle's arguments after the cache: qo_indptr, kv_indptr, kv_indices, sm_scale, mask, mask_indptr, causal
        kv_indptr = indptr(x.numel() for x in ranges)
        self.forward_metadata = (indptr(q_rows), kv_indptr, kv_indices, self.cfg.sm_scale, mask, mask_indptr, causal)

    @staticmethod
    def _trees(spec, bs: int) -> list[DraftTree]:
        """The batch's draft trees (``spec.parents``); a verify input without them is chains (the one "no tree" rule)."""
        n = spec.draft_token_num
        if spec.parents is None:
            return [DraftTree.chain(n)] * bs
        if len(spec.parents) != bs or any(len(p) != n for p in spec.parents):
            raise ValueError(f"spec_info.parents: expected {bs} trees of {n} nodes, got {[len(p) for p in spec.parents]}")
        return [DraftTree(p) for p in spec.parents]

    def _eager_only(self, *a, **k):
        raise NotImplementedError("the oracle runs eagerly only")

    init_cuda_graph_state = init_forward_metadata_capture_cuda_graph = init_forward_metadata_replay_cuda_graph = _eager_only

    def forward(self, q, k, v, layer: int, fb: ForwardBatch) -> torch.Tensor:
        args = [t.to(q.device) if isinstance(t, torch.Tensor) else t for t in self.forward_metadata]
        return dense_forward(self, q, k, v, layer, fb, mha_oracle, mla_oracle, *args).to(q.dtype)


class OracleMultiStep(OracleBackend):
    """One oracle per draft step, for ``MultiStepDraftProgram``."""

    def __init__(self, world, spec=None):
        super().__init__(world, spec)
        self.steps = [OracleBackend(world, spec, step=i) for i in range(spec.num_steps - 1)]

    def step_backend(self, i: int) -> OracleBackend:
        return self.steps[i]

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        for b in self.steps:
            b.init_forward_metadata(fb)
