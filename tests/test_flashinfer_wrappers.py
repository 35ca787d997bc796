"""refimpl.flashinfer_wrappers: the lean stand-ins (binding, plan partition, run), the fast
plans, and signature parity with flashinfer (0.7.2, which SGLang 0.5.23 pins; the lean calls also with 0.6.0).

CPU only. The signature-parity tests need the real flashinfer importable (its Python package
imports without CUDA: ``pip install --no-deps flashinfer-python==0.7.2``, as CI does); they skip otherwise.
Unmodelled features are refused by the full-API subclasses of ``flashinfer_full_api.py``.
"""

import inspect
import os
import subprocess
import sys

import flashinfer_full_api as full_api
import pytest
import torch
from refs import relative_error

from refimpl.flashinfer_wrappers import (
    STANDIN_WORKSPACE_BYTES,
    flashinfer_available,
    is_standin,
    make_workspace,
    read_partition,
    real_wrapper_classes,
    set_kv_window,
    standin,
    wrapper_classes,
)
from refimpl.flashinfer_wrappers.fast_plan import (
    fast_decode_plan,
    fast_mla_decode_plan,
    fast_prefill_plan,
    install_fast_decode_plan,
    install_fast_mla_decode_plan,
    is_fast_plan_installed,
)
from refimpl.graphs import CPUEmulatorEngine
from refimpl.kernels import mha_oracle, mla_oracle

Decode = standin.BatchDecodeWithPagedKVCacheWrapper
Prefill = standin.BatchPrefillWithPagedKVCacheWrapper
MLA = standin.BatchMLAPagedAttentionWrapper
WRAPPER_NAMES = ["BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper", "BatchMLAPagedAttentionWrapper"]

F32 = torch.float32
I32 = torch.int32
H, HKV, D = 4, 2, 16  # GQA group 2
R, RR, HM = 32, 8, 4  # MLA: latent rank, rope dim, heads
SLOTS = 96
TOL = 1e-5


# ----------------------------------------------------------------------------------------------
# helpers


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def csr(lens, g: torch.Generator, slots: int = SLOTS):
    """indptr [bs+1] int32 and random distinct cache slots as indices (req_to_token-free)."""
    lens = torch.as_tensor(lens, dtype=torch.int64)
    indptr = torch.zeros(len(lens) + 1, dtype=I32)
    indptr[1:] = torch.cumsum(lens, 0)
    indices = torch.randperm(slots, generator=g)[: int(lens.sum())].to(I32)
    return indptr, indices


def qo(q_lens) -> torch.Tensor:
    out = torch.zeros(len(q_lens) + 1, dtype=I32)
    out[1:] = torch.cumsum(torch.as_tensor(q_lens), 0)
    return out


def mha_cache(g):
    return torch.randn(SLOTS, HKV, D, generator=g), torch.randn(SLOTS, HKV, D, generator=g)


def mla_cache(g):
    return torch.randn(SLOTS, 1, R + RR, generator=g)


def rand_mask(q_lens, kv_lens, g) -> torch.Tensor:
    n = sum(a * b for a, b in zip(q_lens, kv_lens))
    return torch.rand(n, generator=g) < 0.6


def mask_indptr_of(q_lens, kv_lens) -> torch.Tensor:
    return qo([a * b for a, b in zip(q_lens, kv_lens)])


def ones(bs) -> torch.Tensor:
    return torch.ones(bs, dtype=I32)


def ws():
    return make_workspace("cpu")


def decode_plan(w, lens, g, **kw):
    indptr, indices = csr(lens, g)
    w.plan(indptr, indices, ones(len(lens)), H, HKV, D, 1, q_data_type=F32, **kw)
    return indptr, indices


def decode_ref(q, k, v, indptr, indices):
    return mha_oracle(q, k, v, torch.arange(q.shape[0] + 1), indptr, indices, 1 / D**0.5)


def close(out, ref) -> bool:
    return relative_error(out, ref) < TOL


def bound_decode(bs, indices_len=64, **kw):
    bufs = dict(
        paged_kv_indptr_buffer=torch.zeros(bs + 1, dtype=I32),
        paged_kv_indices_buffer=torch.zeros(indices_len, dtype=I32),
        paged_kv_last_page_len_buffer=torch.ones(bs, dtype=I32),
    )
    return Decode(ws(), "NHD", use_cuda_graph=True, **bufs, **kw), bufs


def bound_prefill(bs, with_mask: bool, indices_len=64, mask_len=256):
    bufs = dict(
        qo_indptr_buf=torch.zeros(bs + 1, dtype=I32),
        paged_kv_indptr_buf=torch.zeros(bs + 1, dtype=I32),
        paged_kv_indices_buf=torch.zeros(indices_len, dtype=I32),
        paged_kv_last_page_len_buf=torch.ones(bs, dtype=I32),
    )
    if with_mask:
        bufs["custom_mask_buf"] = torch.zeros(mask_len, dtype=torch.uint8)
        bufs["mask_indptr_buf"] = torch.zeros(bs + 1, dtype=I32)
    return Prefill(ws(), "NHD", use_cuda_graph=True, **bufs), bufs


def bound_mla(bs, indices_len=64):
    bufs = dict(
        qo_indptr=torch.arange(bs + 1, dtype=I32),
        kv_indptr=torch.zeros(bs + 1, dtype=I32),
        kv_indices=torch.zeros(indices_len, dtype=I32),
        kv_len_arr=torch.ones(bs, dtype=I32),
    )
    return MLA(ws(), use_cuda_graph=True, **bufs, backend="auto"), bufs


def mla_plan(w, q_lens, kv_lens, g, causal=False, sm_scale=0.3):
    indptr, indices = csr(kv_lens, g)
    w.plan(qo(q_lens), indptr, indices, torch.tensor(kv_lens, dtype=I32), HM, R, RR, 1, causal, sm_scale, F32, F32)
    return indptr, indices


def capture(fn):
    graph = CPUEmulatorEngine().new_graph()
    return graph, graph.capture(fn)


# ----------------------------------------------------------------------------------------------
# package surface


def test_import_does_not_import_flashinfer():
    code = (
        "import sys, refimpl.flashinfer_wrappers, refimpl.flashinfer_wrappers.fast_plan, "
        "refimpl.flashinfer_wrappers.ops; print('flashinfer' in sys.modules)"
    )
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False", "the package must not import flashinfer"


