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

import argparse
import datetime as dt
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from sqlalchemy import select
from tqdm import tqdm

from bench.quality_report import (
    against_baseline,
    end_to_end_predictions,
    own_split,
    pooled,
    print_pooled,
    print_window,
    right_answers,
    split_by,
)
from bench.rolling import ROLLING_WINDOWS, build_rolling_home, load_record, window_reader, window_versions

# What the benchmarks over a home's questions share: the served pipeline, the windows and their options.
from bench.served_questions import (
    KS,
    NotReady,
    open_recorded_snapshot,
    open_served,
    own_article_hit,
    parsed_windows,
    question_arguments,
    window_questions,
)
from evaluation.bakeoff import latency_summary, load_baseline_predictions, score
from evaluation.metrics import answer_in_text
from evaluation.paired import em_interval
from evaluation.recent_news import RecentNews
from evaluation.trust import Judged, confidence_bands, grounded_split
from indexer.records import ImportReport
from models.reader_base import RetrievedPassage
from serving.errors import NotFoundError
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


def measure_window(
    service, sessions, snap, questions, cache: AnswerCache, *, bar: bool, gold_read: bool = True
) -> dict:
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

            row = gold_passage(session, q) if gold_read else None
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
        "own_split": own_split(own_held, held, e2e, questions),
        "news": {f"{days}d": round(100 * len(held_by) / n, 1) if n else 0.0 for days, held_by in news.items()},
        "reader_reads_answer": split_by(held, e2e, questions, in_headline),
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


