"""Notebook 02's helpers: capture one graph mode of a backend and replay a fresh padded batch through it (``Lab``), the
verdicts of a planted backend (``Lab.check``, the exercise), and the draft-extend strides figure."""

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from matplotlib.figure import Figure

from .. import layout, viz
from ..batch import ForwardBatch, World
from ..batchgen import BatchGenerator
from ..config import GraphConfig, ModelConfig, SpecConfig
from ..graphs import GraphEngine
from ..graphs.runner import GraphRunner
from ..model import MultiStepDraftProgram, TinyDecoder
from ..modes import ForwardMode
from ..rig.verdicts import capture_vs_replay

RAW_BS = 3  # every replay below: 3 live requests, served by the bs-4 graph (one padded row)
L = 40  # max_context_len


@dataclass
class Replayed:
    """One mode captured at bs 1 and 4, then a fresh batch of ``RAW_BS`` replayed (graph) and run eagerly."""

    runner: GraphRunner
    batch: ForwardBatch  # the live batch
    frozen: Any  # the metadata the last capture (bs 1) froze
    graph: torch.Tensor  # the replay's output (a clone)
    eager: torch.Tensor  # the eager run's output

    @property
    def bs(self) -> int:
        """The graph's batch size (4: the padded row included)."""
        return self.runner.pick_bs(self.batch.batch_size)


@dataclass
class Verdicts:
    """Verdicts (a), (b), (d) of notebook 01 for one batch, and which of each live request's rows differ from eager."""

    capture_equals_replay: bool
    graph_equals_eager: bool
    replay_matches_reference: bool
    wrong_rows: list[list[int]]  # per live request, its rows (0..rows-1) whose graph output differs from eager
    findings: list[str]

    def __str__(self) -> str:
        head = (
            f"(a) capture == replay: {self.capture_equals_replay}   (b) graph == eager: {self.graph_equals_eager}"
            f"   (d) replay == reference: {self.replay_matches_reference}"
        )
        rows = [f"request {i}: rows that differ from eager {r}" for i, r in enumerate(self.wrong_rows)]
        return "\n".join([head, *rows, *self.findings[:2]])


@dataclass
class Lab:
    """A CPU-sized world (one-layer GQA model, ``max_context_len`` 40) and graphs of bs 1 and 4 on ``engine``."""

    engine: GraphEngine
    world: World
    model: TinyDecoder
    graphs: GraphConfig
    gens: dict = field(default_factory=dict)  # spec -> its BatchGenerator, seeded in order

    @classmethod
    def create(cls, engine: GraphEngine) -> "Lab":
        cfg = ModelConfig(num_layers=1)  # 4 query heads sharing 2 KV heads, head dim 16, fp32
        world = World.create(cfg, max_context_len=L, pool_size=32, device=engine.device)
        world.randomize_kv(0)  # every prefix "already prefilled"
        graphs = GraphConfig(max_bs=4, capture_bs=(1, 4), max_context_len=L)
        return cls(engine, world, TinyDecoder(cfg, engine.device), graphs)

    def gen(self, spec: SpecConfig | None) -> BatchGenerator:
        """The batch generator of ``spec`` (made on first use)."""
        return self.gens.setdefault(spec, BatchGenerator(self.world, spec, seed=len(self.gens) + 1))

    def replay(self, kind: ForwardMode | str, backend, spec: SpecConfig | None = None, **batch_kw):
        """Capture ``kind`` (a forward mode, or ``"draft_decode"``) at bs 1 and 4, then replay and run eagerly a fresh
        batch of ``RAW_BS`` (``batch_kw``: the generator's)."""
        kind = layout.GraphKind.parse(kind)
        program = MultiStepDraftProgram(self.model, spec.num_steps) if kind.multi_step else self.model
        runner = GraphRunner(program, backend, self.engine, kind, self.graphs, spec)
        runner.capture()
        frozen = getattr(backend, "forward_metadata", None)
        fb = self.gen(spec).for_mode(kind, RAW_BS, **batch_kw)
        return Replayed(runner, fb, frozen, runner.replay(fb).clone(), runner.eager(fb))  # clone: the next replay rewrites it

    def check(self, backend_cls: type, mode: ForwardMode, spec: SpecConfig) -> Verdicts:
        """``backend_cls`` through verdicts (a) and (d) (``refimpl.check.capture_vs_replay``) and (b) on a batch of
        ``RAW_BS``; per live request, the rows whose graph output differs from eager."""
        new = partial(backend_cls, self.world, spec)
        r = self.replay(mode, new(), spec)
        diffs, ref_diffs = capture_vs_replay(new, r.runner, r.batch)
        bad = ~torch.isclose(r.graph, r.eager, atol=1e-4, rtol=1e-4).view(RAW_BS, r.runner.tokens_per_req, -1).all(-1)
        wrong = [b.nonzero().flatten().tolist() for b in bad.cpu()]  # bad: [RAW_BS, rows]
        self.gen(spec).release(r.batch)
        return Verdicts(not diffs, not any(wrong), not ref_diffs, wrong, diffs + (ref_diffs or []))


def draw_draft_extend_strides(v1: Replayed, v2: Replayed, title: str = "") -> Figure:
    """The draft-extend buffers of the bs-4 graph after ``v1`` (a chain) and ``v2`` (a tree) replays: ``accept_length``,
    ``qo_indptr`` and ``kv_indptr`` per version, and v2's ``qo_indptr`` at the pre-#27545 stride S + 1, its entries
    that differ from the stride-N layout marked (gid ``"differs"``)."""
    bs, stride = v2.bs, v2.runner.spec_cfg.num_steps + 1  # S + 1
    b1, b2 = v1.runner.backend, v2.runner.backend
    qo_v2 = b2.qo_indptr[: bs + 1].cpu()
    wrong = torch.arange(0, bs * stride + 1, stride)  # [bs+1]
    n1, n2 = v1.frozen.max_extend_len, v2.frozen.max_extend_len
    state = {
        "v1 accept_length (live)": v1.batch.spec_info.accept_length,
        f"v1 qo_indptr (S+1 = {n1})": b1.qo_indptr[: bs + 1],
        "v1 kv_indptr": b1.kv_indptr[: bs + 1],
        f"v2 qo_indptr (N = {n2})": qo_v2,
        "v2 kv_indptr": b2.kv_indptr[: bs + 1],
        "v2 qo_indptr before #27545": wrong,
        "max_extend_len v1 / v2 (frozen)": f"{n1} / {n2}",
    }
    live = v2.batch.batch_size
    roles = {k: viz.batch_roles(bs + 1, live, bs, indptr=True) for k in state if "indptr" in k}
    roles["v1 accept_length (live)"] = viz.batch_roles(live, live)
    return viz.draw_buffers(
        state,
        title or "draft extend (Triton): one uniform stride per version",
        roles=roles,
        differs={"v2 qo_indptr before #27545": wrong != qo_v2},
        differs_label="differs from the stride-N layout",
    )
