"""bench/bench_quality.py end to end on the shipped sample: the served pipeline (hash encoder,
first-entity reader, the default hybrid retriever) over one window, figures that agree with the
answers it printed, and a rerun that reuses every cached answer."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import bench_quality
from evaluation.metrics import exact_match, token_f1
from evaluation.recent_news import RecentNews


def test_bench_quality_on_the_sample_measures_the_served_pipeline(served_env, tmp_path, capsys):
    main = bench_quality.main
    out = tmp_path / "quality.json"
    argv = ["--home", str(served_env.home), "--windows", "2024-01-01:2024-03-31", "--baseline", "", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "retriever hybrid, reader first-entity" in printed
    result = json.loads(out.read_text())
    [window] = result["windows"].values()
    assert window["n"] == 13 and result["config"]["retriever"] == "hybrid"
    recall = [window["recall"][f"@{k}"] for k in (1, 5, 10, 20, 50)]
    assert recall == sorted(recall) and 0.0 <= recall[0] and recall[-1] <= 100.0
    preds = window["predictions"]
    em = 100 * sum(exact_match(p["e2e"], p["answers"]) for p in preds.values()) / 13
    f1 = 100 * sum(token_f1(p["e2e"], p["answers"]) for p in preds.values()) / 13
    assert window["end_to_end"]["em"] == pytest.approx(em, abs=0.05)
    assert window["end_to_end"]["f1"] == pytest.approx(f1, abs=0.05)
    split = window["reader_reads_answer"]  # the reader's context holds an answer for n of the 13
    assert 0 < split["n"] <= 13 and split["share"] == pytest.approx(100 * split["n"] / 13, abs=0.05)
    assert "reader reads one" in printed
    whole = (split["em_when_read"] * split["n"] + split["em_otherwise"] * (13 - split["n"])) / 13
    assert whole == pytest.approx(em, abs=0.1)  # EM on those and on the rest make up the whole
    grounded = window["grounded"]  # the fake copies a phrase of the top passage: every answer given is stated there
    answered = sum(1 for p in preds.values() if p["e2e"])
    assert grounded["n"] == answered == sum(p["grounded"] for p in preds.values()) > 0
    assert "grounded answers" in printed
    assert window["confidence"] == {}  # the fake reader gives no confidence
    gold = [p for p in preds.values() if p["gold"] is not None]
    assert window["gold_passage"]["n"] == len(gold) > 0 and window["gold_passage"]["left_out"] == 13 - len(gold)
    assert window["latency_ms"]["total"]["n"] == 13
    news = window["news"]  # the month's news holds every answer the week's holds, and more
    assert set(news) == {"7d", "30d"} and 0.0 < news["7d"] <= news["30d"] <= 100.0
    assert "in the news of the 7 / 30 days before: " in printed
    own = sum(p["own"] for p in preds.values())
    assert window["own_articles"] == pytest.approx(100 * own / 13, abs=0.05)
    o = window["own_split"]
    assert o["n"] == own and o["read"] == sum(p["own"] and p["read"] for p in preds.values()) <= own
    whole = (o["em"] * own + o["em_otherwise"] * (13 - own)) / 13
    assert whole == pytest.approx(em, abs=0.1)  # EM on those and on the rest make up the whole
    assert f"own articles hold one for {own}: the reader reads one for {o['read']} of them" in printed
    for days in (7, 30):  # each question says the shortest span whose news holds its answer
        held = sum(1 for p in preds.values() if p["news_days"] is not None and p["news_days"] <= days)
        assert news[f"{days}d"] == pytest.approx(100 * held / 13, abs=0.05)
    assert window["latency_ms"]["total"]["p50_ms"] >= window["latency_ms"]["read"]["p50_ms"]

    partial = Path(f"{out}.partial.jsonl")
    lines = len(partial.read_text().splitlines())
    assert lines == 13 + len(gold)
    assert main(argv) == 0  # the rerun answers nothing again
    assert len(partial.read_text().splitlines()) == lines
    again = json.loads(out.read_text())
    assert list(again["windows"].values())[0]["predictions"] == preds


def test_bench_quality_says_when_the_home_is_empty(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SQA_DATABASE_URL", raising=False)
    assert bench_quality.main(["--home", str(tmp_path / "nothing")]) == 2
    assert "holds no database" in capsys.readouterr().err


def test_bench_quality_measures_an_older_index_state(served_env, tmp_path, capsys):
    """--snapshot: the index as it stood after January (lag -1Q for February-March questions) finds
    no passage of February or March, and an unknown snapshot is refused."""
    from sqlalchemy import select

    from app.bootstrap.builders import open_database
    from store.tables import IndexSnapshot

    db = open_database(served_env, migrate=False)
    try:
        with db.sessions() as s:
            first = s.scalars(select(IndexSnapshot.snapshot_id).order_by(IndexSnapshot.id)).first()
    finally:
        db.close()
    main = bench_quality.main
    base = ["--home", str(served_env.home), "--windows", "2024-02-01:2024-03-31", "--baseline", ""]
    assert main([*base, "--out", str(tmp_path / "now.json")]) == 0
    assert main([*base, "--snapshot", first, "--out", str(tmp_path / "lag.json")]) == 0
    printed = capsys.readouterr().out
    assert f"snapshot {first} (newest article 2024-01-" in printed
    now, lag = (json.loads((tmp_path / f).read_text()) for f in ("now.json", "lag.json"))
    assert lag["config"]["snapshot"] == first != now["config"]["snapshot"]
    [w_now], [w_lag] = now["windows"].values(), lag["windows"].values()
    assert w_lag["recall"]["@50"] < w_now["recall"]["@50"]  # the answers are in February's and March's news

    assert main([*base, "--snapshot", "nope"]) == 2
    assert "no index snapshot 'nope'" in capsys.readouterr().err


def test_bench_quality_counts_the_answers_a_reader_sees_only_in_a_headline(served_env, tmp_path, capsys, monkeypatch):
    """A reader that prints each article's headline (models.reader_context.add_titles, as the trained Gemma
    versions do) sees more answers than the same reader without them, and the difference is what the
    bench reports as seen in a headline only. Both read the first 12 words of each passage."""
    from models.gemma_prompt import reader_context
    from models.readers import FirstEntityReader

    main = bench_quality.main
    base = ["--home", str(served_env.home), "--windows", "2024-01-01:2024-03-31", "--baseline", ""]
    results = {}
    for titles in (False, True):
        monkeypatch.setattr(
            FirstEntityReader,
            "context",
            raising=False,
            value=lambda self, q, passages, t=titles: reader_context(
                q, passages, n_passages=3, max_passage_words=12, titles=t
            ),
        )
        assert main([*base, "--out", str(tmp_path / f"{titles}.json")]) == 0
        [window] = json.loads((tmp_path / f"{titles}.json").read_text())["windows"].values()
        results[titles] = window["reader_reads_answer"]
    assert "in a headline only: n " in capsys.readouterr().out
    plain, titled = results[False], results[True]
    assert plain["headline_only"] == {"n": 0, "em": 0.0}  # no headline read, none counted
    assert titled["headline_only"]["n"] == titled["n"] - plain["n"] > 0


def test_bench_quality_splits_the_published_system_by_what_our_reader_reads(served_env, tmp_path, capsys):
    """--baseline: the published system's EM on the questions whose answer our reader reads and on
    the rest. A system right exactly where ours reads an answer scores 100 there and 0 elsewhere."""
    import gzip

    main = bench_quality.main
    base = ["--home", str(served_env.home), "--windows", "2024-01-01:2024-03-31"]
    assert main([*base, "--baseline", "", "--out", str(tmp_path / "first.json")]) == 0
    [window] = json.loads((tmp_path / "first.json").read_text())["windows"].values()
    preds = window["predictions"]
    read = {qid for qid, p in preds.items() if p["read"]}
    assert 0 < len(read) < len(preds) and len(read) == window["reader_reads_answer"]["n"]

    data = tmp_path / "data" / "baseline_results" / "2024"
    data.mkdir(parents=True)
    lines = [
        json.dumps({"question_id": qid, "prediction": p["answers"][0] if qid in read else "no such thing"})
        for qid, p in preds.items()
    ]
    with gzip.open(data / "20240105_qa_fake_gen.jsonl.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    assert (
        main(
            [*base, "--baseline", "fake_gen", "--data", str(tmp_path / "data"), "--out", str(tmp_path / "second.json")]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "EM 100.0 where our reader reads an answer, 0.0 on the rest" in printed
    [window] = json.loads((tmp_path / "second.json").read_text())["windows"].values()
    b = window["baseline"]
    assert (b["em_when_read"], b["em_otherwise"]) == (100.0, 0.0)
    assert b["em"] == pytest.approx(100 * len(read) / len(preds), abs=0.05)
    # Paired with ours question by question: the system is right exactly on `read`.
    ours = {qid for qid, p in preds.items() if exact_match(p["e2e"], p["answers"])}
    paired = b["paired"]
    assert (paired["n"], paired["only_a"], paired["only_b"]) == (len(preds), len(ours - read), len(read - ours))
    assert paired["em_a"] == window["end_to_end"]["em"] and paired["em_b"] == b["em"]
    assert paired["low"] <= paired["difference"] <= paired["high"]
    assert f"paired: ours {paired['em_a']:.1f} against theirs {paired['em_b']:.1f} (n {len(preds)})" in printed
    interval = window["em_interval"]
    assert interval["n"] == len(preds) and interval["low"] <= window["end_to_end"]["em"] <= interval["high"]


def test_recent_news_holds_an_answer_published_in_the_days_before_the_question(sqlite_settings):
    """RecentNews over the stored articles (bench_quality.stored_articles): an article published on the
    question's date or up to N days before counts for N; one published a day earlier, or after the
    question, does not; answers match as whole words."""
    from app.bootstrap.builders import open_database
    from store.tables import Article

    asked = dt.date(2023, 4, 14)
    articles = [
        ("Jon Rahm won the Masters.", asked - dt.timedelta(days=7)),
        ("The Denver Nuggets won the title.", asked - dt.timedelta(days=31)),
        ("Miami beat Boston.", asked + dt.timedelta(days=1)),
        ("Chicagoland weather.", asked),
    ]
    db = open_database(sqlite_settings)
    try:
        with db.sessions() as session:
            session.add_all(
                [
                    Article(url=f"https://example.com/{i}", text=text, published=day, content_hash=str(i))
                    for i, (text, day) in enumerate(articles)
                ]
            )
            session.commit()
        with db.sessions() as session:

            def q(*answers):
                return SimpleNamespace(asked=asked, answers=answers)

            news = RecentNews([q("x")], bench_quality.stored_articles(session), (7, 30))
            assert news.holds(q("Jon Rahm"), 7) and news.holds(q("jon rahm."), 30)
            assert not news.holds(q("Jon Rahm"), 6)  # a day too early
            assert not news.holds(q("Denver Nuggets"), 30)  # 31 days before
            assert not news.holds(q("Miami"), 30)  # published after the question
            assert not news.holds(q("Chicago"), 7)  # "Chicagoland" is another word
            assert news.holds(q("Chicago", "Chicagoland weather"), 7)
            nothing = RecentNews([], bench_quality.stored_articles(session), (7, 30))  # no questions, no news loaded
            assert not nothing.holds(q("Jon Rahm"), 7)
    finally:
        db.close()
