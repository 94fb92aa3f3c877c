"""`sqa feeds add|list|remove|poll`: clear errors with a non-zero exit, per-feed poll results."""

from __future__ import annotations

import pytest


@pytest.fixture
def sqa(sqa, monkeypatch):
    """`sqa` with fast feed settings: no host delay, short timeouts, one retry."""
    monkeypatch.setenv("SQA_FEED_HOST_DELAY_S", "0")
    monkeypatch.setenv("SQA_FEED_TIMEOUT_S", "2")
    monkeypatch.setenv("SQA_FEED_RETRIES", "1")
    return sqa


def test_cli_feeds_add_list_poll_remove(sqa, feed_server):
    feed_server.serve("/rss.xml", "rss_content.xml")
    url = feed_server.url("/rss.xml")
    added = sqa("feeds", "add", url, "--source", "gazette")
    assert added.exit_code == 0, added.output
    assert f"added feed {url}" in added.output
    assert url in sqa("feeds", "list").output
    polled = sqa("feeds", "poll")
    assert polled.exit_code == 0, polled.output
    assert f"{url}: 2 new, 0 updated, 0 duplicate, 1 skipped" in polled.output
    assert "no feed is due" in sqa("feeds", "poll").output
    again = sqa("feeds", "poll", "--all")
    assert again.exit_code == 0 and f"{url}: 0 new, 0 updated, 2 duplicate" in again.output
    listed = sqa("feeds", "list").output
    assert "200" in listed and "skipped 1 entry" in listed
    removed = sqa("feeds", "remove", url)
    assert removed.exit_code == 0 and f"removed feed {url}" in removed.output
    assert "no feeds yet" in sqa("feeds", "list").output


def test_cli_feeds_poll_exits_non_zero_when_a_feed_fails(sqa, feed_server):
    feed_server.serve("/rss.xml", "rss_content.xml")
    feed_server.serve("/broken.xml", "malformed.xml")
    assert sqa("feeds", "add", feed_server.url("/rss.xml")).exit_code == 0
    assert sqa("feeds", "add", feed_server.url("/broken.xml")).exit_code == 0
    r = sqa("feeds", "poll")
    assert r.exit_code == 2, r.output
    assert f"{feed_server.url('/broken.xml')}: failed:" in r.output and "not a readable RSS or Atom feed" in r.output
    assert f"{feed_server.url('/rss.xml')}: 2 new" in r.output  # the good feed is stored all the same
    assert "1 of 2 feed(s) failed" in r.output


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("feeds", "add", "not-a-url"), "feed URL 'not-a-url' is not an http(s) URL"),
        (("feeds", "add", "ftp://news.example/rss"), "is not an http(s) URL"),
        (("feeds", "add", "https://news.example/rss", "--source", "x" * 65), "longer than 64 characters"),
        (("feeds", "remove", "https://nowhere.example/rss"), "no feed with URL 'https://nowhere.example/rss'"),
    ],
)
def test_cli_feeds_bad_input_exits_non_zero_with_a_message(sqa, args, fragment):
    r = sqa(*args)
    assert r.exit_code == 2, r.output
    assert fragment in r.output


def test_cli_feeds_add_twice_is_refused(sqa):
    assert sqa("feeds", "add", "https://news.example/rss").exit_code == 0
    r = sqa("feeds", "add", "https://news.example/rss")
    assert r.exit_code == 2 and "feed https://news.example/rss is already polled" in r.output
