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
from ..spec import DraftDecodeInput, DraftTree, build_custom_mask
from .base import AttentionBackend


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
        if mode.is_decode_or_idle() and isinstance(spec, DraftDecodeInput):
            # multi-step draft decode, step i: row (r, k) = prefix + the i+1 drafts of branch k
            if self.step is None:
                raise ValueError("oracle: draft decode needs the step index (OracleMultiStep)")
            topk, i = spec.topk, self.step
            row = lambda r, n, c: torch.cat([r2t[r, :n], r2t[r, c : c + i + 1]]).to(torch.int64)  # c: branch's step 0
            ranges = [row(r, n, layout.draft_column(n, k, 0, spec)) for r, n in zip(rpi, seq) for k in range(topk)]
            kv_indices = torch.cat(ranges) if ranges else torch.zeros(0, dtype=torch.int64, device="cpu")
            kv_indptr = torch.tensor([0] + [x.numel() for x in ranges], dtype=torch.int64, device="cpu").cumsum(0)
            qo = torch.arange(len(ranges) + 1, dtype=torch.int64, device="cpu")
            self.forward_metadata = (qo, kv_indptr, kv_indices, None, None, False)
            return
        if mode.is_target_verify():
            n = spec.draft_token_num
            q_rows, kv_lens = [n] * bs, layout.attended_kv_lens(mode, torch.tensor(seq, device="cpu"), n).tolist()
        elif mode.is_decode_or_idle():
            q_rows, kv_lens = [1] * bs, seq
        elif mode.is_extend() or mode.is_any_draft_extend():
            ext = fb.extend_seq_lens if mode.is_extend() else spec.extend_seq_lens
            q_rows, kv_lens = ext.tolist(), seq
        else:
            raise ValueError(f"oracle: unknown mode {mode}")
        ranges = [r2t[r, :n].to(torch.int64) for r, n in zip(rpi, kv_lens)]
        kv_indices = torch.cat(ranges or [torch.zeros(0, dtype=torch.int64, device=self.device)])
        qo = torch.tensor([0] + q_rows, dtype=torch.int64, device="cpu").cumsum(0)
        kv_indptr = torch.tensor([0] + list(kv_lens), dtype=torch.int64, device="cpu").cumsum(0)
        mask = mask_indptr = None
        causal = not mode.is_decode_or_idle() and not mode.is_target_verify()
        if mode.is_target_verify():  # the mask rebuilt from the draft trees, never taken from the batch
            mask = build_custom_mask(seq, self._trees(spec, bs))
            mask_indptr = torch.tensor([0] + [n * k for n, k in zip(q_rows, kv_lens)], device="cpu").cumsum(0)
        self.forward_metadata = (qo, kv_indptr, kv_indices, mask, mask_indptr, causal)

    @staticmethod
    def _trees(spec, bs: int) -> list[DraftTree]:
        """The batch's draft trees (``spec.parents``); a verify input without them is chains (the one "no tree" rule)."""
        n = spec.draft_token_num
        if spec.parents is None:
            return [DraftTree.chain(n)] * bs
        if len(spec.parents) != bs or any(len(p) != n for p in spec.parents):
            raise ValueError(f"spec_info.parents: expected {bs} trees of {n} nodes, got {[len(p) for p in spec.parents]}")
        return [DraftTree(list(p)) for p in spec.parents]

    def _eager_only(self, *a, **k):
        raise NotImplementedError("the oracle runs eagerly only")

    init_cuda_graph_state = init_forward_metadata_capture_cuda_graph = _eager_only
    init_forward_metadata_replay_cuda_graph = _eager_only

    def forward(self, q, k, v, layer: int, fb: ForwardBatch) -> torch.Tensor:
        cache, cfg = self.world.kv_cache, self.cfg
        *tensors, causal = self.forward_metadata
        qo, kv_indptr, kv_indices, mask, mask_indptr = (None if t is None else t.to(q.device) for t in tensors)
        csr = (qo, kv_indptr, kv_indices, cfg.sm_scale)
        masks = dict(custom_mask=mask, mask_indptr=mask_indptr, causal=causal)
        if cfg.is_mla:
            cache.set_kv(layer, fb.out_cache_loc, k)
            r = cfg.kv_lora_rank
            out = mla_oracle(q[..., :r], q[..., r:], cache.kv[layer], *csr, **masks)
        else:
            cache.set_kv(layer, fb.out_cache_loc, k, v)
            out = mha_oracle(q, cache.k[layer], cache.v[layer], *csr, **masks)
        return out.to(q.dtype)


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
