"""Notebook 07's helpers: the checker as a reviewer runs it on a pull request's backend (``examples/review_backend.py``),
one padded batch through verdict (a)'s two paths, and the figures of what they leave."""

import dataclasses
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.figure import Figure

from .. import viz
from ..batch import ForwardBatch
from ..check import CheckRecord, CheckSettings, row_lengths, run_checks, table
from ..graphs import CPUEmulatorEngine
from ..layout import KINDS
from ..rig.core import Rig, state_after
from ..viz.cells import ancestry
from . import ROOT, entry  # noqa: F401  (entry: notebooks import it from here too)

BUGGY = "examples.review_backend:ReviewBackendBuggy"  # the pull request as submitted
FIXED = "examples.review_backend:ReviewBackend"  # the same class after review
SETTINGS = CheckSettings()  # the CLI's: graphs for bs 1 and 4; a batch of 3 (padded to 4); context 640


def cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m refimpl check *args`` from the repository root, as a reviewer types it: prints the table and its
    findings (not the legend line) and returns the run."""
    res = subprocess.run([sys.executable, "-m", "refimpl", "check", *args], cwd=ROOT, capture_output=True, text=True)
    print("\n".join(line for line in res.stdout.splitlines() if not line.startswith(("legend:", "---"))))
    print(f"exit code {res.returncode}")
    return res


def check(backend: str | type, modes: list[str], glue: bool = True) -> list[CheckRecord]:
    """The checker's records for one backend on ``modes`` (the CPU emulator, ``SETTINGS``), printed as the CLI prints
    them; ``glue=False``: without verdict (e)."""
    settings = SETTINGS if glue else dataclasses.replace(SETTINGS, glue_replays=0)
    rows = run_checks(modes=modes, engine="cpu-emulator", settings=settings, entries=[entry(backend)])
    print(table(rows))
    return rows


@dataclass
class Paths:
    """One padded batch through verdict (a)'s two paths, as ``refimpl.check.capture_vs_replay`` runs them (host copies
    of each ``graph_state``; ``reference``: the backend's ``reference_graph_state``)."""

    batch: ForwardBatch  # the raw batch the checker's row drew
    padded: ForwardBatch  # what the hooks see: padded to the captured size
    p: Any  # path P: a fresh backend after the capture hook on the padded batch
    q: Any  # path Q: a fresh backend after the capture hook on the runner's capture batch, then the replay hook
    capture: dict
    replay: dict
    reference: dict


def _host(state):
    """A host copy of a ``graph_state`` (its tensors cloned to the CPU)."""
    return {k: v.detach().cpu().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


SMALL = dataclasses.replace(SETTINGS, max_context_len=48, num_slots=None)  # the figures' world: a mask one can read


def paths(backend: str | type) -> Paths:
    """A target-verify batch of 3 requests drawn as the checker draws its only row with ``SMALL`` (its world and seed: a
    48-position world, so the figures stay readable) through paths P and Q."""
    rig = Rig.build(entry(backend), KINDS["target_verify"], SMALL.spec, CPUEmulatorEngine(), capture=False, **SMALL.rig_args())
    rig.gen.lengths = row_lengths(3)
    fb = rig.gen.for_mode(rig.kind, 3)
    padded = rig.runner.padded_batch(fb)
    (p, cap), (q, rep) = (state_after(rig.new_backend, rig.runner, padded, replay=r) for r in (False, True))
    return Paths(fb, padded, p, q, _host(cap), _host(rep), _host(q.reference_graph_state(padded)))


def draw_paths(s: Paths, n: int) -> Figure:
    """The verify metadata of ``s``: per-request lengths, ``kv_indptr`` (both paths), ``mask_indptr`` after each path
    and in the reference, the capture and replay rows' differing cells marked; ``n`` drafts per request."""
    seq, bs, live = s.padded.seq_lens_cpu, s.padded.batch_size, s.batch.batch_size
    cap, rep, ref = s.capture["mask_indptr"], s.replay["mask_indptr"], s.reference["mask_indptr"]
    same_kv = torch.equal(s.capture["kv_indptr"], s.replay["kv_indptr"])
    rows = {
        "seq_lens (prefix)": seq,
        f"kv_lens = seq_lens + {n}": seq + n,
        f"kv_indptr: {'both paths' if same_kv else 'capture path'}": s.capture["kv_indptr"],
        **({} if same_kv else {"kv_indptr: replay path": s.replay["kv_indptr"]}),
        "mask_indptr: capture path (P)": cap,
        "mask_indptr: replay path (Q)": rep,
        "mask_indptr: reference": ref,
        "replay - capture": rep - cap,
    }
    roles = {k: viz.batch_roles(v.numel(), live, bs, indptr=v.numel() > bs) for k, v in rows.items()}  # [bs] or [bs+1]
    wrong = "replay" if not torch.equal(rep, ref) else "capture" if not torch.equal(cap, ref) else ""
    verdict = f"the {wrong} path's mask_indptr is not the reference's" if wrong else "both paths match the reference"
    title = f"verify, {live} requests padded to bs {bs}: {verdict}"
    marks = dict.fromkeys(["mask_indptr: capture path (P)", "mask_indptr: replay path (Q)"], cap != rep)
    return viz.draw_buffers(rows, title, roles=roles, differs=marks, differs_label="(a) capture path != replay path")


def mask_as_read(backend, padded: ForwardBatch, i: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request ``i``'s ``[n, kv_len]`` mask block as the captured ``forward`` reads it through ``backend``'s metadata
    (from ``mask_indptr[i]``, row-major), and the block its draft tree asks for."""
    md = backend.forward_metadata
    kv_len = int(md.kv_indptr[i + 1] - md.kv_indptr[i])
    flat = int(md.mask_indptr[i]) + torch.arange(n * kv_len).view(n, kv_len)  # row-major from the block's start
    mask = md.custom_mask.cpu()
    read = mask[flat.clamp(0, mask.numel() - 1)].bool()
    tree = torch.as_tensor(ancestry(padded.spec_info.parents[i]))
    return read, torch.cat([torch.ones(n, kv_len - n), tree], 1).bool()  # what it should read: the prefix, then the tree


def draw_mask_as_read(backend, padded: ForwardBatch, i: int, n: int, path: str) -> Figure:
    """Request ``i``'s mask block as the captured ``forward`` reads it through ``backend``'s metadata (``path`` names
    whose), against its draft tree: ``viz.draw_tree_mask`` frames every cell the tree disagrees with."""
    md = backend.forward_metadata
    start, kv_len = int(md.mask_indptr[i]), int(md.kv_indptr[i + 1] - md.kv_indptr[i])
    read = torch.cat([md.mask_indptr[: i + 1].cpu(), torch.tensor([start + n * kv_len])])  # the block the kernel reads
    title = f"request {i}'s mask as the {path}'s graph reads it, from mask_indptr[{i}] = {start}: red, not its tree"
    return viz.draw_tree_mask(md.custom_mask.cpu(), read, n, i, parents=padded.spec_info.parents[i], title=title)
