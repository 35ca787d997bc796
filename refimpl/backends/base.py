"""The attention-backend contract: SGLang's hook names, mini-sglang's typed shape.

| refimpl / SGLang hook                          | mini-sglang            | when it runs                 |
|------------------------------------------------|------------------------|------------------------------|
| ``init_forward_metadata(fb)``                  | ``prepare_metadata``   | every eager step             |
| ``init_cuda_graph_state(max_bs, max_tokens)``  | ``init_capture_graph`` | once, before any capture     |
| ``init_forward_metadata_capture_cuda_graph``   | ``prepare_for_capture``| once per (bs, mode) capture  |
| ``init_forward_metadata_replay_cuda_graph``    | ``prepare_for_replay`` | before every replay          |
| ``init_forward_metadata_out_graph(fb, cap)``   |                        | SGLang 0.5.23: both above    |
| ``init_forward_metadata_in_graph(fb)``         |                        | first thing in the graph     |
| ``get_cuda_graph_seq_len_fill_value()``        |                        | padding (1 for all six)      |
| ``forward(q, k, v, layer, fb)``                | ``forward``            | inside the captured step     |

The capture and replay hooks run **outside** the graph ([facts#capture]); only ``forward`` (and the in-graph hook) is
recorded. So everything ``forward`` reads is a static buffer from ``init_cuda_graph_state`` (or a view of one) that
replay refills in place ([facts#what-is-and-is-not-captured]). Every backend has a ``legacy`` shape (upstream before the
unification, #26134 / #26665) and a ``unified`` one; each class carries one ``PATTERNS`` label
([facts#pattern-vocabulary]). The runner calls ``init_forward_metadata_out_graph``, whose default drives the classic
pair: a backend implements either (``hook_interface``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

import torch

from ..batch import ForwardBatch, World
from ..config import SpecConfig
from ..modes import ForwardMode

PATTERNS = {
    "A": "capture runs the replay body, then freezes metadata views of the static buffers",
    "B": "capture prepares graph-bound objects (wrappers), then runs the replay body",
    "C": "capture and replay are separate bodies that must be kept in step by hand",
    "C, merged branches": "separate bodies; identical mode branches inside each merged",
    "in-graph": "the metadata rebuild is recorded inside the graph; the replay hook re-points",
}


# why a replay hook stays eager (``AttentionBackend.glue_refusal``): what a metadata glue graph would freeze
COPIES_MASK = "the verify hook copies spec_info.custom_mask, a tensor each batch brings: a glue graph keeps the first's"
PLANS = "the replay hook calls FlashInfer's plan(): a work partition made on the host, which a graph would freeze"


def live_csr_state(md: Any, **scalars: Any) -> dict[str, Any]:
    """The graph state of CSR metadata ``md`` (``kv_indptr``, ``kv_indices``, ``mask_indptr``, ``custom_mask``, as in
    Triton's and torch_native's): the indptrs whole, ``kv_indices`` / ``custom_mask`` (as uint8) cut to the live part their
    indptr's last entry names; ``scalars`` (frozen values, other views) between the CSR and the mask."""
    state = dict(kv_indptr=md.kv_indptr, kv_indices=md.kv_indices[: int(md.kv_indptr[-1])], **scalars)
    if md.mask_indptr is not None:
        state.update(mask_indptr=md.mask_indptr, custom_mask=md.custom_mask[: int(md.mask_indptr[-1])].to(torch.uint8))
    return state


def dense_forward(backend: AttentionBackend, q, k, v, layer: int, fb: ForwardBatch, mha_op, mla_op, *args, **kw):
    """Write this layer's KV at ``fb.out_cache_loc``, then attend with ``mha_op(q, k_cache, v_cache, *args, **kw)``, or on
    an MLA model ``mla_op(q_nope, q_rope, kv_cache, *args, **kw)`` (torch_native's and the oracle's ``forward``)."""
    cache, r = backend.world.kv_cache, backend.cfg.kv_lora_rank
    if backend.cfg.is_mla:
        cache.set_kv(layer, fb.out_cache_loc, k)
        return mla_op(q[..., :r], q[..., r:], cache.kv[layer], *args, **kw)
    cache.set_kv(layer, fb.out_cache_loc, k, v)
    return mha_op(q, cache.k[layer], cache.v[layer], *args, **kw)


NEITHER_INTERFACE = (
    "implements neither init_forward_metadata_out_graph (SGLang 0.5.23) nor the pair "
    "init_forward_metadata_capture_cuda_graph / init_forward_metadata_replay_cuda_graph"
)


