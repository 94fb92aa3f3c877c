"""Whether the news of the days before a question holds its answer: the articles of the questions'
span of days, normalised once (`evaluation.metrics.haystack`) and ordered by day, asked for each
question and each number of days cheaply. bench/bench_quality.py reports, per window, the share of
questions whose answer the news of the 7 and of the 30 days before holds.
"""

from __future__ import annotations

import bisect
import datetime as dt
from collections.abc import Callable, Iterable, Sequence

from evaluation.metrics import answer_in_haystack, haystack

# (published, text) of the articles published in [first, last], by day: what RecentNews reads.
Articles = Callable[[dt.date, dt.date], Iterable[tuple[dt.date, str]]]


class RecentNews:
    """The articles published from `max(days)` days before the first of `questions` to the last one's
    date (read once, through `articles(first, last)`), normalised once and ordered by day, so that
    `holds` asks "is an answer in the news of the N days before?" for each question cheaply. Without
    questions nothing is read. A question has `asked` (its date) and `answers`."""

    def __init__(self, questions: Sequence, articles: Articles, days: Sequence[int]) -> None:
        if not questions:
            self._days, self._texts = [], []
            return
        first = min(q.asked for q in questions) - dt.timedelta(days=max(days))
        last = max(q.asked for q in questions)
        rows = sorted(articles(first, last), key=lambda row: row[0])  # stable: the order within a day kept
        self._days = [published for published, _ in rows]
        self._texts = [haystack(text) for _, text in rows]

    def holds(self, question, days: int) -> bool:
        """Whether an article published in [asked - days, asked] holds a gold answer."""
        lo = bisect.bisect_left(self._days, question.asked - dt.timedelta(days=days))
        hi = bisect.bisect_right(self._days, question.asked)
        answers = list(question.answers)
        return any(answer_in_haystack(answers, text) for text in self._texts[lo:hi])
