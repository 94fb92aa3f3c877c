"""Two runs of `bench.bench_quality`, paired question by question: is B better than A, or only
luckier?

    .venv/bin/python -m bench.compare_quality /tmp/default.json /tmp/variant.json --names default,variant

For each window both runs measured, on the questions both answered: each run's end-to-end EM and F1,
B's difference from A, the questions only one of them gets right (gained and lost going from A to
B), the exact McNemar
p-value of that split and a paired bootstrap interval of the EM difference (evaluation.paired), and
the same split where A's reader reads an answer and where it does not; with several windows, the
same figures over all their questions together (`all windows`: the test is stronger on more
questions). A window or a question only one run has is left out and said. Exit code 2 for a file
that is not such a run.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evaluation.metrics import exact_match, token_f1
from evaluation.paired import describe_paired, paired_em


class NotARun(ValueError):
    """A file that is not the --out of bench.bench_quality."""


def load_run(path: Path) -> dict:
    """{window label: {qid: prediction record}} of one bench_quality --out file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise NotARun(f"{path}: cannot read it as JSON ({exc})") from exc
    windows = data.get("windows") if isinstance(data, dict) else None
    if not isinstance(windows, dict) or not all(isinstance(w, dict) and "predictions" in w for w in windows.values()):
        raise NotARun(f"{path}: not a bench.bench_quality --out file (no windows with predictions)")
    return {label: w["predictions"] for label, w in windows.items()}


def _right(preds: dict, qids) -> dict[str, bool]:
    return {q: preds[q]["e2e"] is not None and exact_match(preds[q]["e2e"], preds[q]["answers"]) == 1.0 for q in qids}


def _f1(preds: dict, qids) -> float:
    return round(100 * sum(token_f1(preds[q]["e2e"] or "", preds[q]["answers"]) for q in qids) / len(qids), 1)


def compare_window(a: dict, b: dict) -> dict:
    """A window's paired figures (both runs' predictions by qid), B against A (`paired_em`'s "a" is
    B: its difference is B - A, its only_a what B gains): overall, and split by whether A's reader
    reads an answer (`read`); `left_out` counts the questions only one run has."""
    common = [q for q in a if q in b]
    if not common:
        raise NotARun("the two runs share no question in this window")
    out = {"all": paired_em(_right(b, common), _right(a, common)), "f1_a": _f1(a, common), "f1_b": _f1(b, common),
           "left_out": len(set(a) ^ set(b))}
    for name, keep in (("read", True), ("not_read", False)):
        part = [q for q in common if bool(a[q].get("read")) is keep]
        out[name] = paired_em(_right(b, part), _right(a, part)) if part else None
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path, help="the first run's --out (the reference)")
    ap.add_argument("b", type=Path, help="the second run's --out")
    ap.add_argument("--names", default="A,B", help="two names for the runs, comma-separated")
    ap.add_argument("--out", type=Path, help="write the figures here (JSON)")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.names.split(",")]
    if len(names) != 2 or not all(names):
        ap.error(f"--names takes two names separated by a comma, got {args.names!r}")
    try:
        run_a, run_b = load_run(args.a), load_run(args.b)
        shared = [label for label in run_a if label in run_b]
        if not shared:
            raise NotARun(f"{args.a} and {args.b} measured no window in common "
                          f"({', '.join(run_a)} against {', '.join(run_b)})")
        results = {label: compare_window(run_a[label], run_b[label]) for label in shared}
        if len(shared) > 1:  # the windows' questions together (a qid is one question, whatever its window)
            results["all windows"] = compare_window({q: r for label in shared for q, r in run_a[label].items()},
                                                    {q: r for label in shared for q, r in run_b[label].items()})
    except NotARun as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    a, b = names
    for label in sorted(set(run_a) ^ set(run_b)):
        print(f"{label}: in one run only, left out")
    for label, r in results.items():
        print(f"\n{label}")
        print(f"  {describe_paired(r['all'], b, a)}")
        print(f"  F1 {r['f1_b']:.1f} against {r['f1_a']:.1f}" + (f"; {r['left_out']} questions in one run only"
                                                                 if r["left_out"] else ""))
        for name, text in (("read", f"where {a}'s reader reads an answer"), ("not_read", "on the rest")):
            if r[name] is not None:
                print(f"  {text}: {describe_paired(r[name], b, a)}")
    if args.out:
        args.out.write_text(json.dumps({"a": str(args.a), "b": str(args.b), "names": names, "windows": results},
                                       indent=1) + "\n")
        print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