def test_ops_route_run_through_one_custom_op():
    # a subprocess: the op registration is process-wide; this keeps the test independent of
    # whatever else the session registered
    code = """
import torch
from refimpl.flashinfer_wrappers import make_workspace, standin
from refimpl.flashinfer_wrappers.ops import fi_run
from refimpl.graphs import CPUEmulatorEngine
bufs = [torch.zeros(3, dtype=torch.int32), torch.zeros(16, dtype=torch.int32),
        torch.ones(2, dtype=torch.int32)]
w = standin.BatchDecodeWithPagedKVCacheWrapper(make_workspace("cpu"), "NHD", True, False, *bufs)
k, v, q = torch.randn(16, 2, 8), torch.randn(16, 2, 8), torch.randn(2, 4, 8)
plan = lambda lens: w.plan(torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32),
                           torch.randperm(16)[: sum(lens)].int(), bufs[2], 4, 2, 8, 1,
                           q_data_type=torch.float32)
plan([3, 5])
graph = CPUEmulatorEngine().new_graph()
out = graph.capture(lambda: fi_run(w, q, k, v))
assert dict(graph.custom_kernels()) == {"refimpl.fi_run.default": 1}, graph.custom_kernels()
plan([7, 2])
graph.replay()
assert torch.equal(out, w.run(q, (k, v)))
print("ok")
"""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_wrapper_classes_and_workspace():
    cls = wrapper_classes(prefer_real=False)
    assert not cls.real
    for name in WRAPPER_NAMES:  # the stand-in classes themselves, recognised as such
        c = getattr(cls, name)
        assert c is getattr(standin, name) and is_standin(c)
    assert not is_standin(object())
    auto = wrapper_classes()
    if not torch.cuda.is_available():
        assert flashinfer_available() == "CUDA is not available"
        assert not auto.real and auto.reason == "CUDA is not available"
    w = make_workspace("cpu")
    assert w.dtype == torch.uint8 and w.numel() == STANDIN_WORKSPACE_BYTES and not w.any()
    assert make_workspace("cpu", 4096).numel() == 4096
    assert make_workspace("cpu", real=True).numel() == 128 * 1024 * 1024


def _real_classes():
    try:
        return real_wrapper_classes()
    except ImportError as e:
        pytest.skip(f"real flashinfer not importable: {e}")


def _params(f):
    return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]


FULL_API_VERSION = "0.7.2"


@pytest.mark.parametrize("name", WRAPPER_NAMES)
def test_full_api_signature_parity_with_real_flashinfer(name):
    real = getattr(_real_classes(), name)
    import flashinfer

    if flashinfer.__version__ != FULL_API_VERSION:  # the lean test below holds for 0.6.0 too
        pytest.skip(f"the full API mirrors flashinfer {FULL_API_VERSION}; {flashinfer.__version__} is installed")
    mine = getattr(full_api, name)
    for method in ("__init__", "plan", "_plan_impl", "run", "forward", "begin_forward", "run_return_lse"):
        has_real, has_mine = hasattr(real, method), hasattr(mine, method)
        assert has_real == has_mine, f"{name}.{method}: real has it={has_real}, full API={has_mine}"
        if has_real:
            assert _params(getattr(mine, method)) == _params(getattr(real, method)), (
                f"{name}.{method} signature differs from flashinfer's"
            )


@pytest.mark.parametrize("name", WRAPPER_NAMES)
def test_lean_signatures_are_a_subset_of_real_flashinfer(name):
    """Every call refimpl makes on a lean stand-in is valid on the real class (0.6.0 and 0.7.2): each positional
    parameter sits at the same position with the same name and kind (and, where the stand-in has a default, the same
    default); each keyword-only one exists in the real method (positional-or-keyword or keyword-only; behind 0.7.2's
    ``**kwargs``, in the ``_plan_impl`` it forwards to) with the same default."""
    real = getattr(_real_classes(), name)
    mine = getattr(standin, name)
    for method in ("__init__", "plan", "run", "begin_forward", "forward", "run_return_lse"):
        if not hasattr(mine, method):
            continue
        assert hasattr(real, method), f"{name}.{method}: the stand-in has it, flashinfer not"
        real_params = inspect.signature(getattr(real, method)).parameters
        real_list = list(real_params.values())
        keywords = dict(real_params)
        if any(q.kind is q.VAR_KEYWORD for q in real_list) and hasattr(real, "_plan_impl"):
            keywords |= inspect.signature(real._plan_impl).parameters
        for i, p in enumerate(inspect.signature(getattr(mine, method)).parameters.values()):
            where = f"{name}.{method}({p.name})"
            if p.kind is p.KEYWORD_ONLY:
                q = keywords.get(p.name)
                assert q is not None, f"{where}: not a parameter of flashinfer's"
                assert q.kind in (q.POSITIONAL_OR_KEYWORD, q.KEYWORD_ONLY), where
                assert q.default == p.default, f"{where}: default {p.default!r} vs {q.default!r}"
            else:
                assert p.kind is p.POSITIONAL_OR_KEYWORD, f"{where}: {p.kind}"
                q = real_list[i]
                default = q.default if p.default is p.empty else p.default  # a required argument: any default
                assert (q.name, q.kind, q.default) == (p.name, p.kind, default), (
                    f"{where}: flashinfer has {q.name} ({q.kind}, default {q.default!r}) there"
                )


# ----------------------------------------------------------------------------------------------
# outputs vs the oracle


@pytest.mark.parametrize("kv_format", ["tuple3", "tuple4", "single4", "single5"])
@pytest.mark.parametrize("tensor_cores", [False, True])
def test_decode_matches_oracle(kv_format, tensor_cores):
    g = gen(1)
    k, v = mha_cache(g)
    kv = {
        "tuple3": (k, v),
        "tuple4": (k[:, None], v[:, None]),
        "single4": torch.stack([k, v], 1),
        "single5": torch.stack([k, v], 1)[:, :, None],
    }[kv_format]
    # the lean stand-in takes (k, v) of [slots, Hkv, D]; the full API also flashinfer's other forms
    cls = Decode if kv_format == "tuple3" else full_api.BatchDecodeWithPagedKVCacheWrapper
    w = cls(ws(), "NHD", use_tensor_cores=tensor_cores)
    indptr, indices = decode_plan(w, [5, 1, 9, 3], g)
    q = torch.randn(4, H, D, generator=g)
    assert close(w.run(q, kv), decode_ref(q, k, v, indptr, indices))
    assert w._max_kv_len == 9 and w._batch_size == 4 and w._cached_q_data_type == F32


def test_full_api_decode_forward_sets_scalars_and_scales():
    g = gen(2)
    k, v = mha_cache(g)
    w = full_api.BatchDecodeWithPagedKVCacheWrapper(ws())
    indptr, indices = decode_plan(w, [4, 6], g)
    q = torch.randn(2, H, D, generator=g)
    out = w.forward(q, (k, v), sm_scale=0.5, k_scale=0.5, v_scale=2.0)
    ref = mha_oracle(q, k, v, torch.arange(3), indptr, indices, 0.25) * 2.0
    assert close(out, ref)


