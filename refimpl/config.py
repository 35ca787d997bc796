"""Model, speculative-decoding and graph configuration. Shapes are small on purpose (every capture runs on a laptop CPU),
except the MLA latent cache row: DeepSeek's real 512 + 64 = 576 ([facts#memory-pools]), which the MLA backends' layouts
depend on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

# the request slot and KV slot the pools never hand out (refimpl.memory): every padded row points at them (refimpl.layout)
RESERVED_REQ_SLOT = 0
RESERVED_TOKEN_SLOT = 0


def sglang_default_capture_bs(max_bs: int, speculative: bool) -> list[int]:
    """SGLang's default batch-size ladder (mid-2025 runner, [facts#capture-batch-sizes]) capped at ``max_bs``; with
    speculative decoding the ladder is denser."""
    ladder = [*range(1, 9), *range(10, 33, 2), *range(40, 161, 16)] if speculative else [1, 2, 4, 8, *range(16, 161, 8)]
    # max_bs itself too: the largest batch the pools can hold must be capturable
    return sorted({bs for bs in ladder if bs <= max_bs} | {max_bs})


@dataclass(frozen=True)
class ModelConfig:
    """A tiny decoder: a few layers of projections + attention, MHA or absorbed MLA."""

    kind: Literal["mha", "mla"] = "mha"
    num_layers: int = 2
    hidden_size: int = 64
    vocab_size: int = 96
    num_heads: int = 4  # H: query heads
    num_kv_heads: int = 2  # Hkv (MHA only); GQA when < num_heads
    head_dim: int = 16  # MHA q/k head dim
    v_head_dim: int = 16  # MHA v head dim
    kv_lora_rank: int = 512  # MLA latent width (the value of absorbed MLA)
    qk_rope_head_dim: int = 64  # MLA rope part of the key
    qk_nope_head_dim: int = 128  # MLA: only used for the softmax scale ([facts#memory-pools])
    dtype: torch.dtype = torch.float32
    seed: int = 0

    def __post_init__(self):
        if self.kind not in ("mha", "mla"):
            raise ValueError(f"ModelConfig.kind must be 'mha' or 'mla', got {self.kind!r}")
        if self.kind == "mha" and self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")

    @property
    def is_mla(self) -> bool:
        return self.kind == "mla"

    @property
    def kv_row_width(self) -> int:
        """MLA latent cache row: kv_lora_rank + rope = 576."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def out_head_dim(self) -> int:
        return self.kv_lora_rank if self.is_mla else self.v_head_dim

    @property
    def sm_scale(self) -> float:
        # MLA: the model's scale comes from nope+rope (192 for DeepSeek), not from 576 ([facts#memory-pools])
        d = self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim
        return d**-0.5


def eagle_max_tree_nodes(topk: int, num_steps: int) -> int:
    """Largest tree EAGLE drafts in ``num_steps`` steps of ``topk`` (root included): step 0 drafts ``topk`` children of the
    root, every later step expands the ``topk`` best beams of the previous depth into ``topk`` children each (``topk *
    topk`` candidates)."""
    return 1 + topk + (num_steps - 1) * topk * topk


@dataclass(frozen=True)
class SpecConfig:
    """EAGLE-style speculative decoding shape: S = num_steps (draft decode steps), topk = branches per step, N =
    num_draft_tokens (tokens verified per request). A chain: topk == 1, N == S + 1."""

    num_steps: int = 3  # S
    topk: int = 1
    num_draft_tokens: int = 4  # N

    def __post_init__(self):
        n, S, k = self.num_draft_tokens, self.num_steps, self.topk
        if S < 1 or k < 1 or n < 2:
            raise ValueError(f"invalid SpecConfig {self}: need num_steps>=1, topk>=1, N>=2")
        if k == 1 and n != S + 1:
            raise ValueError(f"a chain (topk=1) verifies num_steps+1={S + 1} tokens, got num_draft_tokens={n}")
        if n > (m := eagle_max_tree_nodes(k, S)) and k > 1:
            raise ValueError(f"num_draft_tokens={n} exceeds what {S} steps of topk={k} can draft ({m} incl. the root)")


CHAIN = SpecConfig()  # the defaults, an EAGLE chain: S = 3, topk = 1, N = S + 1 = 4
TREE = SpecConfig(topk=2, num_draft_tokens=6)  # a tree of two branches, S = 3: N = 6 > S + 1


@dataclass(frozen=True)
class GraphConfig:
    """What the runner captures: batch sizes, context length, padding."""

    max_bs: int = 8
    capture_bs: tuple[int, ...] | None = None  # None: SGLang's default ladder up to max_bs
    max_context_len: int = 64  # L: longest sequence (prefix + new tokens) a request may have
    disable_padding: bool = False  # True: only exactly-captured batch sizes run as graphs
    speculative: bool = False
    num_warmups: int = 2  # SGLang runs the step twice before capture ([facts#capture])

    def batch_sizes(self) -> list[int]:
        if self.capture_bs is not None:
            if bad := [b for b in self.capture_bs if not 1 <= b <= self.max_bs]:
                raise ValueError(f"capture_bs {bad} outside 1..max_bs={self.max_bs}")
            return sorted(set(self.capture_bs))
        return sglang_default_capture_bs(self.max_bs, self.speculative)


def tiny_model_config(kind: str, dtype: torch.dtype, device_type: str = "cpu") -> ModelConfig:
    """The checker's model: tiny on CPU (the Triton interpreter is slow); on a GPU, head dims the real FlashInfer kernels
    compile for; MLA with 16 heads (FlashInfer MLA's smallest)."""
    if kind == "mla":
        return ModelConfig("mla", num_heads=16, dtype=dtype)
    if kind == "mha" and device_type == "cuda":
        return ModelConfig(num_heads=8, head_dim=64, v_head_dim=64, dtype=dtype)
    return ModelConfig(dtype=dtype)  # the defaults: 2 layers, 4 heads over 2 KV heads
