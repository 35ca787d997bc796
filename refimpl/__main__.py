"""Command line: ``check`` (the capture/replay equivalence checker, one row per backend x variant x mode x batch size;
``--fuzz N``: N random batches per target instead, a reproducer per mismatch), ``bench`` (what a replay costs, phase by
phase) and ``matrix`` (the capability matrix)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import _env  # noqa: F401

VERDICTS = """verdicts (one row per backend x variant x mode x batch size; - = not asked):
  cap=rep      (a) the capture path fills what the replay path fills (the state the graph reads)
  graph=eager  (b) the graph's output is eager's, and no other request's KV slot is written
  oracle       (c) eager matches a dense float64 oracle
  ref          (d) the replayed state matches the backend's first-principles reference
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

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _table(rows) -> str:
    cols = ("backend", "variant", "pattern", "mode", "bs", "engine", "cap=rep", "graph=eager", "oracle", "ref", "glue")
    cols += ("history", "status")
    v = lambda x: "-" if x is None else ("ok" if x else "FAIL")
    verdicts = lambda r: (r.capture_equals_replay, r.graph_equals_eager, r.matches_oracle, r.replay_matches_reference)
    glue = lambda r: {None: "-", True: "yes", False: "no"}[r.glue_equals_eager]  # (e) is not pass / fail
    bs = lambda r: "-" if r.skipped else str(r.bs)
    cells = [(r.backend, r.variant, r.pattern, r.mode, bs(r), r.engine, *map(v, verdicts(r)), glue(r), v(r.history_ok), r.status)
             for r in rows]  # fmt: skip
    width = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    line = lambda values: " ".join(f"{x:<{w}}" for x, w in zip(values, width)).rstrip()
    lines = [line(cols), "-" * (sum(width) + len(width) - 1)]
    for r, row in zip(rows, cells):
        lines += [line(row), *(f"    - {f}" for f in r.findings), *map(_glue_line, r.glue_findings)]
    return "\n".join(lines)


def _glue_line(finding: str) -> str:
    """A verdict (e) finding as information: the row's status does not depend on it."""
    what, _, rest = finding.partition(": ")
    if what == "not glue-safe":
        return f"    (e) not glue-safe (information, not a failure): {rest}"
    return f"    (e) {what} (information): {rest}" if rest else f"    (e) {finding} (information)"


def _check_names(parser: argparse.ArgumentParser, args) -> None:
    """``--backend`` / ``--variant`` / ``--mode`` values must be known: an argparse error."""
    from .backends import REGISTRY
    from .layout import KINDS

    known = {"--backend": {e.name for e in REGISTRY}, "--variant": {e.variant for e in REGISTRY}, "--mode": set(KINDS)}
    for flag, given in (("--backend", args.backend), ("--variant", args.variant), ("--mode", args.mode)):
        unknown = sorted(set(given or ()) - known[flag])
        if unknown:
            parser.error(f"argument {flag}: unknown {unknown}; known: {', '.join(sorted(known[flag]))}")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _int_list(what: str):
    def parse(text: str) -> tuple[int, ...]:
        try:
            values = tuple(int(x) for x in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what} (e.g. 1,3,4)") from None
        if not values or min(values) < 1:
            raise argparse.ArgumentTypeError(f"{what} must be >= 1, got {text!r}")
        return values

    return parse


_batch_sizes = _int_list("batch sizes")


def _count(text: str) -> int:
    n = _int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not a count >= 1")
    return n


TOPK_RANGE = (1, 8)  # the CLI's spec: N = num_steps + topk + 1 must fit the checker's context


