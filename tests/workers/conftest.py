"""The cup stream: one cup final a month, each won by someone new, and a question at the end of each
month from 2023-10 on (used by the replay, evaluation and transportability tests)."""

from __future__ import annotations

import datetime as dt

import pytest

from indexer.records import ArticleRecord, QuestionRecord

WINNERS = {
    dt.date(2023, 7, 20): "Lena Hartwig",
    dt.date(2023, 10, 20): "Ada Quist",
    dt.date(2023, 11, 20): "Bram Oyelaran",
    dt.date(2023, 12, 20): "Cato Venn",
    dt.date(2024, 1, 20): "Dora Maelstrom",
    dt.date(2024, 2, 20): "Emil Rautio",
    dt.date(2024, 3, 20): "Fenna Iwu",
}


def stream() -> tuple[list[ArticleRecord], list[QuestionRecord]]:
    articles, questions = [], []
    for day, name in WINNERS.items():
        url = f"https://cup.example/{day.isoformat()}"
        articles.append(
            ArticleRecord(
                url,
                f"{name} wins the Quillon Cup",
                f"The Quillon Cup final on Saturday was won by {name}. The crowd cheered. "
                f"{name} lifted the trophy in the rain.",
                day,
                "test",
            )
        )
        if day.month >= 10 or day.year == 2024:
            questions.append(
                QuestionRecord(
                    f"cup-{day.isoformat()}",
                    "Who won the Quillon Cup final this month?",
                    day + dt.timedelta(days=5),
                    (name,),
                    "test",
                    meta={"search_result_urls": [url]},
                )
            )
    return articles, questions


@pytest.fixture
def cup_stream() -> tuple[list[ArticleRecord], list[QuestionRecord]]:
    return stream()


@pytest.fixture
def new_job():
    """A function that opens a job context over the settings and creates a queued job row of a kind;
    returns (context, the job's handle): what a job function takes. Closed after the test."""
    import contextlib

    from app.bootstrap import open_context
    from workers.progress import JobProgress
    from workers.runner import JobHandle

    with contextlib.ExitStack() as opened:

        def make(settings, kind: str = "train"):
            ctx = opened.enter_context(open_context(settings))
            job_id = ctx.runner.create(kind, {})
            return ctx, JobHandle(ctx.sessions, job_id, JobProgress(ctx.sessions, job_id))

        yield make
