"""What the templates show, computed in plain Python (and tested without a browser): the passages of
an answer on a time axis ending at `as_of`, the answer marked inside a passage, form input checks.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from urllib.parse import urlencode

from evaluation.trust import confidence_band
from indexer.dates import parse_iso_day


@dataclass(frozen=True)
class PassageCard:
    rank: int  # 1 = the retriever's best
    title: str
    url: str
    published: dt.date
    score: float
    segments: list[tuple[str, bool]]  # (text, is the answer)
    position: float  # 0..100: where `published` sits on the axis (100 = as_of)
    days_before: int  # as_of - published
    read: bool  # one of the passages the reader was given
    new: bool = False  # not among the other date's passages (a comparison)
    states_answer: bool = False  # read, and states the answer (the API's `evidence`)

    @property
    def has_answer(self) -> bool:
        return any(marked for _, marked in self.segments)


@dataclass(frozen=True)
class AnswerView:
    as_of: dt.date
    answer: str
    versions: dict[str, str]
    timings_ms: dict[str, float]
    notes: list[str]
    cards: list[PassageCard]  # oldest first: the axis runs to as_of
    axis_start: dt.date
    ticks: list[tuple[float, str]] = field(default_factory=list)  # (position, label)
    confidence: float | None = None  # the reader's probability of its answer

    @property
    def evidence_ranks(self) -> list[int]:
        """The ranks of the read passages that state the answer, best first."""
        return sorted(c.rank for c in self.cards if c.states_answer)

    @property
    def confidence_band(self) -> str:
        """ "high" (0.7 or more: 57-69% right on the slice), "low" (under 0.15: 3-5% right),
        "medium" between, "" without a confidence (evaluation.trust; README, "How far to trust an
        answer")."""
        return confidence_band(self.confidence)

    @property
    def grounded(self) -> bool:
        return bool(self.evidence_ranks)


def parse_as_of(value: str | None, *, what: str = "as_of") -> dt.date:
    """A day written exactly as YYYY-MM-DD (the page's date picker sends that)."""
    return parse_iso_day(value or "", what=what)


def parse_top_k(value: str | None, default: int, maximum: int) -> int:
    text = (value or "").strip()
    if not text:
        return default
    if not text.isdigit() or not 1 <= int(text) <= maximum:
        raise ValueError(f"top-k {text!r} is not a whole number from 1 to {maximum}")
    return int(text)


def mark_answer(text: str, answer: str) -> list[tuple[str, bool]]:
    """Split `text` into segments, the case-insensitive occurrences of `answer` flagged True."""
    needle = answer.strip()
    if len(needle) < 2:
        return [(text, False)]
    pattern = re.compile(r"(?<!\w)" + re.escape(needle) + r"(?!\w)", re.IGNORECASE)
    out, at = [], 0
    for m in pattern.finditer(text):
        if m.start() > at:
            out.append((text[at : m.start()], False))
        out.append((m.group(0), True))
        at = m.end()
    if at < len(text):
        out.append((text[at:], False))
    return out or [(text, False)]


def answer_view(result, n_read: int, other_ids: set[int] | None = None) -> AnswerView:
    """An AnswerResult laid out for the page: cards by publish date, positioned on [start, as_of]."""
    as_of = result.as_of
    evidence = set(getattr(result, "evidence", ()))
    days = [p.published for p in result.passages]
    start = min(days) if days else as_of - dt.timedelta(days=30)
    if (as_of - start).days < 7:  # a week at least, so close dates do not pile up at the end
        start = as_of - dt.timedelta(days=7)
    span = max((as_of - start).days, 1)
    cards = [
        PassageCard(
            rank=i,
            title=p.title,
            url=p.url,
            published=p.published,
            score=float(p.score),
            segments=mark_answer(p.text, result.answer),
            position=round(100.0 * (p.published - start).days / span, 2),
            days_before=(as_of - p.published).days,
            read=i <= n_read,
            new=other_ids is not None and p.passage_id not in other_ids,
            states_answer=p.passage_id in evidence,
        )
        for i, p in enumerate(result.passages, 1)
    ]
    cards.sort(key=lambda c: (c.published, -c.rank))
    ticks = [(0.0, start.isoformat()), (100.0, as_of.isoformat())]
    if span >= 60:
        middle = start + dt.timedelta(days=span // 2)
        ticks.insert(1, (round(100.0 * (middle - start).days / span, 2), middle.isoformat()))
    return AnswerView(
        as_of=as_of,
        answer=result.answer,
        versions=dict(result.versions),
        timings_ms=dict(result.timings_ms),
        notes=list(result.notes),
        cards=cards,
        axis_start=start,
        ticks=ticks,
        confidence=getattr(result, "confidence", None),
    )


def ask_url(question: str, as_of: dt.date | str, top_k: int | None = None, compare: dt.date | str | None = None) -> str:
    """The link that reproduces a query (`/?q=...&as_of=...`)."""
    params = {"q": question, "as_of": str(as_of)}
    if top_k is not None:
        params["top_k"] = str(top_k)
    if compare:
        params["compare"] = str(compare)
    return "/?" + urlencode(params)


def ago(stamp: dt.datetime | None, now: dt.datetime | None = None) -> str | None:
    """'14 minutes ago', '3 hours ago', '2 days ago' ('just now' under a minute); None for None."""
    if stamp is None:
        return None
    seconds = max(0.0, ((now or dt.datetime.now(dt.UTC)) - stamp).total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''} ago"
    return "just now"