def _seed(text: str) -> int:
    value = int(text) if text.lstrip("-").isdigit() else None
    if value is None or not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{text!r} is not a seed: an integer in [0, 2**63) (torch's generators take 64 bits)")
    return value


def _topk(text: str) -> int:
    (lo, hi), k = TOPK_RANGE, _int(text)
    if not lo <= k <= hi:
        raise argparse.ArgumentTypeError(f"topk={k} outside [{lo}, {hi}]")
    return k


def _names() -> str:
    from .backends import REGISTRY
    from .layout import KINDS

    by_name: dict[str, list[str]] = {}
    for e in REGISTRY:
        by_name.setdefault(e.name, []).append(e.variant)
    backends = "; ".join(f"{n} ({', '.join(vs)})" for n, vs in by_name.items())
    return f"backends (variants): {backends}\nmodes: {', '.join(KINDS)}"


def _bench_defaults() -> str:
    from .bench import CPU_DEFAULTS, GPU_DEFAULTS

    fmt = lambda d: ", ".join(f"{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in d.items())
    return f"GPU defaults: {fmt(GPU_DEFAULTS)}\nCPU defaults: {fmt(CPU_DEFAULTS)}"


def main(argv: list[str] | None = None) -> int:
    p = _Parser(prog="python -m refimpl", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    raw = argparse.RawDescriptionHelpFormatter
    epilog = f"{VERDICTS}\n{_names()}"
    c = sub.add_parser("check", help="run the capture/replay equivalence checker", epilog=epilog, formatter_class=raw)
    c.add_argument("--backend", action="append", help="backend name (repeatable); default: all")
    c.add_argument("--mode", action="append", help="graph mode (repeatable); default: all")
    c.add_argument("--variant", action="append", help="variant, e.g. unified, legacy (repeatable)")
    c.add_argument("--engine", default="auto", choices=("auto", "cuda", "cpu-emulator"))
    c.add_argument("--bs", type=_batch_sizes, default=None, help="raw batch sizes to check, e.g. 1,3,4,7 (default 3)")
    help = "a row per raw batch size 1..4 (each captured size, and 3 padded to 4) instead of the default 3"
    c.add_argument("--all", action="store_true", help=help)
    c.add_argument("--topk", type=_topk, default=1, help="draft tree branching (1 = chain, <= 8)")
    c.add_argument("--jobs", type=_count, help="worker processes on the CPU emulator (default: one per core)")
    c.add_argument("--context", type=_count, help="the world's longest sequence (default 640; >= 64)")
    c.add_argument("--pool", type=_count, help="the world's KV slots (default 102,400: slot ids past 65,536)")
    example = "examples.paged_decode_backend:PagedDecodeBackend"
    help = f"check an out-of-tree backend class implementing refimpl's backend contract (repeatable), e.g. {example}"
    c.add_argument("--backend-class", action="append", metavar="MODULE:CLASS", help=help)
    c.add_argument("--json", action="store_true", help="print a JSON list of records")
    help = "fuzz instead: N random batches per backend x variant x mode x spec"
    c.add_argument("--fuzz", type=_count, metavar="N", help=help)
    c.add_argument("--seed", type=_seed, default=0, help="the fuzz seed (default 0; 0 <= seed < 2**63)")
    epilog = f"{_names()}\n{_bench_defaults()}"
    b = sub.add_parser(
        "bench", help="what a replay costs, part by part (refimpl.bench.sweep)", epilog=epilog, formatter_class=raw
    )
    b.add_argument("--backend", action="append", help="backend name (repeatable); default: all")
    b.add_argument("--variant", action="append", help="variant (repeatable); default: must-pass")
    b.add_argument("--mode", action="append", help="graph mode (repeatable); default: decode, target_verify")
    b.add_argument("--bs", type=_batch_sizes, help="batch sizes (GPU default 1,2,4,...,256)")
    b.add_argument("--ctx", type=_int_list("context lengths"), help="context lengths (GPU default 512,4096,32768)")
    b.add_argument("--repeats", type=_count, help="timed repeats per point (GPU default 30)")
    b.add_argument("--warmup", type=_count, help="untimed repeats first")
    b.add_argument("--rotate", type=_count, help="batches rotated per point")
    b.add_argument("--token-budget", type=_count, help="skip points with bs * context above it")
    b.add_argument("--glue", action="store_true", help="also time each shape the checker proves glue-safe, glued")
    b.add_argument("--pin", type=int, default=None, metavar="CORE", help="pin to one core")
    b.add_argument("--out", default=None, help="write results.json / results.csv here")
    b.add_argument("--figures", default=None, metavar="DIR", help="write the plots here")
    sub.add_parser("matrix", help="the capability matrix (backend x variant x graph mode), Markdown")
    args = p.parse_args(argv)
    if args.cmd == "matrix":
        from .capabilities import markdown, matrix

        print(markdown(matrix()))
        return 0
    if args.cmd == "bench":
        return _bench(args, b)

    import time

    from .backends import load_backend_class
    from .check import CPU_SECONDS_PER_TARGET, CheckSettings, run_checks, targets
    from .config import SpecConfig
    from .graphs import make_engine

    _check_names(c, args)
    _require_cuda(c, args.engine)
    if args.backend_class and (args.backend or args.variant):
        given = " / ".join(f for f, v in (("--backend", args.backend), ("--variant", args.variant)) if v)
        c.error(f"argument --backend-class: not with {given}: it checks the given classes, not registered backends")
    settings = CheckSettings()
    if args.bs and args.all:
        c.error("argument --all: not with --bs (--all checks raw sizes 1, 2, 3 and 4)")
    if args.bs or args.all:
        settings.raw_bs = args.bs or tuple(range(1, max(settings.capture_bs) + 1))
    settings.max_context_len = args.context or settings.max_context_len
    settings.num_slots = args.pool or settings.num_slots
    if settings.max_context_len < 64:
        c.error(f"argument --context: {settings.max_context_len} is below the minimum 64 (room for a tree's draft rows)")
    if settings.num_slots < (need := settings.slots_needed()):
        why = f"{settings.num_slots} slots cannot hold the checker's request pool at --context {settings.max_context_len}"
        c.error(f"argument --pool: {why} (need >= {need})")
    if args.topk != 1:
        s = settings.spec.num_steps
        settings.spec = SpecConfig(num_steps=s, topk=args.topk, num_draft_tokens=s + args.topk + 1)
    try:  # a BackendLoadError is a ValueError too
        entries = [load_backend_class(spec) for spec in args.backend_class] if args.backend_class else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.fuzz:
        flags = (("--bs", args.bs), ("--all", args.all), ("--topk", args.topk != 1), ("--context", args.context))
        flags += (("--pool", args.pool),)
        given = " / ".join(f for f, v in flags if v)
        if given:  # the fuzzer's batch sizes and specs are its own
            why = "the fuzzer draws batch sizes 1..8 and specs (chains, topk-2 trees) itself, in its own world"
            c.error(f"argument --fuzz: not with {given}: {why}")
        return _fuzz(args, entries)
    t0 = time.perf_counter()
    try:  # an empty selection is a ValueError
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        jobs, n = args.jobs or cores, len(targets(args.backend, args.mode, args.variant, entries))
        if make_engine(args.engine).device.type == "cpu":  # the expected time, stated as the run starts
            eta, workers = n * CPU_SECONDS_PER_TARGET / min(jobs, cores, n), min(jobs, n)
            print(
                f"check: {n} targets on {workers} worker(s): about {eta / 60:.1f} min on idle cores (default sizes)",
                file=sys.stderr,
            )
        rows = run_checks(args.backend, args.mode, args.variant, args.engine, settings, entries, _terminal(), jobs)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=1))
    else:
        print(_table(rows))
        print(LEGEND)
    # legacy / as-upstream shapes are expected to show their historical findings; every other
    # row (and every row of an out-of-tree backend under review) must pass
    count = lambda status: sum(r.status == status for r in rows)
    summary = f"check: {len(rows)} rows in {time.perf_counter() - t0:.0f} s: {count('ok')} ok, "
    summary += f"{count('expected')} expected historical findings (legacy / as-upstream shapes), {count('skipped')} skipped, "
    summary += f"{count('FAIL')} unexpected failures"
    print(summary, file=sys.stderr if args.json else sys.stdout)
    if count("FAIL"):
        print(f"{count('FAIL')} row(s) that must pass failed", file=sys.stderr)
        return 1
    if count("skipped") == len(rows):
        print("error: nothing was checked: every selected row was skipped (the reasons are above)", file=sys.stderr)
        return 1
    return 0


def _terminal() -> bool:
    """A progress bar on stderr only when a person watches it: never in a log, a pipe or a notebook's captured output."""
    return sys.stderr.isatty()


def _require_cuda(parser, engine: str) -> None:
    import torch

    if engine == "cuda" and not torch.cuda.is_available():
        parser.error("argument --engine: cuda needs a CUDA device and this machine has none (use auto or cpu-emulator)")


def _bench(args, parser) -> int:
    import csv
    import os
    import time
    from pathlib import Path

    import torch

    from . import bench

    _check_names(parser, args)
    if args.pin is not None and hasattr(os, "sched_getaffinity") and args.pin not in (cores := os.sched_getaffinity(0)):
        parser.error(f"argument --pin: core {args.pin} is not one this process may run on (cores {sorted(cores)})")
    for flag, folder in (("--out", args.out), ("--figures", args.figures)):
        if folder:  # before measuring, not after
            try:
                Path(folder).mkdir(parents=True, exist_ok=True)
                (probe := Path(folder) / ".refimpl-write-test").write_text("")
                probe.unlink()
            except OSError as e:
                parser.error(f"argument {flag}: cannot write to {folder} ({e.strerror or e})")
    given = dict(backends=args.backend, variants=args.variant, modes=tuple(args.mode) if args.mode else None)
    given.update(batch_sizes=args.bs, contexts=args.ctx, repeats=args.repeats, warmup=args.warmup)
    cuda = torch.cuda.is_available()
    settings = bench.BenchSettings.for_device(cuda, rotate=args.rotate, token_budget=args.token_budget, glue=args.glue, **given)
    pairs = [(bs, ctx) for ctx in settings.contexts for bs in settings.batch_sizes]
    over = [f"{bs}x{ctx}" for bs, ctx in pairs if bs * ctx > settings.token_budget]
    why = f"bs * context above the token budget {settings.token_budget} (--token-budget; {'GPU' if cuda else 'CPU'} default)"
    if len(over) == len(pairs):
        parser.error(f"argument --token-budget: every (bs, context) pair has {why}: nothing to measure")
    if over:
        print(f"bench: {len(over)} of {len(pairs)} (bs, context) pairs skipped, {why}: {', '.join(over)}", file=sys.stderr)
    pinned = bench.pin_to_core(args.pin)
    listed = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(settings).items() if k != "spec"}
    env = {**bench.environment(), "pinning": pinned, "settings": listed, "spec": vars(settings.spec)}
    cpu_note = "CPU: emulator timings (what the Python costs), not GPU launch costs"
    env["note"] = f"{env['device']}: CUDA graph timings" if cuda else cpu_note
    out = Path(args.out) if args.out else None

    def write(rows):  # after every runner: a run stopped early keeps what it measured
        if out is None:
            return
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
        with open(out / "results.csv", "w", newline="") as f:
            csv.writer(f).writerows([bench.CSV_COLUMNS, *map(bench.csv_row, rows)])

    t0 = time.perf_counter()
    rows = bench.sweep(settings, progress=_terminal(), sink=write)
    env["wall_seconds"] = round(time.perf_counter() - t0, 1)
    write(rows)
    print(f"{env['device']}; {pinned}; {len(rows)} points in {env['wall_seconds']} s")
    print(bench.summary_table(rows))
    if out is not None:
        print(f"wrote {out}/results.json and results.csv")
    if args.figures and rows:
        from . import viz

        for path in viz.draw_bench_figures(rows, env, args.figures):
            print(f"wrote {path}")
    return 0


def _fuzz(args, given) -> int:
    """``--fuzz``: the registered backends, or ``given`` (the ``--backend-class`` entries)."""
    import time

    from .fuzz import fuzz

    t0 = time.perf_counter()
    report = fuzz(args.fuzz, args.seed, args.backend, args.mode, args.variant, args.engine, not args.json, given)
    total = sum(report.batches.values())
    if args.json:
        found = dict(batches=report.batches, mismatches=report.mismatches, skipped=report.skipped, seed=args.seed)
        print(json.dumps(found, indent=1))
    else:  # mismatches were printed as they came (with their reproducers)
        for line in report.skipped:
            print(f"skipped {line}")
    done = f"{len(report.mismatches)} mismatches, seed {args.seed}, {time.perf_counter() - t0:.0f} s"
    where = sys.stderr if args.json else sys.stdout
    print(f"fuzz: {total} batches over {len(report.batches)} targets, {done}", file=where)
    if not total and not report.mismatches:  # as check: a selection whose every target was skipped fails
        print("fuzz: nothing fuzzed: every selected target was skipped", file=sys.stderr)
        return 1
    return 1 if report.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
