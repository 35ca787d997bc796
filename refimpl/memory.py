"""Request and token pools, and the KV caches the captured step writes into.

Three tables ([facts#memory-pools]):
- ``req_to_token`` ``[pool_size, L]`` int32: row = request slot, column j = position j, value =
  the token slot holding that position's KV. Row 0 is reserved: padded graph rows point at it.
- token slots, handed out in aligned pages of ``page_size`` (``page_id = slot // page_size``).
  Page 0 is reserved: padded rows write their KV into slot 0, which no live request owns.
- the KV cache: MHA ``k[layer]`` ``[slots, Hkv, D]`` / ``v[layer]`` ``[slots, Hkv, Dv]``, or MLA
  ``kv[layer]`` ``[slots, 1, 512 + 64]`` (latent | rope).
"""

from __future__ import annotations

from collections import deque

import torch

from ._env import Device
from .config import RESERVED_REQ_SLOT, ModelConfig


class ReqToTokenPool:
    """``req_to_token[size, max_context_len]`` int32 with request slot 0 reserved; ``live[size]`` bool (device): the rows
    allocated now (validation reads it: a new slot no other live request holds). A freed row is zeroed."""

    def __init__(self, size: int, max_context_len: int, device: Device = "cpu"):
        if size < 2:
            raise ValueError(f"ReqToTokenPool size={size}: need >= 2 (slot 0 is reserved)")
        self.size, self.max_context_len, self.device = size, max_context_len, torch.device(device)
        self.req_to_token = torch.zeros(size, max_context_len, dtype=torch.int32, device=device)
        self.live = torch.zeros(size, dtype=torch.bool, device=device)
        self._free = list(range(1, size))  # slot 0 never handed out

    @property
    def available(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n > (free := len(self._free)):
            raise RuntimeError(
                f"ReqToTokenPool: asked for {n} request slots, only {free} free (pool size {self.size}, slot 0 reserved)"
            )
        out, self._free = self._free[:n], self._free[n:]
        self.live[out] = True
        return out

    def free(self, slots: list[int]):
        if RESERVED_REQ_SLOT in slots:
            raise ValueError("request slot 0 is reserved and cannot be freed")
        self.req_to_token[slots] = 0  # a freed row must not leak stale slot ids
        self.live[slots] = False
        self._free.extend(slots)


class TokenSlotAllocator:
    """Hands out KV slots page by page (page 0 reserved for padded rows). ``page_size``: 1 Triton / FlashInfer, 64
    FlashMLA, 128 Cutlass-MLA, 32 or 64 TRTLLM-MLA ([facts#memory-pools]). Positions ``[p*P, (p+1)*P)`` share a page:
    ``req_to_token[r, p*P] // P`` is its id (what block tables store)."""

    def __init__(self, num_slots: int, page_size: int = 1, seed: int = 0):
        if num_slots % page_size:
            raise ValueError(f"num_slots={num_slots} is not a multiple of page_size={page_size}")
        if num_slots // page_size < 2:
            raise ValueError(f"num_slots={num_slots}: need >= 2 pages (page 0 is reserved)")
        self.num_slots, self.page_size = num_slots, page_size
        g = torch.Generator().manual_seed(seed)  # shuffled: a request's pages are not contiguous (exposes index bugs)
        pages = torch.randperm(num_slots // page_size - 1, generator=g, device="cpu") + 1
        self._free_pages = deque(pages.tolist())  # handed out from the left, freed pages rejoin on the right

    @property
    def free_pages(self) -> int:
        return len(self._free_pages)

    def alloc_pages(self, n: int) -> list[int]:
        if n > (free := self.free_pages):
            raise RuntimeError(f"TokenSlotAllocator: asked for {n} pages of {self.page_size} slots, only {free} free")
        return [self._free_pages.popleft() for _ in range(n)]  # O(n), not O(free)

    def free_page_ids(self, pages: list[int]):
        if 0 in pages:
            raise ValueError("page 0 is reserved and cannot be freed")
        self._free_pages.extend(pages)

    def slots_for(self, pages: list[int], num_tokens: int) -> torch.Tensor:
        """Token slots for positions ``0..num_tokens-1`` laid out over ``pages``."""
        p = self.page_size
        if num_tokens > len(pages) * p:
            raise ValueError(f"{num_tokens} tokens do not fit in {len(pages)} pages of {p}")
        slots = torch.tensor(pages, dtype=torch.int64, device="cpu")[:, None] * p + torch.arange(p, device="cpu")  # [pages, p]
        return slots.flatten()[:num_tokens]


class MHAKVCache:
    """Per layer ``k[slots, Hkv, D]`` and ``v[slots, Hkv, Dv]`` ("NHD", page size folded in)."""

    def __init__(self, cfg: ModelConfig, num_slots: int, device: Device = "cpu"):
        self.cfg, self.num_slots = cfg, num_slots
        per_layer = lambda d: [
            torch.zeros(num_slots, cfg.num_kv_heads, d, dtype=cfg.dtype, device=device) for _ in range(cfg.num_layers)
        ]
        self.k, self.v = per_layer(cfg.head_dim), per_layer(cfg.v_head_dim)

    def set_kv(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        # loc: [tokens] int64; k: [tokens, Hkv, D]; an in-place scatter (graph-safe)
        for cache, x in ((self.k[layer], k), (self.v[layer], v)):
            cache.index_copy_(0, loc, x.to(cache.dtype))

    def buffers(self) -> list[torch.Tensor]:
        return self.k + self.v


class MLAKVCache:
    """Per layer ``kv[slots, 1, kv_lora_rank + rope]``: latent in ``[..., :512]``, rope after."""

    def __init__(self, cfg: ModelConfig, num_slots: int, device: Device = "cpu"):
        self.cfg, self.num_slots = cfg, num_slots
        shape = (num_slots, 1, cfg.kv_row_width)
        self.kv = [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(cfg.num_layers)]

    def set_kv(self, layer: int, loc: torch.Tensor, latent_and_rope: torch.Tensor):
        # latent_and_rope: [tokens, 576] or [tokens, 1, 576]
        row = latent_and_rope.reshape(-1, 1, self.cfg.kv_row_width)
        self.kv[layer].index_copy_(0, loc, row.to(self.kv[layer].dtype))

    def buffers(self) -> list[torch.Tensor]:
        return list(self.kv)


def make_kv_cache(cfg: ModelConfig, num_slots: int, device: Device = "cpu"):
    return (MLAKVCache if cfg.is_mla else MHAKVCache)(cfg, num_slots, device)
