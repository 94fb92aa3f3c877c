"""Importers: exact counts of kept and skipped records on small fixtures, and the shipped sample."""

from __future__ import annotations

import datetime as dt
import gzip
import shutil
from pathlib import Path

import pytest

from indexer.importers import iter_jsonl, read_articles_jsonl, read_realtimeqa, read_streamingqa
from indexer.records import ImportReport

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "indexer" / "sample" / "realtimeqa"
BAD = ROOT / "tests" / "fixtures" / "realtimeqa_bad"
SQA = ROOT / "tests" / "fixtures" / "streamingqa"

D = dt.date

BAD_SKIPS = {
    "malformed json line": 1,
    "json line is not an object": 1,
    "question: no answer": 1,
    "question: answer out of range": 1,
    "question: answer is not a choice number": 1,
    "article: no publish date": 1,
    "article: empty text": 1,
}


def _write(path: Path, lines: list[str]) -> Path:
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


# --- iter_jsonl ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lines.jsonl", "lines.jsonl.gz"])
def test_iter_jsonl_skips_bad_lines_in_plain_and_gzip(tmp_path, name):
    path = _write(tmp_path / name, ['{"a": 1}', "", "{not json", "[1, 2]", '"text"', '{"b": 2}'])
    report = ImportReport()
    rows = list(iter_jsonl(path, report))
    assert rows == [(1, {"a": 1}), (6, {"b": 2})]
    assert report.skipped == {"malformed json line": 1, "json line is not an object": 2}
    assert report.examples[0] == f"{path}:3: malformed json line"


def test_iter_jsonl_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        list(iter_jsonl(tmp_path / "nope.jsonl", ImportReport()))


def test_iter_jsonl_truncated_gzip_is_counted_not_raised(tmp_path):
    whole = gzip.compress(b"".join(b'{"n": %d}\n' % i for i in range(2000)))
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    report = ImportReport()
    rows = list(iter_jsonl(path, report))
    assert 0 < len(rows) < 2000
    assert report.skipped == {"unreadable file (corrupt or truncated)": 1}


def test_iter_jsonl_invalid_utf8_line_is_malformed(tmp_path):
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(b'{"a": "\xff\xfe"}\n{"b": 1}\n')
    report = ImportReport()
    assert list(iter_jsonl(path, report)) == [(2, {"b": 1})]
    assert report.skipped == {"malformed json line": 1}


# --- read_realtimeqa: the bad-records fixture ----------------------------------------------------


def test_read_realtimeqa_bad_fixture_exact_counts():
    articles, questions, report = read_realtimeqa(BAD)
    assert [q.qid for q in questions] == ["20230106_0", "20230106_1", "20230113_0"]
    assert [a.url for a in articles] == [
        "https://news.example/gold",
        "https://news.example/a",
        "https://news.example/late",
        "https://news.example/b",
    ]
    assert report.skipped == BAD_SKIPS
    assert (report.questions_read, report.articles_read, report.duplicates) == (6, 7, 1)
    assert len(report.examples) == 7
    assert report.examples[0].endswith("20230106_gcs.jsonl.gz:1: article: no publish date")


def test_read_realtimeqa_duplicate_url_keeps_longest_text():
    articles, _, _ = read_realtimeqa(BAD)
    (a,) = [a for a in articles if a.url == "https://news.example/a"]
    assert a.text.startswith("The longer version")
    assert a.source == "realtimeqa" and a.published == D(2023, 1, 4)


def test_read_realtimeqa_answer_forms_and_date_forms():
    _, questions, _ = read_realtimeqa(BAD)
    by_id = {q.qid: q for q in questions}
    assert by_id["20230106_0"].answers == ("Bravo",)  # ["1"]
    assert by_id["20230106_1"].answers == ("Charlie",)  # bare "2", date written 2023-01-05
    assert by_id["20230106_1"].asked == D(2023, 1, 5)
    assert by_id["20230113_0"].choices == ("Alpha", "Bravo", "Charlie", "Delta")
    assert {q.subset for q in questions} == {"realtimeqa"}


def test_read_realtimeqa_meta_lists_search_and_gold_urls_in_rank_order():
    _, questions, _ = read_realtimeqa(BAD)
    meta = {q.qid: q.meta for q in questions}
    assert meta["20230106_0"] == {
        "source": "Fixture Quiz",
        "url": "https://quiz.example/20230106_0",
        "search_result_urls": ["https://news.example/a", "https://news.example/no-date", "https://news.example/empty"],
        "gold_urls": ["https://news.example/gold"],
    }
    assert meta["20230106_1"]["search_result_urls"] == ["https://news.example/a", "https://news.example/late"]
    assert meta["20230106_1"]["gold_urls"] == []


