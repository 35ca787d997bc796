"""``ForwardBatch`` (what one forward step sees) and ``World`` (the pools it indexes into).

Rows per request and what ``seq_lens`` counts: ``refimpl.layout`` (EXTEND, eager only: ``extend_seq_lens[i]`` rows,
``seq_lens`` incl. them). ``out_cache_loc[t]``: the token slot query row t writes its KV into,
``req_to_token[req_pool_indices[i], position]`` (a padded row: slot 0).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

import torch

from ._env import Device, resolve_device
from .config import ModelConfig
from .layout import GraphKind
from .memory import MHAKVCache, MLAKVCache, ReqToTokenPool, TokenSlotAllocator, make_kv_cache
from .modes import ForwardMode


@dataclass
class World:
    """Everything a batch's indices point into: request table, slot allocator, KV cache."""

    cfg: ModelConfig
    req_to_token_pool: ReqToTokenPool
    allocator: TokenSlotAllocator
    kv_cache: MHAKVCache | MLAKVCache
    device: torch.device

    @classmethod
    def create(
        cls,
        cfg: ModelConfig,
        *,
        max_context_len: int,
        pool_size: int = 64,
        num_slots: int | None = None,
        page_size: int = 1,
        device: Device | None = None,
        seed: int = 0,
        kv_caches: dict | None = None,
    ) -> "World":
        """A world of ``pool_size`` request slots and ``num_slots`` KV slots (default: room for every request at the
        longest context), handed out in a random page order from ``seed``. ``kv_caches``: a cache of KV caches by
        model config, device, slot count and seed: the first world of each draws random KV from ``seed``, the others
        share it (a 100,000-slot MLA cache is 0.5 GB and takes seconds to draw on a CPU)."""
        if num_slots is None:  # every request's pages at the longest context, and the reserved page
            num_slots = ((pool_size + 1) * -(-max_context_len // page_size) + 1) * page_size
        num_slots = -(-num_slots // page_size) * page_size
        dev = resolve_device(device)
        key = (cfg, dev, num_slots, seed)  # not the page size: a cache is per slot
        shared = (kv_caches or {}).get(key)
        pool, kv_cache = ReqToTokenPool(pool_size, max_context_len, dev), shared or make_kv_cache(cfg, num_slots, dev)
        world = cls(cfg, pool, TokenSlotAllocator(num_slots, page_size, seed), kv_cache, dev)
        if kv_caches is not None and shared is None:
            world.randomize_kv(seed)
            kv_caches[key] = world.kv_cache
        return world

    @property
    def req_to_token(self) -> torch.Tensor:
        return self.req_to_token_pool.req_to_token

    @property
    def max_context_len(self) -> int:
        return self.req_to_token_pool.max_context_len

    @property
    def page_size(self) -> int:
        return self.allocator.page_size

    def new_request(self, num_tokens: int) -> int:
        """Allocate a request slot and pages for ``num_tokens`` positions; fill its row."""
        if num_tokens > (L := self.max_context_len):
            raise ValueError(f"request of {num_tokens} tokens exceeds max_context_len={L}")
        (slot,) = self.req_to_token_pool.alloc(1)
        pages = self.allocator.alloc_pages(-(-num_tokens // self.page_size))
        slots = self.allocator.slots_for(pages, num_tokens)
        self.req_to_token[slot, :num_tokens] = slots.to(self.device, torch.int32)
        return slot

    def randomize_kv(self, seed: int = 0):
        """Fill every KV slot (slot 0 too: nothing live reads it) with random values, as if all prefixes had been
        prefilled."""
        host = torch.Generator(device="cpu").manual_seed(seed)  # one stream over every host-drawn buffer
        for buf in self.kv_cache.buffers():
            big = buf.is_cuda and buf.numel() > 1 << 24  # large GPU caches: drawn on the device, each from seed
            g = torch.Generator(device=buf.device).manual_seed(seed) if big else host
            buf.copy_(torch.randn(buf.shape, generator=g, device=g.device))

    def clone_to(self, device: Device) -> "World":
        """A copy on another device with the same tables, cache contents and free lists."""
        dev, pool = resolve_device(device), self.req_to_token_pool
        # a deep copy whose memo already maps every tensor to its copy on dev (deepcopy reuses what its memo holds)
        moved = {id(t): t.to(dev, copy=True) for t in (pool.req_to_token, pool.live, *self.kv_cache.buffers())}
        twin = copy.deepcopy(self, moved)
        twin.device = twin.req_to_token_pool.device = dev
        return twin

    def live_slots(self) -> torch.Tensor:
        """Every token slot referenced by a live request row (row 0 excluded)."""
        rows = self.req_to_token[1:]
        return torch.unique(rows[rows > 0]).to(torch.int64)


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [num_tokens] int64, device
    positions: torch.Tensor  # [num_tokens] int64, device
    req_pool_indices: torch.Tensor  # [bs] int64, device
    seq_lens: torch.Tensor  # [bs] int32, device
    seq_lens_cpu: torch.Tensor  # [bs] int32, host mirror (planning only; never baked in)
    out_cache_loc: torch.Tensor  # [num_tokens] int64, device
    seq_lens_sum: int
    world: World
    spec_info: Any | None = None  # refimpl.spec.{VerifyInput,DraftExtendInput,DraftDecodeInput}
    extend_seq_lens: torch.Tensor | None = None  # [bs] int32, EXTEND only
    extend_prefix_lens: torch.Tensor | None = None  # [bs] int32, EXTEND only
    meta: dict = field(default_factory=dict)  # free-form notes from generators (for drawing)

    @property
    def kind(self) -> GraphKind:
        """What graph serves it: its mode's, or multi-step draft decode (SGLang's rule: a decode batch that carries a
        spec input is a draft model's step)."""
        multi = self.spec_info is not None and self.forward_mode.is_decode_or_idle()
        return GraphKind.parse("draft_decode" if multi else self.forward_mode)

    def cache_loc_steps(self) -> torch.Tensor:
        """``out_cache_loc`` as ``[steps, rows]`` (``GraphKind.cache_loc_steps``): a draft decode's step ``i`` writes
        ``[i]``."""
        return self.kind.cache_loc_steps(self.out_cache_loc, self.spec_info)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.numel()

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def to_world(self, world: "World") -> "ForwardBatch":
        """The same batch against ``world`` (e.g. a ``World.clone_to('cuda')`` twin)."""
        move = lambda x: x.to(world.device) if isinstance(x, torch.Tensor) else x

        def moved(obj, **given):  # a copy of dataclass obj: the fields in given as given, every other tensor moved
            return replace(obj, **{f.name: move(getattr(obj, f.name)) for f in fields(obj) if f.name not in given}, **given)

        spec = moved(self.spec_info) if is_dataclass(self.spec_info) else self.spec_info
        return moved(self, world=world, spec_info=spec, seq_lens_cpu=self.seq_lens_cpu)  # the host mirror stays

    def replace(self, **kw) -> "ForwardBatch":
        return replace(self, **kw)
