"""Command line: ``python -m refimpl check [--backend NAME]... [--mode MODE]... [--json]``."""

from __future__ import annotations

import argparse
import json
import sys

from . import _env  # noqa: F401


def _table(rows) -> str:
    def v(x):
        return "-" if x is None else ("ok" if x else "FAIL")

    head = f"{'backend':<18} {'variant':<12} {'mode':<16} {'bs':>3} {'engine':<13} {'cap=rep':<7} {'graph=eager':<11} {'oracle':<6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.backend:<18} {r.variant:<12} {r.mode:<16} {r.bs:>3} {r.engine:<13} "
            f"{v(r.capture_equals_replay):<7} {v(r.graph_equals_eager):<11} {v(r.matches_oracle):<6}"
        )
        for f in r.findings:
            lines.append(f"    - {f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m refimpl", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="run the capture/replay equivalence checker")
    c.add_argument("--backend", action="append", help="backend name (repeatable); default: all")
    c.add_argument("--mode", action="append", help="graph mode (repeatable); default: all")
    c.add_argument("--variant", action="append", help="variant, e.g. unified, legacy (repeatable)")
    c.add_argument("--engine", default="auto", help="auto (default), cuda or cpu-emulator")
    c.add_argument("--bs", default=None, help="raw batch sizes to check, e.g. 1,3,4,7")
    c.add_argument("--topk", type=int, default=1, help="draft tree branching (1 = chain)")
    c.add_argument("--json", action="store_true", help="print a JSON list of records")
    args = p.parse_args(argv)

    from .check import CheckSettings, run_checks
    from .config import SpecConfig

    settings = CheckSettings()
    if args.bs:
        settings.raw_bs = tuple(int(x) for x in args.bs.split(","))
    if args.topk != 1:
        s = settings.spec.num_steps
        settings.spec = SpecConfig(num_steps=s, topk=args.topk, num_draft_tokens=s + args.topk + 1)
    try:
        rows = run_checks(args.backend, args.mode, args.variant, args.engine, settings)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=1))
    else:
        print(_table(rows))
    failed = [r for r in rows if r.variant == "unified" and not r.passed]
    if failed:
        print(f"{len(failed)} unified row(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
