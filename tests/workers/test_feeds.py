"""The feed poller against a real HTTP server on 127.0.0.1: RSS content:encoded, Atom, summary-only
feeds whose pages are fetched, malformed feeds, conditional GETs, 5xx with retries and backoff,
timeouts, size limits, per-host politeness and idempotent intake."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from sqlalchemy import func, select

from app.bootstrap.builders import open_database
from serving.errors import ConflictError, InvalidInputError, NotFoundError
from store.tables import Article, Feed, LiveQueueItem
from workers.config import FeedConfig
from workers.feed_poller import FeedPoller, add_feed, feed_status, list_feeds, remove_feed

FAST = FeedConfig(interval_s=300, host_delay_s=0, timeout_s=2.0, retries=1, retry_backoff_s=0.01, poll_s=0.01)


@pytest.fixture
def db(settings):
    database = open_database(settings)
    yield database
    database.close()


def add(db, url: str, source: str = "") -> None:
    with db.sessions() as s, s.begin():
        add_feed(s, url, source)


def feed_row(db, url: str) -> Feed:
    with db.sessions() as s:
        return s.scalar(select(Feed).where(Feed.url == url))


def stored(db) -> dict[str, Article]:
    with db.sessions() as s:
        return {a.url: a for a in s.scalars(select(Article))}


def poll(db, cfg: FeedConfig = FAST, **kw) -> dict:
    poller = FeedPoller(db.sessions, cfg)
    try:
        return poller.step(**kw)
    finally:
        poller.close()


def test_feed_poller_stores_rss_content_encoded_entries(db, feed_server):
    feed_server.serve("/rss.xml", "rss_content.xml")
    add(db, feed_server.url("/rss.xml"), source="gazette")
    result = poll(db)
    assert (result["feeds"], result["ok"], result["new"], result["skipped"]) == (1, 1, 2, 1)
    bridge = stored(db)[feed_server.url("/news/bridge-reopens")]
    assert (
        "counterweight cables" in bridge.text
        and "Odile Brannock thanked residents for their patience & said" in bridge.text
    )
    assert "<p>" not in bridge.text and "trackReader" not in bridge.text
    assert bridge.published == dt.date(2024, 3, 6)  # 23:30 at -05:00 is March 6 in UTC
    assert (bridge.title, bridge.source, bridge.authors, bridge.language) == (
        "Harbour bridge reopens after repairs",
        "gazette",
        ["Ines Halvorsen"],
        "en",
    )
    assert [r.path for r in feed_server.requests] == ["/rss.xml"]  # full content: no page fetched
    assert feed_server.requests[0].user_agent == "streaming-qa feed poller"
    row = feed_row(db, feed_server.url("/rss.xml"))
    assert (row.title, row.last_status, row.failures, row.last_new, row.articles_total) == (
        "Port Calder Gazette",
        200,
        0,
        2,
        2,
    )
    assert "skipped 1 entry" in row.last_error and "no http(s) link" in row.last_error
    assert row.next_fetch_at - row.last_fetch_at == dt.timedelta(seconds=300)
    with db.sessions() as s:
        assert set(s.scalars(select(LiveQueueItem.via))) == {"feed"}
    assert poll(db)["feeds"] == 0  # not due again for interval_s


def test_feed_poller_reads_atom_content_and_resolves_relative_links(db, feed_server):
    feed_server.serve("/atom.xml", "atom.xml", "application/atom+xml")
    add(db, feed_server.url("/atom.xml"))
    assert poll(db)["new"] == 2
    articles = stored(db)
    keeper = articles[feed_server.url("/vessa/lighthouse-keeper")]
    assert keeper.title == "Lighthouse keeper retires after forty years"
    assert keeper.published == dt.date(2024, 2, 19) and keeper.source == "127.0.0.1"  # no source: the host
    assert "hundred and twelve steps" in keeper.text and "&lt;" not in keeper.text
    roof = articles[feed_server.url("/vessa/school-roof")]  # href="/vessa/school-roof"
    assert roof.published == dt.date(2024, 2, 12)  # <published> before <updated>
    assert "damaged in the January storm" in roof.text


def test_feed_poller_fetches_the_pages_of_a_summary_only_feed(db, feed_server):
    feed_server.serve("/brief.xml", "summary_only.xml")
    for name in ("cannery", "shipyard"):
        feed_server.serve(f"/articles/{name}.html", feed_server.fixture(f"articles/{name}.html"), "text/html")
    add(db, feed_server.url("/brief.xml"))
    result = poll(db)
    assert (result["new"], result["results"][0]["pages"]) == (3, 3)
    articles = stored(db)
    cannery = articles[feed_server.url("/articles/cannery.html")].text
    assert "second shift that starts at two in the afternoon" in cannery  # the page's text...
    assert "Read more on our site" not in cannery  # ...not the summary
    assert "Subscribe" not in cannery and "Copyright" not in cannery and "Most read" not in cannery
    assert "battery-electric ferry" in articles[feed_server.url("/articles/shipyard.html")].text
    gone = articles[feed_server.url("/articles/gone.html")]  # 404: the summary is stored
    assert gone.text == "The summary of a story whose page answers 404 is stored instead."


def test_feed_poller_records_a_malformed_feed_and_polls_the_others(db, feed_server):
    feed_server.serve("/broken.xml", "malformed.xml")
    feed_server.serve("/rss.xml", "rss_content.xml")
    add(db, feed_server.url("/broken.xml"))
    add(db, feed_server.url("/rss.xml"))
    result = poll(db)
    assert (result["ok"], result["errors"], result["new"]) == (1, 1, 2)
    row = feed_row(db, feed_server.url("/broken.xml"))
    assert "is not a readable RSS or Atom feed" in row.last_error
    assert (row.last_status, row.failures, row.last_ok_at) == (200, 1, None)
    assert row.next_fetch_at - row.last_fetch_at == dt.timedelta(seconds=600)  # interval * 2**1


def test_feed_poller_sends_a_conditional_get_and_a_304_changes_nothing(db, feed_server):
    stamp = "Tue, 05 Mar 2024 12:00:00 GMT"
    feed_server.serve("/rss.xml", "rss_content.xml", etag='"v1"', last_modified=stamp)
    url = feed_server.url("/rss.xml")
    add(db, url)
    assert poll(db)["new"] == 2
    first = feed_row(db, url)
    assert (first.etag, first.last_modified) == ('"v1"', stamp)
    before = {u: (a.version, a.content_hash) for u, a in stored(db).items()}
    result = poll(db, every=True)
    assert result["not_modified"] == 1 and result["new"] == result["updated"] == result["duplicate"] == 0
    second = feed_server.seen("/rss.xml")[1]
    assert second.headers["if-none-match"] == '"v1"' and second.headers["if-modified-since"] == stamp
    assert {u: (a.version, a.content_hash) for u, a in stored(db).items()} == before
    row = feed_row(db, url)
    assert (row.etag, row.last_modified, row.last_status, row.last_new, row.articles_total) == (
        '"v1"',
        stamp,
        304,
        2,
        2,
    )
    assert row.last_fetch_at > first.last_fetch_at


def test_feed_poller_retries_a_500_then_records_it_and_backs_off(db, feed_server):
    feed_server.serve("/down.xml", b"oops", "text/plain", status=500)
    url = feed_server.url("/down.xml")
    add(db, url)
    cfg = FeedConfig(interval_s=300, host_delay_s=0, timeout_s=2.0, retries=2, retry_backoff_s=0.01)
    assert poll(db, cfg)["errors"] == 1
    assert len(feed_server.seen("/down.xml")) == 3  # one try and two retries
    row = feed_row(db, url)
    assert (row.last_status, row.failures) == (500, 1)
    assert "HTTP 500" in row.last_error and "3 attempt(s)" in row.last_error
    assert row.next_fetch_at - row.last_fetch_at == dt.timedelta(seconds=600)
    poll(db, cfg, every=True)
    row = feed_row(db, url)
    assert row.failures == 2 and row.next_fetch_at - row.last_fetch_at == dt.timedelta(seconds=1200)
    slow = FeedConfig(interval_s=40_000, host_delay_s=0, timeout_s=2.0, retries=0)
    poll(db, slow, every=True)
    row = feed_row(db, url)
    assert row.next_fetch_at - row.last_fetch_at == dt.timedelta(days=1)  # capped
    feed_server.serve("/down.xml", "rss_content.xml")  # back up: a success resets the count
    assert poll(db, cfg, every=True)["ok"] == 1
    row = feed_row(db, url)
    assert (row.failures, row.last_status, row.last_error is None or "skipped" in row.last_error) == (0, 200, True)


def test_feed_poller_loop_survives_failing_feeds_until_stopped(db, feed_server):
    feed_server.serve("/down.xml", b"oops", "text/plain", status=503)
    feed_server.serve("/rss.xml", "rss_content.xml")
    add(db, feed_server.url("/down.xml"))
    add(db, feed_server.url("/rss.xml"))
    poller = FeedPoller(db.sessions, FAST)
    thread = threading.Thread(target=poller.run, daemon=True)
    thread.start()
    urls = [feed_server.url("/down.xml"), feed_server.url("/rss.xml")]
    try:
        for _ in range(500):  # until both feeds were polled once (the loop goes on: they are not due again)
            if all(feed_row(db, u).last_fetch_at is not None for u in urls):
                break
            thread.join(0.02)
    finally:
        poller.stop()
        thread.join(10)
    assert not thread.is_alive() and poller.last is not None and poller.last_error is None
    assert feed_row(db, urls[0]).failures == 1 and feed_row(db, urls[1]).last_status == 200
    assert len(stored(db)) == 2


def test_feed_poller_records_a_timeout_of_a_slow_host(db, feed_server):
    feed_server.serve_slowly("/slow.xml")
    url = feed_server.url("/slow.xml")
    add(db, url)
    cfg = FeedConfig(interval_s=300, host_delay_s=0, timeout_s=0.2, retries=1, retry_backoff_s=0.01)
    result = poll(db, cfg)
    assert result["errors"] == 1 and "timed out after 0.2 s" in result["results"][0]["error"]
    row = feed_row(db, url)
    assert (row.last_status, row.failures) == (None, 1) and "timed out" in row.last_error
    assert len(feed_server.seen("/slow.xml")) == 2


def test_feed_poller_refuses_a_body_over_max_bytes(db, feed_server):
    feed_server.serve("/big.xml", b"<rss>" + b" " * 5000 + b"</rss>")
    url = feed_server.url("/big.xml")
    add(db, url)
    cfg = FeedConfig(interval_s=300, host_delay_s=0, timeout_s=2.0, retries=3, max_bytes=1024)
    poll(db, cfg)
    row = feed_row(db, url)
    assert "larger than 1,024 bytes" in row.last_error and row.failures == 1
    assert len(feed_server.seen("/big.xml")) == 1  # not retried: it would be as large again


def test_feed_poller_stores_repeats_as_duplicates_and_a_changed_entry_as_an_update(db, feed_server):
    feed_server.serve("/rss.xml", "rss_content.xml")
    url = feed_server.url("/rss.xml")
    add(db, url)
    assert poll(db)["new"] == 2
    again = poll(db, every=True)
    assert (again["new"], again["updated"], again["duplicate"]) == (0, 0, 2)
    assert feed_row(db, url).last_new == 0
    changed = feed_server.fixture("rss_content.xml").replace(b"4.2 million crowns", b"4.3 million crowns")
    feed_server.serve("/rss.xml", changed)
    third = poll(db, every=True)
    assert (third["new"], third["updated"], third["duplicate"]) == (0, 1, 1)
    bridge = stored(db)[feed_server.url("/news/bridge-reopens")]
    assert bridge.version == 2 and "4.3 million crowns" in bridge.text
    row = feed_row(db, url)
    assert (row.last_new, row.articles_total) == (1, 2)


def test_feed_poller_waits_host_delay_between_requests_to_one_host(db, feed_server):
    feed_server.serve("/brief.xml", "summary_only.xml")
    for name in ("cannery", "shipyard"):
        feed_server.serve(f"/articles/{name}.html", feed_server.fixture(f"articles/{name}.html"), "text/html")
    add(db, feed_server.url("/brief.xml"))
    cfg = FeedConfig(interval_s=300, host_delay_s=0.3, timeout_s=2.0, retries=0)
    assert poll(db, cfg)["new"] == 3
    paths = [r.path for r in feed_server.requests]
    assert paths == ["/brief.xml", "/articles/cannery.html", "/articles/shipyard.html", "/articles/gone.html"]
    gaps = [b.at - a.at for a, b in zip(feed_server.requests, feed_server.requests[1:])]
    assert min(gaps) >= 0.3, gaps


def test_add_feed_refuses_bad_urls_and_duplicates(db):
    with db.sessions() as s, s.begin():
        add_feed(s, " https://news.example/rss ", source="example")
    for bad in ("not a url", "ftp://news.example/rss", "https://", "https://news.example/a b", ""):
        with pytest.raises(InvalidInputError, match="is not an http\\(s\\) URL"):
            with db.sessions() as s, s.begin():
                add_feed(s, bad)
    with pytest.raises(InvalidInputError, match="longer than 64"):
        with db.sessions() as s, s.begin():
            add_feed(s, "https://other.example/rss", source="x" * 65)
    with pytest.raises(ConflictError, match="already polled"):
        with db.sessions() as s, s.begin():
            add_feed(s, "https://news.example/rss")
    with db.sessions() as s:
        assert [f.url for f in list_feeds(s)] == ["https://news.example/rss"]
        [status] = feed_status(s)
    assert status["url"] == "https://news.example/rss" and status["source"] == "example"
    assert {
        "last_fetch_at",
        "last_ok_at",
        "last_status",
        "last_error",
        "failures",
        "last_new",
        "articles_total",
        "next_fetch_at",
        "title",
    } <= set(status)


def test_remove_feed_keeps_its_articles_and_refuses_an_unknown_url(db, feed_server):
    feed_server.serve("/rss.xml", "rss_content.xml")
    add(db, feed_server.url("/rss.xml"))
    poll(db)
    with db.sessions() as s, s.begin():
        remove_feed(s, feed_server.url("/rss.xml"))
    with pytest.raises(NotFoundError, match="no feed with URL"):
        with db.sessions() as s, s.begin():
            remove_feed(s, feed_server.url("/rss.xml"))
    with db.sessions() as s:
        assert list_feeds(s) == [] and s.scalar(select(func.count()).select_from(Article)) == 2
