"""Importers: RealTimeQA folders, StreamingQA question JSONL, plain article JSONL -> records.

Pure Python, no SQL, no settings. Bad records never stop an import: each is skipped and counted
in an `ImportReport` under a short reason, with the first few kept as "file:line: reason".
Output is deterministic: articles sorted by (published, url), questions by (asked, qid).

Example:
    >>> articles, questions, report = read_realtimeqa(Path("indexer/sample/realtimeqa"))
    >>> len(articles), len(questions), questions[0].asked, questions[0].answers, report.skipped
    (36, 13, datetime.date(2024, 1, 11), ('4.25 percent',), {})
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from indexer.dates import InvalidDateError, parse_day
from indexer.jsonl import (
    article_from_json,
    check_window,
    clean_text,
    in_window,
    iter_jsonl,
    keep_longest,
    parse_published,
)
from indexer.records import ArticleRecord, ImportReport, QuestionRecord

__all__ = ["iter_jsonl", "read_articles_jsonl", "read_realtimeqa", "read_streamingqa"]

# RealTimeQA file names: past/YYYY/YYYYMMDD_{qa,gcs,gold}.jsonl[.gz]; anything else is ignored.
_RTQA_NAME = re.compile(r"^(\d{8})_(qa|gcs|gold)\.jsonl(\.gz)?$")


def _finish_articles(
    articles: dict[str, ArticleRecord], since: dt.date | None, until: dt.date | None, report: ImportReport
) -> list[ArticleRecord]:
    kept = [a for a in articles.values() if in_window(a.published, since, until)]
    report.out_of_range += len(articles) - len(kept)
    return sorted(kept, key=lambda a: (a.published, a.url))


def _finish_questions(
    questions: list[QuestionRecord], since: dt.date | None, until: dt.date | None, report: ImportReport
) -> list[QuestionRecord]:
    kept = [q for q in questions if in_window(q.asked, since, until)]
    report.out_of_range += len(questions) - len(kept)
    return sorted(kept, key=lambda q: (q.asked, q.qid))


def read_articles_jsonl(
    path: Path,
    *,
    since: dt.date | None = None,
    until: dt.date | None = None,
    report: ImportReport | None = None,
    source: str = "jsonl",
) -> tuple[list[ArticleRecord], ImportReport]:
    """Read plain article JSONL: {"id", "url", "title", "text", "published"} a line.

    `published` is 'YYYY-MM-DD', 'YYYY/MM/DD' or unix seconds. A line without url but with an id
    gets the url 'id:<id>'. Articles are deduplicated by url (longest text kept) and kept when
    published within [since, until] (inclusive; None is unbounded).
    """
    check_window(since, until)
    report = report if report is not None else ImportReport()
    path = Path(path)
    articles: dict[str, ArticleRecord] = {}
    for lineno, obj in iter_jsonl(path, report):
        report.articles_read += 1
        record = article_from_json(obj, f"{path}:{lineno}", report, source)
        if record is not None:
            keep_longest(articles, record, report)
    return _finish_articles(articles, since, until, report), report


# --- RealTimeQA ---------------------------------------------------------------------------------


def _realtimeqa_files(root: Path) -> dict[str, list[Path]]:
    """{'qa': [...], 'gcs': [...], 'gold': [...]} sorted by name; `root` is the repo or its past/."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory (expected a RealTimeQA clone or its past/ folder)")
    base = root / "past" if (root / "past").is_dir() else root
    chosen: dict[tuple[str, str], Path] = {}
    for path in sorted(base.rglob("*.jsonl*")):
        match = _RTQA_NAME.match(path.name)
        if match and path.is_file():
            # The same week both plain and gzipped (a half-unpacked clone): read the plain one once.
            key = (str(path.parent), match.group(1) + match.group(2))
            if key not in chosen or not path.name.endswith(".gz"):
                chosen[key] = path
    files: dict[str, list[Path]] = {"qa": [], "gcs": [], "gold": []}
    for path in chosen.values():
        match = _RTQA_NAME.match(path.name)
        assert match is not None  # every chosen path matched above
        files[match.group(2)].append(path)
    if not files["qa"] and not files["gcs"]:
        raise ValueError(
            f"no RealTimeQA files under {base} (expected past/YYYY/YYYYMMDD_qa.jsonl[.gz] and YYYYMMDD_gcs.jsonl[.gz])"
        )
    return {kind: sorted(paths, key=lambda p: (p.name, str(p))) for kind, paths in files.items()}