@pytest.mark.parametrize("mode", ["mask", "causal", "full"])
def test_prefill_matches_oracle(mode):
    g = gen(3)
    k, v = mha_cache(g)
    q_lens, kv_lens = [3, 1, 4, 2], [5, 2, 4, 7]  # ragged queries, kv >= q
    indptr, indices = csr(kv_lens, g)
    q = torch.randn(sum(q_lens), H, D, generator=g)
    mask = rand_mask(q_lens, kv_lens, g) if mode == "mask" else None
    w = Prefill(ws(), "NHD")
    w.plan(qo(q_lens), indptr, indices, ones(4), H, HKV, D, 1, custom_mask=mask, causal=mode == "causal", q_data_type=F32)
    mi = mask_indptr_of(q_lens, kv_lens) if mask is not None else None
    ref = mha_oracle(q, k, v, qo(q_lens), indptr, indices, 1 / D**0.5, mask, mi, mode == "causal")
    assert close(w.run(q, (k, v)), ref)
    if mask is not None:  # the stand-in's representation: bytes + element offsets
        assert w._custom_mask_buf.dtype == torch.uint8 and torch.equal(w._custom_mask_buf, mask.to(torch.uint8))
        assert torch.equal(w._mask_indptr_buf, mi)


def test_prefill_mask_wins_over_causal_and_padding_rows_are_zero():
    g = gen(4)
    k, v = mha_cache(g)
    q_lens, kv_lens = [2, 2], [3, 5]
    indptr, indices = csr(kv_lens, g)
    q = torch.randn(6, H, D, generator=g)  # two rows past qo_indptr[-1] = 4
    mask = rand_mask(q_lens, kv_lens, g)
    w = Prefill(ws())
    w.plan(qo(q_lens), indptr, indices, ones(2), H, HKV, D, 1, custom_mask=mask, causal=True, q_data_type=F32)
    out = w.run(q, (k, v))
    ref = mha_oracle(q[:4], k, v, qo(q_lens), indptr, indices, 1 / D**0.5, mask, mask_indptr_of(q_lens, kv_lens))
    assert close(out[:4], ref) and not out[4:].any()


@pytest.mark.parametrize("joined", [True, False])
@pytest.mark.parametrize("case", ["decode", "verify"])
def test_mla_matches_oracle(joined, case):
    g = gen(5)
    cache = mla_cache(g)
    ckv, kpe = (cache[..., :R], cache[..., R:]) if joined else (cache[..., :R].clone(), cache[..., R:].clone())
    q_lens = [1, 1, 1] if case == "decode" else [3, 3, 3]
    kv_lens = [4, 9, 6]
    causal = case == "verify"
    w = MLA(ws())
    indptr, indices = mla_plan(w, q_lens, kv_lens, g, causal=causal)
    T = sum(q_lens)
    q_nope, q_pe = torch.randn(T, HM, R, generator=g), torch.randn(T, HM, RR, generator=g)
    out = w.run(q_nope, q_pe, ckv, kpe)
    ref = mla_oracle(q_nope, q_pe, cache, qo(q_lens), indptr, indices, 0.3, causal=causal)
    assert close(out, ref)


# ----------------------------------------------------------------------------------------------
# binding: plan copies into the bound buffers; run reads them and the partition as flashinfer's kernels do


def test_plan_copies_into_bound_buffers():
    g = gen(6)
    w, bufs = bound_decode(3)
    ptrs = {n: b.data_ptr() for n, b in bufs.items()}
    indptr, indices = decode_plan(w, [2, 5, 3], g)
    assert w._fixed_batch_size == 3
    assert w._paged_kv_indptr_buf is bufs["paged_kv_indptr_buffer"]
    assert {n: b.data_ptr() for n, b in bufs.items()} == ptrs
    assert torch.equal(bufs["paged_kv_indptr_buffer"], indptr)
    assert torch.equal(bufs["paged_kv_indices_buffer"][:10], indices)
    q_len, kv_len = read_partition(w)  # the partition lives in the int workspace
    assert q_len.tolist() == [1, 1, 1] and kv_len.tolist() == [2, 5, 3]
    assert kv_len.untyped_storage().data_ptr() == w._int_workspace_buffer.data_ptr()
    assert w._int_workspace_buffer.numel() == standin.INT_WORKSPACE_BYTES

    pw, pbufs = bound_prefill(2, with_mask=True)
    q_lens, kv_lens = [2, 3], [4, 3]
    indptr, indices = csr(kv_lens, g)
    mask = rand_mask(q_lens, kv_lens, g)
    pw.plan(qo(q_lens), indptr, indices, ones(2), H, HKV, D, 1, custom_mask=mask, q_data_type=F32)
    assert pw._custom_mask_buf is pbufs["custom_mask_buf"] and pw._qo_indptr_buf is pbufs["qo_indptr_buf"]
    assert torch.equal(pbufs["qo_indptr_buf"], qo(q_lens))
    assert torch.equal(pbufs["custom_mask_buf"][: mask.numel()], mask.to(torch.uint8))
    assert torch.equal(pbufs["mask_indptr_buf"], mask_indptr_of(q_lens, kv_lens))

    mw, mbufs = bound_mla(2)
    indptr, indices = mla_plan(mw, [1, 1], [3, 6], g)
    assert mw._kv_indices_buf is mbufs["kv_indices"]
    assert torch.equal(mbufs["kv_indptr"], indptr) and mbufs["kv_len_arr"].tolist() == [3, 6]
    assert torch.equal(mbufs["kv_indices"][:9], indices)


def test_decode_graph_replay_after_replan():
    g = gen(7)
    k, v = mha_cache(g)
    w, _ = bound_decode(3)
    decode_plan(w, [2, 5, 3], g)
    q = torch.randn(3, H, D, generator=g)
    graph, out = capture(lambda: w.run(q, (k, v)))
    assert graph.custom_kernels() == {"refimpl.dense_paged_attention.default": 1}
    indptr, indices = decode_plan(w, [7, 1, 12], g)  # same bs, new lengths / indices
    q.copy_(torch.randn(3, H, D, generator=g))
    graph.replay()
    assert close(out, decode_ref(q, k, v, indptr, indices))


def test_prefill_graph_replay_after_replan_with_new_mask():
    g = gen(8)
    k, v = mha_cache(g)
    w, _ = bound_prefill(2, with_mask=True)
    q = torch.randn(6, H, D, generator=g)

    def plan(q_lens, kv_lens):
        indptr, indices = csr(kv_lens, g)
        mask = rand_mask(q_lens, kv_lens, g)
        w.plan(qo(q_lens), indptr, indices, ones(2), H, HKV, D, 1, custom_mask=mask, q_data_type=F32)
        return indptr, indices, mask

    plan([3, 3], [4, 6])
    graph, out = capture(lambda: w.run(q, (k, v)))
    assert graph.custom_kernels() == {"refimpl.dense_paged_attention.default": 1}
    q_lens, kv_lens = [2, 4], [9, 5]  # ragged this time
    indptr, indices, mask = plan(q_lens, kv_lens)
    graph.replay()
    ref = mha_oracle(q, k, v, qo(q_lens), indptr, indices, 1 / D**0.5, mask, mask_indptr_of(q_lens, kv_lens))
    assert close(out, ref)


