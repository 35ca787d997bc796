"""A tiny decoder step: the program that gets captured.

Per layer: RMS-norm, q/k/v projections, KV write at ``out_cache_loc`` and attention (both
through the backend, as in SGLang), output projection, residual. Positions enter through a
sinusoidal embedding, so a draft token's tree position changes its logits.

MHA flavour: q ``[T, H, D]``, k ``[T, Hkv, D]``, v ``[T, Hkv, Dv]``.
MLA flavour (absorbed, [facts#flashinfer-mla]): q ``[T, H, 512 + 64]`` (q_nope | q_rope already
absorbed into latent space), k = the cache row ``[T, 1, 576]`` (latent | rope), v = its latent
``[T, 1, 512]``; attention returns ``[T, H, 512]``.

Every op here is graph-safe: fixed shapes, no host reads.
"""

from __future__ import annotations

import math

import torch

from ._env import default_device
from .batch import ForwardBatch
from .config import ModelConfig


def _rms_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class TinyDecoder:
    """Weights are random but fixed by ``cfg.seed``; logits are ``[num_tokens, vocab]``."""

    def __init__(self, cfg: ModelConfig, device: str | torch.device | None = None):
        self.cfg = cfg
        device = device if device is not None else default_device()
        g = torch.Generator().manual_seed(cfg.seed)
        hd = cfg.hidden_size

        def w(*shape):  # scaled so activations stay O(1) through the layers
            return (torch.randn(*shape, generator=g, device="cpu") / math.sqrt(shape[0])).to(device, cfg.dtype)

        self.embed = w(cfg.vocab_size, hd) * math.sqrt(cfg.vocab_size)
        self.inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32, device="cpu") / hd))
        self.inv_freq = self.inv_freq.to(device)
        H = cfg.num_heads
        self.layers = []
        for _ in range(cfg.num_layers):
            if cfg.is_mla:
                layer = {
                    "wq": w(hd, H * cfg.kv_row_width),  # -> q_nope|q_rope per head
                    "wkv": w(hd, cfg.kv_row_width),  # -> latent|rope, one shared row
                    "wo": w(H * cfg.kv_lora_rank, hd),
                }
            else:
                layer = {
                    "wq": w(hd, H * cfg.head_dim),
                    "wk": w(hd, cfg.num_kv_heads * cfg.head_dim),
                    "wv": w(hd, cfg.num_kv_heads * cfg.v_head_dim),
                    "wo": w(H * cfg.v_head_dim, hd),
                }
            self.layers.append(layer)
        self.lm_head = w(hd, cfg.vocab_size)

    def _pos_embedding(self, positions: torch.Tensor) -> torch.Tensor:
        ang = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]  # [T, hd/2]
        return torch.cat([ang.sin(), ang.cos()], dim=-1).to(self.cfg.dtype)  # [T, hd]

    def __call__(self, fb: ForwardBatch, backend) -> torch.Tensor:
        cfg = self.cfg
        T, H = fb.input_ids.shape[0], cfg.num_heads
        x = self.embed[fb.input_ids] + self._pos_embedding(fb.positions)  # [T, hidden]
        for i, p in enumerate(self.layers):
            h = _rms_norm(x)
            if cfg.is_mla:
                q = (h @ p["wq"]).view(T, H, cfg.kv_row_width)  # [T, H, 576]
                k = (h @ p["wkv"]).view(T, 1, cfg.kv_row_width)  # [T, 1, 576]
                v = k[..., : cfg.kv_lora_rank]  # [T, 1, 512]
            else:
                q = (h @ p["wq"]).view(T, H, cfg.head_dim)  # [T, H, D]
                k = (h @ p["wk"]).view(T, cfg.num_kv_heads, cfg.head_dim)  # [T, Hkv, D]
                v = (h @ p["wv"]).view(T, cfg.num_kv_heads, cfg.v_head_dim)  # [T, Hkv, Dv]
            o = backend.forward(q, k, v, i, fb)  # [T, H, Dv]
            x = x + o.reshape(T, H * cfg.out_head_dim) @ p["wo"]
        return _rms_norm(x) @ self.lm_head  # [T, vocab]


class MultiStepDraftProgram:
    """The captured program of multi-step draft decode ([facts#multi-step-draft-decode-indices]).

    ``S - 1`` decode steps over ``bs * topk`` rows (one per draft branch). Step i feeds draft
    token i of every branch at ``positions + i``, writes its KV at the step's slice of
    ``out_cache_loc`` (``[step][seq][branch]``), attends through ``backend.step_backend(i)``
    and picks the branch's next token greedily (``argmax``: graph-safe; real EAGLE re-ranks
    the top-k children of every branch, which changes which tokens are fed, not the shapes).
    Returns ``[rows, S-1, vocab]``, rows first so the runner can slice the live rows.
    """

    def __init__(self, model: TinyDecoder, num_steps: int):
        if num_steps < 2:
            raise ValueError(f"multi-step draft decode needs num_steps >= 2, got {num_steps}")
        self.model, self.num_steps = model, num_steps
        self.cfg = model.cfg

    def __call__(self, fb: ForwardBatch, backend) -> torch.Tensor:
        rows, ids, outs = fb.num_tokens, fb.input_ids, []
        for i in range(self.num_steps - 1):
            step = fb.replace(
                input_ids=ids, positions=fb.positions + i, out_cache_loc=fb.out_cache_loc[i * rows : (i + 1) * rows]
            )
            logits = self.model(step, backend.step_backend(i))  # [rows, vocab]
            outs.append(logits)
            ids = logits.argmax(-1)  # [rows] int64: the next draft token of every branch
        return torch.stack(outs, 1)  # [rows, S-1, vocab]
