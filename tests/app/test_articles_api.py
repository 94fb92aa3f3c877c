"""POST /admin/articles: JSON arrays and NDJSON, idempotent by URL, bad records named by line and field
while the good ones are stored, and a pushed article answerable as of its day once published."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from store.tables import Article, LiveQueueItem

ADMIN = {"X-Admin-Token": "test-admin-token"}


def rec(i: int, **over) -> dict:
    body = {
        "url": f"https://push.example/{i}",
        "title": f"Story {i}",
        "published": "2024-03-28",
        "text": f"The lighthouse keeper Mirela Voss{i} reopened the north beacon on Thursday.",
        "source": "push",
    }
    body.update(over)
    return body


def ndjson(*records) -> bytes:
    return "\n".join(json.dumps(r) for r in records).encode()


def count(client, table) -> int:
    with client.app.state.db.sessions() as s:
        return s.scalar(select(func.count()).select_from(table))


def test_post_articles_json_array_stores_and_is_idempotent(client):
    before = count(client, Article)
    r = client.post("/admin/articles", json=[rec(1), rec(2)], headers=ADMIN)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["new"], body["updated"], body["duplicate"], body["rejected"]) == (2, 0, 0, 0)
    assert [x["outcome"] for x in body["results"]] == ["new", "new"]
    assert body["waiting"] == 2
    again = client.post("/admin/articles", json=[rec(1), rec(2)], headers=ADMIN).json()
    assert (again["new"], again["duplicate"]) == (0, 2)
    changed = client.post(
        "/admin/articles", json=[rec(1, text="A corrected text about the beacon.")], headers=ADMIN
    ).json()
    assert changed["updated"] == 1 and changed["results"][0]["outcome"] == "updated"
    assert count(client, Article) == before + 2
    with client.app.state.db.sessions() as s:
        assert s.scalar(select(Article.version).where(Article.url == rec(1)["url"])) == 2


def test_post_articles_ndjson_half_bad_stores_the_good_and_names_the_bad(client):
    lines = [
        json.dumps(rec(1)),
        json.dumps(rec(2, published="2024-02-30")),
        "{not json",
        json.dumps({k: v for k, v in rec(3).items() if k != "title"}),
        json.dumps(rec(4, url="ftp://x/y")),
        json.dumps(rec(5, published="2999-01-01")),
        json.dumps(rec(6, text="x" * 200_001)),
        json.dumps(rec(7, extra=1)),
        json.dumps(rec(1)),
        json.dumps(rec(1, text="Other text.")),
    ]
    body = "\n".join(lines).encode() + b"\n" + b'{"url": "https://push.example/8", "text": "caf\xe9"}'
    r = client.post("/admin/articles", content=body, headers={**ADMIN, "Content-Type": "application/x-ndjson"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["new"], out["duplicate"]) == (1, 1)
    errors = {(e["line"], e["field"]) for e in out["errors"]}
    assert errors == {
        (2, "published"),
        (3, "record"),
        (4, "title"),
        (5, "url"),
        (6, "published"),
        (7, "text"),
        (8, "extra"),
        (10, "url"),
        (11, "record"),
    }
    reasons = {e["line"]: e["reason"] for e in out["errors"]}
    assert "not a date" in reasons[2] and "future" in reasons[6] and "200,000" in reasons[7]
    assert "repeats line 1" in reasons[10] and "UTF-8" in reasons[11]
    assert count(client, LiveQueueItem) == 1


def test_post_articles_all_bad_or_unreadable_is_422(client):
    before = count(client, Article)
    r = client.post("/admin/articles", json=[rec(1, published="tomorrow")], headers=ADMIN)
    assert r.status_code == 422 and "line 1" in r.json()["detail"]
    assert r.json()["errors"][0]["loc"] == ["body", 1, "published"]
    r = client.post("/admin/articles", content=b'[{"url": ', headers={**ADMIN, "Content-Type": "application/json"})
    assert r.status_code == 422 and "JSON array" in r.json()["detail"]
    r = client.post("/admin/articles", content=b'["caf\xe9"]', headers={**ADMIN, "Content-Type": "application/json"})
    assert r.status_code == 422 and "UTF-8" in r.json()["detail"]
    r = client.post("/admin/articles", json=[], headers=ADMIN)  # found by the schema fuzzer: was a 500
    assert r.status_code == 422 and "empty JSON array" in r.json()["detail"]
    r = client.post("/admin/articles", content=b"   ", headers=ADMIN)
    assert r.status_code == 422 and "no articles" in r.json()["detail"]
    assert count(client, Article) == before


def test_post_articles_needs_the_admin_token(client):
    assert client.post("/admin/articles", json=[rec(1)]).status_code == 401
    assert count(client, LiveQueueItem) == 0


def test_post_articles_body_over_the_limit_is_413(make_settings, tmp_path):
    from fastapi.testclient import TestClient

    from app.main import create_app

    with TestClient(create_app(make_settings(max_articles_body_bytes=4096))) as c:
        r = c.post("/admin/articles", json=[rec(1, text="y" * 10_000)], headers=ADMIN)
        assert r.status_code == 413 and "SQA_MAX_ARTICLES_BODY_BYTES" in r.json()["detail"]
        # The other routes keep their own (smaller) limit.
        r = c.post("/v1/answers", content=b"x" * 70_000, headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "SQA_MAX_BODY_BYTES" in r.json()["detail"]


def test_pushed_article_is_answerable_as_of_its_day_after_publish(client):
    question = {"question": "Who reopened the north beacon?", "as_of": "2024-03-28", "top_k": 5}
    r = client.post("/admin/articles?publish=true", json=[rec(9)], headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["published"]["articles"] == 1 and r.json()["waiting"] == 0
    answer = client.post("/v1/answers", json=question).json()
    assert any(p["url"] == rec(9)["url"] for p in answer["passages"]), answer
    earlier = client.post("/v1/answers", json={**question, "as_of": "2024-03-27"}).json()
    assert all(p["url"] != rec(9)["url"] for p in earlier["passages"])
    live = client.get("/admin/live", headers=ADMIN).json()
    assert live["waiting"] == 0 and live["months"] == [{"month": "2024-03", "pieces": 1, "passages": 1}]
    assert live["newest_article_at"] is not None and live["last_publish_at"] is not None


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("authors", "Ann", "authors must be a list"),
        ("language", "x" * 17, "short code"),
        ("source", "", "source is missing"),
        ("published", 20240328, "must be a string"),
    ],
)
def test_post_articles_optional_and_typed_fields_are_checked(client, field, value, fragment):
    r = client.post("/admin/articles", json=[rec(1, **{field: value})], headers=ADMIN)
    assert r.status_code == 422
    assert fragment in r.json()["errors"][0]["msg"] and r.json()["errors"][0]["loc"] == ["body", 1, field]


def test_ask_page_and_dashboard_say_how_fresh_the_index_is(client):
    client.post("/admin/articles?publish=true", json=[rec(11)], headers=ADMIN)
    client.post("/admin/articles", json=[rec(12)], headers=ADMIN)  # waits: not published
    page = client.get("/")
    assert page.status_code == 200
    assert 'id="freshness"' in page.text and "Newest article" in page.text
    assert "just now" in page.text and "1 more arriving now" in page.text
    assert client.post("/dashboard/login", data={"token": "test-admin-token"}).status_code == 200
    dash = client.get("/dashboard")
    assert dash.status_code == 200 and 'id="live-status"' in dash.text
    assert "1 article(s) waiting" in dash.text and "<td>2024-03</td><td>1</td><td>1</td>" in dash.text
    assert "live-2024-03" not in dash.text  # the months table lists month shards only


def test_ago_reads_as_a_person_would():
    import datetime as dt

    from app.web.views import ago

    now = dt.datetime(2024, 4, 1, 12, tzinfo=dt.UTC)
    assert ago(now - dt.timedelta(seconds=30), now) == "just now"
    assert ago(now - dt.timedelta(minutes=14), now) == "14 minutes ago"
    assert ago(now - dt.timedelta(hours=1, minutes=5), now) == "1 hour ago"
    assert ago(now - dt.timedelta(days=3), now) == "3 days ago"
    assert ago(None, now) is None


def test_answer_index_as_of_retrieves_only_what_an_earlier_index_held(client):
    import datetime as dt

    from serving.errors import InvalidInputError

    client.post("/admin/articles?publish=true", json=[rec(13)], headers=ADMIN)
    service = client.app.state.answers
    day = dt.date(2024, 3, 28)
    now = service.answer("Who reopened the north beacon?", day, 5)
    assert any(p.url == rec(13)["url"] for p in now.passages)
    before = service.answer("Who reopened the north beacon?", day, 5, index_as_of=dt.date(2024, 2, 29))
    assert before.as_of == day and all(p.published <= dt.date(2024, 2, 29) for p in before.passages)
    with pytest.raises(InvalidInputError, match="is after as_of"):
        service.answer("Who reopened the north beacon?", day, 5, index_as_of=dt.date(2024, 3, 29))


def test_dashboard_lists_feeds_with_their_errors(client):
    from store.tables import Feed

    with client.app.state.db.sessions() as s, s.begin():
        s.add(
            Feed(
                url="https://feeds.example/ok.xml",
                title="Harbour Wire",
                last_status=200,
                last_new=3,
                articles_total=12,
                failures=0,
            )
        )
        s.add(
            Feed(
                url="https://feeds.example/down.xml", last_status=500, failures=2, last_error="HTTP 500 after 3 retries"
            )
        )
    assert client.post("/dashboard/login", data={"token": "test-admin-token"}).status_code == 200
    dash = client.get("/dashboard").text
    assert 'id="feeds"' in dash and "Harbour Wire" in dash and "<td>12</td>" in dash
    assert "HTTP 500 after 3 retries (2 failed in a row)" in dash and 'class="failing"' in dash


def test_post_articles_ten_megabyte_text_is_rejected_and_the_rest_stored(client):
    big = rec(20, text="word " * (2 * 1024 * 1024))  # 10 MiB of text, inside the 16 MiB body limit
    r = client.post(
        "/admin/articles", content=ndjson(big, rec(21)), headers={**ADMIN, "Content-Type": "application/x-ndjson"}
    )
    assert r.status_code == 200, r.text[:300]
    out = r.json()
    assert out["new"] == 1 and [(e["line"], e["field"]) for e in out["errors"]] == [(1, "text")]
    assert "more than the 200,000 allowed" in out["errors"][0]["reason"]
    with client.app.state.db.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Article).where(Article.url == big["url"])) == 0