def test_mla_graph_replay_after_replan_causal():
    g = gen(9)
    cache = mla_cache(g)
    w, _ = bound_mla(2)
    mla_plan(w, [2, 2], [3, 5], g, causal=True)
    q_nope, q_pe = torch.randn(4, HM, R, generator=g), torch.randn(4, HM, RR, generator=g)
    graph, out = capture(lambda: w.run(q_nope, q_pe, cache[..., :R], cache[..., R:]))
    assert graph.custom_kernels() == {"refimpl.dense_paged_mla_attention.default": 1}
    indptr, indices = mla_plan(w, [2, 2], [8, 2], g, causal=True)
    graph.replay()
    ref = mla_oracle(q_nope, q_pe, cache, qo([2, 2]), indptr, indices, 0.3, causal=True)
    assert close(out, ref)


@pytest.mark.parametrize("kind", ["decode", "decode-tensor-cores", "prefill"])
def test_a_stale_bound_kv_indptr_with_a_current_plan_gives_a_wrong_answer(kind):
    """flashinfer's decode and prefill kernels read each request's keys from the bound indptr
    (``paged_kv_t::get_length``, ``page.cuh``; ``decode.cuh``, ``prefill.cuh``); the plan only lays out the tiles.
    Re-planned, but with the last batch's indptr left in the bound buffer, a replay reads the old key ranges."""
    g = gen(10)
    k, v = mha_cache(g)
    prefill = kind == "prefill"
    w, bufs = bound_prefill(2, with_mask=False) if prefill else bound_decode(2, use_tensor_cores=kind != "decode")
    bound = bufs["paged_kv_indptr_buf" if prefill else "paged_kv_indptr_buffer"]
    q_lens = [2, 2] if prefill else [1, 1]

    def plan(kv_lens):
        if not prefill:
            return decode_plan(w, kv_lens, g)
        indptr, indices = csr(kv_lens, g)
        w.plan(qo(q_lens), indptr, indices, ones(2), H, HKV, D, 1, causal=True, q_data_type=F32)
        return indptr, indices

    def ref(indptr, indices):
        return mha_oracle(q, k, v, qo(q_lens), indptr, indices, 1 / D**0.5, causal=prefill)

    plan([3, 4])
    q = torch.randn(sum(q_lens), H, D, generator=g)
    graph, out = capture(lambda: w.run(q, (k, v)))
    stale = bound.clone()  # [0, 3, 7]
    indptr, indices = plan([5, 2])  # a current plan, and the bound buffers written ...
    bound.copy_(stale)  # ... then the last batch's indptr back in the bound buffer
    graph.replay()
    assert not close(out, ref(indptr, indices))
    live = bufs["paged_kv_indices_buf" if prefill else "paged_kv_indices_buffer"]
    assert close(out, ref(stale, live))  # what it read: the old ranges of the new indices
    assert [t.tolist() for t in standin.keys_read(w)] == [[0, 3], [3, 4]]
    bound.copy_(indptr)
    graph.replay()
    assert close(out, ref(indptr, indices))


def test_a_skipped_plan_is_wrong_once_a_request_outgrows_its_planned_tiles():
    """The bound buffers current, plan() skipped: the last plan's tiles run, reaching each request's planned kv length
    rounded up to a kv chunk (``KV_CHUNK``, 128 keys: flashinfer's smallest at page size 1). Within them the answer is
    right; a request longer than that loses the keys past them."""
    g, slots = gen(22), 400
    k, v = torch.randn(slots, HKV, D, generator=g), torch.randn(slots, HKV, D, generator=g)
    w, bufs = bound_decode(2, indices_len=slots)
    decode_plan(w, [3, 4], g)
    q = torch.randn(2, H, D, generator=g)
    graph, out = capture(lambda: w.run(q, (k, v)))
    for lens, right in (([100, 20], True), ([150, 20], False)):
        indptr, indices = csr(lens, g, slots)
        bufs["paged_kv_indptr_buffer"].copy_(indptr)  # the replay hook's writes, without plan()
        bufs["paged_kv_indices_buffer"][: len(indices)].copy_(indices)
        graph.replay()
        assert read_partition(w)[1].tolist() == [3, 4]  # the stale partition
        assert close(out, decode_ref(q, k, v, indptr, indices)) is right
    assert [t.tolist() for t in standin.keys_read(w)] == [[0, 150], [standin.KV_CHUNK, 20]]
    cut = torch.tensor([0, standin.KV_CHUNK, standin.KV_CHUNK + 20], dtype=I32)  # request 0's first 128 keys
    assert close(out, decode_ref(q, k, v, cut, torch.cat([indices[:128], indices[150:]])))
    w.plan(indptr, indices, ones(2), H, HKV, D, 1, q_data_type=F32)  # re-planned: right again
    graph.replay()
    assert close(out, decode_ref(q, k, v, indptr, indices))


def test_mla_reads_key_positions_from_its_plan_not_the_bound_kv_indptr():
    """flashinfer's MLA run takes q / kv positions and lengths from the plan's work list (``scheduler.cuh`` ``MLAPlan``,
    ``batch_mla_run.cu``: ``params.kv_indptr`` from the int workspace) and only ``kv_indices`` from the bound buffers:
    overwriting the bound ``kv_indptr`` / ``kv_len_arr`` changes nothing (the stale buffers of SGLang #37975 hide)."""
    g = gen(10)
    cache = mla_cache(g)
    mw, mbufs = bound_mla(2)
    indptr, indices = mla_plan(mw, [1, 1], [5, 2], g)
    qn, qp = torch.randn(2, HM, R, generator=g), torch.randn(2, HM, RR, generator=g)
    old = mw.run(qn, qp, cache[..., :R], cache[..., R:])
    mbufs["kv_indptr"].copy_(torch.tensor([0, 1, 2], dtype=I32))
    mbufs["kv_len_arr"].fill_(1)
    assert torch.equal(mw.run(qn, qp, cache[..., :R], cache[..., R:]), old)
    assert close(old, mla_oracle(qn, qp, cache, qo([1, 1]), indptr, indices, 0.3))


