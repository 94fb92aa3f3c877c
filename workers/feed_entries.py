"""Feed bytes -> entry drafts (workers/feed_poller.py makes them articles): feedparser for RSS and Atom,
HTML -> plain text for entry content, trafilatura for an article page's main text.

feedparser only ever parses bytes we fetched (workers/feed_http.py enforces the politeness, the
timeouts and the size cap): it is handed a file object, never a URL or a string it could take for
a path. It also sanitises entry HTML, resolves relative links against the feed's URL and gives
dates as UTC `struct_time`s, so an entry's day is its UTC day.
"""

from __future__ import annotations

import datetime as dt
import io
import logging
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import feedparser

log = logging.getLogger(__name__)

# Elements that end a line of text, and elements whose text is not the article's.
_BLOCKS = {
    "address",
    "article",
    "aside",
    "blockquote",
    "br",
    "dd",
    "div",
    "dl",
    "dt",
    "figcaption",
    "figure",
    "footer",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hr",
    "li",
    "main",
    "ol",
    "p",
    "pre",
    "section",
    "table",
    "td",
    "th",
    "tr",
    "ul",
}
_SKIPPED = {"script", "style", "noscript", "template", "iframe", "object", "svg"}
_BREAK = "\x00"  # where a block element began or ended: a paragraph break


class FeedFormatError(ValueError):
    """The bytes are not an RSS or Atom feed feedparser can read any entry from."""


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in _SKIPPED:
            self._skip += 1
        elif tag in _BLOCKS:
            self.parts.append(_BREAK)

    def handle_endtag(self, tag):
        if tag in _SKIPPED:
            self._skip = max(0, self._skip - 1)
        elif tag in _BLOCKS:
            self.parts.append(_BREAK)

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(" ".join(data.split("\n")))  # a line break in HTML source is a space


def plain_text(text: str) -> str:
    """Whitespace made tidy: words one space apart, paragraphs (non-empty lines) a blank line apart."""
    lines = (" ".join(line.split()) for line in text.replace("\x00", "").split("\n"))  # no NUL: PostgreSQL refuses it
    return "\n\n".join(line for line in lines if line)


def html_to_text(html: str) -> str:
    """The text of an HTML fragment (entry content): tags dropped, block elements as paragraphs,
    scripts and styles left out, entities decoded."""
    parser = _TextParser()
    parser.feed(html.replace(_BREAK, " "))
    parser.close()
    return plain_text("".join(parser.parts).replace(_BREAK, "\n"))


def page_text(html: bytes, url: str) -> str:
    """The main text of an article page (trafilatura: boilerplate, menus and comments left out);
    "" when it finds none."""
    import trafilatura  # noqa: PLC0415 (lazy: trafilatura, 0.2 s, only for summary-only feeds; keeps the API start-up fast)

    try:
        text = trafilatura.extract(html, url=url, include_comments=False, include_tables=False)
    except Exception as exc:  # a page trafilatura cannot read: the caller falls back to the summary
        log.warning("no text extracted from %s: %s: %s", url, type(exc).__name__, exc)
        return ""
    return plain_text(text or "")


def parse_feed(body: bytes, url: str, content_type: str | None = None) -> feedparser.FeedParserDict:
    """Parse fetched bytes. A feed with a small fault but entries is read (feedparser's "bozo" flag
    is only logged); one with no entry and a fault, or that is no feed at all, raises FeedFormatError."""
    headers = {"content-location": url}
    if content_type:
        headers["content-type"] = content_type
    parsed = feedparser.parse(io.BytesIO(body), response_headers=headers)
    if parsed.entries:
        if parsed.bozo:
            log.info(
                "feed %s has a fault (%s); its %d entries are read all the same",
                url,
                parsed.get("bozo_exception"),
                len(parsed.entries),
            )
        return parsed
    if parsed.bozo or not parsed.version:
        why = parsed.get("bozo_exception") or "no RSS or Atom root element"
        raise FeedFormatError(
            f"{url} is not a readable RSS or Atom feed ({why}): check the URL points at the feed itself, not a page"
        )
    return parsed  # a well-formed feed with no entries yet


@dataclass(frozen=True)
class EntryDraft:
    """One feed entry before it is checked as an article (`workers.feed_poller`)."""

    url: str
    title: str
    published: dt.date  # the entry's UTC day, or the fetch day when it has none
    text: str  # the full content's text; "" when the entry has no content element
    summary: str  # the summary's (description's) text
    authors: tuple[str, ...] = ()


def _fragment_text(part) -> str:
    value = part.get("value", "") if isinstance(part, dict) else str(part or "")
    kind = part.get("type", "text/html") if isinstance(part, dict) else "text/html"
    return html_to_text(value) if "html" in kind else plain_text(value)


def _day(entry, fetch_day: dt.date) -> dt.date:
    for key in ("published_parsed", "updated_parsed", "created_parsed"):
        stamp = entry.get(key)
        if stamp:
            try:
                return dt.date(stamp.tm_year, stamp.tm_mon, stamp.tm_mday)
            except ValueError:
                continue
    return fetch_day


def _authors(entry) -> tuple[str, ...]:
    names = [a.get("name", "") for a in entry.get("authors", []) if isinstance(a, dict)]
    if not names and entry.get("author"):
        names = [entry.get("author")]
    return tuple(dict.fromkeys(n.strip()[:200] for n in names if n and n.strip()))[:50]


def entry_drafts(
    parsed: feedparser.FeedParserDict, feed_url: str, fetch_day: dt.date
) -> tuple[list[EntryDraft], list[str]]:
    """The feed's entries as drafts, first of each URL kept; and why the others were skipped."""
    drafts: list[EntryDraft] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for n, entry in enumerate(parsed.entries, start=1):
        link = (entry.get("link") or "").strip()
        url = urljoin(feed_url, link) if link else ""
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            skipped.append(f"entry {n}: no http(s) link ({link[:100]!r})")
            continue
        if url in seen:
            continue
        seen.add(url)
        content = [_fragment_text(part) for part in entry.get("content", [])]
        text = max(content, key=len) if content else ""
        summary = _fragment_text(entry.get("summary_detail") or entry.get("summary", ""))
        title = _fragment_text(entry.get("title_detail") or entry.get("title", "")).replace("\n\n", " ")
        drafts.append(
            EntryDraft(
                url=url,
                title=title,
                published=_day(entry, fetch_day),
                text=text,
                summary=summary,
                authors=_authors(entry),
            )
        )
    return drafts, skipped


_WS = re.compile(r"\s+")


def feed_title(parsed: feedparser.FeedParserDict) -> str:
    return _WS.sub(" ", parsed.feed.get("title", "") or "").strip()


def feed_language(parsed: feedparser.FeedParserDict) -> str:
    """The feed's language code ("en-us" -> "en-us"), at most 16 characters, "" when it names none."""
    return (parsed.feed.get("language", "") or "").strip()[:16]
