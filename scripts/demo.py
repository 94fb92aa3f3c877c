"""The main job (`make demo`): import news, answer at once from the newest month, then index the rest
and train in the background, swapping to the trained reader only when it answers better.

With the RealTimeQA slice at --data:
1. First answer: import the questions and articles of 2022-06..2023-06, index the newest month
   (2023-06) while the server starts with the untrained Gemma 3 270M reader, then ask three questions
   of that month whose evidence it holds, over HTTP, and print our answer beside the gold one.
2. In the background of the running server: index the four months before the questions' window
   (2022-12..2023-03, --train-months) and April, and let that ingest train on what is dated before
   2023-04-01 (a re-ranker, then the reader; each is activated only if it beats what serves on March;
   --train-minutes bounds the reader); then index May, then backfill the older news (2022-06..11).
   The server picks up each new snapshot and the newly activated reader by itself. Training before
   the backfill brings the trained reader about as many minutes sooner as the older months take to
   index; the backfill then serves questions whose evidence is older.
3. Ask the same three questions again and say which reader answered, when it took over, and how many
   each got right.

Every step prints the time since the demo started. Without the data it uses the shipped sample
(36 invented articles, January-March 2024): March first, then January and February, with the
packaged models untrained (too few articles to train on). It ends by keeping the server up, printing
the web page's address and the dashboard's admin token, until Ctrl-C (--no-serve: stop after the
questions). State lives under SQA_HOME (default ./.sqa); re-running is cheap (imports are idempotent,
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
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

import httpx
from sqlalchemy import select

from app.bootstrap.builders import open_database
from app.server_process import ServerNotReady, free_port, port_is_free, served
from evaluation.metrics import answer_in_evidence, exact_match
from evaluation.subsets import needs_choices
from indexer.dates import month_key, months_before, parse_month
from settings import get_settings
from store.tables import Article, Passage, Question

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "indexer" / "sample" / "realtimeqa"


T0 = time.monotonic()
TRAINING = " and training on what is dated before the questions' window"
FAILED: list[int] = []  # exit codes of the steps that failed beside the server's start


def say(message: str) -> None:
    """A line of the demo's story, stamped with the minutes and seconds since it started."""
    m, s = divmod(int(time.monotonic() - T0), 60)
    print(f"\n[{m}m{s:02d}s] {message}", flush=True)


def sqa(*args: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", *args]


def run(*args: str) -> None:
    say(f"$ sqa {' '.join(args)}")
    subprocess.run(sqa(*args), cwd=ROOT, check=True)


def pick_questions(
    since: str, until: str, n: int = 3, settings=None, *, indexed_from: str | None = None, per: str = "month"
) -> list[tuple[str, str, str]]:
    """Three questions (text, date, gold), each from a different month (per="week": week), whose
    evidence the index holds: one of the question's own articles (RealTimeQA's cited gold URLs, else
    its search results), stored and published on or before the question date (and on or after
    `indexed_from`, the first day indexed), holds the gold answer in a sentence that also holds the
    question's words (evaluation.metrics.answer_in_evidence: "4" somewhere in a long article is no
    evidence that the article says how many). A store whose questions name no articles (the shipped
    sample) falls back to any passage published by then that holds such a sentence.
    """
    spread = {"month": "%Y-%m", "week": "%G-W%V"}[per]
    first_indexed = dt.date.fromisoformat(indexed_from) if indexed_from else dt.date.min

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
                url in articles
                and first_indexed <= articles[url][0] <= q.asked
                and answer_in_evidence(gold, q.text, articles[url][1])
                for url in cited_urls(q)
            )
        return any(
            first_indexed <= p.published <= q.asked and answer_in_evidence(gold, q.text, p.text) for p in passages
        )

    chosen, spans = [], set()
    for q in questions:
        gold = q.answers[0]
        span = q.asked.strftime(spread)
        if span in spans or needs_choices(q.text) or len(gold.split()) > 4:
            continue
        if answerable(q, gold):
            chosen.append((q.text, q.asked.isoformat(), gold))
            spans.add(span)
        if len(chosen) == n:
            break
    return chosen


def ask(base: str, questions: list[tuple[str, str, str]]) -> tuple[int, str]:
    """Ask each question over HTTP and print the answer beside the gold one; (right, reader)."""
    right, reader = 0, ""
    for text, as_of, gold in questions:
        r = httpx.post(f"{base}/v1/answers", json={"question": text, "as_of": as_of, "top_k": 5}, timeout=120)
        r.raise_for_status()
        body = r.json()
        reader = body["versions"]["reader"]
        print(f"\nQ (as of {as_of}): {text}")
        ok = exact_match(body["answer"], [gold]) == 1.0
        right += ok
        sure = f"confidence {body['confidence']:.2f}; " if body.get("confidence") is not None else ""
        print(
            f"A: {body['answer'] or '(no answer)'}    [gold: {gold}]  {'right' if ok else 'wrong'}    "
            f"({sure}{body['timings_ms']['total']:.0f} ms; {reader}, {body['versions']['retriever']})"
        )
        stated = [i for i, p in enumerate(body["passages"], 1) if p["passage_id"] in body["evidence"]]
        print(
            "   stated in passage " + ", ".join(f"[{i}]" for i in stated)
            if stated
            else "   not stated in any passage read: an inference or a guess"
        )
        for i, p in enumerate(body["passages"][:3], 1):
            print(f"   [{i}] {p['published']}  {p['title'][:90]}\n       {p['url']}")
    print(f"\n{right} of {len(questions)} right (exact match after normalisation), read by {reader}.")
    return right, reader