def test_read_realtimeqa_root_and_past_folder_agree_and_baselines_ignored():
    from_root = read_realtimeqa(BAD)
    from_past = read_realtimeqa(BAD / "past")
    assert from_root[:2] == from_past[:2]
    assert from_root[2].skipped == from_past[2].skipped == BAD_SKIPS


def test_read_realtimeqa_since_until_filter_questions_and_articles():
    articles, questions, report = read_realtimeqa(BAD, since=D(2023, 1, 4), until=D(2023, 1, 9))
    assert [q.qid for q in questions] == ["20230106_0", "20230106_1"]
    assert [a.url for a in articles] == ["https://news.example/a", "https://news.example/late"]
    assert report.out_of_range == 3  # 20230113_0, gold (01-03), b (01-12)
    assert report.skipped == BAD_SKIPS  # filtering is not a fault in the data

    _, questions, _ = read_realtimeqa(BAD, since=D(2023, 1, 12))
    assert [q.qid for q in questions] == ["20230113_0"]
    articles, _, _ = read_realtimeqa(BAD, until=D(2023, 1, 3))
    assert [a.url for a in articles] == ["https://news.example/gold"]


def test_read_realtimeqa_since_after_until_raises():
    with pytest.raises(ValueError, match="after until"):
        read_realtimeqa(BAD, since=D(2023, 2, 1), until=D(2023, 1, 1))


def test_read_realtimeqa_plain_copy_reads_like_gzip(tmp_path):
    for src in (BAD / "past" / "2023").iterdir():
        dst = tmp_path / "past" / "2023" / src.name.removesuffix(".gz")
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(gzip.decompress(src.read_bytes()))
    assert read_realtimeqa(tmp_path)[:2] == read_realtimeqa(BAD)[:2]


def test_read_realtimeqa_same_week_plain_and_gzip_is_read_once(tmp_path):
    week = tmp_path / "past" / "2023"
    shutil.copytree(BAD / "past" / "2023", week)
    plain = week / "20230113_qa.jsonl"
    plain.write_bytes(gzip.decompress((week / "20230113_qa.jsonl.gz").read_bytes()))
    _, questions, report = read_realtimeqa(tmp_path)
    assert report.questions_read == 6
    assert [q.qid for q in questions].count("20230113_0") == 1


def test_read_realtimeqa_no_files_raises_value_error_naming_path(tmp_path):
    (tmp_path / "past" / "2023").mkdir(parents=True)
    (tmp_path / "past" / "2023" / "notes.txt").write_text("not data")
    with pytest.raises(ValueError, match=r"no RealTimeQA files under .*past.*YYYYMMDD_qa\.jsonl"):
        read_realtimeqa(tmp_path)


def test_read_realtimeqa_missing_root_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing"):
        read_realtimeqa(tmp_path / "missing")


def test_read_realtimeqa_duplicate_question_id_is_skipped_with_own_week_urls(tmp_path):
    week = tmp_path / "past" / "2023"
    shutil.copytree(BAD / "past" / "2023", week)
    # The real data reuses 20230414_20 a week later for another question; do the same here.
    _write(
        week / "20230120_qa.jsonl",
        [
            '{"question_id": "20230113_0", "question_date": "2023/01/19", '
            '"question_sentence": "Other?", "choices": ["x", "y"], "answer": ["0"]}'
        ],
    )
    _write(
        week / "20230120_gcs.jsonl",
        ['{"question_id": "20230113_0", "search_result": [{"url": "https://news.example/other"}]}'],
    )
    _, questions, report = read_realtimeqa(tmp_path)
    (q,) = [q for q in questions if q.qid == "20230113_0"]
    assert q.asked == D(2023, 1, 12) and q.meta["search_result_urls"] == ["https://news.example/b"]
    assert report.skipped["question: duplicate id"] == 1


# --- read_realtimeqa: the shipped sample --------------------------------------------------------


def test_read_realtimeqa_sample_reads_cleanly_and_sorted():
    articles, questions, report = read_realtimeqa(SAMPLE)
    assert (len(articles), len(questions)) == (36, 13)
    assert report.skipped == {} and report.duplicates == report.articles_read - 36
    assert articles == sorted(articles, key=lambda a: (a.published, a.url))
    assert questions == sorted(questions, key=lambda q: (q.asked, q.qid))
    per_month = [sum(a.published.month == m for a in articles) for m in (1, 2, 3)]
    assert per_month == [12, 12, 12] and {a.published.year for a in articles} == {2024}
    assert all(len(q.choices) == 4 and q.answers[0] in q.choices for q in questions)