CLASSIC_PAIR = ("init_forward_metadata_capture_cuda_graph", "init_forward_metadata_replay_cuda_graph")


def hook_interface(cls: type) -> str | None:
    """Which metadata interface a backend class implements: ``"out_graph"`` (stage 3, SGLang 0.5.23), ``"classic"``
    (the capture / replay pair, stages 1 and 2), or ``None`` (neither: it cannot be captured)."""
    own = lambda name: getattr(cls, name, None) not in (None, getattr(AttentionBackend, name))  # noqa: E731
    if own("init_forward_metadata_out_graph"):
        return "out_graph"
    return "classic" if all(map(own, CLASSIC_PAIR)) else None


def dead_classic_hooks(cls: type) -> list[str]:
    """The classic hooks a stage-3 class defines below its ``init_forward_metadata_out_graph``: the runner never calls
    them (a subclass that plants a bug there would go unseen)."""
    mro = cls.__mro__
    owner = next((i for i, c in enumerate(mro) if "init_forward_metadata_out_graph" in vars(c)), None)
    if owner is None or mro[owner] is AttentionBackend:
        return []
    base = {n: getattr(AttentionBackend, n) for n in CLASSIC_PAIR}
    return sorted({n for c in mro[:owner] for n in CLASSIC_PAIR if vars(c).get(n, base[n]) is not base[n]})


class GraphModeNotSupported(ValueError):
    """A backend was asked to capture a mode it does not support under graphs."""


