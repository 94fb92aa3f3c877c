"""/admin/feeds: add (201; 409 a duplicate, 422 a bad URL), list with health, delete (204; 404 unknown),
admin token required."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.main import create_app

ADMIN = {"X-Admin-Token": "test-admin-token"}


@pytest.fixture
def api(settings):
    with TestClient(create_app(settings)) as c:
        yield c


def test_post_feed_adds_it_due_at_once_and_refuses_a_duplicate(api):
    r = api.post("/admin/feeds", json={"url": "https://news.example/rss.xml", "source": "example"}, headers=ADMIN)
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["url"], body["source"], body["active"], body["failures"], body["next_fetch_at"]) == (
        "https://news.example/rss.xml",
        "example",
        True,
        0,
        None,
    )
    again = api.post("/admin/feeds", json={"url": "https://news.example/rss.xml"}, headers=ADMIN)
    assert again.status_code == 409 and "already polled" in again.json()["detail"]
    assert [f["url"] for f in api.get("/admin/feeds", headers=ADMIN).json()] == ["https://news.example/rss.xml"]


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"url": "not a url"}, "is not an http(s) URL"),
        ({"url": "ftp://news.example/rss"}, "is not an http(s) URL"),
        ({"url": "https://news.example/rss", "extra": 1}, "extra"),
        ({"source": "example"}, "url"),
    ],
)
def test_post_feed_bad_input_is_422(api, body, fragment):
    r = api.post("/admin/feeds", json=body, headers=ADMIN)
    assert r.status_code == 422, r.text
    assert fragment in r.text
    assert api.get("/admin/feeds", headers=ADMIN).json() == []


def test_get_feeds_shows_the_health_of_a_polled_feed(api, feed_server):
    from workers.config import FeedConfig
    from workers.feed_poller import FeedPoller

    feed_server.serve("/rss.xml", "rss_content.xml")
    feed_server.serve("/down.xml", b"oops", "text/plain", status=500)
    for path in ("/rss.xml", "/down.xml"):
        assert api.post("/admin/feeds", json={"url": feed_server.url(path)}, headers=ADMIN).status_code == 201
    poller = FeedPoller(api.app.state.db.sessions, FeedConfig(host_delay_s=0, timeout_s=2, retries=0))
    try:
        poller.step()
    finally:
        poller.close()
    rows = {f["url"]: f for f in api.get("/admin/feeds", headers=ADMIN).json()}
    ok, down = rows[feed_server.url("/rss.xml")], rows[feed_server.url("/down.xml")]
    assert (ok["title"], ok["last_status"], ok["last_new"], ok["articles_total"], ok["failures"]) == (
        "Port Calder Gazette",
        200,
        2,
        2,
        0,
    )
    assert ok["last_fetch_at"] and ok["last_ok_at"] and ok["next_fetch_at"]
    assert (down["last_status"], down["failures"], down["last_ok_at"]) == (500, 1, None)
    assert "HTTP 500" in down["last_error"]


def test_delete_feed_removes_it_and_an_unknown_url_is_404(api):
    api.post("/admin/feeds", json={"url": "https://news.example/rss.xml"}, headers=ADMIN)
    r = api.delete("/admin/feeds", params={"url": "https://news.example/rss.xml"}, headers=ADMIN)
    assert r.status_code == 204, r.text
    assert api.get("/admin/feeds", headers=ADMIN).json() == []
    missing = api.delete("/admin/feeds", params={"url": "https://news.example/rss.xml"}, headers=ADMIN)
    assert missing.status_code == 404 and "no feed with URL" in missing.json()["detail"]
    assert api.delete("/admin/feeds", headers=ADMIN).status_code == 422  # no url


def test_feeds_routes_need_the_admin_token(api):
    assert api.get("/admin/feeds").status_code == 401
    assert api.post("/admin/feeds", json={"url": "https://news.example/rss.xml"}).status_code == 401
    assert api.delete("/admin/feeds", params={"url": "https://news.example/rss.xml"}).status_code == 401
    assert api.get("/admin/feeds", headers=ADMIN).json() == []
