"""Every rule of the CPU graph emulator (README, "The CPU graph emulator";
``refimpl/graphs/emulator.py``), one test each; each fails if the rule breaks."""

import pytest
import torch

from refimpl.graphs import CPUEmulatorEngine, GraphCaptureError, GraphReplayError


@torch.library.custom_op("refimpl_test::scale_into", mutates_args=("out",))
def scale_into(x: torch.Tensor, out: torch.Tensor, factor: float) -> None:
    # a stand-in "kernel" with several internal aten ops: the recorder must see one op
    out.copy_(x * factor + 0.0)


def capture(fn):
    g = CPUEmulatorEngine().new_graph()
    return g, g.capture(fn)


def test_replay_does_not_run_python():
    x, calls = torch.ones(4), []

    def step():
        calls.append(1)
        return x * 3

    g, y = capture(step)
    assert len(calls) == 1
    x.fill_(2.0)
    g.replay()
    g.replay()
    assert len(calls) == 1, "replay must not call the Python function again"
    assert torch.equal(y, torch.full((4,), 6.0)), "replay must recompute the recorded ops"


def test_replay_writes_into_captured_storage():
    x = torch.arange(6.0)

    def step():
        h = x + 1
        return (h * 2).sum(0, keepdim=True), h[2:4]  # a fresh tensor and a view of an intermediate

    g, (total, view) = capture(step)
    ptrs = (total.data_ptr(), view.data_ptr())
    x.copy_(torch.full((6,), 10.0))
    g.replay()
    assert (total.data_ptr(), view.data_ptr()) == ptrs, "outputs must stay at the captured address"
    assert total.item() == 6 * 22.0
    assert torch.equal(view, torch.tensor([11.0, 11.0])), "views of intermediates must see new data"


def test_in_place_ops_rerun_on_static_buffers():
    cache, loc, val = torch.zeros(8), torch.tensor([1, 5]), torch.tensor([1.0, 2.0])

    def step():
        cache.index_copy_(0, loc, val)

    g, _ = capture(step)
    cache.zero_()
    loc.copy_(torch.tensor([0, 7]))
    val.copy_(torch.tensor([9.0, 8.0]))
    g.replay()
    assert cache.tolist() == [9.0, 0, 0, 0, 0, 0, 0, 8.0]


def test_python_scalars_and_shapes_are_frozen():
    x = torch.arange(8.0)
    knobs = {"factor": 2.0, "n": 3}

    def step():
        return x[: knobs["n"]] * knobs["factor"]

    g, y = capture(step)
    knobs.update(factor=100.0, n=8)  # a backend updating a Python attribute at replay time
    g.replay()
    assert y.shape == (3,), "the captured slice length must not change"
    assert torch.equal(y, torch.tensor([0.0, 2.0, 4.0])), "the captured scalar must not change"


@pytest.mark.parametrize(
    "bad",
    [
        lambda x: x.sum().item(),
        lambda x: (x + 1) if x.sum() > 0 else x,  # data-dependent branching
        lambda x: x.tolist(),
        lambda x: x.cpu(),
        lambda x: x.numpy(),
        lambda x: torch.equal(x, x),
        lambda x: int(x[0]),
        lambda x: x.nonzero(),
        lambda x: x[x > 0],  # boolean indexing: data-dependent shape
    ],
    ids=["item", "branch", "tolist", "cpu", "numpy", "equal", "int", "nonzero", "bool-index"],
)
def test_host_sync_during_capture_raises(bad):
    x = torch.arange(4.0)
    with pytest.raises(GraphCaptureError):
        capture(lambda: bad(x))
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0], "tolist must work again after a failed capture"


def test_tensors_allocated_after_capture_are_invisible():
    class Backend:
        buf = torch.tensor([1.0, 2.0])

    b = Backend()
    g, y = capture(lambda: b.buf * 10)
    b.buf = torch.tensor([7.0, 7.0])  # a fresh tensor at replay time: the graph never sees it
    g.replay()
    assert y.tolist() == [10.0, 20.0]
    Backend.buf.copy_(torch.tensor([3.0, 4.0]))  # writing the captured buffer (alive: the class holds it) does count
    g.replay()
    assert y.tolist() == [30.0, 40.0]


