"""Two runs of `bench.bench_quality`, paired question by question: is B better than A, or only
luckier?

    .venv/bin/python -m bench.compare_quality /tmp/default.json /tmp/variant.json --names default,variant

For each window both runs measured, on the questions both runs asked: each run's end-to-end EM and
F1, B's difference from A, the questions only one of them gets right (gained and lost going from A
to B), the exact McNemar p-value of that split and a paired bootstrap interval of the EM difference
(evaluation.paired: the p-value is the test, the interval approximate), and the same split where
A's reader reads an answer and where it does not; with several windows, the same figures over all
their questions together (`all windows`: the test is stronger on more questions). A window or a
question only one run has is left out and said, and so is a difference in the runs' --seed or
--max-questions. Exit code 2 for a file that is not such a run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evaluation.metrics import token_f1
from evaluation.paired import correct, describe_paired, paired_em

POOLED = "all windows"


class NotARun(ValueError):
    """A file that is not the --out of bench.bench_quality."""


def load_run(path: Path) -> tuple[dict, dict]:
    """(config, {window label: {qid: prediction record}}) of one bench_quality --out file; NotARun
    naming the file (and the window and question) for anything else."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise NotARun(f"{path}: cannot read it as JSON ({exc})") from exc
    windows = data.get("windows") if isinstance(data, dict) else None
    if not isinstance(windows, dict) or not all(
        isinstance(w, dict) and isinstance(w.get("predictions"), dict) for w in windows.values()
    ):
        raise NotARun(f"{path}: not a bench.bench_quality --out file (no windows with predictions)")
    for label, w in windows.items():
        for qid, r in w["predictions"].items():
            if not isinstance(r, dict) or "e2e" not in r or not isinstance(r.get("answers"), list):
                raise NotARun(
                    f"{path}: window {label}, question {qid}: a prediction needs 'e2e' and a list of 'answers'"
                )
    return data.get("config") or {}, {label: w["predictions"] for label, w in windows.items()}


def _right(preds: dict, qids) -> dict[str, bool]:
    return {q: correct(preds[q]["e2e"], preds[q]["answers"]) for q in qids}


def _f1(preds: dict, qids) -> float:
    return round(100 * sum(token_f1(preds[q]["e2e"] or "", preds[q]["answers"]) for q in qids) / len(qids), 1)


# paired_em(B, A)'s keys -> their names by role (B is new, A the reference); the others keep theirs.
_ROLES = {"em_a": "em_new", "em_b": "em_ref", "only_a": "gained", "only_b": "lost"}


def _new_against_reference(new: dict, ref: dict, qids) -> dict:
    """`paired_em` of B (new) against A (the reference), with the keys named by role: em_new, em_ref,
    difference (B - A), gained (only B right), lost (only A right), p, low, high, level, n."""
    return {_ROLES.get(k, k): v for k, v in paired_em(_right(new, qids), _right(ref, qids)).items() if k != "left_out"}


def _describe(r: dict, a: str, b: str) -> str:
    """`describe_paired`'s line for B against A."""
    back = {role: key for key, role in _ROLES.items()}
    return describe_paired({back.get(k, k): v for k, v in r.items()}, b, a)


def compare_window(a: dict, b: dict) -> dict | None:
    """A window's paired figures, B against A (both runs' predictions by qid): overall, and split by
    whether A's reader reads an answer (`read`, `not_read`); F1 of each; `left_out` counts the
    questions only one run has. None when the runs share no question there."""
    common = [q for q in a if q in b]
    if not common:
        return None
    out = {
        "all": _new_against_reference(b, a, common),
        "f1_ref": _f1(a, common),
        "f1_new": _f1(b, common),
        "left_out": len(set(a) ^ set(b)),
    }
    for name, keep in (("read", True), ("not_read", False)):
        part = [q for q in common if bool(a[q].get("read")) is keep]
        out[name] = _new_against_reference(b, a, part) if part else None
    return out


def _config_differences(config_a: dict, config_b: dict) -> list[str]:
    return [
        f"{key} {config_a.get(key)} against {config_b.get(key)}"
        for key in ("seed", "max_questions")
        if key in config_a and key in config_b and config_a[key] != config_b[key]
    ]


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
    a, b = names
    try:
        (config_a, run_a), (config_b, run_b) = load_run(args.a), load_run(args.b)
    except NotARun as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    windows = {label: compare_window(run_a[label], run_b[label]) for label in run_a if label in run_b}
    shared = [label for label, r in windows.items() if r is not None]
    if not shared:
        print(
            f"error: {args.a} and {args.b} share no question in any window "
            f"({', '.join(run_a)} against {', '.join(run_b)})",
            file=sys.stderr,
        )
        return 2
    for difference in _config_differences(config_a, config_b):
        print(f"note: the runs were sampled differently ({difference}): only the questions both asked are paired")
    for label in sorted(set(run_a) ^ set(run_b)):
        print(f"{label}: in one run only, left out")
    for label in [label for label, r in windows.items() if r is None]:
        print(f"{label}: no question in both runs, left out")
    results = {label: windows[label] for label in shared}
    pooled = None
    if len(shared) > 1:  # the windows' questions together (a qid is one question, whatever its window)
        pooled = compare_window(
            {q: r for label in shared for q, r in run_a[label].items()},
            {q: r for label in shared for q, r in run_b[label].items()},
        )
    for label, r in [*results.items(), *([(POOLED, pooled)] if pooled else [])]:
        print(f"\n{label}")
        print(f"  {_describe(r['all'], a, b)}")
        left = r["left_out"]
        print(
            f"  F1 {b} {r['f1_new']:.1f} against {a} {r['f1_ref']:.1f}"
            + (f"; {left} question{'s' if left != 1 else ''} in one run only" if left else "")
        )
        for name, text in (("read", f"where {a}'s reader reads an answer"), ("not_read", "on the rest")):
            if r[name] is not None:
                print(f"  {text}: {_describe(r[name], a, b)}")
    if args.out:
        args.out.write_text(
            json.dumps(
                {"a": str(args.a), "b": str(args.b), "names": names, "windows": results, "pooled": pooled}, indent=1
            )
            + "\n"
        )
        print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
