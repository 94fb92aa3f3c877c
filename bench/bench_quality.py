"""Where answers are lost, on the served pipeline: retrieval recall, the reader on the retrieved and
on the gold passage, end to end, and the time of each stage, on fixed question sets.

    .venv/bin/python -m bench.bench_quality --home "$SQA_HOME" --out /tmp/quality.json
    SQA_READER=first-entity .venv/bin/python -m bench.bench_quality --home "$SQA_HOME" --windows 2023-04-01:2023-06-30

It builds the answer service exactly as `sqa serve` does (app.bootstrap.builders.build_answer_service: the
SQA_* settings of the environment with their defaults: retriever, reader, passages) over the home's
serving snapshot, and for each window (default: 2023-01..03, the tuning quarter, and 2023-04..06,
the reporting quarter) takes RealTimeQA's generation subset of the window's questions (a --seed
sample of --max-questions), each asked as of its own date:

- recall@1/5/10/20/50: the share of questions whose top-k retrieved passages (the service's
  retriever, same date filter) hold a gold answer string; `own articles`: the share whose own
  search-result articles, as stored, hold one (a ceiling for any retriever over this corpus);
  `in the news of the 7 / 30 days before`: the share whose answer string occurs in any stored
  article published on the question's date or in the N days before it: how many answers the
  week's or the month's news holds at all, whatever finds them;
- end to end: `service.answer(question, as_of)` as the API runs it (EM/F1, and timings_ms per stage);
- gold passage: the same reader given only the stored passage that holds the answer (reading
  without retrieval; questions without one are left out of that row and counted);
- a published system's answers on the same question ids (--baseline, GPT-3 + Google search), also
  split by whether our reader reads an answer: where the gap to it lies, in reading or in finding;
  and paired with ours (evaluation.paired): the questions only one of the two gets right, the exact
  McNemar p-value and a bootstrap interval of the EM difference, so a gap of a few questions is not
  read as more than the questions' luck. End-to-end EM comes with its own bootstrap interval.
  `python -m bench.compare_quality A.json B.json` pairs two runs of this benchmark the same way.

`--snapshot ID` measures over a recorded index state instead of the serving one: the index as it stood
before the window (lag -1Q in StreamingQA's terms) against the serving one (0Q), the reader unchanged.

Every answer is appended to `<out>.partial.jsonl`; a rerun with the same --out reuses the answers of
the same reader, snapshot and question, so a long run can be killed and resumed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from sqlalchemy import select
from tqdm import tqdm

# What the benchmarks over a home's questions share: the served pipeline, the windows and their options.
from bench.served_questions import (
    KS,
    NotReady,
    each_window,
    open_recorded_snapshot,
    open_served,
    own_article_hit,
    parsed_windows,
    question_arguments,
)
from evaluation.bakeoff import latency_summary, load_baseline_predictions, score
from evaluation.metrics import answer_in_text
from evaluation.paired import correct, describe_paired, em_interval, paired_em
from evaluation.recent_news import RecentNews
from evaluation.trust import Judged, confidence_bands, describe, grounded_split
from indexer.records import ImportReport
from models.reader_base import RetrievedPassage
from store.tables import Article
from workers.bakeoff_gold import gold_passage

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "realtimeqa"
DEFAULT_WINDOWS = "2023-01-01:2023-03-31,2023-04-01:2023-06-30"
NEWS_DAYS = (7, 30)  # "in the news of the N days before the question"


class AnswerCache:
    """(kind, reader, snapshot, qid) -> {"prediction", "ms"}, appended to a JSONL file as it goes."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.rows = path, {}
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                r = json.loads(line)
                self.rows[(r["kind"], r["reader"], r["snapshot"], r["qid"])] = r

    def get(self, *key):
        return self.rows.get(key)

    def add(self, record: dict) -> None:
        self.rows[(record["kind"], record["reader"], record["snapshot"], record["qid"])] = record
        if self.path is not None:
            with open(self.path, "a") as fh:
                fh.write(json.dumps(record) + "\n")


def stored_articles(session):
    """RecentNews's `articles`: (published, text) of the stored articles published in [first, last],
    by day (and id within a day)."""

    def between(first: dt.date, last: dt.date):
        return session.execute(
            select(Article.published, Article.text)
            .where(Article.published >= first, Article.published <= last)
            .order_by(Article.published, Article.id)
        ).all()

    return between


