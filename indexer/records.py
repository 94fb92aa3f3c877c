"""Plain records that importers produce and the database stores. No SQL, no settings."""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field
from typing import Any


def content_hash(text: str) -> str:
    """sha256 of the article text, to tell a changed article from a repeated one."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ArticleRecord:
    url: str
    title: str
    text: str
    published: dt.date
    source: str = ""  # which importer/collection it came from, e.g. "realtimeqa"
    authors: tuple[str, ...] = ()
    language: str = ""

    @property
    def content_hash(self) -> str:
        return content_hash(self.text)


@dataclass(frozen=True)
class QuestionRecord:
    qid: str  # stable id from the source (RealTimeQA question_id, StreamingQA qa_id)
    text: str
    asked: dt.date  # the question date: answer as of this day
    answers: tuple[str, ...]  # gold answers, best first; never empty
    subset: str  # collection name: "realtimeqa", "streamingqa"
    choices: tuple[str, ...] = ()
    # Free-form extras kept as JSON: evidence urls, recent_or_past, search result urls, ...
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


MAX_REPORT_EXAMPLES = 10


@dataclass
class ImportReport:
    """What one import saw: counts of records read, kept and skipped (with reasons).

    `examples` holds the first few skips as "file:line: reason", enough to find a bad record.
    `duplicates` counts records merged into an earlier one with the same key (an article URL seen
    again: the longest text is kept), `out_of_range` those left out by a since/until window; neither
    is a fault in the data, so neither is in `skipped`.
    """

    articles_read: int = 0
    questions_read: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    duplicates: int = 0
    out_of_range: int = 0

    def skip(self, reason: str, where: str | None = None) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        if where is not None and len(self.examples) < MAX_REPORT_EXAMPLES:
            self.examples.append(f"{where}: {reason}")

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())
