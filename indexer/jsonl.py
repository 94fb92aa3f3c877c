"""JSON-lines reading and the article-line -> ArticleRecord step the importers share.

Bad content never raises: a skipped line or record is counted in the `ImportReport` with its
"file:line". Only a missing file is an error.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from indexer.dates import InvalidDateError, parse_day
from indexer.records import ArticleRecord, ImportReport

_UNIX_SECONDS = re.compile(r"^\d{9,11}(\.\d+)?$")  # "1577836800" as a string, 1973..5138


def iter_jsonl(path: Path, report: ImportReport) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each JSON object line of a `.jsonl` or `.jsonl.gz` file.

    Blank lines are ignored; a line that is not JSON, or is JSON but not an object, is skipped and
    counted in `report`. A truncated or corrupt gzip stream ends the file with a counted skip.
    Raises FileNotFoundError if `path` is not a file.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist or is not a file (expected a .jsonl or .jsonl.gz file)")
    opener = gzip.open if path.name.endswith(".gz") else open
    lineno = 0
    try:
        with opener(path, "rb") as handle:
            for lineno, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                    report.skip("malformed json line", f"{path}:{lineno}")
                    continue
                if not isinstance(obj, dict):
                    report.skip("json line is not an object", f"{path}:{lineno}")
                    continue
                yield lineno, obj
    except (OSError, EOFError):  # gzip.BadGzipFile is an OSError; EOFError: stream cut short
        report.skip("unreadable file (corrupt or truncated)", f"{path}:{lineno + 1}")


def parse_published(value: object, *, what: str = "publish date") -> dt.date:
    """A day from 'YYYY-MM-DD', 'YYYY/MM/DD' (a time part is ignored) or unix seconds (UTC day)."""
    if isinstance(value, str) and _UNIX_SECONDS.match(value.strip()):
        value = float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return dt.datetime.fromtimestamp(value, tz=dt.UTC).date()
        except (OverflowError, OSError, ValueError):
            raise InvalidDateError(f"{what} {value!r} is not a unix time in seconds") from None
    return parse_day(value, what=what)  # type: ignore[arg-type]  # a non-string raises InvalidDateError


def clean_text(value: object) -> str:
    """A stripped string, or '' for anything that is not a string."""
    return value.strip() if isinstance(value, str) else ""


def article_from_json(obj: dict[str, Any], where: str, report: ImportReport, source: str) -> ArticleRecord | None:
    """A search result or article line -> record; None (skip counted) without url, text or date.

    The date is `publish_date` (RealTimeQA) or `published` (plain JSONL); a line with an `id` but
    no `url` gets the url 'id:<id>'.
    """
    url = clean_text(obj.get("url"))
    if not url and obj.get("id") not in (None, ""):
        url = f"id:{obj['id']}"
    if not url:
        report.skip("article: no url", where)
        return None
    text = obj.get("text")
    if not isinstance(text, str) or not text.strip():
        report.skip("article: empty text", where)
        return None
    raw_day = obj.get("publish_date", obj.get("published"))
    if raw_day is None or raw_day == "":
        report.skip("article: no publish date", where)
        return None
    try:
        published = parse_published(raw_day)
    except InvalidDateError:
        report.skip("article: bad publish date", where)
        return None
    return ArticleRecord(url=url, title=clean_text(obj.get("title")), text=text, published=published, source=source)


def keep_longest(articles: dict[str, ArticleRecord], record: ArticleRecord, report: ImportReport) -> None:
    """Dedupe by url: the longest text wins; on a tie the first one seen stays."""
    old = articles.get(record.url)
    if old is not None:
        report.duplicates += 1
        if len(record.text.strip()) <= len(old.text.strip()):
            return
    articles[record.url] = record


def check_window(since: dt.date | None, until: dt.date | None) -> None:
    for name, day in (("since", since), ("until", until)):
        if day is not None and (not isinstance(day, dt.date) or isinstance(day, dt.datetime)):
            raise TypeError(f"{name} must be a datetime.date or None, not {day!r}")
    if since is not None and until is not None and since > until:
        raise ValueError(f"since {since.isoformat()} is after until {until.isoformat()}: nothing can match")


def in_window(day: dt.date, since: dt.date | None, until: dt.date | None) -> bool:
    """since <= day <= until, None meaning unbounded."""
    return (since is None or day >= since) and (until is None or day <= until)
