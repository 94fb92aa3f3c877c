"""The HTTP API over the sample news, with the fast fakes (hash encoder, first-entity reader)."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.bootstrap.builders import open_database
from app.main import create_app
from store.tables import Article, IndexSnapshot, Job, Passage
from tests import loaded

loaded_settings = loaded.loaded_settings  # the sample copied from a template: overrides conftest's fixture here

ADMIN = {"X-Admin-Token": "test-admin-token"}


def counts(settings):
    db = open_database(settings, migrate=False)
    try:
        with db.sessions() as s:
            return (
                s.scalar(select(func.count()).select_from(Article)),
                s.scalar(select(func.count()).select_from(Passage)),
                s.scalar(select(func.count()).select_from(IndexSnapshot)),
                s.scalar(select(func.count()).select_from(Job)),
            )
    finally:
        db.close()


def test_answers_returns_the_documented_fields(client):
    r = client.post("/v1/answers", json={"question": "Who is the mayor of Port Calder?", "as_of": "2024-01-31"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) >= {"answer", "as_of", "passages", "versions", "timings_ms"}
    assert body["as_of"] == "2024-01-31"
    assert body["passages"], "the sample has passages on or before 2024-01-31"
    p = body["passages"][0]
    assert set(p) >= {"passage_id", "title", "url", "published", "score", "text"}
    assert body["versions"]["encoder"] == "hash-384"
    assert body["versions"]["reader"] == "first-entity"
    assert body["timings_ms"]["total"] >= body["timings_ms"]["retrieve"]
    assert body["timings_ms"]["queue"] >= 0  # from arrival until the answer gate let it in
    # the fake reader copies a phrase of the top passage: stated there, and said so
    assert body["answer"] and body["grounded"] is True
    assert body["evidence"][0] == p["passage_id"] and body["answer"].lower() in p["text"].lower()
    assert body["confidence"] is None  # the fake reader gives none


def test_answers_say_when_no_passage_read_states_the_answer_and_how_sure_the_reader_is(client):
    from models.readers import ReaderAnswer
    from serving.reader_state import ReaderState

    class Guess:  # answers with a word no passage of the sample holds
        name = "guess"

        def generate(self, question, as_of, passages):
            return ReaderAnswer(text="Zanzibarville", raw="Zanzibarville", confidence=0.04)

    client.app.state.answers.reader_state = ReaderState(Guess())
    r = client.post("/v1/answers", json={"question": "Who is the mayor of Port Calder?", "as_of": "2024-01-31"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == "Zanzibarville" and body["passages"]
    assert body["grounded"] is False and body["evidence"] == [] and body["confidence"] == 0.04
    page = client.get("/", params={"q": "Who is the mayor of Port Calder?", "as_of": "2024-01-31"}).text
    assert "Not stated in any passage the reader read" in page and "states the answer" not in page
    assert "low confidence (4%)" in page


@pytest.mark.parametrize("as_of", ["2024-01-10", "2024-01-31", "2024-02-15", "2024-03-01", "2024-03-31"])
def test_answers_never_cite_passages_after_as_of(client, as_of):
    for question in [
        "Who is the mayor of Port Calder?",
        "Who is the head coach of the Kestrel Bay Harriers?",
        "What is the Calder Reserve Bank's benchmark interest rate?",
    ]:
        r = client.post("/v1/answers", json={"question": question, "as_of": as_of, "top_k": 50})
        assert r.status_code == 200, r.text
        published = [p["published"] for p in r.json()["passages"]]
        assert published and max(published) <= as_of


def test_answers_same_question_two_dates_use_their_own_period(client):
    q = "Who is the head coach of the Kestrel Bay Harriers?"
    early = client.post("/v1/answers", json={"question": q, "as_of": "2024-01-24", "top_k": 3}).json()
    late = client.post("/v1/answers", json={"question": q, "as_of": "2024-03-14", "top_k": 3}).json()
    assert all(p["published"] <= "2024-01-24" for p in early["passages"])
    # As of March the newer passages (February/March news of the coaching change) are reachable and cited.
    assert any(p["published"] > "2024-01-31" for p in late["passages"])
    assert "Okafor" in " ".join(p["text"] for p in late["passages"])
    assert "Okafor" not in " ".join(p["text"] for p in early["passages"])


@pytest.mark.parametrize(
    "payload, fragment",
    [
        ({"question": "Who?", "as_of": "2031-02-30"}, "as_of '2031-02-30' is not a date"),
        ({"question": "Who?", "as_of": "yesterday"}, "is not a date (use YYYY-MM-DD)"),
        ({"question": "   "}, "question is empty"),
        ({"question": ""}, "question is empty"),
        ({"question": "x" * 10_000}, "question is 10000 characters long"),
        ({"question": "Who?", "top_k": 0}, "top_k 0 is out of range"),
        ({"question": "Who?", "top_k": 100000}, "top_k 100000 is out of range"),
        ({"question": "Who?", "top_k": "many"}, "top_k"),
        ({"question": "Who?", "top_k": "5"}, "top_k: Input should be a valid integer"),
        ({"question": "Who?", "top_k": True}, "top_k: Input should be a valid integer"),
        ({"question": "Who?", "top_k": 5.5}, "top_k"),
        ({"question": "Who?", "as_of": "2024-02-20T99:99"}, "as_of '2024-02-20T99:99' is not a date (use YYYY-MM-DD)"),
        ({"question": "Who?", "as_of": "2024-W08-2"}, "is not a date"),
        ({"question": "Who?", "as_of": "20240220"}, "is not a date"),
        ({"question": "Who?", "as_of": "2024/02/20"}, "is not a date"),
        ({"as_of": "2024-01-01"}, "question"),
        ({"question": "Who?", "colour": "red"}, "colour"),
    ],
)
def test_answers_bad_input_is_a_clear_422(client, loaded_settings, payload, fragment):
    before = counts(loaded_settings)
    r = client.post("/v1/answers", json=payload)
    assert r.status_code == 422, r.text
    assert fragment in r.json()["detail"]
    assert counts(loaded_settings) == before


def test_answers_future_as_of_says_so(client):
    r = client.post("/v1/answers", json={"question": "Who is the mayor of Port Calder?", "as_of": "2030-01-01"})
    assert r.status_code == 200
    assert any("after the newest indexed article" in n for n in r.json()["notes"])


def test_answers_before_any_news_returns_no_passages(client):
    r = client.post("/v1/answers", json={"question": "Who is the mayor of Port Calder?", "as_of": "2001-01-01"})
    assert r.status_code == 200
    assert r.json()["passages"] == [] and r.json()["answer"] == ""


def test_answers_default_as_of_is_today(client):
    r = client.post("/v1/answers", json={"question": "Who is the mayor of Port Calder?"})
    assert r.json()["as_of"] == dt.datetime.now(dt.UTC).date().isoformat()


def test_health_and_ready(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    assert 0 < ready.json()["load_s"] < 60  # the snapshot's own load time
    assert client.get("/docs").status_code == 200
    assert "/v1/answers" in client.get("/openapi.json").json()["paths"]


def test_ready_is_503_without_an_index(settings):
    with TestClient(create_app(settings)) as c:
        assert c.get("/readyz").status_code == 503
        r = c.post("/v1/answers", json={"question": "Who?"})
        assert r.status_code == 503 and "sqa ingest" in r.json()["detail"]


@pytest.mark.parametrize("headers, status", [({}, 401), ({"X-Admin-Token": "wrong"}, 401)])
def test_admin_needs_the_right_token(client, loaded_settings, headers, status):
    before = counts(loaded_settings)
    r = client.post("/admin/ingest", json={"month": "2024-02"}, headers=headers)
    assert r.status_code == status and "token" in r.json()["detail"].lower()
    assert client.get("/admin/jobs/1", headers=headers).status_code == status
    assert counts(loaded_settings) == before


def test_admin_disabled_without_a_configured_token(make_settings):
    with TestClient(create_app(make_settings(admin_token=""))) as c:
        r = c.post("/admin/ingest", json={"month": "2024-02"}, headers=ADMIN)
        assert r.status_code == 403 and "SQA_ADMIN_TOKEN" in r.json()["detail"]


def test_production_refuses_to_start_without_admin_token(make_settings):
    with pytest.raises(ValueError, match="SQA_ADMIN_TOKEN must be set"):
        make_settings(env="production", admin_token="")


@pytest.mark.parametrize(
    "month, status, fragment",
    [
        ("2031-01", 422, "no articles published in 2031-01"),
        ("2024-13", 422, "is not a month"),
        ("January", 422, "is not a month"),
    ],
)
def test_admin_ingest_bad_month_is_rejected(client, loaded_settings, month, status, fragment):
    before = counts(loaded_settings)
    r = client.post("/admin/ingest", json={"month": month}, headers=ADMIN)
    assert r.status_code == status, r.text
    assert fragment in r.json()["detail"]
    assert counts(loaded_settings) == before


def test_admin_unknown_job_is_404(client):
    r = client.get("/admin/jobs/999999", headers=ADMIN)
    assert r.status_code == 404 and "no job with id 999999" in r.json()["detail"]


def test_admin_ingest_runs_in_background_and_swaps_snapshot(client, loaded_settings, wait_job):
    old = client.get("/readyz").json()["snapshot"]
    r = client.post("/admin/ingest", json={"month": "2024-02"}, headers=ADMIN)
    assert r.status_code == 202, r.text
    job = wait_job(client, r.json()["job_id"])
    assert job["state"] == "succeeded", job
    assert job["progress"] == 1.0
    assert job["counts"]["2024-02"]["articles"] == 12
    # The server swaps to the new snapshot right after the job commits, without a restart.
    deadline = time.monotonic() + 10
    while client.get("/readyz").json()["snapshot"] == old and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.get("/readyz").json()["snapshot"] == job["counts"]["2024-02"]["snapshot"] != old
    # Re-ingesting a month replaces its shard: same number of vectors, no duplicated passages.
    assert client.get("/readyz").json()["vectors"] == client.get("/admin/index", headers=ADMIN).json()["vectors"]
    listing = client.get("/admin/jobs", headers=ADMIN).json()
    assert listing[0]["id"] == job["id"]


def test_admin_ingest_trains_after_it_as_the_scheduler_does(loaded_settings, wait_job):
    """After the ingest job succeeded, `workers.after_ingest.train_after_ingest` runs with the server's
    settings (auto-train on, the fine-tune policy `always`) and its result lands in the job's counts."""
    from workers.after_ingest import NO_ACTIVE_READER

    settings = loaded_settings.model_copy(
        update={"auto_train": True, "auto_train_reranker": False, "finetune_policy": "always"}
    )
    with TestClient(create_app(settings)) as c:
        r = c.post("/admin/ingest", json={"month": "2024-02"}, headers=ADMIN)
        assert r.status_code == 202, r.text
        job_id = r.json()["job_id"]
        assert wait_job(c, job_id)["state"] == "succeeded"
        runner = c.app.state.jobs.runner
        runner.wait("ingest", timeout=30)  # its follow-up starts the training ...
        runner.wait("training", timeout=30)  # ... on the training slot
        job = c.get(f"/admin/jobs/{job_id}", headers=ADMIN).json()
    done = job["counts"]["after_ingest"]
    assert done["auto_train"]["action"] == "skip"
    assert "SQA_READER=first-entity pins the reader" in done["auto_train"]["reason"]
    assert done["finetune"] == {"policy": "always", "ran": False, "reason": NO_ACTIVE_READER}
    assert job["counts"]["2024-02"]["articles"] == 12  # the ingest's own counts stay