def measure_window(service, sessions, snap, questions, cache: AnswerCache, *, bar: bool) -> dict:
    from serving.answering import answer_evidence  # noqa: PLC0415 (lazy: serving.answering pulls faiss)

    reader = service.reader
    hits = {k: 0 for k in KS}
    own_held: set[str] = set()  # questions whose own articles hold an answer
    e2e, gold, times = {}, {}, {"retrieve": [], "rerank": [], "read": [], "total": [], "gold_read": []}
    n_gold = 0
    held: set[str] = set()  # questions whose answer lies in what the reader reads
    grounded: set[str] = set()  # questions whose end-to-end answer a passage read states
    confidence: dict[str, float] = {}  # the reader's probability of its end-to-end answer
    in_headline: set[str] = set()  # ... of those, only in a headline the reader reads
    n_read = service.passages_for(reader)
    news: dict[int, set[str]] = {days: set() for days in NEWS_DAYS}  # questions whose answer the N days' news holds
    with sessions() as session:
        recent = RecentNews(questions, stored_articles(session), NEWS_DAYS)
        for q in tqdm(questions, desc="questions", unit="q", disable=not bar, file=sys.stderr):
            found = service.retriever.retrieve(session, snap, q.text, q.asked, max(KS))
            assert all(p.published <= q.asked for p in found), "a passage published after the question date"
            has = [answer_in_text(list(q.answers), p.text) for p in found]
            for k in KS:
                hits[k] += any(has[:k])
            if own_article_hit(session, q):
                own_held.add(q.qid)
            for days in NEWS_DAYS:
                if recent.holds(q, days):
                    news[days].add(q.qid)
            top = found[:n_read]
            if _reads_answer(reader, q, top):
                held.add(q.qid)
                # The same passages without headlines: a reader that prints them (models.reader_context.add_titles)
                # then reads what it would read without them.
                if not _reads_answer(reader, q, [replace(p, title="") for p in top]):
                    in_headline.add(q.qid)

            r = cache.get("e2e", reader.name, snap.snapshot_id, q.qid)
            if r is None:
                result = service.answer(q.text, q.asked, snapshot=snap)
                r = {
                    "kind": "e2e",
                    "reader": reader.name,
                    "snapshot": snap.snapshot_id,
                    "qid": q.qid,
                    "prediction": result.answer,
                    "timings_ms": result.timings_ms,
                    "confidence": result.confidence,
                }
                cache.add(r)
            e2e[q.qid] = r["prediction"]
            if r.get("confidence") is not None:  # a reader that gives one (answers cached before it did not)
                confidence[q.qid] = r["confidence"]
            if answer_evidence(r["prediction"], top):
                grounded.add(q.qid)
            for stage in ("retrieve", "rerank", "read", "total"):
                if stage in r["timings_ms"]:  # rerank: only with a re-ranker version serving
                    times[stage].append(r["timings_ms"][stage])

            row = gold_passage(session, q)
            if row is None:
                continue
            n_gold += 1
            g = cache.get("gold", reader.name, snap.snapshot_id, q.qid)
            if g is None:
                t0 = time.perf_counter()
                text = reader.generate(
                    q.text, q.asked, [RetrievedPassage(row.article.title, row.text, row.published)]
                ).text
                g = {
                    "kind": "gold",
                    "reader": reader.name,
                    "snapshot": snap.snapshot_id,
                    "qid": q.qid,
                    "prediction": text,
                    "ms": round((time.perf_counter() - t0) * 1000, 2),
                }
                cache.add(g)
            gold[q.qid] = g["prediction"]
            times["gold_read"].append(g["ms"])
    n = len(questions)
    with_gold = [q for q in questions if q.qid in gold]
    judged = [Judged(score(e2e, [q])["em"] == 1.0, q.qid in grounded, confidence.get(q.qid)) for q in questions]
    return {
        "n": n,
        "recall": {f"@{k}": round(100 * hits[k] / n, 1) if n else 0.0 for k in KS},
        "own_articles": round(100 * len(own_held) / n, 1) if n else 0.0,
        "own_split": _own_split(own_held, held, e2e, questions),
        "news": {f"{days}d": round(100 * len(held_by) / n, 1) if n else 0.0 for days, held_by in news.items()},
        "reader_reads_answer": _split_by(held, e2e, questions, in_headline),
        "grounded": grounded_split(judged),
        "confidence": confidence_bands(judged),
        "end_to_end": {k: round(100 * v, 1) if k in ("em", "f1") else v for k, v in score(e2e, questions).items()},
        "gold_passage": {
            **{k: round(100 * v, 1) if k in ("em", "f1") else v for k, v in score(gold, with_gold).items()},
            "left_out": n - n_gold,
        },
        "latency_ms": {stage: latency_summary(ms) for stage, ms in times.items()},
        "predictions": {
            q.qid: {
                "e2e": e2e.get(q.qid),
                "gold": gold.get(q.qid),
                "answers": list(q.answers),
                "read": q.qid in held,
                "own": q.qid in own_held,
                "grounded": q.qid in grounded,
                "news_days": min((d for d in NEWS_DAYS if q.qid in news[d]), default=None),
                "confidence": confidence.get(q.qid),
            }
            for q in questions
        },
    }