def test_read_realtimeqa_sample_answers_change_over_time():
    articles, questions, _ = read_realtimeqa(SAMPLE)
    answers: dict[str, list[tuple[dt.date, str]]] = {}
    for q in questions:
        answers.setdefault(q.text, []).append((q.asked, q.answers[0]))
    changing = {text: seen for text, seen in answers.items() if len({a for _, a in seen}) > 1}
    assert len(changing) >= 3
    coach = changing["Who is the head coach of the Kestrel Bay Harriers?"]
    assert coach == [(D(2024, 1, 24), "Tomas Verhoeven"), (D(2024, 3, 14), "Ines Okafor")]
    for text, seen in changing.items():
        (first, _), (last, new) = seen[0], seen[-1]
        assert first.month == 1 and last.month == 3
        assert any(new in a.text for a in articles if first < a.published <= last), text
    # Nothing published by the January date names the new coach or the new rate.
    for new, first in (("Ines Okafor", D(2024, 1, 24)), ("4.00 percent", D(2024, 1, 11))):
        assert not any(new in a.text for a in articles if a.published <= first)


def test_read_realtimeqa_sample_has_one_result_published_after_its_question():
    articles, questions, _ = read_realtimeqa(SAMPLE)
    published = {a.url: a.published for a in articles}
    late = [(q.qid, url) for q in questions for url in q.meta["search_result_urls"] if published[url] > q.asked]
    assert len(late) == 1
    assert all(2 <= len(q.meta["search_result_urls"]) <= 4 for q in questions)


def test_read_realtimeqa_sample_month_window():
    articles, questions, _ = read_realtimeqa(SAMPLE, since=D(2024, 2, 1), until=D(2024, 2, 29))
    assert len(articles) == 12 and all(a.published.month == 2 for a in articles)
    assert [q.qid for q in questions] == ["20240209_0", "20240223_0"]


# --- read_streamingqa / read_articles_jsonl ------------------------------------------------------


def test_read_streamingqa_fixture_exact_counts():
    articles, questions, report = read_streamingqa(SQA / "questions.jsonl", SQA / "articles.jsonl")
    assert [q.qid for q in questions] == ["sqa-2", "sqa-1", "sqa-3"]
    assert [a.url for a in articles] == ["https://news.example/a1", "id:art-2", "https://news.example/a5"]
    assert report.skipped == {
        "malformed json line": 2,
        "question: no answer": 1,
        "article: empty text": 1,
        "article: bad publish date": 1,
    }
    assert (report.questions_read, report.articles_read, report.duplicates) == (4, 6, 1)


def test_read_streamingqa_answers_merged_and_days_in_utc():
    articles, questions, _ = read_streamingqa(SQA / "questions.jsonl", SQA / "articles.jsonl")
    by_id = {q.qid: q for q in questions}
    assert by_id["sqa-1"].answers == ("Ada Brook", "A. Brook")
    assert by_id["sqa-3"].answers == ("the Tarn", "Tarn River")
    assert by_id["sqa-1"].asked == D(2020, 3, 1) and by_id["sqa-2"].asked == D(2020, 2, 29)
    assert by_id["sqa-1"].meta == {
        "evidence_id": "art-1",
        "evidence_date": "2020-02-29",
        "recent_or_past": "recent",
        "written_or_generated": "written",
    }
    assert {q.subset for q in questions} == {"streamingqa"}
    assert {a.source for a in articles} == {"streamingqa"}
    assert articles[1].published == D(2020, 3, 1)  # unix seconds


def test_read_streamingqa_without_articles_and_with_window():
    articles, questions, report = read_streamingqa(SQA / "questions.jsonl", since=D(2020, 3, 1), until=D(2020, 3, 31))
    assert articles == [] and [q.qid for q in questions] == ["sqa-1"]
    assert report.out_of_range == 2


def test_read_articles_jsonl_dedupes_by_url_keeping_longest_text():
    articles, report = read_articles_jsonl(SQA / "articles.jsonl")
    (a1,) = [a for a in articles if a.url == "https://news.example/a1"]
    assert a1.title == "Bridge opens (updated)" and "Ada Brook" in a1.text
    assert {a.source for a in articles} == {"jsonl"}
    assert report.skipped == {"article: empty text": 1, "malformed json line": 1, "article: bad publish date": 1}


def test_read_articles_jsonl_window_and_missing_url(tmp_path):
    path = _write(
        tmp_path / "a.jsonl.gz",
        [
            '{"url": "u1", "text": "x", "published": "2020-01-31"}',
            '{"url": "u2", "text": "x", "published": "2020/02/01"}',
            '{"text": "no url and no id", "published": "2020-02-02"}',
            '{"url": "u3", "text": "x"}',
        ],
    )
    articles, report = read_articles_jsonl(path, since=D(2020, 2, 1), source="test")
    assert [(a.url, a.published, a.source) for a in articles] == [("u2", D(2020, 2, 1), "test")]
    assert report.skipped == {"article: no url": 1, "article: no publish date": 1}
    assert report.out_of_range == 1
