"""Deliberately broken out-of-tree backends: each plants one classic capture/replay bug in the
example backend (``examples/paged_decode_backend.py``), or in a registry shape (FlashInfer's split replay hook, Triton's
stage-3 entry point, ...). ``tests/test_backend_class.py`` loads them the way a reviewer would, through
``--backend-class``, and asserts the checker names the buffer or the cause."""

from __future__ import annotations

import dataclasses

import torch

from examples.paged_decode_backend import PagedDecodeBackend, PagedDecodeMetadata
from refimpl.backends.base import AttentionBackend
from refimpl.backends.flashinfer import FlashInferAttnBackend
from refimpl.backends.triton import TritonAttnBackend, TritonAttnBackendOutGraph, TritonMultiStepDraftBackend
from refimpl.kernels import build_kv_indices
from refimpl.layout import PAD_REQ_SLOT


class CaptureSkipsAFill(PagedDecodeBackend):
    """Capture fills ``kv_indptr`` but never ``kv_indices`` (a second body that drifted)."""

    name = "bug_capture_skips_fill"

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ):
        indptr = self.cuda_graph_kv_indptr[: bs + 1]
        indptr[1:] = torch.cumsum(seq_lens[:bs], 0)  # ... and no build_kv_indices
        self.forward_metadata = PagedDecodeMetadata(indptr, self.cuda_graph_kv_indices, self.world.max_context_len)


class FrozenScalar(PagedDecodeBackend):
    """Capture freezes ``max_kv_len = seq_lens.max()`` (old TRTLLM-MLA ``max_seq_len``)."""

    name = "bug_frozen_scalar"

    def init_forward_metadata_capture_cuda_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
    ):
        super().init_forward_metadata_capture_cuda_graph(
            bs, num_tokens, req_pool_indices, seq_lens, encoder_lens, forward_mode, spec_info
        )
        longest = int(seq_lens[:bs].max())  # a host read outside the graph, then baked in
        md = self.forward_metadata
        self.forward_metadata = PagedDecodeMetadata(md.kv_indptr, md.kv_indices, longest)


class FreshTensorAtReplay(PagedDecodeBackend):
    """Replay builds ``kv_indptr`` in a fresh tensor: the graph keeps reading the old one."""

    name = "bug_fresh_tensor"

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ):
        indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)  # not the buffer
        indptr[1:] = torch.cumsum(seq_lens[:bs], 0)
        build_kv_indices(self.world.req_to_token, req_pool_indices[:bs], seq_lens[:bs], indptr, self.cuda_graph_kv_indices)
        self.replay_kv_indptr = indptr  # where a metadata object built now would point


class ForeignKVWrite(PagedDecodeBackend):
    """``forward`` also writes each row's K/V one slot past its own: into the next request's KV
    (the slot allocator hands requests consecutive slots), which no output comparison sees when
    that request is not in the batch; only the KV guard does."""

    name = "bug_foreign_kv_write"

    def forward(self, q, k, v, layer, fb):
        cache = self.world.kv_cache
        cache.set_kv(layer, (fb.out_cache_loc + 1).clamp(max=cache.num_slots - 1), k, v)
        return super().forward(q, k, v, layer, fb)


class NoGraphState(PagedDecodeBackend):
    """Not a backend at all: the contract method ``graph_state`` is missing."""

    graph_state = None


class HostValueInHook(PagedDecodeBackend):
    """The replay hook writes the last ``kv_indptr`` entry from ``seq_lens_sum``, a value the host wrote: right when
    the hook runs eagerly (all four verdicts pass), frozen at capture in a metadata glue graph. Capture succeeds and a
    padded batch's live outputs stay right (the entry ends the padded row's range), yet the graph reads a stale
    ``kv_indptr``: SGLang's glue-graph failure ("capture succeeds, outputs stay correct"), which verdict (e) names."""

    name = "bug_host_value_in_hook"

    def init_forward_metadata_replay_cuda_graph(
        self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
    ):
        super().init_forward_metadata_replay_cuda_graph(
            bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, forward_mode, spec_info, seq_lens_cpu
        )
        if seq_lens_sum is not None:  # the capture hook passes None: its own body computes the sum on device
            self.cuda_graph_kv_indptr[bs].fill_(seq_lens_sum)


