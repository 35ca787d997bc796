"""A bug planted in SGLang 0.5.23's own TRTLLM-MLA hook, for ``tests/test_sglang_adapter.py`` (imported by a child
process only: importing the adapter installs SGLang's stand-ins)."""

from refimpl.adapters.sglang import SGLangTRTLLMMLABackend


class TRTLLMReplayKeepsDecodeLens(SGLangTRTLLMMLABackend):
    """SGLang's ``init_forward_metadata_out_graph`` with plain decode's static ``seq_lens_k`` left as it was on replay
    (its capture batch's lengths): the captured kernel reads stale lengths. Capture is untouched."""

    def __init__(self, world, spec=None, **kw):
        super().__init__(world, spec, **kw)
        theirs, real = self.sglang, self.sglang.init_forward_metadata_out_graph

        def planted(batch, in_capture=False):
            md = theirs.decode_cuda_graph_metadata.get(batch.batch_size)
            kept = None if in_capture or md is None else md.seq_lens_k.clone()
            real(batch, in_capture)
            if kept is not None and batch.forward_mode.is_decode():
                md.seq_lens_k.copy_(kept)

        theirs.init_forward_metadata_out_graph = planted