def test_kv_window_is_fixed_at_construction_in_graph_mode():
    g = gen(11)
    w, _ = bound_decode(2, indices_len=40)
    assert w._kv_window == 40
    assert set_kv_window(w, 8) and w._kv_window == 8
    with pytest.raises(ValueError, match=r"kv_len=9 > the wrapper's kv window 8"):
        decode_plan(w, [9, 1], g)
    eager = Decode(ws())
    decode_plan(eager, [6, 2], g)
    assert eager._window() == 6  # eager: the planned max


def test_a_graph_prefill_plan_may_not_have_more_rows_than_the_first():
    """flashinfer 0.7.2's rule (``prefill.py``, ``_max_total_num_rows``): in cuda-graph mode the first plan's query rows
    are the most any later plan may have (SGLang's ``fast_prefill_plan`` reads the same attribute)."""
    g = gen(12)
    w, _ = bound_prefill(2, with_mask=False)

    def plan(q_lens):
        indptr, indices = csr([6, 6], g)
        w.plan(qo(q_lens), indptr, indices, ones(2), H, HKV, D, 1, causal=True, q_data_type=F32)

    plan([2, 2])
    assert w._max_total_num_rows == 4
    plan([1, 3])
    plan([1, 1])  # fewer: fine
    with pytest.raises(ValueError, match=r"qo_indptr has 5 rows, more than the 4 of the first plan"):
        plan([2, 3])


# ----------------------------------------------------------------------------------------------
# fast plans


def test_fast_decode_plan_matches_full_plan_and_replays():
    g = gen(12)
    k, v = mha_cache(g)
    fast_w, _ = bound_decode(3)
    full_w, _ = bound_decode(3)
    decode_plan(fast_w, [2, 2, 2], g)
    q = torch.randn(3, H, D, generator=g)
    graph, out = capture(lambda: fast_w.run(q, (k, v)))

    lens = [6, 3, 11]
    indptr, indices = csr(lens, g)
    # the caller writes the bound buffers in place (as SGLang's kv-indices kernel does) ...
    fast_w._paged_kv_indptr_buf.copy_(indptr)
    fast_w._paged_kv_indices_buf[: len(indices)].copy_(indices)
    # ... and re-plans from the host indptr: no device-to-host copy
    fast_decode_plan(fast_w, indptr.clone(), ones(3), H, HKV, D, 1, q_data_type=F32)
    full_w.plan(indptr, indices, ones(3), H, HKV, D, 1, q_data_type=F32)
    graph.replay()
    assert torch.equal(out, full_w.run(q, (k, v)))
    assert close(out, decode_ref(q, k, v, indptr, indices))
    assert fast_w._batch_size == 3 and fast_w._plan_info[1] == 3


def test_install_fast_decode_plan_routes_plan_and_begin_forward():
    g = gen(13)
    k, v = mha_cache(g)
    w, bufs = bound_decode(2)
    decode_plan(w, [3, 3], g)
    assert not is_fast_plan_installed(w)
    install_fast_decode_plan(w)
    assert is_fast_plan_installed(w) and w._refimpl_fast and w.begin_forward is w.plan
    indptr, indices = csr([5, 8], g)
    bufs["paged_kv_indptr_buffer"].copy_(indptr)
    bufs["paged_kv_indices_buffer"][:13].copy_(indices)
    w.plan(
        bufs["paged_kv_indptr_buffer"],
        bufs["paged_kv_indices_buffer"],
        bufs["paged_kv_last_page_len_buffer"],
        H,
        HKV,
        D,
        1,
        data_type=F32,
        q_data_type=F32,
        non_blocking=True,
        global_override_indptr_cpu=indptr,
    )
    q = torch.randn(2, H, D, generator=g)
    assert close(w.run(q, (k, v)), decode_ref(q, k, v, indptr, indices))
    with pytest.raises(ValueError, match="indices is not the wrapper's bound buffer"):
        w.plan(bufs["paged_kv_indptr_buffer"], indices, ones(2), H, HKV, D, 1, q_data_type=F32, global_override_indptr_cpu=indptr)
    with pytest.raises(ValueError, match="indptr is not the wrapper's bound buffer"):
        w.plan(
            indptr.clone(),
            bufs["paged_kv_indices_buffer"],
            ones(2),
            H,
            HKV,
            D,
            1,
            q_data_type=F32,
            global_override_indptr_cpu=indptr,
        )