def _gold_answer(obj: dict[str, Any]) -> tuple[str | None, str]:
    """(gold answer text, '') or (None, skip reason). `answer` is ["2"], "2" or [2]."""
    answer = obj.get("answer")
    if isinstance(answer, list):
        answer = answer[0] if answer else None
    if answer is None or answer == "":
        return None, "question: no answer"
    try:
        if isinstance(answer, bool) or isinstance(answer, float) and not answer.is_integer():
            raise ValueError
        index = int(answer)
    except (TypeError, ValueError):
        return None, "question: answer is not a choice number"
    choices = obj.get("choices")
    if not isinstance(choices, list) or not 0 <= index < len(choices):
        return None, "question: answer out of range"
    text = clean_text(choices[index])
    return (text, "") if text else (None, "question: empty answer choice")


def _realtimeqa_question(obj: dict[str, Any], where: str, report: ImportReport) -> QuestionRecord | None:
    qid, text = clean_text(obj.get("question_id")), clean_text(obj.get("question_sentence"))
    if not qid or not text:
        report.skip("question: no id or text", where)
        return None
    try:
        asked = parse_day(obj.get("question_date"), what="question_date")  # type: ignore[arg-type]
    except InvalidDateError:
        report.skip("question: bad date", where)
        return None
    answer, reason = _gold_answer(obj)
    if answer is None:
        report.skip(reason, where)
        return None
    choices = tuple(c.strip() if isinstance(c, str) else str(c) for c in obj["choices"])
    meta = {"source": obj.get("question_source"), "url": obj.get("question_url")}
    return QuestionRecord(
        qid=qid, text=text, asked=asked, answers=(answer,), subset="realtimeqa", choices=choices, meta=meta
    )


def _week(path: Path) -> tuple[str, str]:
    """(folder, YYYYMMDD): a question's search results are in the gcs/gold file of its own week."""
    return str(path.parent), path.name[:8]


def _read_search_results(
    paths: list[Path], articles: dict[str, ArticleRecord], report: ImportReport
) -> dict[tuple[str, str, str], list[str]]:
    """Add every usable result to `articles`; return {(folder, week, question_id): result urls}."""
    urls_by_question: dict[tuple[str, str, str], list[str]] = {}
    for path in paths:
        for lineno, obj in iter_jsonl(path, report):
            where = f"{path}:{lineno}"
            results = obj.get("search_result")
            if not isinstance(results, list):
                report.skip("search record: no search_result list", where)
                continue
            urls = urls_by_question.setdefault((*_week(path), clean_text(obj.get("question_id"))), [])
            for result in results:
                report.articles_read += 1
                if not isinstance(result, dict):
                    report.skip("article: not an object", where)
                    continue
                url = clean_text(result.get("url"))
                if url and url not in urls:
                    urls.append(url)
                record = article_from_json(result, where, report, "realtimeqa")
                if record is not None:
                    keep_longest(articles, record, report)
    return urls_by_question


def _read_questions(
    path: Path,
    parse: Callable[[dict[str, Any], str, ImportReport], QuestionRecord | None],
    seen: set[str],
    report: ImportReport,
) -> Iterator[QuestionRecord]:
    """Questions of one JSONL file: each line parsed by `parse(obj, where, report)` (None: skipped);
    an id already in `seen` is skipped and counted."""
    for lineno, obj in iter_jsonl(path, report):
        report.questions_read += 1
        where = f"{path}:{lineno}"
        question = parse(obj, where, report)
        if question is None:
            continue
        if question.qid in seen:
            report.skip("question: duplicate id", where)
            continue
        seen.add(question.qid)
        yield question


