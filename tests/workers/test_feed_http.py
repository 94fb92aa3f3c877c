"""The feed fetcher's turns per host, on a fake clock: a redirect counts for both hosts."""

from __future__ import annotations

import httpx

from workers.feed_http import PoliteFetcher


class FakeTime:
    def __init__(self) -> None:
        self.now, self.slept = 0.0, []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(round(s, 6))
        self.now += s


def _fetcher(handler, t: FakeTime) -> PoliteFetcher:
    client = httpx.Client(transport=httpx.MockTransport(handler), follow_redirects=True)
    return PoliteFetcher(
        client, host_delay_s=2.0, timeout_s=5.0, retries=0, max_bytes=10_000, sleep=t.sleep, clock=t.clock
    )


def _handler(request: httpx.Request) -> httpx.Response:
    if request.url.host == "feeds.example":  # the feed moved to the publisher's own host
        return httpx.Response(301, headers={"Location": "https://news.example/rss"})
    return httpx.Response(200, text="<rss/>")


def test_a_redirected_request_makes_the_answering_host_wait_its_turn():
    t = FakeTime()
    fetcher = _fetcher(_handler, t)
    got = fetcher.get("https://feeds.example/rss")
    assert got.url == "https://news.example/rss" and got.status == 200
    fetcher.get("https://news.example/articles/1")  # the host that answered the redirect
    assert t.slept == [2.0]


def test_hosts_do_not_wait_for_each_other():
    t = FakeTime()
    fetcher = _fetcher(_handler, t)
    fetcher.get("https://news.example/rss")
    fetcher.get("https://other.example/a")
    assert t.slept == []
    fetcher.get("https://news.example/b")
    assert t.slept == [2.0]
