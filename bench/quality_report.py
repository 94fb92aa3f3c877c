"""What bench_quality prints and pools: the splits of a window's answers (by what the reader reads,
by the question's own articles, a published system's on the same split), the pairing with that
system, and the windows pooled (the rolling decision's figures: EM/F1 with its interval, recall@k
weighted by each window's questions, the paired test over every question together)."""

from __future__ import annotations

from evaluation.bakeoff import score
from evaluation.paired import correct, describe_paired, em_interval, paired_em
from evaluation.trust import describe


def own_split(own_held: set[str], held: set[str], predictions: dict, questions) -> dict:
    """Of the questions whose own articles hold an answer (the evidence the benchmark gathered for
    them), how many the reader reads an answer for, and end-to-end EM on them and on the rest:
    whether what the reader misses is evidence the corpus has, or an answer it does not state."""
    split = split_by(own_held, predictions, questions)
    return {
        "n": split["n"],
        "read": len(own_held & held),
        "em": split["em_when_read"],
        "em_otherwise": split["em_otherwise"],
    }


def split_by(held: set[str], predictions: dict, questions, in_headline: set[str] = frozenset()) -> dict:
    """The share of questions whose answer lies in what the reader read, and end-to-end EM on those
    and on the rest: whether answers are lost in the ranking or in the reading. `headline_only`:
    those of `held` whose answer the reader sees only in a headline, and EM on them (what printing
    headlines adds)."""

    def em(qs) -> float:
        return round(100 * score(predictions, qs)["em"], 1) if qs else 0.0

    inside = [q for q in questions if q.qid in held]
    outside = [q for q in questions if q.qid not in held]
    titled = [q for q in inside if q.qid in in_headline]
    return {
        "share": round(100 * len(inside) / len(questions), 1) if questions else 0.0,
        "n": len(inside),
        "em_when_read": em(inside),
        "em_otherwise": em(outside),
        "headline_only": {"n": len(titled), "em": em(titled)},
    }


def baseline_split(m: dict, baseline: dict[str, str], questions) -> dict:
    """A published system's EM on the questions whose answer our reader reads and on the rest
    (`measure_window`'s split): whether the gap to it is in reading or in what we find."""
    held = {qid for qid, p in m["predictions"].items() if p["read"]}
    split = split_by(held, baseline, questions)
    return {"em_when_read": split["em_when_read"], "em_otherwise": split["em_otherwise"]}


def right_answers(predictions: dict[str, str | None], questions) -> dict[str, bool]:
    """qid -> whether the prediction matches a gold answer exactly (no prediction: wrong, as `score` counts it)."""
    return {q.qid: correct(predictions.get(q.qid), q.answers) for q in questions}


def print_window(label: str, m: dict, baseline: dict | None) -> None:
    r, e, g, lat = m["recall"], m["end_to_end"], m["gold_passage"], m["latency_ms"]
    print(f"\n{label}: {m['n']} questions (generation subset)")
    print(
        "  retrieval recall "
        + "  ".join(f"{k} {v:.1f}" for k, v in r.items())
        + f"   own articles {m['own_articles']:.1f}"
    )
    if "own_split" in m:
        o = m["own_split"]
        print(
            f"  own articles hold one for {o['n']}: the reader reads one for {o['read']} of them; "
            f"EM {o['em']:.1f} on them, {o['em_otherwise']:.1f} on the rest"
        )
    if "news" in m:
        print(
            "  in the news of the "
            + " / ".join(k.removesuffix("d") for k in m["news"])
            + " days before: "
            + " / ".join(f"{v:.1f}" for v in m["news"].values())
            + "% of questions"
        )
    interval = m.get("em_interval")
    print(
        f"  end to end        EM {e['em']:.1f}  F1 {e['f1']:.1f}  (n {e['n']})"
        + (
            f"  EM {round(100 * interval['level'])}% interval {interval['low']:.1f}..{interval['high']:.1f}"
            if interval
            else ""
        )
    )
    if "reader_reads_answer" in m:
        h = m["reader_reads_answer"]
        print(
            f"  reader reads one  {h['share']:.1f}% of questions (n {h['n']}): EM {h['em_when_read']:.1f} on those, "
            f"{h['em_otherwise']:.1f} on the rest"
        )
        t = h["headline_only"]
        print(f"    in a headline only: n {t['n']}, EM {t['em']:.1f} on those")
    for line in describe({"grounded": m.get("grounded"), "confidence": m.get("confidence")}):
        print("  " + line)
    if g["n"]:
        print(f"  gold passage      EM {g['em']:.1f}  F1 {g['f1']:.1f}  (n {g['n']}, {g['left_out']} without one)")
    if baseline is not None:
        print(
            f"  {baseline['system']:17s} EM {baseline['em']:.1f}  F1 {baseline['f1']:.1f}  (same questions): "
            f"EM {baseline['em_when_read']:.1f} where our reader reads an answer, {baseline['em_otherwise']:.1f} "
            "on the rest"
        )
        if baseline.get("paired"):
            print("    paired: " + describe_paired(baseline["paired"], "ours", "theirs"))
        if baseline.get("paired_answered"):
            print("    paired, the ones it answered: " + describe_paired(baseline["paired_answered"], "ours", "theirs"))
    print(
        "  latency ms        " + "  ".join(f"{s} p50 {v['p50_ms']} p95 {v['p95_ms']}" for s, v in lat.items() if v["n"])
    )