class Recording:
    """Wraps a ``_cached_module`` and records the positional arguments of each ``plan``."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def plan(self, *args):
        self.calls.append(args)
        return self.inner.plan(*args)


def test_fast_decode_plan_tensor_core_path_and_module_arguments():
    g = gen(14)
    k, v = mha_cache(g)
    for tc in (False, True):
        w, bufs = bound_decode(2, use_tensor_cores=tc)
        decode_plan(w, [1, 1], g)
        w._cached_module = Recording(w._cached_module)
        indptr, indices = csr([4, 7], g)
        bufs["paged_kv_indptr_buffer"].copy_(indptr)
        bufs["paged_kv_indices_buffer"][:11].copy_(indices)
        fast_decode_plan(w, indptr, ones(2), H, HKV, D, 1, q_data_type=F32)
        (args,) = w._cached_module.calls
        if tc:  # the prefill module's fa2 argument list (0.7.2: ..., fixed_split_size, disable_split_kv, 0, uniform_q_len 0)
            assert len(args) == 20 and args[3].tolist() == [0, 1, 2] and args[4] is indptr
            assert args[5].tolist() == [4, 7] and args[6:8] == (2, 2) and args[14] is False
            assert args[16:] == (-1, False, 0, 0)
        else:  # the CUDA-core decode module's 15 arguments
            assert len(args) == 15 and args[3] is indptr and args[4:9] == (2, H, HKV, 1, True)
            assert args[13].dtype == F32 and args[14].dtype == F32
        assert args[0] is w._float_workspace_buffer and args[1] is w._int_workspace_buffer
        q = torch.randn(2, H, D, generator=g)
        assert close(w.run(q, (k, v)), decode_ref(q, k, v, indptr, indices))


def test_fast_decode_plan_refusals():
    g = gen(15)
    w, _ = bound_decode(2)
    with pytest.raises(RuntimeError, match="planned once with its full plan"):
        fast_decode_plan(w, torch.tensor([0, 1, 2], dtype=I32), ones(2), H, HKV, D, 1, q_data_type=F32)
    with pytest.raises(RuntimeError, match="planned once"):
        install_fast_decode_plan(w)
    decode_plan(w, [1, 2], g)
    with pytest.raises(ValueError, match="must be a CPU tensor"):
        fast_decode_plan(w, torch.empty(3, device="meta"), ones(2), H, HKV, D, 1, q_data_type=F32)
    with pytest.raises(ValueError, match="batch_size=3 differs from the batch size 2"):
        fast_decode_plan(w, torch.tensor([0, 1, 2, 3]), ones(3), H, HKV, D, 1, q_data_type=F32)
    with pytest.raises(ValueError, match="q_data_type=torch.float16 differs"):
        fast_decode_plan(w, torch.tensor([0, 1, 2]), ones(2), H, HKV, D, 1, q_data_type="float16")
    install_fast_decode_plan(w)
    with pytest.raises(ValueError, match="needs the host indptr"):
        w.plan(torch.empty(3, device="meta"), torch.zeros(4, dtype=I32), ones(2), H, HKV, D, 1, q_data_type=F32)


def test_fast_mla_decode_plan_on_flashinfer_072s_planned_backend():
    """flashinfer 0.7.2 keeps an MLA plan on the backend object its full plan chose (``wrapper._planned_backend``) and
    schedules through ``plan_with_staged_workspace_bytes``: the fast plan writes the plan there, through the wrapper's
    module (so ``count_plans`` still counts it), and checks the backend's dtypes. The real wrappers: the GPU gate."""
    from types import SimpleNamespace

    from refimpl.flashinfer_wrappers import count_plans

    g = gen(17)
    w, _ = bound_mla(3)
    mla_plan(w, [1, 1, 1], [2, 2, 2], g)
    staged = []

    class Module072:  # 0.7.2's module adapter: plan() is plan_with_staged_workspace_bytes()[0]
        def plan_with_staged_workspace_bytes(self, *args):
            staged.append(args)
            return ["info", len(staged)], 24

    ws = (w._float_workspace_buffer, w._int_workspace_buffer, w._pin_memory_int_workspace_buffer)
    backend = SimpleNamespace(
        _float_workspace_buffer=ws[0],
        _int_workspace_buffer=ws[1],
        _pin_memory_int_workspace_buffer=ws[2],
        _q_data_type=F32,
        _kv_data_type=F32,
    )
    w._planned_backend, w._cached_module, before = backend, Module072(), w._plan_info
    with count_plans(SimpleNamespace(wrappers=[w])) as calls:
        fast_mla_decode_plan(
            w, qo([1, 1, 1]), qo([3, 1, 2]), torch.tensor([3, 1, 2], dtype=I32), HM, R, RR, 1, True, 0.5, F32, F32
        )
    assert calls[0] == 1 and len(staged) == 1 and staged[0][:3] == ws and staged[0][5].tolist() == [3, 1, 2]
    assert backend._plan_info == ["info", 1] and backend._staged_int_workspace_bytes == 24
    assert (backend._causal, backend._sm_scale, w._causal) == (True, 0.5, True)
    assert w._plan_info is before, "the wrapper's own plan is not where 0.7.2's run reads it"
    backend._q_data_type = torch.float16
    with pytest.raises(ValueError, match="q_data_type=torch.float32 differs from the full plan's torch.float16"):
        fast_mla_decode_plan(
            w, qo([1, 1, 1]), qo([3, 1, 2]), torch.tensor([3, 1, 2], dtype=I32), HM, R, RR, 1, True, 0.5, F32, F32
        )


def test_fast_mla_decode_plan_matches_full_plan():
    g = gen(16)
    cache = mla_cache(g)
    ckv, kpe = cache[..., :R], cache[..., R:]
    w, bufs = bound_mla(3)
    with pytest.raises(RuntimeError, match="planned once"):
        fast_mla_decode_plan(w, qo([1, 1, 1]), qo([1, 1, 1]), ones(3), HM, R, RR, 1, False, 0.3, F32, F32)
    mla_plan(w, [1, 1, 1], [2, 2, 2], g)
    qn, qp = torch.randn(3, HM, R, generator=g), torch.randn(3, HM, RR, generator=g)
    graph, out = capture(lambda: w.run(qn, qp, ckv, kpe))
    install_fast_mla_decode_plan(w)
    assert is_fast_plan_installed(w)

    kv_lens = [5, 9, 1]
    indptr, indices = csr(kv_lens, g)
    stale_indptr = bufs["kv_indptr"].clone()
    bufs["kv_indices"][:15].copy_(indices)  # the caller writes the bound indices in place
    w.plan(qo([1, 1, 1]), indptr, bufs["kv_indices"], torch.tensor(kv_lens, dtype=I32), HM, R, RR, 1, False, 0.3, F32, F32)
    assert torch.equal(bufs["kv_indptr"], stale_indptr), "the fast plan copies nothing"
    graph.replay()
    ref = mla_oracle(qn, qp, cache, qo([1, 1, 1]), indptr, indices, 0.3)
    assert close(out, ref)
    full, _ = bound_mla(3)
    mla_plan(full, [1, 1, 1], [2, 2, 2], g)
    full.plan(qo([1, 1, 1]), indptr, indices, torch.tensor(kv_lens, dtype=I32), HM, R, RR, 1, False, 0.3, F32, F32)
    assert torch.equal(out, full.run(qn, qp, ckv, kpe))
    with pytest.raises(ValueError, match="must be a CPU tensor"):
        fast_mla_decode_plan(w, torch.empty(4, device="meta"), indptr, ones(3), HM, R, RR, 1, False, 0.3, F32, F32)
    with pytest.raises(ValueError, match="not the wrapper's bound buffer"):
        w.plan(qo([1, 1, 1]), indptr, indices, torch.tensor(kv_lens, dtype=I32), HM, R, RR, 1, False, 0.3, F32, F32)


@pytest.mark.parametrize("with_mask", [True, False], ids=["tree mask", "causal"])
def test_fast_prefill_plan_fills_what_the_full_plan_fills(with_mask):
    """Verify / draft-extend replays: host indptrs in, the caller's bound kv buffers kept, the mask written; the bound
    buffers, the partition and the captured run equal a full plan's, the module fed int32 host tensors."""
    g = gen(18)
    k, v = mha_cache(g)
    fast_w, fbufs = bound_prefill(2, with_mask)
    full_w, _ = bound_prefill(2, with_mask)
    mask_of = lambda q_lens, kv_lens: torch.rand(sum(a * b for a, b in zip(q_lens, kv_lens)), generator=g) < 0.6
    kw = lambda q_lens, kv_lens: dict(custom_mask=mask_of(q_lens, kv_lens)) if with_mask else dict(causal=True)
    first_indptr, first_indices = csr([5, 6], g)
    fast_w.plan(qo([3, 3]), first_indptr, first_indices, ones(2), H, HKV, D, 1, q_data_type=F32, **kw([3, 3], [5, 6]))
    q = torch.randn(6, H, D, generator=g)
    graph, out = capture(lambda: fast_w.run(q, (k, v)))

    kv_lens = [7, 4]
    indptr, indices = csr(kv_lens, g)
    fbufs["paged_kv_indptr_buf"].copy_(indptr)  # the caller writes the bound kv buffers in place
    fbufs["paged_kv_indices_buf"][:11].copy_(indices)
    extra = kw([3, 3], kv_lens)
    fast_w._cached_module = Recording(fast_w._cached_module)
    fast_prefill_plan(
        fast_w,
        qo([3, 3]),
        indptr.long(),
        torch.tensor(kv_lens),
        H,
        HKV,
        D,
        1,
        q_data_type=F32,
        causal=not with_mask,
        custom_mask=extra.get("custom_mask"),
    )
    full_w.plan(qo([3, 3]), indptr, indices, ones(2), H, HKV, D, 1, q_data_type=F32, **extra)
    (args,) = fast_w._cached_module.calls
    assert all(t.dtype == I32 and t.device.type == "cpu" for t in args[3:6]) and args[14] is (not with_mask)
    for name in ("_qo_indptr_buf", "_custom_mask_buf", "_mask_indptr_buf"):
        a, b = getattr(fast_w, name), getattr(full_w, name)
        assert (a is None and b is None) or torch.equal(a[: len(b)], b), name
    assert [t.tolist() for t in read_partition(fast_w)] == [t.tolist() for t in read_partition(full_w)]
    graph.replay()
    assert torch.equal(out, full_w.run(q, (k, v)))


