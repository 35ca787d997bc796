"""The graph runner: one graph per captured batch size, padding, eager fallback.

Follows SGLang's ``CudaGraphRunner`` (digest §1):

* **Static inputs** are allocated once, sized for the largest batch: ``input_ids``,
  ``positions``, ``out_cache_loc`` ``[max_bs * tokens_per_req]``, ``req_pool_indices`` and
  ``seq_lens`` ``[max_bs]`` (+ a host mirror ``seq_lens_cpu``). The backend allocates its own
  graph buffers in ``init_cuda_graph_state(max_bs, max_num_tokens)``.
* **Capture**, largest batch first (smaller graphs reuse the shared pool's blocks): slice the
  static inputs to ``[:bs]``, call the backend's capture hook *outside* the graph, warm up, then
  capture the step.
* **Replay**: pick the smallest captured ``bs >= raw_bs``; when padding, reset the static
  inputs so padded rows have ``seq_len = fill value``, request slot 0 and cache slot 0 (they
  write their KV into the reserved slot 0, never a live request's slots); copy the live batch
  into the prefixes; call the backend's replay hook; ``graph.replay()``; slice the outputs.
* **Fallback**: a batch that cannot run as a graph runs eagerly, and the runner says why.

Tokens per request (§1.2): decode 1, target verify N, draft extend S+1 (v1) or N (v2),
multi-step draft decode topk.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..batch import ForwardBatch
from ..config import GraphConfig, SpecConfig
from ..modes import ForwardMode
from ..spec import DraftDecodeInput, DraftExtendInput, VerifyInput
from .engine import GraphEngine, GraphReplayError


@dataclass
class CaptureRecord:
    bs: int
    seconds: float  # wall time of warm-up + capture for this batch size
    pool_bytes: int | None  # CUDA: reserved bytes after this capture; None on the emulator
    pool_growth: int | None  # CUDA: bytes this capture added to the shared pool
    kernels: dict = field(default_factory=dict)


@dataclass
class RunResult:
    logits: torch.Tensor  # [raw_num_tokens, vocab]
    used_graph: bool
    graph_bs: int | None  # the captured size that served the batch (None when eager)
    fallback_reason: str | None = None


class GraphRunner:
    def __init__(
        self,
        model: Callable[[ForwardBatch, Any], torch.Tensor],
        backend,
        engine: GraphEngine,
        mode: ForwardMode,
        graph_cfg: GraphConfig,
        spec_cfg: SpecConfig | None = None,
        multi_step_draft: bool = False,
    ):
        if not mode.is_graph_mode():
            raise ValueError(f"{mode.label} is never captured; run it eagerly")
        if mode.has_multi_token_queries() and spec_cfg is None:
            raise ValueError(f"{mode.label} needs a SpecConfig (draft tokens per request)")
        self.model, self.backend, self.engine = model, backend, engine
        self.mode, self.graph_cfg, self.spec_cfg = mode, graph_cfg, spec_cfg
        self.multi_step_draft = multi_step_draft
        self.world = backend.world
        self.device = self.world.device
        if spec_cfg is not None and mode.is_graph_mode():
            self.tokens_per_req = spec_cfg.tokens_per_request(mode, multi_step_draft)
        else:
            self.tokens_per_req = 1
        # multi-step draft decode writes one KV slot per branch per step
        self.locs_per_req = self.tokens_per_req * (spec_cfg.num_steps if multi_step_draft else 1)
        self.capture_bs = graph_cfg.batch_sizes()
        if self.world.req_to_token_pool.size <= max(self.capture_bs):
            raise ValueError(
                f"largest capture bs {max(self.capture_bs)} needs a request pool larger than "
                f"{self.world.req_to_token_pool.size} (slot 0 is reserved)"
            )
        self.max_bs = max(self.capture_bs)
        self.max_num_tokens = self.max_bs * self.tokens_per_req
        self.fill_value = backend.get_cuda_graph_seq_len_fill_value()
        self._alloc_static_inputs()
        backend.init_cuda_graph_state(self.max_bs, self.max_num_tokens)
        self.graphs: dict[int, Any] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.capture_records: list[CaptureRecord] = []

    # --- static inputs ------------------------------------------------------------------------
    def _alloc_static_inputs(self) -> None:
        B, T, dev = self.max_bs, self.max_num_tokens, self.device
        i64 = dict(dtype=torch.int64, device=dev)
        self.input_ids = torch.zeros(T, **i64)  # [T] int64
        self.positions = torch.zeros(T, **i64)  # [T] int64
        self.out_cache_loc = torch.zeros(B * self.locs_per_req, **i64)  # 0 = the reserved slot
        self.req_pool_indices = torch.zeros(B, **i64)  # 0 = the reserved request row
        self.seq_lens = torch.full((B,), self.fill_value, dtype=torch.int32, device=dev)
        self.seq_lens_cpu = torch.full((B,), self.fill_value, dtype=torch.int32)

    def _static_batch(self, bs: int, spec_info: Any, raw_bs: int | None = None) -> ForwardBatch:
        n = bs * self.tokens_per_req
        return ForwardBatch(
            forward_mode=self.mode,
            batch_size=bs,
            input_ids=self.input_ids[:n],
            positions=self.positions[:n],
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            seq_lens_cpu=self.seq_lens_cpu[:bs],
            out_cache_loc=self.out_cache_loc[: bs * self.locs_per_req],
            seq_lens_sum=int(self.seq_lens_cpu[:bs].sum()),
            world=self.world,
            spec_info=spec_info,
        )

    # --- capture ------------------------------------------------------------------------------
    def capture(self, progress: bool = False) -> list[CaptureRecord]:
        self.backend.check_graph_mode(self.mode)
        order = sorted(self.capture_bs, reverse=True)  # largest first: memory reuse (§1.4)
        if progress:
            from tqdm.auto import tqdm

            order = tqdm(order, desc=f"capture {self.mode.label}")
        for bs in order:
            t0, mem0 = time.perf_counter(), self.engine.memory_in_use()
            spec_info = capture_spec_input(self.mode, bs, self)
            fb = self._static_batch(bs, spec_info)
            self.backend.init_forward_metadata_capture_cuda_graph(
                bs, fb.num_tokens, fb.req_pool_indices, fb.seq_lens, None, self.mode, spec_info
            )

            def run_once(fb=fb):
                return self.model(fb, self.backend)

            self.engine.warmup(run_once, self.graph_cfg.num_warmups)
            graph = self.engine.new_graph()
            self.outputs[bs] = graph.capture(run_once)
            self.graphs[bs] = graph
            self.engine.synchronize()
            self.capture_records.append(
                CaptureRecord(
                    bs,
                    time.perf_counter() - t0,
                    mem1 := self.engine.memory_in_use(),
                    None if mem1 is None else mem1 - mem0,
                    dict(graph.custom_kernels()),
                )
            )
        return self.capture_records

    # --- replay -------------------------------------------------------------------------------
    def can_run(self, fb: ForwardBatch) -> tuple[bool, str | None]:
        """Whether ``fb`` can be served by a captured graph, and if not, why."""
        if not self.graphs:
            return False, "no graph captured yet (call capture() first)"
        mode_ok = fb.forward_mode == self.mode or (
            self.mode.is_decode_or_idle() and fb.forward_mode.is_decode_or_idle()
        )
        if not mode_ok:
            return (
                False,
                f"mode {fb.forward_mode.label} was not captured (runner: {self.mode.label})",
            )
        raw_bs = fb.batch_size
        if raw_bs > self.max_bs:
            return False, f"batch size {raw_bs} exceeds the largest captured size {self.max_bs}"
        if self.graph_cfg.disable_padding and raw_bs not in self.graphs:
            return False, f"batch size {raw_bs} not captured and padding is disabled"
        expected = raw_bs * self.tokens_per_req
        if fb.num_tokens != expected:
            return False, (
                f"{fb.num_tokens} tokens for {raw_bs} requests; the graph lays out "
                f"{self.tokens_per_req} per request ({expected})"
            )
        if fb.out_cache_loc.numel() != raw_bs * self.locs_per_req:
            return False, (
                f"out_cache_loc has {fb.out_cache_loc.numel()} entries, the graph expects "
                f"{raw_bs * self.locs_per_req}"
            )
        return True, None

    def pick_bs(self, raw_bs: int) -> int:
        """The smallest captured batch size >= ``raw_bs`` (an idle batch uses the smallest)."""
        if raw_bs > self.max_bs:
            raise ValueError(f"batch size {raw_bs} exceeds the largest captured size {self.max_bs}")
        return self.capture_bs[bisect.bisect_left(self.capture_bs, max(raw_bs, 1))]

    def replay(self, fb: ForwardBatch) -> torch.Tensor:
        """Serve ``fb`` with a graph; raises ``GraphReplayError`` when it cannot."""
        ok, why = self.can_run(fb)
        if not ok:
            raise GraphReplayError(why)
        return self._replay(fb)

    def _replay(self, fb: ForwardBatch) -> torch.Tensor:
        """The replay path proper (``can_run`` already said yes)."""
        fb.validate()
        raw_bs, n = fb.batch_size, fb.num_tokens
        bs = self.pick_bs(raw_bs)
        if bs != raw_bs:  # padded rows: fill value, request 0, cache slot 0 (§1.5 step 2)
            self.seq_lens.fill_(self.fill_value)
            self.seq_lens_cpu.fill_(self.fill_value)
            self.out_cache_loc.zero_()
            self.req_pool_indices.zero_()
        self.input_ids[:n].copy_(fb.input_ids)
        self.positions[:n].copy_(fb.positions)
        if self.multi_step_draft:  # [step][seq][branch]: each step's block starts at step*rows
            steps = self.spec_cfg.num_steps
            static = self.out_cache_loc[: bs * self.locs_per_req].view(steps, -1)
            static[:, :n].copy_(fb.out_cache_loc.view(steps, n))
        else:
            self.out_cache_loc[: fb.out_cache_loc.numel()].copy_(fb.out_cache_loc)
        self.req_pool_indices[:raw_bs].copy_(fb.req_pool_indices)
        self.seq_lens[:raw_bs].copy_(fb.seq_lens)
        self.seq_lens_cpu[:raw_bs].copy_(fb.seq_lens_cpu)
        seq_lens_sum = fb.seq_lens_sum + (bs - raw_bs) * self.fill_value
        self.backend.init_forward_metadata_replay_cuda_graph(
            bs,
            self.req_pool_indices[:bs],
            self.seq_lens[:bs],
            seq_lens_sum,
            None,
            self.mode,
            fb.spec_info,
            self.seq_lens_cpu[:bs],
        )
        self.graphs[bs].replay()
        return self.outputs[bs][:n]

    def eager(self, fb: ForwardBatch) -> torch.Tensor:
        fb.validate()
        self.backend.init_forward_metadata(fb)
        return self.model(fb, self.backend)

    def run(self, fb: ForwardBatch) -> RunResult:
        """Replay when possible, else run eagerly and report the reason."""
        ok, why = self.can_run(fb)
        if ok:
            return RunResult(self._replay(fb), True, self.pick_bs(fb.batch_size))
        return RunResult(self.eager(fb), False, None, why)


def capture_spec_input(mode: ForwardMode, bs: int, runner: GraphRunner) -> Any:
    """A plausible spec input for the dummy capture batch (every row: seq_len = fill value)."""
    spec, dev = runner.spec_cfg, runner.device
    if mode.is_target_verify():
        n = spec.num_draft_tokens
        seq = runner.fill_value
        # request block [N, seq + N]: prefix all ones, then a causal chain over the drafts
        block = torch.cat(
            [torch.ones(n, seq, dtype=torch.bool), torch.ones(n, n, dtype=torch.bool).tril()], 1
        )
        return VerifyInput(n, block.flatten().repeat(bs).to(dev), topk=spec.topk)
    if mode.is_any_draft_extend():
        version = 2 if mode.is_draft_extend_v2() else 1
        tpr = runner.tokens_per_req
        zeros = torch.zeros(bs, dtype=torch.int32, device=dev)
        return DraftExtendInput(
            version=version,
            accept_length=zeros,
            accept_length_cpu=[0] * bs,
            extend_seq_lens=torch.full((bs,), tpr, dtype=torch.int32, device=dev),
            num_tokens_per_req=tpr,
        )
    if mode.is_decode_or_idle() and runner.multi_step_draft:
        return DraftDecodeInput(topk=spec.topk, num_steps=spec.num_steps)
    return None
