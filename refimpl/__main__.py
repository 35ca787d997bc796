"""Command line: ``check`` (the capture/replay equivalence checker, one row per backend x variant x mode x batch size;
``--fuzz N``: N random batches per target instead, a reproducer per mismatch), ``bench`` (what a replay costs, phase by
phase) and ``matrix`` (the capability matrix)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter

import torch

from . import _env  # noqa: F401
from .backends import REGISTRY, load_backend_class
from .layout import KINDS

SGLANG = {
    "triton": "SGLangTritonAttnBackend",
    "wave": "SGLangWaveAttnBackend",
    "trtllm_mla": "SGLangTRTLLMMLABackend",
    "flashinfer": "SGLangFlashInferAttnBackend",
    "flashinfer_mla": "SGLangFlashInferMLAAttnBackend",
}  # --sglang NAME: the adapter's class (refimpl/adapters/sglang.py)
VERDICTS = """verdicts (one row per backend x variant x mode x batch size; - = not asked):
  cap=rep      (a) the capture path fills what the replay path fills (the state the graph reads); draft extend
               also through SGLang 0.5.23's max-capacity views (PR #36913)
  graph=eager  (b) the graph's output is eager's, and no other request's KV slot is written
  oracle       (c) eager matches a dense float64 oracle
  ref          (d) the replayed state keeps the padded-row invariants (indptr from 0, never decreasing; lengths
               >= 0) and matches the backend's first-principles reference
  glue         (e) information, not pass/fail: yes, the replay hook may run from a glue graph; no, it may not
               (it copies a spec input or reads a host value: correct unglued); - refused (e.g. a plan())
  history      (f) one sequence of replays, each right (on the largest batch size's row): A, that row's replay;
               A's lengths for other requests (with trees, other trees); B, A's size with other lengths; C, the
               other captured graphs but the smallest; a long run of 20 replays through the smallest, two batches in turn
  status       ok; expected (a legacy / as-upstream shape showing its historical bug); skipped; FAIL
under a row: "- <buffer>: ..." a finding of (a)-(d) or (f) ("stale from capture": the replay path kept
the values the capture batch left); "(e) ..." the glue verdict's reason, information"""
LEGEND = (
    "legend: (a) cap=rep, (b) graph=eager, (c) oracle, (d) ref, (f) history: ok, failed or - (not asked); (e) glue: "
    "information, yes / no / - (refused); what each asks: python -m refimpl check --help"
)


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line (the usage is in ``--help``)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _check_names(parser, args):
    """``--backend`` / ``--variant`` / ``--mode`` values must be known: an argparse error."""
    known = dict(backend={e.name for e in REGISTRY}, variant={e.variant for e in REGISTRY}, mode=set(KINDS))
    for name, names in known.items():
        if unknown := sorted(set(getattr(args, f"{name}s") or ()) - names):
            parser.error(f"argument --{name}: unknown {unknown}; known: {', '.join(sorted(names))}")


def _ints(bad, lo=1, hi=2**63 - 1, many=None):
    """An argparse type: an integer in [``lo``, ``hi``], or (``many``: what they are) a comma-separated list of them;
    ``bad``: the error for a value outside, ``{}`` the text."""

    def parse(text):
        try:
            values = tuple(map(int, text.split(",") if many else [text]))
        except ValueError:
            form = f"a comma-separated list of {many} (e.g. 1,3,4)" if many else "an integer"
            raise argparse.ArgumentTypeError(f"{text!r} is not {form}") from None
        if not all(lo <= v <= hi for v in values):
            raise argparse.ArgumentTypeError(bad.format(text))
        return values if many else values[0]

    return parse


_count = _ints("{} is not a count >= 1")
_batch_sizes = _ints("batch sizes must be >= 1, got {!r}", many="batch sizes")


def _names():
    names = dict.fromkeys(e.name for e in REGISTRY)  # in registry order
    backends = "; ".join(f"{n} ({', '.join(e.variant for e in REGISTRY if e.name == n)})" for n in names)
    return f"backends (variants): {backends}\nmodes: {', '.join(KINDS)}"


def _bench_defaults():
    from .bench import CPU_DEFAULTS, BenchSettings

    fmt = lambda cuda: ", ".join(
        f"{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}"
        for k, v in vars(BenchSettings.for_device(cuda)).items()
        if k in CPU_DEFAULTS
    )
    return f"GPU defaults: {fmt(True)}\nCPU defaults: {fmt(False)}"


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="python -m refimpl", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    raw = argparse.RawDescriptionHelpFormatter
    c = sub.add_parser(
        "check", help="run the capture/replay equivalence checker", epilog=f"{VERDICTS}\n{_names()}", formatter_class=raw
    )
    b = sub.add_parser(
        "bench",
        help="what a replay costs, part by part (refimpl.bench.sweep)",
        epilog=f"{_names()}\n{_bench_defaults()}",
        formatter_class=raw,
    )
    sub.add_parser("matrix", help="the capability matrix (backend x variant x graph mode), Markdown")
    for parser, variants, modes in ((c, "all", "all"), (b, "must-pass", "decode, target_verify")):  # the selection
        for flag, what, default in (
            ("--backend", "backend name", "all"),
            ("--variant", "variant, e.g. unified, legacy", variants),
            ("--mode", "graph mode", modes),
        ):
            parser.add_argument(flag, action="append", dest=f"{flag[2:]}s", help=f"{what} (repeatable); default: {default}")
    arg = c.add_argument
    arg("--engine", default="auto", choices=("auto", "cuda", "cpu-emulator"))
    arg("--bs", type=_batch_sizes, help="raw batch sizes to check, e.g. 1,3,4,7 (default 3)")
    arg(
        "--all",
        action="store_true",
        help="a row per raw batch size 1..4 (each captured size, and 3 padded to 4) instead of the default 3",
    )
    # the CLI's spec: N = num_steps + topk + 1 must fit the checker's context
    arg("--topk", type=_ints("topk={} outside [1, 8]", hi=8), default=1, help="draft tree branching (1 = chain, <= 8)")
    arg("--jobs", type=_count, help="worker processes on the CPU emulator (default: one per core)")
    arg(
        "--context",
        type=_ints("{} is below the minimum 64 (room for a tree's draft rows)", lo=64),
        help="the world's longest sequence (default 640; >= 64)",
    )
    arg("--pool", type=_count, help="the world's KV slots (default 102,400: slot ids past 65,536)")
    arg(
        "--backend-class",
        action="append",
        metavar="MODULE:CLASS",
        help="check an out-of-tree backend class implementing refimpl's backend contract (repeatable), e.g. "
        "examples.paged_decode_backend:PagedDecodeBackend",
    )
    arg(
        "--sglang",
        action="append",
        choices=sorted(SGLANG),
        help="check SGLang 0.5.23's own backend (its graph buffers and metadata hook; refimpl.adapters.sglang), from its "
        "wheel unpacked by scripts/fetch_sglang.sh (repeatable; not with --backend / --variant / --backend-class)",
    )
    arg("--json", action="store_true", help="print a JSON list of records")
    arg(
        "--arguments",
        action="store_true",
        help="per row, which fields of the batch the replay hook and the eager path read and which are dead "
        "(each varied alone; information, not a verdict)",
    )
    arg("--fuzz", type=_count, metavar="N", help="fuzz instead: N random batches per backend x variant x mode x spec")
    arg(
        "--seed",
        type=_ints("{} is not a seed: an integer in [0, 2**63) (torch's generators take 64 bits)", lo=0),
        default=0,
        help="the fuzz seed (default 0; 0 <= seed < 2**63)",
    )
    arg = b.add_argument
    arg("--bs", type=_batch_sizes, dest="batch_sizes", help="batch sizes (GPU default 1,2,4,...,256)")
    arg(
        "--ctx",
        type=_ints("context lengths must be >= 1, got {!r}", many="context lengths"),
        dest="contexts",
        help="context lengths (GPU default 512,4096,32768)",
    )
    for flag, what in (
        ("--repeats", "timed repeats per point (GPU default 30)"),
        ("--warmup", "untimed repeats first"),
        ("--rotate", "batches rotated per point"),
        ("--token-budget", "skip points with bs * context above it"),
    ):
        arg(flag, type=_count, help=what)
    arg("--glue", action="store_true", help="also time each shape the checker proves glue-safe, glued")
    arg("--pin", type=int, metavar="CORE", help="pin to one core")
    arg("--out", help="write results.json / results.csv here")
    arg("--figures", metavar="DIR", help="write the plots here")
    args = p.parse_args(argv)
    if args.cmd == "matrix":
        from .capabilities import markdown, matrix

        print(markdown(matrix()))
        return 0
    if args.cmd == "bench":
        return _bench(args, b)

    from .check import CPU_SECONDS_PER_TARGET, CheckSettings, run_checks, table, targets
    from .config import SpecConfig
    from .fuzz import fuzz
    from .graphs import make_engine

    _check_names(c, args)
    if args.engine == "cuda" and not torch.cuda.is_available():
        c.error("argument --engine: cuda needs a CUDA device and this machine has none (use auto or cpu-emulator)")

    named = lambda *given: " / ".join(f for f, v in given if v)  # the flags set among (flag, value) pairs
    if args.sglang and args.backend_class:  # SGLang's stand-ins (transformers, pydantic, ...) would reach the classes too
        c.error("argument --sglang: not with --backend-class: its stand-ins for SGLang's imports are process-wide")
    args.backend_class = (args.backend_class or []) + [f"refimpl.adapters.sglang:{SGLANG[n]}" for n in args.sglang or ()]
    if args.backend_class and (given := named(("--backend", args.backends), ("--variant", args.variants))):
        c.error(f"argument --backend-class: not with {given}: it checks the given classes, not registered backends")
    if args.bs and args.all:
        c.error("argument --all: not with --bs (--all checks raw sizes 1, 2, 3 and 4)")
    given = named(
        ("--bs", args.bs),
        ("--all", args.all),
        ("--topk", args.topk != 1),
        ("--context", args.context),
        ("--pool", args.pool),
        ("--arguments", args.arguments),
    )
    if args.fuzz and given:
        why = "the fuzzer draws batch sizes 1..8 and specs (chains, topk-2 trees) itself, in its own world"
        c.error(f"argument --fuzz: not with {given}: {why}")
    if args.arguments and make_engine(args.engine).device.type != "cpu":
        why = "it varies host lengths apart from the device's, and real FlashInfer kernels on a GPU are not bounds-guarded"
        c.error(f"argument --arguments: runs on a CPU-only machine (the CPU emulator): {why}")
    s = CheckSettings(arguments=args.arguments)
    if args.bs or args.all:
        s.raw_bs = args.bs or tuple(range(1, max(s.capture_bs) + 1))
    s.max_context_len = args.context or s.max_context_len
    s.num_slots = args.pool or s.num_slots
    if s.num_slots < (need := s.slots_needed()):
        why = f"{s.num_slots} slots cannot hold the checker's request pool at --context {s.max_context_len}"
        c.error(f"argument --pool: {why} (need >= {need})")
    if args.topk != 1:
        n = s.spec.num_steps
        s.spec = SpecConfig(n, args.topk, n + args.topk + 1)
    chosen, t0 = (args.backends, args.modes, args.variants), time.perf_counter()
    try:  # a BackendLoadError is a ValueError too, and so is an empty selection
        entries = [load_backend_class(x) for x in args.backend_class] if args.backend_class else None
        if args.fuzz:
            report = fuzz(args.fuzz, args.seed, *chosen, args.engine, not args.json, entries)
        else:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            jobs, n = args.jobs or cores, len(targets(*chosen, entries))
            if make_engine(args.engine).device.type == "cpu":  # the expected time, stated as the run starts
                eta = n * CPU_SECONDS_PER_TARGET / min(jobs, cores, n) / 60
                print(
                    f"check: {n} targets on {min(jobs, n)} worker(s): about {eta:.1f} min on idle cores (default sizes)",
                    file=sys.stderr,
                )
            rows = run_checks(*chosen, args.engine, s, entries, _terminal(), jobs)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    where = sys.stderr if args.json else sys.stdout
    if args.fuzz:  # mismatches were printed as they came (with their reproducers)
        total = sum(report.batches.values())
        if args.json:
            print(json.dumps(vars(report) | {"seed": args.seed}, indent=1))
        else:
            for line in report.skipped:
                print(f"skipped {line}")
        done = f"{len(report.mismatches)} mismatches, seed {args.seed}, {time.perf_counter() - t0:.0f} s"
        print(f"fuzz: {total} batches over {len(report.batches)} targets, {done}", file=where)
        if not total and not report.mismatches:  # as check: a selection whose every target was skipped fails
            print("fuzz: nothing fuzzed: every selected target was skipped", file=sys.stderr)
        return 1 if report.mismatches or not total else 0
    print(json.dumps([r.to_json() for r in rows], indent=1) if args.json else f"{table(rows)}\n{LEGEND}")
    # legacy / as-upstream shapes are expected to show their historical findings; every other
    # row (and every row of an out-of-tree backend under review) must pass
    count = Counter(r.status for r in rows)
    print(
        f"check: {len(rows)} rows in {time.perf_counter() - t0:.0f} s: {count['ok']} ok, {count['expected']} expected "
        f"historical findings (legacy / as-upstream shapes), {count['skipped']} skipped, {count['FAIL']} unexpected failures",
        file=where,
    )
    if count["FAIL"] or count["skipped"] == len(rows):
        nothing = "error: nothing was checked: every selected row was skipped (the reasons are above)"
        print(f"{count['FAIL']} row(s) that must pass failed" if count["FAIL"] else nothing, file=sys.stderr)
        return 1
    return 0


def _terminal():
    """A progress bar on stderr only when a person watches it: never in a log, a pipe or a notebook's captured output."""
    return sys.stderr.isatty()


def _bench(args, parser) -> int:
    import csv
    import tempfile
    from pathlib import Path

    from . import bench

    _check_names(parser, args)
    if args.pin is not None and hasattr(os, "sched_getaffinity") and args.pin not in (cores := os.sched_getaffinity(0)):
        parser.error(f"argument --pin: core {args.pin} is not one this process may run on (cores {sorted(cores)})")
    for flag, folder in (("--out", args.out), ("--figures", args.figures)):
        if folder:  # before measuring, not after
            try:
                os.makedirs(folder, exist_ok=True)
                tempfile.TemporaryFile(dir=folder).close()
            except OSError as e:
                parser.error(f"argument {flag}: cannot write to {folder} ({e.strerror or e})")
    cuda = torch.cuda.is_available()
    fields = bench.BenchSettings.__dataclass_fields__  # the flags' dests are its fields' names
    settings = bench.BenchSettings.for_device(cuda, **{k: v for k, v in vars(args).items() if k in fields})
    pairs = [(bs, ctx) for ctx in settings.contexts for bs in settings.batch_sizes]
    over = [f"{bs}x{ctx}" for bs, ctx in pairs if bs * ctx > settings.token_budget]
    why = f"bs * context above the token budget {settings.token_budget} (--token-budget; {'GPU' if cuda else 'CPU'} default)"
    if len(over) == len(pairs):
        parser.error(f"argument --token-budget: every (bs, context) pair has {why}: nothing to measure")
    if over:
        print(f"bench: {len(over)} of {len(pairs)} (bs, context) pairs skipped, {why}: {', '.join(over)}", file=sys.stderr)
    pinned = bench.pin_to_core(args.pin)
    listed = {k: v for k, v in vars(settings).items() if k != "spec"}  # tuples are written as JSON lists
    env = bench.environment() | {"pinning": pinned, "settings": listed, "spec": vars(settings.spec)}
    env["note"] = (
        f"{env['device']}: CUDA graph timings" if cuda else "CPU: emulator timings (what the Python costs), not GPU launch costs"
    )

    def write(rows):  # after every runner: a run stopped early keeps what it measured
        (out / "results.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
        with open(out / "results.csv", "w", newline="") as f:
            csv.writer(f).writerows([bench.CSV_COLUMNS, *map(bench.csv_row, rows)])

    out, t0 = Path(args.out) if args.out else None, time.perf_counter()
    rows = bench.sweep(settings, progress=_terminal(), sink=write if out else None)
    env["wall_seconds"] = round(time.perf_counter() - t0, 1)
    print(f"{env['device']}; {pinned}; {len(rows)} points in {env['wall_seconds']} s")
    print(bench.summary_table(rows))
    if out:
        write(rows)
        print(f"wrote {out}/results.json and results.csv")
    if args.figures and rows:
        from . import viz

        for path in viz.draw_bench_figures(rows, env, args.figures):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