class HostReadInHook(PagedDecodeBackend):
    """Correct, but its replay hook reads a device value on the host (``.item()``): no graph can record that, so a
    glue capture fails and the runner keeps the hook eager (contained, with the reason)."""

    name = "host_read_in_hook"

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, *rest):
        super().init_forward_metadata_replay_cuda_graph(bs, req_pool_indices, seq_lens, *rest)
        self.longest_seen = int(seq_lens[:bs].max())


class RefreshOnlyWhenSizeChanges(PagedDecodeBackend):
    """The replay hook rebuilds ``kv_indptr`` / ``kv_indices`` only when the batch size differs from the previous
    replay's (a "nothing changed" shortcut): every first replay of a size is right, and so is every capture; the next
    batch of the same size reads the last one's keys. Only a history of replays shows it (verdict (f))."""

    name = "bug_refresh_on_size_change"

    def init_forward_metadata_capture_cuda_graph(self, *args, **kwargs):
        super().init_forward_metadata_capture_cuda_graph(*args, **kwargs)
        self._last_replay_bs = None  # a capture is not a replay: the next replay refreshes

    def init_forward_metadata_replay_cuda_graph(self, bs, *args, **kwargs):
        if getattr(self, "_last_replay_bs", None) == bs:
            return  # the shortcut: "same size as last time, nothing to do"
        self._last_replay_bs = bs
        super().init_forward_metadata_replay_cuda_graph(bs, *args, **kwargs)


class SlotPastTheCache(PagedDecodeBackend):
    """The replay hook leaves a KV slot index past the end of the KV cache in ``kv_indices`` (a block table too short
    for its lengths does the same): the attention kernel would gather outside the cache (an IndexError on a CPU, a
    device-side assert on a GPU). The checker's bounds guard reads slot 0 instead and reports the entry."""

    name = "bug_slot_past_the_cache"

    def init_forward_metadata_replay_cuda_graph(self, bs, *args, **kwargs):
        super().init_forward_metadata_replay_cuda_graph(bs, *args, **kwargs)
        self.cuda_graph_kv_indices[0] = 10**9


class RefreshOnlyWhenLengthsChange(PagedDecodeBackend):
    """The replay hook skips its rebuild when the lengths equal the previous replay's (a "nothing changed" shortcut
    keyed on ``seq_lens``): a batch of the same lengths for other requests reads the last one's keys. The history's
    second step (A's lengths, other requests) is there for it."""

    name = "bug_refresh_on_lengths_change"

    def init_forward_metadata_capture_cuda_graph(self, *args, **kwargs):
        super().init_forward_metadata_capture_cuda_graph(*args, **kwargs)
        self._last_lens = None  # a capture is not a replay: the next replay refreshes

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, *rest):
        lens = tuple(seq_lens[:bs].tolist())
        if getattr(self, "_last_lens", None) == lens:
            return
        self._last_lens = lens
        super().init_forward_metadata_replay_cuda_graph(bs, req_pool_indices, seq_lens, *rest)


class IndptrOnlyWhenSizeChanges(PagedDecodeBackend):
    """The replay hook rebuilds ``kv_indptr`` only when the batch size changes, ``kv_indices`` every time (laid out by
    that ``kv_indptr``): right for a batch of the previous one's lengths, wrong for the same size with other lengths.
    The history's third step (B, A's size, other lengths) is there for it."""

    name = "bug_indptr_on_size_change"

    def init_forward_metadata_capture_cuda_graph(self, *args, **kwargs):
        super().init_forward_metadata_capture_cuda_graph(*args, **kwargs)
        self._indptr_bs = None

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, *rest):
        indptr = self.cuda_graph_kv_indptr[: bs + 1]
        if getattr(self, "_indptr_bs", None) != bs:
            self._indptr_bs = bs
            indptr[1:] = torch.cumsum(seq_lens[:bs], 0)
        build_kv_indices(self.world.req_to_token, req_pool_indices[:bs], seq_lens[:bs], indptr, self.cuda_graph_kv_indices)


