"""A tiny decoder step: the program that gets captured (every op graph-safe: fixed shapes, no host reads).

Per layer: RMS-norm, q/k/v projections, KV write at ``out_cache_loc`` and attention (both through the backend, as in
SGLang), output projection, residual. Positions enter through a sinusoidal embedding, so a draft token's tree position
changes its logits. MHA: q ``[T, H, D]``, k ``[T, Hkv, D]``, v ``[T, Hkv, Dv]``. Absorbed MLA ([facts#flashinfer-mla]):
q ``[T, H, 512 + 64]`` (q_nope | q_rope in latent space), k = the cache row ``[T, 1, 576]``, v = its latent ``[T, 1,
512]``.
"""

from __future__ import annotations

import math

import torch

from ._env import Device, resolve_device
from .batch import ForwardBatch
from .config import ModelConfig


def _rms_norm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class TinyDecoder:
    """Weights are random but fixed by ``cfg.seed``; logits are ``[num_tokens, vocab]``."""

    def __init__(self, cfg: ModelConfig, device: Device | None = None):
        self.cfg = cfg
        device = resolve_device(device)
        g = torch.Generator().manual_seed(cfg.seed)
        hd = cfg.hidden_size  # w: a random weight, scaled so activations stay O(1) through the layers
        w = lambda *shape: (torch.randn(*shape, generator=g, device="cpu") / math.sqrt(shape[0])).to(device, cfg.dtype)
        self.embed = w(cfg.vocab_size, hd) * math.sqrt(cfg.vocab_size)
        self.inv_freq = (1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32, device="cpu") / hd))).to(device)
        H, D, Dv, Hkv, R = cfg.num_heads, cfg.head_dim, cfg.v_head_dim, cfg.num_kv_heads, cfg.kv_row_width
        # per layer: the q, k (, v) projections as (weight, heads, head width), then wo. MLA: q -> q_nope|q_rope per
        # head, k -> latent|rope (one shared row), v = k's latent
        shapes = [(H, R), (1, R)] if cfg.is_mla else [(H, D), (Hkv, D), (Hkv, Dv)]  # (heads, head width)
        self.layers = [([(w(hd, h * d), h, d) for h, d in shapes], w(H * cfg.out_head_dim, hd)) for _ in range(cfg.num_layers)]
        self.lm_head = w(hd, cfg.vocab_size)

    def _pos_embedding(self, positions):
        ang = positions.to(torch.float32)[:, None] * self.inv_freq  # [T, hd/2]
        return torch.cat([ang.sin(), ang.cos()], -1).to(self.cfg.dtype)  # [T, hd]

    def __call__(self, fb: ForwardBatch, backend) -> torch.Tensor:
        T = fb.input_ids.shape[0]
        x = self.embed[fb.input_ids] + self._pos_embedding(fb.positions)  # [T, hidden]
        for i, (proj, wo) in enumerate(self.layers):
            h = _rms_norm(x)
            # q [T, H, D], k [T, Hkv, D], v [T, Hkv, Dv]; MLA: q [T, H, 576], k [T, 1, 576], v [T, 1, 512]
            q, k, *v = ((h @ p).view(T, heads, width) for p, heads, width in proj)
            o = backend.forward(q, k, v[0] if v else k[..., : self.cfg.kv_lora_rank], i, fb)  # [T, H, Dv]
            x = x + o.reshape(T, wo.shape[0]) @ wo
        return _rms_norm(x) @ self.lm_head  # [T, vocab]


class MultiStepDraftProgram:
    """The captured program of multi-step draft decode ([facts#multi-step-draft-decode-indices]): ``S - 1`` decode steps
    over ``bs * topk`` rows (one per branch). Step i feeds every branch's draft token i at ``positions + i``, writes KV
    at its slice of ``out_cache_loc``, attends through ``backend.step_backend(i)`` and picks the next token by
    ``argmax`` (graph-safe; real EAGLE re-ranks each branch's top-k children: other tokens, same shapes). Returns
    ``[rows, S-1, vocab]``.

    ``follow``: another run's output ``[rows, S-1, vocab]``, whose picks feed the next step instead of this run's own
    (teacher forcing). The checker runs its float64 oracle this way: a near tie in the bf16 logits can rank the other
    way in float64, and one flipped pick changes every later step of that branch (the H200 fuzz met one: a 3.14 logit
    difference from a single token, every attention value right)."""

    def __init__(self, model: TinyDecoder, num_steps: int):
        if num_steps < 2:
            raise ValueError(f"multi-step draft decode needs num_steps >= 2, got {num_steps}")
        self.model, self.num_steps, self.cfg = model, num_steps, model.cfg

    def __call__(self, fb: ForwardBatch, backend, follow: torch.Tensor | None = None) -> torch.Tensor:
        ids, outs, locs = fb.input_ids, [], fb.cache_loc_steps()  # locs: [S, rows]
        for i in range(self.num_steps - 1):
            step = fb.replace(input_ids=ids, positions=fb.positions + i, out_cache_loc=locs[i])
            outs.append(self.model(step, backend.step_backend(i)))  # [rows, vocab]
            ids = (outs[-1] if follow is None else follow[:, i]).argmax(-1)  # [rows] int64: each branch's next token
        return torch.stack(outs, 1)  # [rows, S-1, vocab]