def end_to_end_predictions(m: dict) -> dict[str, str | None]:
    return {qid: p["e2e"] for qid, p in m["predictions"].items()}


def against_baseline(system: str, baseline: dict, m: dict, questions) -> dict | None:
    """The published system's EM/F1 on the same questions, and ours paired with it: over all of them
    (a question it did not answer counts as wrong) and over the ones it answered."""
    if not baseline:
        return None
    s = score(baseline, questions)
    ours = right_answers(end_to_end_predictions(m), questions)
    theirs = right_answers(baseline, questions)
    answered = [q for q in questions if q.qid in baseline]
    return {
        "system": system,
        "em": round(100 * s["em"], 1),
        "f1": round(100 * s["f1"], 1),
        "answered": s["answered"],
        **baseline_split(m, baseline, questions),
        "paired": paired_em(ours, theirs),
        "paired_answered": paired_em({q.qid: ours[q.qid] for q in answered}, {q.qid: theirs[q.qid] for q in answered})
        if answered
        else None,
    }


def pooled(results: dict, asked: dict, system: str, baseline: dict) -> dict:
    """The windows' questions together: EM/F1 with its interval, recall@k, and the paired test
    against the published system (the rolling decision's figures)."""
    questions = [q for label in results for q in asked[label]]
    e2e = {qid: r for m in results.values() for qid, r in end_to_end_predictions(m).items()}
    n = len(questions)
    recall = {
        k: round(sum(m["recall"][k] * m["n"] for m in results.values()) / n, 1)
        for k in next(iter(results.values()))["recall"]
    }
    joined = {"predictions": {qid: p for m in results.values() for qid, p in m["predictions"].items()}}
    s = score(e2e, questions)
    return {
        "n": n,
        "windows": list(results),
        "end_to_end": {"em": round(100 * s["em"], 1), "f1": round(100 * s["f1"], 1), "n": n},
        "em_interval": em_interval(right_answers(e2e, questions)),
        "recall": recall,
        "baseline": against_baseline(system, baseline, joined, questions),
    }


def print_pooled(p: dict) -> None:
    e, i = p["end_to_end"], p["em_interval"]
    print(f"\npooled ({len(p['windows'])} windows, {p['n']} questions)")
    print("  retrieval recall " + "  ".join(f"{k} {v:.1f}" for k, v in p["recall"].items()))
    print(
        f"  end to end        EM {e['em']:.1f}  F1 {e['f1']:.1f}  "
        f"EM {round(100 * i['level'])}% interval {i['low']:.1f}..{i['high']:.1f}"
    )
    b = p["baseline"]
    if b:
        print(f"  {b['system']:17s} EM {b['em']:.1f}  F1 {b['f1']:.1f}  (answered {b['answered']} of {p['n']})")
        print("    paired, all questions: " + describe_paired(b["paired"], "ours", "theirs"))
        if b.get("paired_answered"):
            print("    paired, the ones it answered: " + describe_paired(b["paired_answered"], "ours", "theirs"))