class EveryKthReplaySkips(PagedDecodeBackend):
    """Every 8th replay since the capture skips the refresh (a counter, a periodic cache flush gone wrong): whether a
    check sees it depends on how many replays it makes. The history's long run (20 replays, no batch twice in a row)
    is there for it."""

    name = "bug_every_8th_replay"
    K = 8

    def init_forward_metadata_capture_cuda_graph(self, *args, **kwargs):
        super().init_forward_metadata_capture_cuda_graph(*args, **kwargs)
        self._replays = 0

    def init_forward_metadata_replay_cuda_graph(self, *args, **kwargs):
        self._replays = getattr(self, "_replays", 0) + 1
        if self._replays % self.K:
            super().init_forward_metadata_replay_cuda_graph(*args, **kwargs)


class SplitDevicePhaseReadsHostArray(FlashInferAttnBackend):
    """The host/device split done wrong, as in the DFlash failure SGLang PR #39825 describes (``[facts#host-device-split]``):
    the host phase fills a fresh host array (the cumulative lengths) and the device phase copies it into ``kv_indptr``
    (host to device) instead of summing ``seq_lens`` on the device. Run eagerly the phases follow each other and every
    unglued verdict passes; a glue graph copies from the array it saw at capture, so ``paged_kv_indptr`` keeps the
    capture batch's lengths: verdict (e) names it."""

    name = "bug_split_device_phase_reads_host_array"

    def _plan_decode(self, bs, seq_lens_cpu, wrapper, mode, spec_info, kv=None):
        super()._plan_decode(bs, seq_lens_cpu, wrapper, mode, spec_info, kv)
        host = torch.cumsum(seq_lens_cpu[:bs], 0, dtype=torch.int32)  # fresh each replay
        self._indptr_host = host.pin_memory() if self.device.type == "cuda" else host  # (a graph copies only pinned)
        # every array kept alive, as SGLang keeps its pinned host buffers: the glue graph copies a live, stale array
        # (freed, the emulator would refuse the replay instead: liveness, tests/test_emulator.py)
        self.__dict__.setdefault("_kept", []).append(self._indptr_host)

    def _write_decode(self, bs, rpi, seq_lens, wrapper, mode, spec_info, kv=None):
        super()._write_decode(bs, rpi, seq_lens, wrapper, mode, spec_info, kv)
        host = getattr(self, "_indptr_host", None)  # (a capture hook's first device phase: none yet, or another bs's)
        if wrapper.is_cuda_graph_enabled and host is not None and host.numel() == bs:
            self.kv_indptr[1 : bs + 1].copy_(host, non_blocking=True)  # the bug: the host's array, not the device's sum


class SplitHostPhaseSkipped(FlashInferAttnBackend):
    """A split whose glued replays never re-plan (``prepare_host_metadata`` does nothing): the bound buffers are right,
    the plan is the capture batch's. The hook itself plans, so every unglued verdict passes; verdict (e) compares the
    plans too and names them."""

    name = "bug_split_host_phase_skipped"

    def prepare_host_metadata(self, fb):
        pass  # the bug