def read_realtimeqa(
    root: Path,
    *,
    since: dt.date | None = None,
    until: dt.date | None = None,
    report: ImportReport | None = None,
) -> tuple[list[ArticleRecord], list[QuestionRecord], ImportReport]:
    """Read a RealTimeQA tree (the repository root or its past/ folder; .jsonl or .jsonl.gz).

    Every search result (gcs and gold) with text and a publish date becomes an article, deduplicated
    by url (longest text kept). A question's gold answer is `choices[int(answer[0])]`; its meta
    holds source, url, `search_result_urls` (its week's gcs result urls in rank order, whether or
    not the article was usable) and `gold_urls`. A question id seen before is skipped (the real data
    reuses one id for a different question a week later). `since`/`until` (inclusive) filter
    questions by question date and articles by publication date.

    Raises FileNotFoundError if `root` is not a directory, ValueError if it holds no qa or gcs file.
    """
    check_window(since, until)
    report = report if report is not None else ImportReport()
    files = _realtimeqa_files(root)
    articles: dict[str, ArticleRecord] = {}
    gcs_urls = _read_search_results(files["gcs"], articles, report)
    gold_urls = _read_search_results(files["gold"], articles, report)
    questions: list[QuestionRecord] = []
    seen: set[str] = set()
    for path in files["qa"]:
        for question in _read_questions(path, _realtimeqa_question, seen, report):
            key = (*_week(path), question.qid)
            question.meta["search_result_urls"] = gcs_urls.get(key, [])
            question.meta["gold_urls"] = gold_urls.get(key, [])
            questions.append(question)
    return _finish_articles(articles, since, until, report), _finish_questions(questions, since, until, report), report


# --- StreamingQA --------------------------------------------------------------------------------


def _strings(value: object) -> list[str]:
    """A str or a list of str -> the non-empty stripped strings (anything else -> [])."""
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return [s.strip() for s in items if isinstance(s, str) and s.strip()]


def _streamingqa_question(obj: dict[str, Any], where: str, report: ImportReport) -> QuestionRecord | None:
    qid, text = obj.get("qa_id"), clean_text(obj.get("question"))
    if qid in (None, "") or not text:
        report.skip("question: no id or text", where)
        return None
    try:
        asked = parse_published(obj.get("question_ts"), what="question_ts")
    except InvalidDateError:
        report.skip("question: bad date", where)
        return None
    answers = tuple(dict.fromkeys(_strings(obj.get("answers")) + _strings(obj.get("answers_additional"))))
    if not answers:
        report.skip("question: no answer", where)
        return None
    try:
        evidence_date = parse_published(obj.get("evidence_ts"), what="evidence_ts").isoformat()
    except InvalidDateError:
        evidence_date = None
    meta = {
        "evidence_id": obj.get("evidence_id"),
        "evidence_date": evidence_date,
        "recent_or_past": obj.get("recent_or_past"),
        "written_or_generated": obj.get("written_or_generated"),
    }
    return QuestionRecord(qid=str(qid), text=text, asked=asked, answers=answers, subset="streamingqa", meta=meta)


def read_streamingqa(
    questions_path: Path,
    articles_path: Path | None = None,
    *,
    since: dt.date | None = None,
    until: dt.date | None = None,
    report: ImportReport | None = None,
) -> tuple[list[ArticleRecord], list[QuestionRecord], ImportReport]:
    """Read StreamingQA questions (JSONL, .gz allowed) and, if given, its articles as plain JSONL.

    A question is asked on the UTC day of `question_ts`; its answers are `answers` then
    `answers_additional`, deduplicated in order. `since`/`until` filter questions by that day and
    articles by publication day.
    """
    check_window(since, until)
    report = report if report is not None else ImportReport()
    questions_path = Path(questions_path)
    questions = list(_read_questions(questions_path, _streamingqa_question, set(), report))
    articles: list[ArticleRecord] = []
    if articles_path is not None:
        articles, _ = read_articles_jsonl(articles_path, since=since, until=until, report=report, source="streamingqa")
    return articles, _finish_questions(questions, since, until, report), report
