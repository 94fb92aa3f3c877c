"""The reader bake-off: generation subset, published baselines, scoring, the gold passage, and an
end-to-end run of bench.bench_readers on the shipped sample (hash encoder, first-entity reader)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import gzip
import json
from pathlib import Path

import pytest

from bench import bench_readers
from evaluation.bakeoff import generation_subset, latency_summary, load_baseline_predictions, score
from evaluation.metrics import exact_match, token_f1
from evaluation.questions import DatedQuestion
from indexer.records import ImportReport
from workers.bakeoff_gold import gold_passage

KC = "https://www.kestrel-courier.example/2024"
TITLE_PUSH = f"{KC}/01/03/harriers-title-push"  # "Tomas Verhoeven"
STANNARD = f"{KC}/01/17/stannard-double-ashcombe"  # "Tomas Verhoeven"
RESIGNS = f"{KC}/02/13/verhoeven-resigns-okafor-appointed"  # both names
WINNING_START = f"{KC}/02/19/okafor-winning-start"  # "Ines Okafor"


def Q(qid: str, text: str, answers: tuple[str, ...], asked: dt.date = dt.date(2024, 1, 24), meta=None) -> DatedQuestion:
    return DatedQuestion(qid, text, asked, answers, {} if meta is None else meta)


def test_generation_subset_keeps_short_answers_without_choices_and_counts_the_rest():
    questions = [
        Q("a", "Who is the mayor of Port Calder?", ("Helen Marsh",)),
        Q("b", "Which of the following teams won the final?", ("Marrowby Rovers",)),
        Q("c", "What did the review recommend?", ("A taller flood wall along the Tarn river bank",)),
        Q("d", "Who won?", ()),
        Q("e", "Who won?", ("The",)),  # normalises to nothing: no usable gold answer
        Q("f", "What is the rate?", ("The 4.25 percent rate",)),  # "the" dropped: 3 tokens
        Q("g", "Who is pictured here?", ("An answer that is far too long anyway",)),  # first reason counts
    ]
    kept, left_out = generation_subset(questions)
    assert [q.qid for q in kept] == ["a", "f"]
    assert left_out == {"needs its choices": 2, "answer over 5 tokens": 1, "no gold answer": 2}
    kept_any, left_any = generation_subset(questions, max_tokens=0)
    assert [q.qid for q in kept_any] == ["a", "c", "f"]
    assert "answer over 0 tokens" not in left_any


def _write_jsonl(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "\n".join(lines) + "\n"
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(data)
    else:
        path.write_text(data)


def _baselines(root: Path) -> Path:
    """Two weeks of an invented system 'sys_gen', a malformed line, and files that must be ignored."""
    base = root / "baseline_results"
    _write_jsonl(
        base / "2024" / "20240112_qa_sys_gen.jsonl.gz",
        [
            json.dumps({"question_id": "20240112_0", "prediction": "4.25 percent", "score": "0.9"}),
            "{not json",
            json.dumps({"question_id": "20240112_1", "prediction": "Vandermere Council"}),
            json.dumps({"question_id": "20240112_2"}),  # no prediction
        ],
    )
    _write_jsonl(
        base / "2024" / "20240126_qa_sys_gen.jsonl",
        [
            json.dumps({"question_id": "20240126_0", "prediction": "Tomas Verhoeven"}),
            json.dumps({"question_id": "20240112_0", "prediction": "a later week reusing the id"}),
        ],
    )
    _write_jsonl(
        base / "2024" / "20240126_qa_nota_sys_gen.jsonl.gz",  # another system's file
        [json.dumps({"question_id": "20240126_1", "prediction": "otter"})],
    )
    _write_jsonl(
        base / "2024" / "20240126_qa_sys_gen_extra.jsonl", [json.dumps({"question_id": "x", "prediction": "y"})]
    )
    return root


def test_load_baseline_predictions_reads_gz_and_plain_and_counts_malformed_lines(tmp_path):
    root = _baselines(tmp_path / "rtqa")
    report = ImportReport()
    preds = load_baseline_predictions(root, "sys_gen", report)
    assert preds == {"20240112_0": "4.25 percent", "20240112_1": "Vandermere Council", "20240126_0": "Tomas Verhoeven"}
    assert report.skipped == {"malformed json line": 1, "baseline: no prediction": 1}
    assert report.duplicates == 1  # the first week's prediction is kept
    # baseline_results/ itself works as the root too; an unknown system gives nothing
    assert load_baseline_predictions(root / "baseline_results", "sys_gen") == preds
    assert load_baseline_predictions(root, "missing_gen") == {}


def test_score_em_f1_best_over_golds_and_missing_prediction_scores_zero():
    questions = [Q("1", "q", ("Denver Nuggets", "Nuggets")), Q("2", "q", ("red dog",)), Q("3", "q", ("Paris",))]
    result = score({"1": "the nuggets", "2": "big red dog", "unrelated": "x"}, questions)
    assert result["n"] == 3 and result["answered"] == 2
    assert result["em"] == pytest.approx(1 / 3)
    assert result["f1"] == pytest.approx((1.0 + 0.8 + 0.0) / 3)
    assert score({}, []) == {"n": 0, "answered": 0, "em": 0.0, "f1": 0.0}


def test_latency_summary_percentiles():
    lat = latency_summary([10.0, 20.0, 30.0, 40.0, 1000.0])
    assert lat["n"] == 5 and lat["p50_ms"] == 30.0 and lat["p95_ms"] == pytest.approx(808.0)
    assert latency_summary([])["p50_ms"] is None


def _session(settings):
    from app.bootstrap.builders import open_database

    db = open_database(settings, migrate=False)
    return db, db.sessions()


def test_gold_passage_prefers_gold_urls_then_search_order(loaded_settings):
    db, session = _session(loaded_settings)
    try:
        q = Q(
            "x",
            "Who is the head coach of the Kestrel Bay Harriers?",
            ("Tomas Verhoeven",),
            meta={"search_result_urls": [STANNARD, TITLE_PUSH]},
        )
        assert gold_passage(session, q).article.url == STANNARD
        q.meta["gold_urls"] = [TITLE_PUSH]
        row = gold_passage(session, q)
        assert row.article.url == TITLE_PUSH
        assert "Tomas Verhoeven" in row.text
    finally:
        session.close()
        db.close()


def test_gold_passage_never_returns_a_passage_published_after_the_question(loaded_settings):
    db, session = _session(loaded_settings)
    try:
        # The answer is only in articles of 2024-02-13 and later.
        q = Q(
            "y",
            "Who is the new head coach of the Harriers?",
            ("Ines Okafor",),
            asked=dt.date(2024, 2, 12),
            meta={"gold_urls": [RESIGNS], "search_result_urls": [WINNING_START, RESIGNS]},
        )
        assert gold_passage(session, q) is None
        q = dataclasses.replace(q, asked=dt.date(2024, 2, 13))  # published that day: allowed
        row = gold_passage(session, q)
        assert row.article.url == RESIGNS and row.published == dt.date(2024, 2, 13)
        # A later article first in the search order is skipped, the earlier one found.
        q2 = Q("z", "Who coaches the Harriers?", ("Tomas Verhoeven",), meta={"search_result_urls": [RESIGNS, STANNARD]})
        assert gold_passage(session, q2).article.url == STANNARD
        assert gold_passage(session, Q("w", "?", ("Tomas Verhoeven",))) is None  # no urls at all
    finally:
        session.close()
        db.close()


def _bench_argv(settings, tmp_path: Path, out: Path) -> list[str]:
    return [
        "--home",
        str(settings.home),
        "--database-url",
        settings.db_url,
        "--encoder",
        "hash",
        "--from",
        "2024-01-01",
        "--to",
        "2024-03-31",
        "--readers",
        "fe=first-entity",
        "--gold-for",
        "fe",
        "--passages",
        "3",
        "--top-k",
        "5",
        "--baselines",
        "sys_gen,absent_gen",
        "--data",
        str(_baselines(tmp_path / "rtqa")),
        "--out",
        str(out),
    ]


def test_bench_readers_end_to_end_on_the_sample(loaded_settings, tmp_path, capsys):
    main = bench_readers.main

    out = tmp_path / "bake" / "results.json"
    assert main(_bench_argv(loaded_settings, tmp_path, out)) == 0
    printed = capsys.readouterr().out
    assert "| system | n | answered | EM | F1 | p50 ms | p95 ms |" in printed
    result = json.loads(out.read_text())

    answers = {q["qid"]: q["answers"] for q in result["per_question"]}
    assert len(answers) == result["questions"]["evaluated"] == 13
    rows = {r["system"]: r for r in result["rows"]}
    assert set(rows) == {"fe", "fe (gold passage)", "sys_gen"}  # absent_gen has no file: left out, noted
    assert any("absent_gen" in n for n in result["notes"])
    for row in rows.values():
        preds = {qid: p for qid, p in row["predictions"].items() if p is not None}
        assert row["answered"] == len(preds)
        assert row["em"] == pytest.approx(sum(exact_match(p, answers[q]) for q, p in preds.items()) / row["n"])
        assert row["f1"] == pytest.approx(sum(token_f1(p, answers[q]) for q, p in preds.items()) / row["n"])
    assert rows["fe"]["n"] == 13 and rows["fe"]["answered"] == 13
    assert rows["fe"]["p50_ms"] is not None and rows["fe"]["p95_ms"] >= rows["fe"]["p50_ms"]
    gold = rows["fe (gold passage)"]
    with_gold = [q for q in result["per_question"] if q["gold_passage_id"] is not None]
    assert gold["n"] == len(with_gold) > 0 and gold["left_out"] == 13 - len(with_gold)
    # the baseline is scored on exactly the bench's questions: 3 of them have a prediction, 2 right
    assert rows["sys_gen"]["n"] == 13 and rows["sys_gen"]["answered"] == 3
    assert rows["sys_gen"]["em"] == pytest.approx(2 / 13)
    assert 0.0 <= result["retrieval"]["recall@3"] <= result["retrieval"]["recall@5"] <= 1.0

    # The gold passages were published by their question's date.
    from store.tables import Passage

    db, session = _session(loaded_settings)
    try:
        for q in with_gold:
            assert session.get(Passage, q["gold_passage_id"]).published <= dt.date.fromisoformat(q["asked"])
    finally:
        session.close()
        db.close()

    # A rerun reuses every cached answer and gives the same rows.
    partial = Path(f"{out}.partial.jsonl")
    assert len(partial.read_text().splitlines()) == 13 + len(with_gold)
    assert main(_bench_argv(loaded_settings, tmp_path, out)) == 0
    again = {r["system"]: r for r in json.loads(out.read_text())["rows"]}
    assert again["fe"]["reused_from_partial"] == 13 and again["fe"]["predictions"] == rows["fe"]["predictions"]
    assert again["fe (gold passage)"]["reused_from_partial"] == len(with_gold)
    assert len(partial.read_text().splitlines()) == 13 + len(with_gold)


def test_bench_readers_baselines_only_needs_no_index(sqlite_settings, sample_root, tmp_path):
    from app.bootstrap.builders import open_database

    main = bench_readers.main
    from indexer.importers import read_realtimeqa
    from workers.imports import store_records

    db = open_database(sqlite_settings)
    try:
        _, questions, _ = read_realtimeqa(sample_root)
        store_records(db.sessions, [], questions)
    finally:
        db.close()
    out = tmp_path / "b.json"
    argv = [
        "--home",
        str(sqlite_settings.home),
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-31",
        "--baselines-only",
        "--baselines",
        "sys_gen",
        "--data",
        str(_baselines(tmp_path / "rtqa")),
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["retrieval"] is None
    assert [(r["system"], r["n"], r["answered"]) for r in result["rows"]] == [("sys_gen", 5, 3)]
    # without the data the baseline rows are left out, and the output says why
    assert main([*argv[:-4], "--data", str(tmp_path / "nowhere"), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["rows"] == [] and "no baseline results under" in result["notes"][0]


def test_bench_readers_rejects_bad_arguments(capsys):
    main = bench_readers.main

    for argv in (
        ["--readers", "nope"],
        ["--passages", "30", "--top-k", "20"],
        ["--from", "2023-02-30"],
        ["--readers", "first-entity", "--gold-for", "gemma"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