def serving_reader(base: str, token: str) -> tuple[str | None, str | None]:
    """(the active version in the registry, the version this server serves), from GET /admin/models."""
    r = httpx.get(f"{base}/admin/models", headers={"X-Admin-Token": token}, timeout=30)
    r.raise_for_status()
    body = r.json()
    active = next((v["version"] for v in body["versions"] if v["active"]), None)
    return active, body["serving"]["version"]


def wait_for_active_reader(base: str, token: str, timeout_s: float = 180.0) -> str | None:
    """The newly activated version once the server serves it (it polls the registry); None when no
    version is active (the training did not beat the untrained reader, or nothing trained)."""
    deadline = time.monotonic() + timeout_s
    while True:
        active, serving = serving_reader(base, token)
        if active is None or active == serving:
            return active
        if time.monotonic() > deadline:
            raise ServerNotReady(f"the server still serves {serving!r} {timeout_s:.0f} s after {active} was activated")
        time.sleep(2)


def stop_if_failed(step: subprocess.Popen) -> None:
    """Watch a step that runs beside the server's start: if it fails, stop the demo (the server
    would otherwise wait its whole start-up timeout for a snapshot that never comes)."""
    if step.wait() != 0:
        FAILED.append(step.returncode)
        print(f"\n{' '.join(map(str, step.args[2:]))} failed (exit code {step.returncode}): stopping", file=sys.stderr)
        signal.raise_signal(signal.SIGTERM)  # handled as Ctrl-C in the main thread: every child stops