class PaddedMaskIndptrZeroed(TritonAttnBackend):
    """Triton's verify replay marks the padded rows empty by zeroing their ``mask_indptr`` entries, as if the buffer held
    lengths: a padded row's range then ends at 0, below its start. The kernel reads only each row's start, so every live
    output stays right and nothing is read out of bounds (the bounds guard sees ``kv_indptr`` only). It has no reference
    state (optional for a reviewer's backend, and SGLang's classes have none): only the padded-row invariant (each
    indptr starts at 0 and never decreases) names it."""

    name = "bug_padded_mask_indptr_zeroed"

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, mode, *rest):
        super().init_forward_metadata_replay_cuda_graph(bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, mode, *rest)
        if mode.is_target_verify():
            self.mask_indptr[1 : bs + 1].masked_fill_(req_pool_indices[:bs] == PAD_REQ_SLOT, 0)  # the bug

    def reference_graph_state(self, fb):
        return None


class PaddedIndptrZeroedOnceWarm(PaddedMaskIndptrZeroed):
    """The bug above from the backend's third replay-body call on ("once warm"): a fresh backend fed one batch (capture,
    then replay: two calls) keeps the invariant, so verdict (d)'s state, taken that way, shows nothing; the runner's own
    backend (every graph size captured, then replayed) breaks it at its first replay. Only the invariants checked after
    each of the runner's replays (``Rig.run``) name it. Its reference is Triton's (the one above has none)."""

    name = "bug_padded_indptr_zeroed_once_warm"
    calls = 0

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, mode, *rest):
        self.calls += 1
        if self.calls > 2:
            super().init_forward_metadata_replay_cuda_graph(
                bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, mode, *rest
            )
        else:
            TritonAttnBackend.init_forward_metadata_replay_cuda_graph(
                self, bs, req_pool_indices, seq_lens, seq_lens_sum, encoder_lens, mode, *rest
            )

    reference_graph_state = TritonAttnBackend.reference_graph_state


class MultiStepSkipsSplitsDraft(TritonMultiStepDraftBackend):
    """The multi-step replay regenerates every step's indices but skips ``get_num_kv_splits``: the shared split buffer
    keeps the ``max_kv_splits`` it was filled with, so every step splits each row as far as it may. Outputs stay right
    (only the reduction's grouping changes: slower, not wrong); verdict (d) names the buffer."""

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, *rest):
        self._common_template(bs, req_pool_indices, seq_lens, rest[3])  # the indices ... and no split counts


class MultiStepSkipsSplits(TritonAttnBackend):
    """Triton's unified step backend, its multi-step wrapper the one above (what ``--backend-class`` loads)."""

    name = "bug_multi_step_skips_splits"
    multi_step_class = "broken_backends:MultiStepSkipsSplitsDraft"


class PlanOverCapacity(FlashInferAttnBackend):
    """Its verify and draft-extend plans take the request count from the host mirror's length (``seq_lens_cpu.numel()``)
    instead of ``bs``: right through views of the bucket (refimpl's runner; SGLang 0.5.23's for verify, and for draft
    extend after PR #36913); through SGLang 0.5.23's draft-extend views, whose ``seq_lens_cpu`` keeps the buffer's full
    capacity, it plans rows past the bucket."""

    name = "bug_plan_over_capacity"

    def _plan_prefill(self, bs, seq_lens_cpu, *rest, **kw):
        super()._plan_prefill(seq_lens_cpu.numel(), seq_lens_cpu, *rest, **kw)  # the bug


class CachesAConstant(PagedDecodeBackend):
    """Not a bug: the control for the capture order. The replay hook makes a constant on its first call and reuses it
    (a fresh tensor, nothing it wrote before), and its capture hook does not run the replay body, so the glue capture's
    first warm-up makes the constant and its capture does not; both write the same buffers."""

    name = "control_caches_a_constant"

    def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens, *rest):
        self.forward_metadata = PagedDecodeMetadata(
            self.cuda_graph_kv_indptr[: bs + 1], self.cuda_graph_kv_indices, self.world.max_context_len
        )

    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, *rest):
        if getattr(self, "_ones", None) is None:  # made once, then read
            self._ones = torch.ones(self.cuda_graph_kv_indptr.numel() - 1, dtype=torch.int32, device=self.device)
        super().init_forward_metadata_replay_cuda_graph(bs, req_pool_indices, seq_lens * self._ones[: seq_lens.numel()], *rest)