def test_fast_prefill_plan_refusals():
    g = gen(19)
    w, _ = bound_prefill(2, with_mask=True)
    args = (qo([2, 2]), qo([3, 3]), torch.tensor([3, 3]), H, HKV, D, 1)
    mask = torch.ones(12, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="planned once with its full plan"):
        fast_prefill_plan(w, *args, causal=False, q_data_type=F32, custom_mask=mask)
    indptr, indices = csr([3, 3], g)
    w.plan(qo([2, 2]), indptr, indices, ones(2), H, HKV, D, 1, custom_mask=mask, q_data_type=F32)
    with pytest.raises(ValueError, match="no custom_mask for a wrapper with one bound"):
        fast_prefill_plan(w, *args, causal=True, q_data_type=F32)
    with pytest.raises(ValueError, match=r"custom_mask has 11 entries, expected sum\(q_len_i \* kv_len_i\) = 12"):
        fast_prefill_plan(w, *args, causal=False, q_data_type=F32, custom_mask=mask[:11])
    with pytest.raises(ValueError, match="must have 3 entries"):
        fast_prefill_plan(w, qo([2]), *args[1:], causal=False, q_data_type=F32, custom_mask=mask)
    with pytest.raises(ValueError, match="q_data_type=torch.float16 differs"):
        fast_prefill_plan(w, *args, causal=False, q_data_type="float16", custom_mask=mask)
    with pytest.raises(ValueError, match="must be a CPU tensor"):
        fast_prefill_plan(w, torch.empty(3, device="meta"), *args[1:], causal=False, q_data_type=F32, custom_mask=mask)
    eager = Prefill(ws(), "NHD")
    eager.plan(qo([2, 2]), indptr, indices, ones(2), H, HKV, D, 1, causal=True, q_data_type=F32)
    with pytest.raises(ValueError, match="needs a wrapper in cuda-graph mode"):
        fast_prefill_plan(eager, *args, causal=True, q_data_type=F32)


# ----------------------------------------------------------------------------------------------
# errors


def test_plan_validation_errors_name_values():
    g = gen(17)
    idx = torch.arange(20, dtype=I32)
    w = Decode(ws())
    with pytest.raises(ValueError, match=r"indptr must be non-decreasing: indptr\[1\]=5 > indptr\[2\]=3"):
        w.plan(torch.tensor([0, 5, 3], dtype=I32), idx, ones(2), H, HKV, D, 1, q_data_type=F32)
    with pytest.raises(ValueError, match=r"indptr\[0\]=2: must be 0"):
        w.plan(torch.tensor([2, 5, 7], dtype=I32), idx, ones(2), H, HKV, D, 1, q_data_type=F32)

    bw, _ = bound_decode(2, indices_len=8)
    with pytest.raises(ValueError, match="batch_size=3 differs from the batch size 2"):
        bw.plan(qo([1, 1, 1]), idx[:3], ones(3), H, HKV, D, 1, q_data_type=F32)
    with pytest.raises(ValueError, match=r"indices has 20 entries, more than the bound paged_kv_indices_buffer holds \(8\)"):
        bw.plan(qo([2, 2]), idx, ones(2), H, HKV, D, 1, q_data_type=F32)

    pw = Prefill(ws())
    indptr, indices = csr([3, 4], g)
    with pytest.raises(ValueError, match=r"custom_mask has 13 entries, expected sum\(q_len_i \* kv_len_i\) = 14"):
        pw.plan(qo([2, 2]), indptr, indices, ones(2), H, HKV, D, 1, custom_mask=torch.ones(13, dtype=torch.bool), q_data_type=F32)
    bp, _ = bound_prefill(2, with_mask=True, mask_len=10)
    with pytest.raises(ValueError, match=r"custom_mask has 14 entries, more than the bound custom_mask_buf holds \(10\)"):
        bp.plan(qo([2, 2]), indptr, indices, ones(2), H, HKV, D, 1, custom_mask=torch.ones(14, dtype=torch.bool), q_data_type=F32)
    bm, _ = bound_mla(2)
    with pytest.raises(ValueError, match="batch_size=3 differs from the batch size 2"):
        mla_plan(bm, [1, 1, 1], [1, 1, 1], g)
    with pytest.raises(ValueError, match=r"kv_len_arr \[3, 3\] disagrees"):
        bm.plan(
            qo([1, 1]),
            qo([2, 4]),
            torch.arange(6, dtype=I32),
            torch.tensor([3, 3], dtype=I32),
            HM,
            R,
            RR,
            1,
            False,
            0.3,
            F32,
            F32,
        )


def test_constructor_and_run_errors():
    with pytest.raises(ValueError, match="paged_kv_indices_buffer should be a torch.Tensor"):
        Decode(
            ws(),
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=torch.zeros(3, dtype=I32),
            paged_kv_last_page_len_buffer=ones(2),
        )
    with pytest.raises(ValueError, match="qo_indptr_buf should be a torch.Tensor"):
        Prefill(ws(), use_cuda_graph=True)
    with pytest.raises(ValueError, match="kv_indices should be a torch.Tensor"):
        MLA(ws(), use_cuda_graph=True, qo_indptr=qo([1]), kv_indptr=qo([1]), kv_len_arr=ones(1))
    w = Decode(ws())
    with pytest.raises(RuntimeError, match="call plan"):
        w.run(torch.zeros(1, H, D), (torch.zeros(4, HKV, D), torch.zeros(4, HKV, D)))
    g = gen(18)
    decode_plan(w, [2], g)
    k, v = mha_cache(g)
    with pytest.raises(ValueError, match="do not match the q_data_type"):
        w.run(torch.zeros(1, H, D, dtype=torch.float16), (k, v))
    w.plan(*csr([2], g), ones(1), H, HKV, D, 1)  # q_data_type defaults to float16, as flashinfer
    with pytest.raises(ValueError, match="q_data_type torch.float16"):
        w.run(torch.zeros(1, H, D), (k, v))