def demo_backfill(
    train_from: str, since: str, until: str, train_months: int, train_minutes: float
) -> list[tuple[str, ...]]:
    """The ingests that follow the first answers: the `train_months` months before `since` (all from
    `train_from` with 0) and `since`'s month, trained on what is dated before `since`; the months up to
    `until`; then the older months from `train_from` (none where the first ingest began there).

    >>> for step in demo_backfill("2022-06-01", "2023-04-01", "2023-06-30", 4, 10.0): print(" ".join(step))
    ingest --through 2023-04 --from 2022-12 --train-minutes 10.0
    ingest --through 2023-06 --no-train
    ingest --through 2022-11 --from 2022-06 --no-train
    """
    first, recent = month_key(dt.date.fromisoformat(train_from)), parse_month(since[:7])
    recent_from = max(first, month_key(months_before(recent, train_months))) if train_months > 0 else first
    steps = [
        ("ingest", "--through", month_key(recent), "--from", recent_from, "--train-minutes", str(train_minutes)),
        ("ingest", "--through", until[:7], "--no-train"),
    ]
    if recent_from > first:
        older = month_key(months_before(parse_month(recent_from), 1))
        steps.append(("ingest", "--through", older, "--from", first, "--no-train"))
    return steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--data",
        default=str(ROOT.parent / "shared" / "data" / "realtimeqa"),
        help="RealTimeQA repository clone or slice (default ../shared/data/realtimeqa)",
    )
    # The whole slice (2022-06 on): older articles answer recent questions too (recall@5 of 2023-04..06
    # 47.0 with news since 2022-06 against 41.6 since 2022-11-20; docs/reader-experiments.md).
    ap.add_argument("--train-from", default="2022-06-01", help="the first day of news and questions imported")
    ap.add_argument("--since", default="2023-04-01", help="the first day asked about (training stops before it)")
    ap.add_argument("--until", default="2023-06-30", help="the last day asked about; its month is indexed first")
    ap.add_argument("--train-minutes", type=float, default=10.0, help="the reader's training budget")
    ap.add_argument(
        "--train-months",
        type=int,
        default=4,
        help="the months before --since indexed first and trained on, the older ones backfilled after the "
        "training (0: every month from --train-from before the training)",
    )
    ap.add_argument("--port", type=int, default=8000, help="the server's port (a free one if it is taken)")
    ap.add_argument("--no-serve", action="store_true", help="stop the server after the questions")
    args = ap.parse_args()
    if args.train_months < 0:
        ap.error(f"--train-months must be 0 or more, got {args.train_months}")
    # `kill` stops the demo as Ctrl-C does, at any step: the server and the step running end with it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("SQA_PROGRESS", "1")
    data = Path(args.data)
    if data.exists():
        say(f"Using the RealTimeQA slice at {data} (questions of {args.since}..{args.until}).")
        since, until = args.since, args.until
        run("import", "realtimeqa", str(data), "--since", args.train_from, "--until", until)
        # the months before the questions' window, then training on them (held back: the last one)
        trains = True
        backfill = demo_backfill(args.train_from, since, until, args.train_months, args.train_minutes)
    else:
        say(
            f"No RealTimeQA data at {data}: using the shipped sample ({SAMPLE}, invented news of 2024-01..03); "
            "36 articles are too few to train on, so the packaged models answer untrained."
        )
        since, until = "2024-01-01", "2024-03-31"
        run("import", "realtimeqa", str(SAMPLE))
        trains = False
        backfill = [("ingest", "--through", until[:7], "--from", since[:7], "--no-train")]
    newest = until[:7]  # indexed first: the server answers about the latest weeks at once

    log_path = Path(os.environ.get("SQA_HOME", ROOT / ".sqa")) / "demo-server.log"
    token = os.environ.setdefault("SQA_ADMIN_TOKEN", secrets.token_urlsafe(12))  # for the dashboard
    port = args.port if port_is_free(args.port) else free_port()
    say(
        f"$ sqa ingest --month {newest} --no-train   and, beside it,   $ sqa serve   (the encoder and the untrained "
        "Gemma 3 270M reader; the first start converts the packaged weights once, about a minute; the "
        f"server is ready once {newest} is indexed)"
    )
    first_ingest = subprocess.Popen(sqa("ingest", "--month", newest, "--no-train"), cwd=ROOT)
    watcher = threading.Thread(target=stop_if_failed, args=(first_ingest,), daemon=True)
    watcher.start()
    try:
        with served(os.environ, log_path, ready_timeout_s=900, port=port) as server:
            watcher.join()  # the first ingest has ended; had it failed, the watcher is stopping the demo
            say(f"The server is ready: {server.ready}")
            questions = pick_questions(f"{newest}-01", until, indexed_from=f"{newest}-01", per="week")
            say(f"{len(questions)} questions of {newest}, one a week, whose evidence the newest month holds:")
            first_right, first_reader = ask(server.base, questions)
            first_at = time.monotonic() - T0
            say(f"First answers {first_at / 60:.1f} min after the demo started.")
            text, as_of, _ = questions[0] if questions else ("", until, "")
            print(f"Ask your own while the rest is indexed: {server.base}/?{urlencode({'q': text, 'as_of': as_of})}")
            print(f"The dashboard shows the jobs: {server.base}/dashboard   (admin token: {token})", flush=True)

            say(f"Indexing the rest of the news{TRAINING if trains else ''}:")
            trained, took_over_at = None, None
            for step in backfill:
                run(*step)
                if trained is None and (trained := wait_for_active_reader(server.base, token)) is not None:
                    took_over_at = time.monotonic() - T0
                    say(
                        f"Reader version {trained} serves now ({took_over_at / 60:.1f} min after the start): it "
                        "beat the untrained reader on the held-back month."
                    )
            done_at = time.monotonic() - T0
            if trained is None:
                why = "no trained reader beat the untrained one" if trains else "nothing was trained on the sample"
                say(
                    f"All news indexed ({done_at / 60:.1f} min); {why}, so the untrained reader serves on. "
                    "The same questions again:"
                )
            else:
                say(f"All news indexed ({done_at / 60:.1f} min). The same questions again:")
            right, reader = ask(server.base, questions)
            trained_line = f"the trained reader serving at {took_over_at / 60:.1f} min, " if took_over_at else ""
            say(
                f"Summary: first answers at {first_at / 60:.1f} min "
                f"({first_right}/{len(questions)} right, {first_reader}); {trained_line}"
                f"everything indexed at {done_at / 60:.1f} min ({right}/{len(questions)} right, {reader})."
            )
            if args.no_serve:
                print(f"\nThe server at {server.base} is stopping. Run it yourself with `.venv/bin/sqa serve`.")
                return 0
            print(f"\nThe web page: {server.base}/   (ask a question as of a date, and as of a second one beside it)")
            print(f"The dashboard: {server.base}/dashboard   (admin token: {token})")
            print("The server keeps running until Ctrl-C.", flush=True)
            try:
                server.process.wait()
            except KeyboardInterrupt:
                print("\nstopping the server")
    except ServerNotReady as exc:
        print(f"the server did not start: {exc}", file=sys.stderr)
        return 1
    finally:
        if first_ingest.poll() is None:
            first_ingest.terminate()
            first_ingest.wait()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C or `kill` before the last step: every child has been stopped
        print("\nstopped", file=sys.stderr)
        sys.exit(1 if FAILED else 130)