def test_an_input_freed_or_re_carved_after_capture_fails_the_replay_by_name():
    """Liveness: the graph holds what it did not allocate by address, as a CUDA graph does. Its owner rebinding it (the
    old buffer freed: vLLM #55341's workspace grown after capture) or re-carving it in place (``resize_``) fails the
    next replay, naming the op and the input; an owner that keeps it and writes into it passes."""

    class Backend:
        def __init__(self):
            self.buf = torch.tensor([1.0, 2.0])

    b = Backend()
    g, y = capture(lambda: b.buf * 10)
    b.buf.copy_(torch.tensor([3.0, 4.0]))  # the right way: in place
    g.replay()
    assert y.tolist() == [30.0, 40.0]
    b.buf.resize_(64)  # grown in place: its storage moves
    with pytest.raises(GraphReplayError, match=r"aten.mul.Tensor's self \(\(2,\) float32, memory the graph did not.* moved"):
        g.replay()
    b = Backend()
    g, y = capture(lambda: b.buf * 10)
    b.buf = torch.zeros(64)  # grown by rebinding: the captured one is freed
    with pytest.raises(GraphReplayError, match=r"self \(\(2,\) float32, .*\) was freed after capture: keep it alive"):
        g.replay()


def test_what_the_graph_itself_made_is_never_borrowed():
    """A constant lifted inside the captured code, and a 0-element allocation an ``out=`` op grows, are the graph's
    own memory: kept alive by the graph, replayed without a liveness error."""
    x = torch.arange(4.0)

    def step():
        buf = x.new_empty(0)
        torch.cumsum(x, 0, out=buf)
        return buf * torch.tensor([1.0, 2.0, 3.0, 4.0])

    g, y = capture(step)
    x.fill_(1.0)
    g.replay()
    assert y.tolist() == [1.0, 4.0, 9.0, 16.0]


def test_custom_op_is_one_recorded_kernel():
    x, out = torch.arange(4.0), torch.zeros(4)
    g, _ = capture(lambda: scale_into(x, out, 3.0))
    assert g.kernels() == {"refimpl_test.scale_into.default": 1}, g.ops()
    x.fill_(1.0)
    g.replay()
    assert out.tolist() == [3.0] * 4


def test_allocations_are_not_rerun_but_fills_are():
    def step():
        a = torch.empty(3)
        a.fill_(5.0)
        return a + torch.zeros(3)

    g, y = capture(step)
    assert "aten.empty.memory_format" not in g.kernels()
    y.zero_()
    g.replay()
    assert y.tolist() == [5.0] * 3


def test_replay_before_capture_and_double_capture_raise():
    g = CPUEmulatorEngine().new_graph()
    with pytest.raises(GraphReplayError):
        g.replay()
    g.capture(lambda: torch.ones(1) + 1)
    with pytest.raises(GraphCaptureError):
        g.capture(lambda: torch.ones(1))


def test_copy_ops_inside_capture_rerun():
    """A copy made inside the capture (``clone``, ``.contiguous()`` of a strided view) is a kernel, not an allocation:
    replay recomputes it from the current input (treating it as an allocation would replay stale values)."""
    x = torch.arange(6.0).view(2, 3)

    def step():
        a = x.clone()
        b = x.t().contiguous()  # a copy: x.t() is not contiguous
        return a * 2, b + 1

    g, (a2, b1) = capture(step)
    x.copy_(torch.full((2, 3), 10.0))
    g.replay()
    assert torch.equal(a2, torch.full((2, 3), 20.0)) and torch.equal(b1, torch.full((3, 2), 11.0))


def test_a_triton_launch_outside_any_torch_op_is_refused_at_capture():
    """The emulator records torch ops (a refimpl kernel is one custom op): a Triton kernel launched directly (SGLang's
    own, through ``refimpl.adapters.sglang``) would be skipped at every replay, so its capture is refused by name; the
    same launch inside a custom op, or outside any capture, runs."""
    import triton
    import triton.language as tl

    from refimpl import _env

    if not _env.INTERPRET:
        pytest.skip("the rule is the interpreter's (a CUDA graph records the launch itself)")

    @triton.jit
    def add_one(x_ptr, n: tl.constexpr):
        offs = tl.arange(0, n)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1)

    x = torch.zeros(4)
    add_one[(1,)](x, 4)  # eager: runs
    with pytest.raises(GraphCaptureError, match=r"Triton kernel launched outside any torch op .*add_one"):
        capture(lambda: add_one[(1,)](x, 4))

    @torch.library.custom_op("refimpl_test::add_one", mutates_args=("x",))
    def add_one_op(x: torch.Tensor) -> None:
        add_one[(1,)](x, 4)

    g, _ = capture(lambda: add_one_op(x))  # inside an op: recorded, replayed
    g.replay()
    assert x.tolist() == [3.0] * 4  # eager, capture, replay (the refused capture launched nothing)