@pytest.mark.parametrize(
    "path",
    [
        "/admin/jobs/99999999999999999999",
        "/admin/evaluations/99999999999999999999",
        "/admin/evaluations/99999999999999999999/report",
        "/admin/jobs/0",
    ],
)
def test_an_id_out_of_range_is_a_422_not_a_server_error(client, path):
    r = client.get(path, headers={"X-Admin-Token": "test-admin-token"})
    assert r.status_code == 422, r.text
    assert "less than or equal to 9223372036854775807" in r.text or "greater than or equal to 1" in r.text


def test_ingest_of_a_month_past_the_calendar_is_a_400(client):
    r = client.post("/admin/ingest", json={"month": "9999-12"}, headers={"X-Admin-Token": "test-admin-token"})
    assert r.status_code in (400, 422), r.text
    assert "9999-12" in r.text and "out of range" in r.text


def test_docs_work_offline_with_their_assets_served_here(client):
    page = client.get("/docs")
    assert page.status_code == 200 and "cdn.jsdelivr.net" not in page.text
    assert "/static-offline-docs/swagger-ui-bundle.js" in page.text
    js = client.get("/static-offline-docs/swagger-ui-bundle.js")
    assert js.status_code == 200 and len(js.content) > 100_000
    assert client.get("/redoc").status_code == 200


