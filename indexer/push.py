"""Articles pushed by a client (`POST /admin/articles`, the NATS consumer, the inbox watcher): a JSON
array or NDJSON body -> checked `ArticleRecord`s, with every rejected record named by its line (or
array position) and field. Pure Python: no SQL, no settings; the caller gives the limits.

A record is an object with `url` (http or https), `title`, `text`, `published` (YYYY-MM-DD, or an
ISO 8601 time: with an offset it counts on its UTC day) and `source`; optional `authors` (a list
of names) and `language` (a short code such as "en"). A bad record never stops the batch: the good
ones are stored, the bad ones come back with why.

Example:
    >>> batch = parse_articles(b'{"url": "https://x.org/a", "title": "A", "text": "Hi.", '
    ...                        b'"published": "2023-04-14", "source": "x"}\\n{"url": 3}', today=dt.date(2023, 4, 14))
    >>> len(batch.records), batch.rejected[0].line, batch.rejected[0].field
    (1, 2, 'url')
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from indexer.dates import InvalidDateError, parse_day
from indexer.records import ArticleRecord

__all__ = ["PushLimits", "Rejected", "PushBatch", "RecordError", "BodyError", "parse_articles", "check_article"]

FIELDS = ("url", "title", "text", "published", "source", "authors", "language")


@dataclass(frozen=True)
class PushLimits:
    max_records: int = 5_000  # records in one body
    max_text_chars: int = 200_000  # one article's text (RealTimeQA's longest are capped at 100,000)
    max_title_chars: int = 1_000
    max_url_chars: int = 2_048  # the articles table's column
    max_source_chars: int = 64
    future_days: int = 1  # a publication day may be this many days after today (time zones)


@dataclass(frozen=True)
class Rejected:
    line: int  # NDJSON line or JSON array position, from 1
    field: str  # the field at fault, or "record" for the record as a whole
    reason: str
    url: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"line": self.line, "field": self.field, "reason": self.reason, "url": self.url}


@dataclass
class PushBatch:
    records: list[tuple[int, ArticleRecord]] = field(default_factory=list)  # (line, record)
    rejected: list[Rejected] = field(default_factory=list)


class BodyError(ValueError):
    """The body as a whole cannot be read (not UTF-8 JSON, not an array or NDJSON, too many records)."""


def parse_published(value: object) -> dt.date:
    """'2023-04-14', '2023/04/14' or an ISO 8601 time ('2023-04-14T23:30:00-05:00' is April 15 in UTC)."""
    if isinstance(value, str) and len(value.strip()) > 10:
        try:
            stamp = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            stamp = None
        if stamp is not None:
            return stamp.astimezone(dt.UTC).date() if stamp.tzinfo else stamp.date()
    if not isinstance(value, str):
        raise InvalidDateError(f"published must be a string such as 2023-04-14, not {type(value).__name__}")
    return parse_day(value, what="published")


def _text_field(obj: dict[str, Any], name: str, limit: int, *, required: bool) -> str:
    value = obj.get(name)
    if value is None or value == "":
        if required:
            raise RecordError(name, f"{name} is missing")
        return ""
    if not isinstance(value, str):
        raise RecordError(name, f"{name} must be a string, not {type(value).__name__}")
    value = value.strip()
    if required and not value:
        raise RecordError(name, f"{name} is empty")
    if len(value) > limit:
        raise RecordError(name, f"{name} is {len(value):,} characters, more than the {limit:,} allowed")
    return value


class RecordError(ValueError):
    """One record is wrong: `field` names what, `reason` says why (what a client is told)."""

    def __init__(self, field_name: str, reason: str):
        super().__init__(reason)
        self.field = field_name
        self.reason = reason


def check_article(obj: object, limits: PushLimits, today: dt.date) -> ArticleRecord:
    """One pushed object -> record; raises RecordError naming the field."""
    if not isinstance(obj, dict):
        raise RecordError("record", f"a record must be a JSON object, not {type(obj).__name__}")
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise RecordError(unknown[0], f"unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
    url = _text_field(obj, "url", limits.max_url_chars, required=True)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or any(c.isspace() for c in url):
        raise RecordError("url", f"url {url[:100]!r} is not an http(s) URL")
    title = _text_field(obj, "title", limits.max_title_chars, required=True)
    text = _text_field(obj, "text", limits.max_text_chars, required=True)
    source = _text_field(obj, "source", limits.max_source_chars, required=True)
    if "published" not in obj or obj["published"] in (None, ""):
        raise RecordError("published", "published is missing (use YYYY-MM-DD)")
    try:
        published = parse_published(obj["published"])
    except InvalidDateError as exc:
        raise RecordError("published", str(exc)) from None
    if published > today + dt.timedelta(days=limits.future_days):
        raise RecordError("published", f"published {published} is in the future (today is {today})")
    authors = obj.get("authors") or []
    if (
        not isinstance(authors, list)
        or not all(isinstance(a, str) and len(a) <= 200 for a in authors)
        or len(authors) > 50
    ):
        raise RecordError("authors", "authors must be a list of at most 50 names (strings of up to 200 characters)")
    language = obj.get("language") or ""
    if not isinstance(language, str) or len(language) > 16:
        raise RecordError("language", "language must be a short code such as 'en' (at most 16 characters)")
    return ArticleRecord(
        url=url,
        title=title,
        text=text,
        published=published,
        source=source,
        authors=tuple(a.strip() for a in authors if a.strip()),
        language=language.strip(),
    )


def _objects(body: bytes, batch: PushBatch) -> list[tuple[int, object]]:
    """(line, parsed value) of a JSON array (position from 1) or of each non-blank NDJSON line.

    A line that is not UTF-8 or not JSON is rejected by itself (NDJSON); a JSON array must parse whole.
    """
    head = body.lstrip()[:1]
    if head == b"[":
        try:
            values = json.loads(body.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise BodyError(f"the body is not UTF-8 (byte {exc.start}): send UTF-8 JSON") from None
        except (ValueError, RecursionError) as exc:
            raise BodyError(f"the body is not a JSON array ({exc}); or send NDJSON, one object a line") from None
        if not isinstance(values, list):
            raise BodyError("the body must be a JSON array of articles or NDJSON")
        if not values:
            raise BodyError("the body holds no articles (an empty JSON array)")
        return list(enumerate(values, start=1))
    out = []
    for lineno, raw in enumerate(body.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            out.append((lineno, json.loads(raw.decode("utf-8"))))
        except UnicodeDecodeError as exc:
            batch.rejected.append(Rejected(lineno, "record", f"line is not UTF-8 (byte {exc.start})"))
        except (ValueError, RecursionError):
            batch.rejected.append(Rejected(lineno, "record", "line is not a JSON object"))
    if not out and not batch.rejected:
        raise BodyError("the body holds no articles: send a JSON array or NDJSON, one object a line")
    return out


def parse_articles(body: bytes, *, today: dt.date, limits: PushLimits = PushLimits()) -> PushBatch:
    """Check every record of a pushed body. A URL twice in one body: the second is a duplicate when its
    text is the same, rejected when it differs (which version is meant is not for us to guess).

    Raises:
        BodyError: the body as a whole is unreadable or holds more than `limits.max_records` records.
    """
    batch = PushBatch()
    objects = _objects(body, batch)
    if len(objects) + len(batch.rejected) > limits.max_records:
        raise BodyError(
            f"the body holds {len(objects) + len(batch.rejected):,} records, more than the "
            f"{limits.max_records:,} allowed in one request: split it"
        )
    seen: dict[str, tuple[int, ArticleRecord]] = {}
    for line, obj in objects:
        try:
            record = check_article(obj, limits, today)
        except RecordError as bad:
            url = obj.get("url") if isinstance(obj, dict) and isinstance(obj.get("url"), str) else None
            batch.rejected.append(Rejected(line, bad.field, bad.reason, url))
            continue
        first = seen.get(record.url)
        if first is not None:
            if first[1].content_hash != record.content_hash or first[1].published != record.published:
                batch.rejected.append(
                    Rejected(
                        line,
                        "url",
                        f"url repeats line {first[0]} with another text or date in this batch: send one version",
                        record.url,
                    )
                )
            else:
                batch.records.append((line, record))  # stored once; counted as a duplicate
            continue
        seen[record.url] = (line, record)
        batch.records.append((line, record))
    batch.rejected.sort(key=lambda r: r.line)
    return batch
