"""refimpl's own Triton shapes (not upstream's; [facts#fused-and-in-graph-metadata]): ``fused`` (the replay hook's metadata
in one launch) and ``in_graph`` (that launch recorded inside the graph). Both are ``TritonAttnBackend`` with another
replay hook: same buffers, ``forward``, graph state, reference.
"""

from __future__ import annotations

from ..batch import ForwardBatch
from ..kernels import fused_graph_metadata_args, launch_fused_graph_metadata
from ..modes import ForwardMode
from .triton import TritonAttnBackend, TritonMetadata


class TritonAttnBackendFused(TritonAttnBackend):
    """The replay hook's metadata in ONE Triton launch (``refimpl.kernels.fused_graph_metadata``), outside the graph, where
    the unified hook launches several (~180 µs host time on an H200 vs ~2.4 µs for ``graph.replay()``; goal: <= 20 µs
    per hook at bs 1..256). SGLang 0.5.23 attacks the same cost with an optional captured "metadata glue graph"
    (``SGLANG_ENABLE_METADATA_GLUE_GRAPH``). Capture = the replay body + the unified views (A). Modes: decode, idle,
    target verify."""

    variant = "fused"
    pattern = "A"
    graph_modes = frozenset({ForwardMode.DECODE, ForwardMode.IDLE, ForwardMode.TARGET_VERIFY})

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kw) -> None:
        super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kw)
        self._fused_plans: dict[tuple, tuple] = {}  # (bs, N, mask?) -> (seq_lens, rpi, args)
        self._graph_views: dict[tuple, TritonMetadata] = {}  # in_graph's: (bs, verify, mask?) -> views

    def _fused_metadata(self, req_pool_indices, seq_lens, n=None, mask=None) -> None:
        """The one launch: every buffer ``forward`` reads (decode: ``n`` None; verify: N and the spec's mask). Arguments
        are checked once per (bs, mode, mask) and runner tensors (the runner's same static per-bs views); later calls
        check the mask, launch."""
        key = (seq_lens.shape[0], n, mask is not None)
        plan = self._fused_plans.get(key)
        if plan is None or plan[0] is not seq_lens or plan[1] is not req_pool_indices:
            if n is None:
                kw = dict(num_kv_splits=self.cuda_graph_num_kv_splits, **self._split_kw())
            else:
                kw = dict(
                    num_draft_tokens=n,
                    qo_indptr=self.qo_indptr,
                    mask_indptr=self.mask_indptr,
                    custom_mask_src=mask,
                    custom_mask=None if mask is None else self.cuda_graph_custom_mask,
                )
            csr = (self.world.req_to_token, req_pool_indices, seq_lens, self.kv_indptr, self.cuda_graph_kv_indices)
            plan = self._fused_plans[key] = (seq_lens, req_pool_indices, fused_graph_metadata_args(*csr, **kw))
        launch_fused_graph_metadata(plan[2], mask)

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ) -> None:
        if forward_mode.is_decode_or_idle() and spec_info is not None:  # a draft step
            raise self._unsupported("multi-step draft decode")
        super().init_forward_metadata_capture_cuda_graph(
            bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
        )  # the graph-mode check, the replay hook, then the unified shape's views

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        self.check_graph_mode(forward_mode)  # (capture refused a draft step)
        if seq_lens.shape[0] != bs:  # the runner passes bs-long views already (the plans key on them)
            seq_lens = seq_lens[:bs]
        verify = self._verify_mask(spec_info) if forward_mode.is_target_verify() else ()  # (N, the spec's mask)
        self._fused_metadata(req_pool_indices, seq_lens, *verify)


class TritonAttnBackendInGraph(TritonAttnBackendFused):
    """The fused metadata launch recorded INSIDE the graph (in-graph), as TRTLLM-MLA's in_graph shape (#30807 / #31628,
    [facts#trtllm-mla-after-26665-and-after-29077]): ``init_forward_metadata_in_graph`` launches it on the runner's
    static inputs; the replay hook only re-points ``forward_metadata`` (verify: and copies the spec's mask, a
    varying-size input). Goal: <= 5 µs host beyond the copies."""

    variant = "in_graph"
    pattern = "in-graph"

    def init_forward_metadata_in_graph(self, fb: ForwardBatch) -> None:
        """Runs inside the captured region: recorded, so every replay rebuilds in the graph. Reads only static buffers (the
        runner's ``seq_lens`` / ``req_pool_indices``)."""
        n = self.spec.num_draft_tokens if fb.forward_mode.is_target_verify() else None
        self._fused_metadata(fb.req_pool_indices, fb.seq_lens, n)  # no mask copy here

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ) -> None:
        self.check_graph_mode(forward_mode)
        mask = None
        if forward_mode.is_target_verify():  # copy the spec's mask (a varying-size input)
            _, mask = self._verify_mask(spec_info)
            if mask is not None:
                self.cuda_graph_custom_mask[: mask.numel()].copy_(mask)
        key = (bs, forward_mode.is_target_verify(), mask is not None)  # the views: built once per bs / mode / mask?
        if key not in self._graph_views:
            self._graph_views[key] = self._build_cuda_graph_forward_metadata(bs, forward_mode, spec_info)
        self.forward_metadata = self._graph_views[key]  # re-point only