@pytest.mark.parametrize(
    "kw, feature",
    [
        (dict(pos_encoding_mode="ROPE_LLAMA"), "pos_encoding_mode"),
        (dict(window_left=16), "sliding window"),
        (dict(logits_soft_cap=30.0), "soft capping"),
        (dict(page_size=16), "page_size=16"),
    ],
)
def test_full_api_refuses_unmodelled_plan_features(kw, feature):
    page_size = kw.pop("page_size", 1)
    with pytest.raises(NotImplementedError, match=feature):
        w = full_api.BatchDecodeWithPagedKVCacheWrapper(ws())
        w.plan(qo([2]), torch.arange(2, dtype=I32), ones(1), H, HKV, D, page_size, q_data_type=F32, **kw)


def test_full_api_refuses_unmodelled_constructor_and_run_features():
    FDecode = full_api.BatchDecodeWithPagedKVCacheWrapper
    FPrefill = full_api.BatchPrefillWithPagedKVCacheWrapper
    with pytest.raises(NotImplementedError, match="HND"):
        FDecode(ws(), "HND")
    with pytest.raises(NotImplementedError, match="cutlass"):
        full_api.BatchMLAPagedAttentionWrapper(ws(), backend="cutlass")
    g = gen(19)
    pw = FPrefill(ws())
    indptr, indices = csr([2], g)
    with pytest.raises(NotImplementedError, match="packed_custom_mask"):
        pw.plan(
            qo([1]), indptr, indices, ones(1), H, HKV, D, 1, packed_custom_mask=torch.ones(1, dtype=torch.uint8), q_data_type=F32
        )
    w = FDecode(ws())
    decode_plan(w, [2], g)
    k, v = mha_cache(g)
    with pytest.raises(NotImplementedError, match="return_lse"):
        w.run_return_lse(torch.zeros(1, H, D), (k, v))


def test_idle_batch_plans_and_runs():
    g = gen(20)
    k, v = mha_cache(g)
    empty = torch.zeros(0, dtype=I32)
    w = Decode(ws())
    w.plan(qo([]), empty, empty, H, HKV, D, 1, q_data_type=F32)
    assert w.run(torch.zeros(0, H, D), (k, v)).shape == (0, H, D)
    pw, _ = bound_prefill(0, with_mask=False)
    pw.plan(qo([]), qo([]), empty, empty, H, HKV, D, 1, q_data_type=F32)
    assert not pw.run(torch.ones(2, H, D), (k, v)).any()
    mw = MLA(ws())
    mw.plan(qo([]), qo([]), empty, empty, HM, R, RR, 1, False, 0.3, F32, F32)
    cache = mla_cache(g)
    out = mw.run(torch.ones(0, HM, R), torch.ones(0, HM, RR), cache[..., :R], cache[..., R:])
    assert out.shape == (0, HM, R)


def test_bound_mask_buffer_selects_mask_mode_even_without_a_plan_mask():
    # flashinfer picks CUSTOM mode from whether custom_mask_buf was bound: a plan without a mask
    # then still reads the (here: all-zero) bound mask, blocking every key.
    g = gen(21)
    k, v = mha_cache(g)
    w, _ = bound_prefill(1, with_mask=True)
    indptr, indices = csr([3], g)
    w.plan(qo([2]), indptr, indices, ones(1), H, HKV, D, 1, causal=True, q_data_type=F32)
    assert not w.run(torch.randn(2, H, D, generator=g), (k, v)).any()


def test_count_plans_leaves_a_wrapper_without_a_kernel_module_as_it_was():
    """A real flashinfer wrapper has no ``_cached_module`` until its first plan (the H200 gate at 90d0049 met one):
    counting its plans must neither need nor add the attribute."""
    from refimpl.flashinfer_wrappers import count_plans

    class Wrapper:  # flashinfer's own class, as count_plans finds it: no kernel module before its first plan
        __module__ = "flashinfer.decode"

        def plan(self, *args):
            return args

    class Backend:
        def __init__(self):
            self.wrapper = Wrapper()

    backend = Backend()
    with count_plans(backend) as calls:
        backend.wrapper.plan(1)
    assert calls[0] == 1 and not hasattr(backend.wrapper, "_cached_module")
    assert "plan" not in backend.wrapper.__dict__  # the class's plan again


def test_plan_state_tells_two_plans_apart_when_the_plan_info_does_not():
    """In CUDA-graph mode flashinfer's plan info is offsets fixed by the batch size (the H200 gate at d9938fa: a split
    hook that never re-planned kept an equal ``_plan_info``): the integer inputs of the last plan, and of the kernel
    module's scheduling it ran, are what differ. The uint8 workspaces and float arguments are not recorded."""
    from types import SimpleNamespace

    from refimpl.flashinfer_wrappers import count_plans, plan_state

    class Module:
        def plan(self, workspace, indptr_host, batch_size, scale):
            return [0, 64, 128]

    class Wrapper:
        __module__ = "flashinfer.decode"

        def __init__(self):
            self._cached_module, self._plan_info = Module(), None

        def plan(self, indptr, workspace, scale=1.0):
            self._plan_info = self._cached_module.plan(workspace, indptr.to("cpu"), len(indptr) - 1, scale)

    class KeepsNoInfo(Wrapper):  # a plan info that is not kept (or not a list of ints): the inputs still compare
        __module__ = "flashinfer.decode"

        def plan(self, indptr, workspace, scale=1.0):
            self._cached_module.plan(workspace, indptr.to("cpu"), len(indptr) - 1, scale)

    def planned(indptr, cls=Wrapper):
        backend = SimpleNamespace(wrapper=cls())
        with count_plans(backend):
            backend.wrapper.plan(
                torch.tensor(indptr, dtype=torch.int32, device="cpu"), torch.zeros(8, dtype=torch.uint8, device="cpu")
            )
        return plan_state(backend)

    a, b = planned([0, 5, 9]), planned([0, 7, 9])
    assert torch.equal(a["plan[0].info"], b["plan[0].info"])
    assert a["plan[0].plan"].tolist() == [0, 5, 9] and a["plan[0].module.plan"].tolist() == [0, 5, 9, 2]
    assert not torch.equal(a["plan[0].plan"], b["plan[0].plan"])
    c = planned([0, 5, 9], KeepsNoInfo)
    assert "plan[0].info" not in c and torch.equal(c["plan[0].plan"], a["plan[0].plan"])