class NeitherInterface(PagedDecodeBackend):
    """Not a backend: its capture hook is the base class's again, and it has no ``init_forward_metadata_out_graph``."""

    init_forward_metadata_capture_cuda_graph = AttentionBackend.init_forward_metadata_capture_cuda_graph


class OutGraphSkipsSplitsAtCapture(TritonAttnBackendOutGraph):
    """Stage 3 (SGLang 0.5.23's one entry point) with Wave's old drift inside it: a decode capture fills the CSR but no
    split counts, so the buffer keeps ``max_kv_splits`` (benign: every replay writes them first). One entry point does
    not make drift impossible: a branch on ``in_capture`` is a second body, and verdict (a) names the buffer."""

    name = "bug_out_graph_skips_splits"

    def init_forward_metadata_out_graph(self, fb, in_capture=False):
        if not (in_capture and fb.forward_mode.is_decode_or_idle()):
            return super().init_forward_metadata_out_graph(fb, in_capture)
        self._update_decode_kv_buffers(fb.batch_size, fb.seq_lens, fb.req_pool_indices)  # ... and no get_num_kv_splits
        self.forward_metadata = self._build_cuda_graph_forward_metadata(fb.batch_size, fb.forward_mode, None)


class ReplayFixInADeadHook(TritonAttnBackendOutGraph):
    """A stage-3 class whose change went into the classic replay hook, which its runner never calls."""

    def init_forward_metadata_replay_cuda_graph(self, *args):
        raise AssertionError("never called: the runner calls init_forward_metadata_out_graph")


# a duck-typed class (no AttentionBackend in its bases) implementing the classic pair only: the example's methods and the
# base class's defaults, but no init_forward_metadata_out_graph
DuckClassicPair = type(
    "DuckClassicPair",
    (),
    {
        k: v
        for k, v in {**vars(AttentionBackend), **vars(PagedDecodeBackend)}.items()
        if k not in ("init_forward_metadata_out_graph", "__dict__", "__weakref__", "__abstractmethods__", "_abc_impl")
    },
)


class ScratchReallocatedAtReplay(TritonAttnBackend):
    """A liveness bug (vLLM #55341's class: a buffer the graphs baked in, replaced after capture): the replay hook
    re-allocates the split-KV scratch ("sized for this batch") and points the metadata at the new one. The graph
    recorded the capture-time scratch, which nothing references any more: on a GPU its kernels write and read freed
    memory (the output stays right until that memory is handed to another tensor); the emulator refuses the replay."""

    name = "bug_scratch_reallocated_at_replay"

    def init_forward_metadata_replay_cuda_graph(self, bs, *args) -> None:
        super().init_forward_metadata_replay_cuda_graph(bs, *args)
        md = self.forward_metadata
        if md is not None and md.attn_logits is not None:
            self.cuda_graph_attn_logits = torch.empty_like(self.cuda_graph_attn_logits)
            self.forward_metadata = dataclasses.replace(md, attn_logits=self.cuda_graph_attn_logits[: md.attn_logits.shape[0]])


class EagerVerifyDropsTheMask(TritonAttnBackend):
    """SGLang's kit's "M12" class: the eager verify path is handed the tree mask and never uses it (it attends causally
    among the draft rows). On a chain the tree mask is the causal one, so every output agrees and every verdict passes;
    ``--arguments`` names ``spec_info.custom_mask`` dead on the eager path (the replay hook reads it)."""

    def init_forward_metadata(self, fb):
        if fb.forward_mode.is_target_verify():
            fb = fb.replace(spec_info=dataclasses.replace(fb.spec_info, custom_mask=None))  # None: causal
        super().init_forward_metadata(fb)