def test_a_body_over_the_limit_is_refused_before_it_is_read(client):
    big = b'{"question": "' + b"x" * (70 * 1024) + b'"}'
    r = client.post("/v1/answers", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "the limit is 65536 bytes (SQA_MAX_BODY_BYTES)" in r.json()["detail"]

    def chunks():  # no Content-Length: the streamed bytes are counted
        for _ in range(80):
            yield b" " * 1024

    r = client.post("/v1/answers", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert client.get("/healthz").status_code == 200


def test_admin_token_guessing_is_locked_out_per_client(client):
    for _ in range(10):
        assert client.get("/admin/jobs", headers={"X-Admin-Token": "guess"}).status_code == 401
    r = client.get("/admin/jobs", headers={"X-Admin-Token": "test-admin-token"})  # even the right one now
    assert r.status_code == 429 and "too many failed admin logins" in r.json()["detail"]
    assert int(r.headers["Retry-After"]) >= 1


def test_metrics_count_requests_by_route(client):
    client.get("/healthz")
    text = client.get("/metrics").text
    assert "http_requests_total" in text and 'handler="/healthz"' in text


def test_rate_limit_answers_429_with_retry_after(make_settings):
    from fastapi.testclient import TestClient

    from app.main import create_app
    from tests.conftest import load_sample

    settings = make_settings(rate_limit="3/minute")
    load_sample(settings)
    with TestClient(create_app(settings)) as c:
        codes = [c.get("/admin/index", headers={"X-Admin-Token": "test-admin-token"}).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        assert c.get("/healthz").status_code == 200  # health checks are never limited
    with pytest.raises(ValueError, match="is not a rate"):
        make_settings(rate_limit="lots")


def test_an_unknown_field_lists_the_allowed_ones_and_bad_json_says_where(client):
    r = client.post("/v1/answers", json={"question": "Who?", "bogus": 1})
    assert r.status_code == 422
    assert r.json()["detail"] == "unknown field 'bogus' (allowed: question, as_of, top_k)"
    r = client.post("/v1/answers", content=b'{"question": "x",', headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"].startswith("the body is not valid JSON (at character 17)")


def test_reencode_refuses_paths_unknown_names_and_bad_options(make_settings):
    from fastapi.testclient import TestClient

    from app.main import create_app
    from tests.conftest import load_sample

    load_sample(make_settings())  # ingested with the hash encoder; the server follows it (auto)
    with TestClient(create_app(make_settings(encoder="auto"))) as c:
        for encoder in ("~", "../x", "/tmp", "nope-version"):
            r = c.post(
                "/admin/index/reencode", json={"encoder": encoder}, headers={"X-Admin-Token": "test-admin-token"}
            )
            assert r.status_code == 422, r.text
            assert r.json()["detail"].startswith(f"encoder {encoder!r} is not 'minilm' or a trained version"), r.text
        r = c.post(
            "/admin/index/reencode", json={"encoder": "hash:dim=0"}, headers={"X-Admin-Token": "test-admin-token"}
        )
        assert r.status_code == 422 and "dim 0 must be in 1..4096" in r.json()["detail"]


def test_the_root_is_the_ask_page_and_links_the_docs(client):
    r = client.get("/", follow_redirects=False)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'href="/docs"' in r.text and 'href="/dashboard"' in r.text
    assert client.get("/static/style.css").status_code == 200 and client.get("/static/app.js").status_code == 200


def test_the_json_api_keeps_json_errors_while_the_pages_show_html(client):
    r = client.get("/admin/jobs", headers={"X-Admin-Token": "wrong"})
    assert r.status_code == 401 and r.json()["detail"] == "wrong admin token (X-Admin-Token)"
    assert client.get("/v1/nothing").json()["detail"] == "Not Found"
    page = client.get("/dashboard/nothing")
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")


def test_a_duplicate_evaluation_request_gets_409_and_one_run(client, wait_job):
    """Three requests for the same quarter while the first runs: one run, two clear 409s."""
    import threading

    from sqlalchemy import func, select

    from store.tables import EvalRun, Job

    headers = {"X-Admin-Token": "test-admin-token"}
    service = client.app.state.answers
    release, original = threading.Event(), service.answer
    service.answer = lambda *a, **k: (release.wait(30), original(*a, **k))[1]
    try:
        first = client.post("/admin/evaluations", json={"quarter": "2024Q1"}, headers=headers)
        again = [client.post("/admin/evaluations", json={"quarter": "2024Q1"}, headers=headers) for _ in range(2)]
    finally:
        release.set()
    assert first.status_code == 202, first.text
    assert [r.status_code for r in again] == [409, 409]
    assert all("an evaluation of 2024Q1 is already running" in r.json()["detail"] for r in again)
    assert wait_job(client, first.json()["job_id"])["state"] == "succeeded"
    with client.app.state.db.sessions() as s:
        assert s.scalar(select(func.count()).select_from(EvalRun)) == 1
        assert s.scalar(select(func.count()).select_from(Job).where(Job.kind == "evaluation")) == 1
    service.answer = original