def window_rerankers(text: str) -> dict[str, str]:
    """--rerankers' value: {window's first day (ISO): version or "none"}."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, sep, version = part.partition("=")
        try:
            day = dt.date.fromisoformat(first.strip()).isoformat()
        except ValueError:
            day = ""
        if not sep or not day or not version.strip():
            example = "2022-10-01=reranker-2022-10-01-ab12cd"
            raise argparse.ArgumentTypeError(f"{part!r} is not FIRST=VERSION (e.g. {example})")
        out[day] = version.strip()
    return out


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
    ap.add_argument(
        "--rolling",
        action="store_true",
        help=f"rolling windows (default {ROLLING_WINDOWS}): each answered by the reader and re-ranker the "
        "home served at the window's start (bench/rolling.py), pooled; every reading kept in --readings",
    )
    ap.add_argument("--build", action="store_true", help="--rolling: import and ingest the home window by window first")
    ap.add_argument("--train-minutes", type=float, default=10.0, help="--build: each window's reader training budget")
    ap.add_argument("--readings", help="--rolling: the readings kept across runs (default HOME/bench/readings.jsonl)")
    ap.add_argument(
        "--rerankers",
        type=window_rerankers,
        default={},
        help="--rolling: FIRST=VERSION[,FIRST=VERSION...]: answer the window starting FIRST with this "
        "re-ranker version of the home ('none': no re-ranker) instead of the one rolling.json recorded "
        "(a version trained later with `sqa train reranker --until FIRST`, compared on the same readers)",
    )
    ap.add_argument("--no-gold", action="store_true", help="skip reading each question's gold passage alone")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--rolling" in argv and "--windows" not in argv and not any(a.startswith("--windows=") for a in argv):
        argv += ["--windows", ROLLING_WINDOWS]
    args = parsed_windows(ap, argv)
    if (args.build or args.readings or args.rerankers) and not args.rolling:
        ap.error("--build, --readings and --rerankers go with --rolling")
    unknown = sorted(set(args.rerankers) - {first.isoformat() for first, _ in args.windows})
    if unknown:
        ap.error(f"--rerankers names {', '.join(unknown)}: no window starts there")
    if args.rolling and args.snapshot:
        ap.error("--rolling answers over the serving snapshot: leave out --snapshot")
    return args


def measure_windows(args, home: Path, baseline: dict, bar: bool) -> tuple[dict, dict, dict] | int:
    """Every window over one served pipeline (or, --rolling, each over its own models): (results by
    window, the questions by window, the run's config); an exit code when the home cannot serve."""
    record = load_record(home) if args.rolling else {}
    readings = Path(args.readings) if args.readings else home / "bench" / "readings.jsonl"
    results, asked, config = {}, {}, {}
    opened = None  # (db, service, snap) when one pipeline serves every window
    try:
        for first, last in args.windows:
            pins: dict = {}
            if args.rolling:
                try:
                    versions = window_versions(record, first)
                except KeyError as exc:
                    print(f"error: {exc.args[0]}", file=sys.stderr)
                    return 2
                pins = {"reader": window_reader(versions["reader"], os.environ.get("SQA_READER", "auto"))}
                reranker = args.rerankers.get(first.isoformat(), versions["reranker"])
                pins.update(reranker=None if reranker == "none" else reranker, readings=readings)
            if opened is None or args.rolling:
                if opened is not None:
                    opened[0].close()
                t0 = time.perf_counter()
                try:
                    opened = open_served(home, **pins)
                except (NotReady, NotFoundError) as exc:  # NotFoundError: a pinned re-ranker version not in the home
                    print(f"error: {exc}", file=sys.stderr)
                    return 2
                db, service, snap = opened
                if args.snapshot:
                    snap = open_recorded_snapshot(service, db, args.snapshot)
                    if snap is None:
                        print(
                            f"error: no index snapshot {args.snapshot!r} in {home} (`sqa index status` lists them)",
                            file=sys.stderr,
                        )
                        return 2
                    opened = (db, service, snap)
                reader = service.reader
                print(
                    f"served pipeline: retriever {service.retriever.name}, reader {reader.name} "
                    f"({service.passages_for(reader)} passages), encoder {snap.manifest.encoder}, snapshot "
                    f"{snap.snapshot_id} (newest article {snap.newest_day}); loaded in "
                    f"{time.perf_counter() - t0:.1f} s"
                )
            db, service, snap = opened
            label = f"{first}..{last}"
            questions, left_out = window_questions(db, first, last, args.max_questions, args.seed)
            if not questions:
                print(f"\n{label}: no questions in this window (imported?)")
                continue
            if snap.newest_day is not None and snap.newest_day < last:
                print(f"note: the index ends on {snap.newest_day}, before {last}: is the window ingested?")
            # --rolling: the readings file is the cache (a variant re-reads only what it changed)
            cache = AnswerCache(Path(args.out + ".partial.jsonl") if args.out and not args.rolling else None)
            m = measure_window(service, db.sessions, snap, questions, cache, bar=bar, gold_read=not args.no_gold)
            m["em_interval"] = em_interval(right_answers(end_to_end_predictions(m), questions))
            base = against_baseline(args.baseline, baseline, m, questions)
            m.update(left_out_of_subset=dict(left_out), baseline=base)
            reader = service.reader
            m["served"] = {"retriever": service.retriever.name, "reader": reader.name}
            if args.rolling:
                m["served"]["readings_reused"] = reader.hits
            print_window(label, m, base)
            results[label], asked[label] = m, questions
            config = {
                "retriever": service.retriever.name,
                "reader": reader.name,
                "passages": service.passages_for(reader),
                "snapshot": snap.snapshot_id,
            }
    finally:
        if opened is not None:
            opened[0].close()
    return results, asked, config


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bar = sys.stderr.isatty() or os.environ.get("SQA_PROGRESS") == "1"
    home = Path(args.home)
    if args.build:
        data = Path(args.data)
        if not (data / "past").is_dir():
            print(f"error: no RealTimeQA slice at {data} (give --data)", file=sys.stderr)
            return 2
        build_rolling_home(home, args.windows, data=data, train_minutes=args.train_minutes)
    baseline = load_baseline_predictions(Path(args.data), args.baseline, ImportReport()) if args.baseline else {}
    measured = measure_windows(args, home, baseline, bar)
    if isinstance(measured, int):
        return measured
    results, asked, served = measured
    summary = pooled(results, asked, args.baseline, baseline) if len(results) > 1 else None
    if summary:
        print_pooled(summary)
    if args.out:
        config = {
            "home": str(home),
            **served,
            "rolling": load_record(home) if args.rolling else None,
            "max_questions": args.max_questions,
            "seed": args.seed,
            "cpu_count": os.cpu_count(),
            "loadavg": list(os.getloadavg()),
        }
        Path(args.out).write_text(
            json.dumps({"config": config, "windows": results, "pooled": summary}, indent=1) + "\n"
        )
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