class AttentionBackend(ABC):
    """Everything a backend owes the runner, the checker and the registry: abstract hooks and ``forward``; defaulted
    labels, fill value, in-graph hook, graph buffers and checker views."""

    name: str = "?"
    variant: str = "unified"  # "legacy" | "unified" | "as-upstream" | ...
    pattern: str = "A"  # a key of PATTERNS
    graph_modes: frozenset[ForwardMode] = frozenset()
    model_kind: str = "mha"  # the model it serves: "mha" or "mla" (the registry reads it)
    page_sizes: tuple[int, ...] | None = None  # the KV page sizes its kernels take (None: any); __init__ refuses others
    page_size: int = 1  # the one the registry builds its world with
    graph_buffer_names: tuple[str, ...] = ()  # what init_cuda_graph_state allocates for forward
    # graph buffers SGLang's backends allocate in __init__ for the eager path, which some graphs read too (Triton's): where
    # no live view covers one, the eager path owns it (the fuzzer leaves it unpoisoned)
    eager_buffer_names: tuple[str, ...] = ("kv_indptr", "qo_indptr", "mask_indptr")
    multi_step_class: str | None = None  # "module:Class" of its multi-step draft wrapper (--backend-class reads it)

    def __init__(self, world: World, spec: SpecConfig | None = None):
        if self.page_sizes is not None and world.page_size not in self.page_sizes:
            supported = ", ".join(map(str, self.page_sizes))
            raise ValueError(f"{self.name}: page_size={world.page_size} is not supported (supported: {supported})")
        self.world = world
        self.cfg = world.cfg
        self.spec = spec
        self.device = world.device
        self.forward_metadata = self.max_bs = self.max_num_tokens = None  # init_cuda_graph_state sets the sizes

    # --- eager --------------------------------------------------------------------------------
    @abstractmethod
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        """Build ``self.forward_metadata`` for one eager step (fresh tensors are fine here)."""

    # --- graphs ---------------------------------------------------------------------------------
    @abstractmethod
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate every tensor a captured ``forward`` will read, sized for the largest graph."""

    def init_forward_metadata_out_graph(self, fb: ForwardBatch, in_capture: bool = False) -> None:
        """SGLang 0.5.23's one entry point, the per-batch metadata call its decode and EAGLE runners make outside the
        graph: before capture (``in_capture=True``) and before every replay, on views of the static inputs
        ([facts#three-stages-of-the-hooks]). Upstream's default is a no-op and the classic pair is gone from its base
        class; refimpl's default drives the classic pair below with SGLang's argument lists, so every shape written in
        stage 1 or 2 runs through it. A stage-3 shape overrides this instead."""
        if in_capture:
            self.init_forward_metadata_capture_cuda_graph(
                fb.batch_size, fb.num_tokens, fb.req_pool_indices, fb.seq_lens, None, fb.forward_mode, fb.spec_info
            )
        else:
            self.init_forward_metadata_replay_cuda_graph(
                fb.batch_size, fb.req_pool_indices, fb.seq_lens, fb.seq_lens_sum, None, fb.forward_mode, fb.spec_info,
                fb.seq_lens_cpu,
            )  # fmt: skip

    def init_forward_metadata_capture_cuda_graph(
        self,
        bs: int,
        num_tokens: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        encoder_lens: torch.Tensor | None,
        forward_mode: ForwardMode,
        spec_info: Any,
    ) -> None:
        """The classic capture hook (SGLang before 0.5.23): implement it and the replay hook, or
        ``init_forward_metadata_out_graph``."""
        raise self._no_classic_pair()

    def init_forward_metadata_replay_cuda_graph(
        self,
        bs: int,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        seq_lens_sum: int | None,
        encoder_lens: torch.Tensor | None,
        forward_mode: ForwardMode,
        spec_info: Any,
        seq_lens_cpu: torch.Tensor | None,
    ) -> None:
        """The classic replay hook (see the capture hook)."""
        raise self._no_classic_pair()

    def _no_classic_pair(self) -> NotImplementedError:
        name = type(self).__name__
        if hook_interface(type(self)) == "out_graph":
            return NotImplementedError(
                f"{name} has no capture / replay pair (SGLang 0.5.23 removed it): call init_forward_metadata_out_graph"
            )
        return NotImplementedError(f"{name} {NEITHER_INTERFACE}")

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1  # all six SGLang backends ([facts#static-inputs]); 0 would give an empty kv range

    def init_forward_metadata_in_graph(self, fb: ForwardBatch) -> None:
        """Metadata rebuilt *inside* the captured step (SGLang #29843 for TRTLLM-MLA; refimpl's Triton ``in_graph`` shape):
        the runner calls it first thing in the step, so capture records its kernels and every replay reruns them. Most
        backends have none (the default)."""
        return None

    def glue_refusal(self, mode: ForwardMode) -> str | None:
        """Why the replay hook of ``mode`` must run eagerly, not from a metadata glue graph (``GraphRunner(glue=True)``,
        [facts#metadata-glue-graph]): a graph freezes a host-side plan, a host read, or a spec input the hook copies.
        ``None``: it may be glued. The checker's verdict (e) tests the claim (``tests/test_glue.py``)."""
        return None

    def splits_hook(self, mode: ForwardMode) -> bool:
        """Whether the replay hook of ``mode`` is split in two ([facts#host-device-split], SGLang PR #39825, open): a
        host phase (``prepare_host_metadata``: plans, host arrays), which a glued replay runs eagerly every time, and a
        device phase (``apply_device_metadata``: device writes computed from device tensors only), which the glue graph
        captures. False (the default): one phase, glued whole (``glue_refusal`` says whether) or not at all."""
        return False

    def prepare_host_metadata(self, fb: ForwardBatch) -> None:
        """The split hook's host phase for the static batch ``fb`` (``splits_hook``); eager, every replay."""
        raise NotImplementedError(f"{type(self).__name__} does not split its replay hook")

    def apply_device_metadata(self, fb: ForwardBatch) -> None:
        """The split hook's device phase for the static batch ``fb``: nothing the host computed may reach it (a glue graph
        would keep the value it had at capture, the failure #39825 describes)."""
        raise NotImplementedError(f"{type(self).__name__} does not split its replay hook")

    def graph_buffers(self) -> dict[str, torch.Tensor]:
        """The static device tensors a captured ``forward`` may read (``graph_buffer_names``; no host mirrors). The fuzzer
        poisons what a batch leaves unread; the bench counts bytes."""
        return {n: t for n in self.graph_buffer_names if isinstance(t := getattr(self, n, None), torch.Tensor)}

    # --- the captured step ----------------------------------------------------------------------
    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, fb: ForwardBatch) -> torch.Tensor:
        """Write this layer's KV at ``fb.out_cache_loc`` and return attention output."""

    # --- checker support ------------------------------------------------------------------------
    def graph_state(self, bs: int, mode: ForwardMode) -> dict[str, Any]:
        """What a captured ``forward`` of batch size ``bs`` reads: live views + frozen scalars (the checker compares it).
        Default: every field of ``forward_metadata``; backends narrow tensors to the live part
        (``kv_indices[:kv_indptr[bs]]``): unread stale tails are noise."""
        md = self.forward_metadata  # a dataclass or a plain object: its instance attributes are its fields
        return {} if md is None else {k: v for k, v in vars(md).items() if v is not None}

    def reference_graph_state(self, fb: ForwardBatch) -> dict[str, Any] | None:
        """What ``graph_state`` must hold after the replay hook ran on padded ``fb``, from first principles
        (``refimpl.kernels``' ``*_ref`` builders, ``refimpl.layout``), never the hook's code. Tensors: the prefix a
        correct hook writes; scalars: equal. ``None``: no verdict (d)."""
        return None

    def check_graph_mode(self, mode: ForwardMode) -> None:
        if mode not in self.graph_modes:
            raise self._unsupported(mode.label)

    def _unsupported(self, what: str) -> GraphModeNotSupported:
        supported = ", ".join(sorted(m.label for m in self.graph_modes))
        return GraphModeNotSupported(f"{self.name}/{self.variant} does not support {what} under graphs (supported: {supported})")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(variant={self.variant!r}, pattern={self.pattern!r})"


class DraftStep(Protocol):
    """What the multi-step wrapper (``backends.multistep.MultiStepDraftBackend``) asks of its step class (Triton, Wave,
    FlashInfer), besides ``AttentionBackend``: built as ``step_cls(world, spec, kv_indptr_buf=<its row of the wrapper's
    [S, pool*topk + 1] indptr>, skip_prefill=True)``; its graph state over lent buffers; the split counts it computes;
    its reference for the rows the wrapper lends it."""

    kv_indices_dtype: torch.dtype
    max_kv_splits: int  # the split buffer's fill value (Triton / Wave; FlashInfer: none read)

    def init_cuda_graph_state(self, max_bs, max_num_tokens, kv_indices_buf=None, num_kv_splits_buf=None) -> None: ...

    def get_num_kv_splits(self, num_kv_splits: torch.Tensor, seq_lens: torch.Tensor) -> None: ...

    def draft_step_reference(self, indptr: torch.Tensor, indices: torch.Tensor, fb: ForwardBatch) -> dict: ...


class MultiStepBackend(AttentionBackend):
    """Multi-step draft decode's wrapper: ``S - 1`` step backends of ``step_cls`` in ``step_backends`` (step i drafts every
    branch's token i + 2). The step contract: ``MultiStepDraftProgram`` calls ``step_backend(i).forward`` (never the
    wrapper's); the wrapper's hooks fill every step's metadata (one launch for all steps, ``backends.multistep``, or
    step by step, TRTLLM-MLA); its graph state and buffers are its steps' (``step{i}.`` names) beside its own; it
    captures decode only."""

    step_cls: type[AttentionBackend] = AttentionBackend  # a DraftStep for the one-launch wrapper (backends.multistep)
    graph_modes = frozenset({ForwardMode.DECODE})
    step_backends: list

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        for label in ("name", "variant", "pattern", "model_kind", "page_sizes", "page_size"):
            setattr(cls, label, getattr(cls.step_cls, label))

    def __init__(self, world: World, spec: SpecConfig | None = None):
        self.require_steps(spec)
        super().__init__(world, spec)

    chains_only = False  # True: trees (topk > 1) are refused by name, skipped as an unsupported mode (upstream raises)

    @classmethod
    def require_steps(cls, spec: SpecConfig | None) -> None:
        if spec is None or spec.num_steps < 2:
            raise ValueError(f"multi-step draft decode needs a SpecConfig with num_steps >= 2, got {spec}")
        if cls.chains_only and spec.topk != 1:
            raise GraphModeNotSupported(f"{cls.name}: multi-step draft decode takes chains only (topk=1), got topk={spec.topk}")

    def step_backend(self, i: int) -> AttentionBackend:
        return self.step_backends[i]

    def check_graph_mode(self, mode: ForwardMode) -> None:
        if not mode.is_decode_or_idle():
            raise GraphModeNotSupported(f"multi-step draft decode runs decode steps, not {mode.label}")

    @staticmethod
    def per_step(states) -> dict[str, Any]:
        """``{"step{i}.{name}": value}`` over the steps' dicts."""
        return {f"step{i}.{k}": v for i, state in enumerate(states) for k, v in state.items()}

    def graph_state(self, bs: int, mode: ForwardMode) -> dict[str, Any]:
        return self.per_step(b.graph_state(bs, mode) for b in self.step_backends)

    def graph_buffers(self) -> dict[str, torch.Tensor]:
        return {**super().graph_buffers(), **self.per_step(b.graph_buffers() for b in self.step_backends)}

    def glue_refusal(self, mode: ForwardMode) -> str | None:
        return self.step_backends[0].glue_refusal(mode)  # the wrapper's hook fills its steps' metadata

    def init_forward_metadata_in_graph(self, fb: ForwardBatch) -> None:
        for b in self.step_backends:
            b.init_forward_metadata_in_graph(fb)

    def forward(self, q, k, v, layer, fb):
        raise RuntimeError("the multi-step program calls step_backend(i).forward, not the wrapper")
