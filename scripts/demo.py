"""The main job (`make demo`): import news, ingest, train on the past, serve, ask three real questions over HTTP.

With the RealTimeQA slice at --data it imports the questions and articles of 2023-01..06, ingests
2023-01..04 and lets the ingest train on what is dated before 2023-04-01 (a re-ranker, then the Gemma
reader, each activated only if it beats what serves on March; --train-minutes bounds the reader),
ingests May and June without training, then asks three questions of 2023-04..06 (weeks no model
saw) whose answer the indexed news holds, and prints our answer beside the gold one. Without the data
it uses the shipped sample (36 invented articles, January-March 2024) with the packaged models
untrained. It ends by keeping the server up, printing the web page's address and the dashboard's
admin token, until Ctrl-C (--no-serve: stop after the questions). State lives under SQA_HOME
(default ./.sqa); re-running is cheap (imports are idempotent,
months already ingested are skipped, and a trained model is not trained again).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlencode

import httpx
from sqlalchemy import select

from app.bootstrap.builders import open_database
from app.server_process import ServerNotReady, free_port, port_is_free, served
from evaluation.metrics import answer_in_evidence, exact_match
from evaluation.subsets import needs_choices
from settings import get_settings
from store.tables import Article, Passage, Question

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "indexer" / "sample" / "realtimeqa"


def run(*args: str) -> None:
    print(f"\n$ sqa {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, check=True)


def pick_questions(since: str, until: str, n: int = 3, settings=None) -> list[tuple[str, str, str]]:
    """Three questions (text, date, gold) from different months whose evidence the index holds: one of
    the question's own articles (RealTimeQA's cited gold URLs, else its search results), stored and
    published on or before the question date, holds the gold answer in a sentence that also holds the
    question's words (evaluation.metrics.answer_in_evidence: "4" somewhere in a long article is no
    evidence that the article says how many). A store whose questions name no articles (the shipped
    sample) falls back to any passage published by then that holds such a sentence.
    """

    def cited_urls(q) -> list[str]:
        meta = q.meta or {}
        return meta.get("gold_urls") or meta.get("search_result_urls") or []

    db = open_database(settings or get_settings(), migrate=False)
    try:
        with db.sessions() as s:
            first, last = (
                dt.date.fromisoformat(since),
                dt.date.fromisoformat(until),
            )  # dates: PostgreSQL compares no strings
            questions = s.scalars(
                select(Question).where(Question.asked.between(first, last)).order_by(Question.asked, Question.qid)
            ).all()
            urls = {url for q in questions for url in cited_urls(q)}
            if urls:  # the cited articles alone
                articles = {
                    url: (published, text)
                    for url, published, text in s.execute(
                        select(Article.url, Article.published, Article.text).where(Article.url.in_(urls))
                    ).all()
                }
            else:  # no cited articles: every passage
                passages = s.execute(select(Passage.published, Passage.text)).all()
    finally:
        db.close()

    def answerable(q, gold: str) -> bool:
        if urls:
            return any(
                url in articles and articles[url][0] <= q.asked and answer_in_evidence(gold, q.text, articles[url][1])
                for url in cited_urls(q)
            )
        return any(p.published <= q.asked and answer_in_evidence(gold, q.text, p.text) for p in passages)

    chosen, months = [], set()
    for q in questions:
        gold = q.answers[0]
        month = q.asked.strftime("%Y-%m")
        if month in months or needs_choices(q.text) or len(gold.split()) > 4:
            continue
        if answerable(q, gold):
            chosen.append((q.text, q.asked.isoformat(), gold))
            months.add(month)
        if len(chosen) == n:
            break
    return chosen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--data",
        default=str(ROOT.parent / "shared" / "data" / "realtimeqa"),
        help="RealTimeQA repository clone or slice (default ../shared/data/realtimeqa)",
    )
    # The whole slice (2022-06 on): older articles answer recent questions too (recall@5 of 2023-04..06
    # 47.0 with news since 2022-06 against 41.6 since 2022-11-20; README, "Training elsewhere").
    ap.add_argument("--train-from", default="2022-06-01", help="the first day of news and questions imported")
    ap.add_argument("--since", default="2023-04-01", help="the first day asked about (training stops before it)")
    ap.add_argument("--until", default="2023-06-30")
    ap.add_argument("--train-minutes", type=float, default=10.0, help="the reader's training budget")
    ap.add_argument("--port", type=int, default=8000, help="the server's port (a free one if it is taken)")
    ap.add_argument("--no-serve", action="store_true", help="stop the server after the questions")
    args = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("SQA_PROGRESS", "1")
    data = Path(args.data)
    if data.exists():
        print(f"Using the RealTimeQA slice at {data} ({args.since}..{args.until}).")
        since, until = args.since, args.until
        run("import", "realtimeqa", str(data), "--since", args.train_from, "--until", until)
        # the months before the questions' window, then training on them (held back: the last one)
        run("ingest", "--through", since[:7], "--from", args.train_from[:7], "--train-minutes", str(args.train_minutes))
        run("ingest", "--through", until[:7], "--no-train")
    else:
        print(
            f"No RealTimeQA data at {data}: using the shipped sample ({SAMPLE}, invented news of 2024-01..03); "
            "36 articles are too few to train on, so the packaged models answer untrained."
        )
        since, until = "2024-01-01", "2024-03-31"
        run("import", "realtimeqa", str(SAMPLE))
        run("ingest", "--through", until[:7], "--from", since[:7], "--no-train")

    questions = pick_questions(since, until)
    print(
        "\n$ sqa serve   (loading the encoder and the Gemma 3 270M reader; the first start converts the "
        "packaged weights once, a few minutes)",
        flush=True,
    )
    log_path = Path(os.environ.get("SQA_HOME", ROOT / ".sqa")) / "demo-server.log"
    os.environ.setdefault("SQA_ADMIN_TOKEN", secrets.token_urlsafe(12))  # for the dashboard
    port = args.port if port_is_free(args.port) else free_port()
    try:
        with served(os.environ, log_path, ready_timeout_s=900, port=port) as server:
            print(f"ready in {server.startup_s:.0f} s: {server.ready}")
            right = 0
            for text, as_of, gold in questions:
                r = httpx.post(
                    f"{server.base}/v1/answers", json={"question": text, "as_of": as_of, "top_k": 5}, timeout=120
                )
                r.raise_for_status()
                body = r.json()
                print(f"\nQ (as of {as_of}): {text}")
                ok = exact_match(body["answer"], [gold]) == 1.0
                right += ok
                sure = f"confidence {body['confidence']:.2f}; " if body.get("confidence") is not None else ""
                print(
                    f"A: {body['answer'] or '(no answer)'}    [gold: {gold}]  {'right' if ok else 'wrong'}    "
                    f"({sure}{body['timings_ms']['total']:.0f} ms; {body['versions']['reader']}, "
                    f"{body['versions']['retriever']})"
                )
                stated = [i for i, p in enumerate(body["passages"], 1) if p["passage_id"] in body["evidence"]]
                print(
                    "   stated in passage " + ", ".join(f"[{i}]" for i in stated)
                    if stated
                    else "   not stated in any passage read: an inference or a guess"
                )
                for i, p in enumerate(body["passages"][:3], 1):
                    print(f"   [{i}] {p['published']}  {p['title'][:90]}\n       {p['url']}")
            print(f"\n{right} of {len(questions)} right (exact match after normalisation).")
            if args.no_serve:
                print(f"\nThe server at {server.base} is stopping. Run it yourself with `.venv/bin/sqa serve`.")
                return 0
            text, as_of, _ = questions[0] if questions else ("", until, "")
            print(f"\nThe web page: {server.base}/   (ask a question as of a date, and as of a second one beside it)")
            print(f"  this one:    {server.base}/?{urlencode({'q': text, 'as_of': as_of})}")
            print(f"The dashboard: {server.base}/dashboard   (admin token: {os.environ['SQA_ADMIN_TOKEN']})")
            print("The server keeps running until Ctrl-C.", flush=True)
            signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` stops it as Ctrl-C does
            try:
                server.process.wait()
            except KeyboardInterrupt:
                print("\nstopping the server")
    except ServerNotReady as exc:
        print(f"the server did not start: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
