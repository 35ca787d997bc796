"""Bugs planted in SGLang 0.5.23's own TRTLLM-MLA and FlashInfer hooks, for ``tests/test_sglang_adapter.py`` (imported by a child
process only: importing the adapter installs SGLang's stand-ins)."""

from refimpl.adapters.sglang import SGLangFlashInferAttnBackend, SGLangTRTLLMMLABackend


class TRTLLMReplayKeepsDecodeLens(SGLangTRTLLMMLABackend):
    """SGLang's ``init_forward_metadata_out_graph`` with a length buffer left as it was on replay (its capture batch's
    lengths): plain decode's static ``seq_lens_k`` (the captured kernel reads stale lengths), target verify's
    ``global_seq_lens_k`` (no kernel reads it here: only the state shows it). Capture is untouched."""

    def __init__(self, world, spec=None, **kw):
        super().__init__(world, spec, **kw)
        theirs, real = self.sglang, self.sglang.init_forward_metadata_out_graph

        def planted(batch, in_capture=False):
            md, mode = theirs.decode_cuda_graph_metadata.get(batch.batch_size), batch.forward_mode
            name = "seq_lens_k" if mode.is_decode() else "global_seq_lens_k" if mode.is_target_verify() else None
            kept = None if in_capture or md is None or name is None else getattr(md, name).clone()
            real(batch, in_capture)
            if kept is not None:
                getattr(md, name).copy_(kept)

        theirs.init_forward_metadata_out_graph = planted


class TRTLLMReplayRebindsDecodeLens(SGLangTRTLLMMLABackend):
    """SGLang's hook with plain decode's ``seq_lens_k`` rebound to a fresh tensor on replay (``md.seq_lens_k =
    seq_lens.to(int32)``, the eager path's way) instead of written into: the graph reads the captured tensor, stale."""

    def __init__(self, world, spec=None, **kw):
        super().__init__(world, spec, **kw)
        theirs, real = self.sglang, self.sglang.init_forward_metadata_out_graph

        def planted(batch, in_capture=False):
            md = theirs.decode_cuda_graph_metadata.get(batch.batch_size)
            if in_capture or md is None or not batch.forward_mode.is_decode():
                return real(batch, in_capture)
            kept = md.seq_lens_k
            md.seq_lens_k = kept.clone()  # the hook below writes this one; the captured one keeps its old values
            real(batch, in_capture)

        theirs.init_forward_metadata_out_graph = planted


class FlashInferReplaySkipsThePlan(SGLangFlashInferAttnBackend):
    """SGLang's FlashInfer hook with the replay's wrapper re-plan skipped (each captured wrapper's ``begin_forward`` a
    no-op after capture). Decode: the bound buffers get this batch's indices (the hook writes them), the plan keeps the
    capture batch's partition. Verify and draft extend: the plan is what copies the indices, mask and indptrs into the
    bound buffers, so they keep the capture batch's too."""

    def __init__(self, world, spec=None, **kw):
        super().__init__(world, spec, **kw)
        theirs, real = self.sglang, self.sglang.init_forward_metadata_out_graph
        graphs = (theirs.decode_cuda_graph_metadata, theirs.prefill_cuda_graph_metadata, theirs.draft_extend_cuda_graph_metadata)

        def planted(batch, in_capture=False):
            if not in_capture:
                for w in (w for per_bs in graphs for w in per_bs.get(batch.batch_size, ())):
                    w.begin_forward = lambda *a, **k: None
            real(batch, in_capture)

        theirs.init_forward_metadata_out_graph = planted