def _reads_answer(reader, question, passages) -> bool:
    """Whether a gold answer string lies in what `reader` reads of the ranked `passages` (its
    context as cut, headlines included where it prints them), date prefixes left out."""
    read = reader.context(question.text, passages) if hasattr(reader, "context") else passages
    return any(answer_in_text(list(question.answers), p.text) for p in read)


def _own_split(own_held: set[str], held: set[str], predictions: dict, questions) -> dict:
    """Of the questions whose own articles hold an answer (the evidence the benchmark gathered for
    them), how many the reader reads an answer for, and end-to-end EM on them and on the rest:
    whether what the reader misses is evidence the corpus has, or an answer it does not state."""
    split = _split_by(own_held, predictions, questions)
    return {
        "n": split["n"],
        "read": len(own_held & held),
        "em": split["em_when_read"],
        "em_otherwise": split["em_otherwise"],
    }


def _split_by(held: set[str], predictions: dict, questions, in_headline: set[str] = frozenset()) -> dict:
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
    split = _split_by(held, baseline, questions)
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
    print(f"  gold passage      EM {g['em']:.1f}  F1 {g['f1']:.1f}  (n {g['n']}, {g['left_out']} without one)")
    if baseline is not None:
        print(
            f"  {baseline['system']:17s} EM {baseline['em']:.1f}  F1 {baseline['f1']:.1f}  (same questions): "
            f"EM {baseline['em_when_read']:.1f} where our reader reads an answer, {baseline['em_otherwise']:.1f} "
            "on the rest"
        )
        if baseline.get("paired"):
            print("    paired: " + describe_paired(baseline["paired"], "ours", "theirs"))
    print(
        "  latency ms        " + "  ".join(f"{s} p50 {v['p50_ms']} p95 {v['p95_ms']}" for s, v in lat.items() if v["n"])
    )


def parse_args(argv):
    ap = question_arguments(__doc__, DEFAULT_WINDOWS, 150)
    ap.add_argument("--baseline", default="open_gpt3_gcs_gen", help="a published system ('' for none)")
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="RealTimeQA tree holding baseline_results/")
    ap.add_argument("--out", help="write everything here (JSON); answers cached in <out>.partial.jsonl")
    ap.add_argument(
        "--snapshot",
        help="measure over this recorded index state instead of the serving one "
        "(`sqa index status` lists them): an index that stopped before the "
        "window, against the serving one, is StreamingQA's lag -1Q against 0Q",
    )
    return parsed_windows(ap, argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bar = sys.stderr.isatty() or os.environ.get("SQA_PROGRESS") == "1"
    home = Path(args.home)
    t0 = time.perf_counter()
    try:
        db, service, snap = open_served(home)
    except NotReady as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.snapshot:
            snap = open_recorded_snapshot(service, db, args.snapshot)
            if snap is None:
                print(
                    f"error: no index snapshot {args.snapshot!r} in {home} (`sqa index status` lists them)",
                    file=sys.stderr,
                )
                return 2
        load_s = round(time.perf_counter() - t0, 1)
        reader = service.reader
        print(
            f"served pipeline: retriever {service.retriever.name}, reader {reader.name} "
            f"({service.passages_for(reader)} passages), encoder {snap.manifest.encoder}, snapshot "
            f"{snap.snapshot_id} (newest article {snap.newest_day}); loaded in {load_s} s"
        )
        baseline = load_baseline_predictions(Path(args.data), args.baseline, ImportReport()) if args.baseline else {}
        cache = AnswerCache(Path(args.out + ".partial.jsonl") if args.out else None)
        results = {}
        for label, last, questions, left_out in each_window(db, args):
            if snap.newest_day is not None and snap.newest_day < last:
                print(f"note: the index ends on {snap.newest_day}, before {last}: is the window ingested?")
            m = measure_window(service, db.sessions, snap, questions, cache, bar=bar)
            ours = right_answers({qid: p["e2e"] for qid, p in m["predictions"].items()}, questions)
            m["em_interval"] = em_interval(ours)
            base = None
            if baseline:
                s = score(baseline, questions)
                base = {
                    "system": args.baseline,
                    "em": round(100 * s["em"], 1),
                    "f1": round(100 * s["f1"], 1),
                    "answered": s["answered"],
                    **baseline_split(m, baseline, questions),
                    "paired": paired_em(ours, right_answers(baseline, questions)),
                }
            m.update(left_out_of_subset=dict(left_out), baseline=base)
            print_window(label, m, base)
            results[label] = m
    finally:
        db.close()
    if args.out:
        config = {
            "home": str(home),
            "retriever": service.retriever.name,
            "reader": reader.name,
            "passages": service.passages_for(reader),
            "snapshot": snap.snapshot_id,
            "max_questions": args.max_questions,
            "seed": args.seed,
            "cpu_count": os.cpu_count(),
            "loadavg": list(os.getloadavg()),
        }
        Path(args.out).write_text(json.dumps({"config": config, "windows": results}, indent=1) + "\n")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
