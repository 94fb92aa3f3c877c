"""The pages without a browser: what they show, who may use the dashboard, CSRF, escaping, errors."""

from __future__ import annotations

import datetime as dt
import re
from types import SimpleNamespace

import pytest

from app.web import session as web_session
from app.web.views import answer_view, mark_answer, parse_as_of, parse_top_k
from indexer.dates import InvalidDateError, months_before
from tests import loaded

loaded_settings = loaded.loaded_settings  # the sample copied from a template: overrides conftest's fixture here

TOKEN = "test-admin-token"
QUESTION = "Who is the mayor of Port Calder?"


def _csrf(html: str) -> str:
    return re.search(r'name="csrf" value="([0-9a-f]+)"', html).group(1)


def login(client) -> str:
    r = client.post("/dashboard/login", data={"token": TOKEN})
    assert r.status_code == 200 and r.url.path == "/dashboard"
    return _csrf(r.text)


# ---- views -----------------------------------------------------------------------------------------


def test_mark_answer_flags_whole_word_occurrences_case_insensitively():
    assert mark_answer("Marsh won. marshes; MARSH!", "marsh") == [
        ("Marsh", True),
        (" won. marshes; ", False),
        ("MARSH", True),
        ("!", False),
    ]
    assert mark_answer("text", "") == [("text", False)]
    assert mark_answer("a+b (c)", "(c)") == [("a+b ", False), ("(c)", True)]  # regex characters are literal


def test_answer_view_orders_cards_by_date_on_an_axis_ending_at_as_of():
    as_of = dt.date(2024, 2, 20)

    def p(i, day, text="x"):
        return SimpleNamespace(passage_id=i, title=f"t{i}", url=f"u{i}", published=day, score=1.0 / i, text=text)

    result = SimpleNamespace(
        as_of=as_of,
        answer="Lindqvist",
        versions={"reader": "r"},
        timings_ms={"total": 1.0},
        notes=[],
        passages=[p(1, dt.date(2024, 2, 10), "Lindqvist won"), p(2, dt.date(2024, 1, 21)), p(3, dt.date(2024, 2, 19))],
    )
    view = answer_view(result, n_read=2, other_ids={2})
    assert [c.published for c in view.cards] == sorted(c.published for c in view.cards)
    assert view.axis_start == dt.date(2024, 1, 21) and view.cards[0].position == 0.0
    assert [c.rank for c in view.cards] == [2, 1, 3]
    by_rank = {c.rank: c for c in view.cards}
    assert by_rank[1].has_answer and not by_rank[2].has_answer
    assert by_rank[1].read and by_rank[2].read and not by_rank[3].read
    assert by_rank[1].new and not by_rank[2].new
    assert by_rank[3].days_before == 1 and 0 < by_rank[3].position < 100
    assert not view.grounded  # the result names no evidence


def test_answer_view_marks_the_read_passages_that_state_the_answer():
    as_of = dt.date(2024, 2, 20)

    def p(i, day):
        return SimpleNamespace(
            passage_id=10 + i, title=f"t{i}", url=f"u{i}", published=day, score=1.0 / i, text="Lindqvist won"
        )

    result = SimpleNamespace(
        as_of=as_of,
        answer="Lindqvist",
        versions={},
        timings_ms={},
        notes=[],
        passages=[p(1, dt.date(2024, 2, 10)), p(2, dt.date(2024, 2, 1)), p(3, dt.date(2024, 2, 19))],
        evidence=[13, 11],
    )  # evidence names passage ids, not ranks
    view = answer_view(result, n_read=3)
    assert view.grounded and view.evidence_ranks == [1, 3]
    assert {c.rank: c.states_answer for c in view.cards} == {1: True, 2: False, 3: True}
    assert view.confidence is None and view.confidence_band == ""  # no confidence given: no band shown


@pytest.mark.parametrize(
    "confidence, band",
    [(0.95, "high"), (0.7, "high"), (0.69, "medium"), (0.15, "medium"), (0.149, "low"), (0.0, "low")],
)
def test_answer_view_bands_the_readers_confidence(confidence, band):
    result = SimpleNamespace(
        as_of=dt.date(2024, 2, 20), answer="x", versions={}, timings_ms={}, notes=[], passages=[], confidence=confidence
    )
    assert answer_view(result, n_read=3).confidence_band == band


def test_form_inputs_are_parsed_strictly():
    assert parse_as_of("2024-02-20") == dt.date(2024, 2, 20)
    for bad in ("20240220", "2024-02-30", "2024-W08-2", "2024-02-20T99:99", ""):
        with pytest.raises(InvalidDateError):
            parse_as_of(bad)
    assert parse_top_k("", 5, 50) == 5 and parse_top_k("7", 5, 50) == 7
    for bad in ("0", "51", "true", "2.5", "-1"):
        with pytest.raises(ValueError, match="not a whole number"):
            parse_top_k(bad, 5, 50)
    assert months_before(dt.date(2024, 3, 31), 1) == dt.date(2024, 2, 29)
    assert months_before(dt.date(2024, 1, 15), 12) == dt.date(2023, 1, 15)


def test_session_cookies_are_signed_expire_and_die_with_the_token():
    value = web_session.new_session("secret", now=1_000_000)
    assert web_session.valid_session("secret", value, now=1_000_000 + 60)
    assert not web_session.valid_session("other-secret", value, now=1_000_000 + 60)
    assert not web_session.valid_session("secret", value, now=1_000_000 + web_session.SESSION_MAX_AGE_S + 1)
    issued, mac = value.split(".")
    assert not web_session.valid_session("secret", f"{int(issued) + 1}.{mac}", now=1_000_000)
    assert "secret" not in value
    token = web_session.csrf_token("secret", value)
    assert web_session.valid_csrf("secret", value, token)
    assert not web_session.valid_csrf("secret", web_session.new_session("secret", now=1_000_001), token)


# ---- the ask page ---------------------------------------------------------------------------------


def test_ask_page_shows_an_empty_form_with_today_the_indexed_days_and_questions_to_try(client):
    r = client.get("/")
    assert r.status_code == 200 and 'id="q"' in r.text
    assert f'value="{dt.datetime.now(dt.UTC).date().isoformat()}"' in r.text
    assert 'section class="result"' not in r.text
    assert re.search(r'id="indexed-from">2024-01-0\d</strong> to <strong id="indexed-to">2024-03-\d\d<', r.text)
    tries = re.findall(r'<a href="(/\?q=[^"]+&amp;as_of=(2024-0\d-\d\d))">', r.text.split('class="examples"')[1])
    assert len(tries) == 3 and len({day[:7] for _, day in tries}) == 3  # one a month, inside the index
    assert client.get(tries[0][0].replace("&amp;", "&")).status_code == 200


def test_ask_page_answers_with_passages_no_later_than_as_of(client):
    r = client.get("/", params={"q": QUESTION, "as_of": "2024-01-20", "top_k": "4"})
    assert r.status_code == 200
    days = re.findall(r'data-published="([0-9-]+)"', r.text)
    assert len(days) == 4 and all(d <= "2024-01-20" for d in days) and days == sorted(days)
    # the same query, reproducible from its link; a second date one click away
    assert 'href="/?q=Who+is+the+mayor+of+Port+Calder%3F&amp;as_of=2024-01-20&amp;top_k=4"' in r.text
    assert "compare=2023-12-20" in r.text
    # the fake reader copies a phrase of the top passage: the page says where it is stated
    assert "Stated in passage" in r.text and "states the answer" in r.text


def test_ask_page_compares_two_dates(client):
    r = client.get("/", params={"q": QUESTION, "as_of": "2024-02-28", "compare": "2024-01-10"})
    sections = r.text.split('<section class="result"')[1:]
    assert len(sections) == 2
    later, earlier = (re.findall(r'data-published="([0-9-]+)"', s) for s in sections)
    assert max(earlier) <= "2024-01-10" < max(later) <= "2024-02-28"


@pytest.mark.parametrize(
    "params,field,words",
    [
        ({"q": QUESTION, "as_of": "2024-02-30"}, "as_of", "is not a date"),
        ({"q": QUESTION, "as_of": "2024-02-20", "compare": "20240101"}, "compare", "is not a date"),
        ({"q": QUESTION, "as_of": "2024-02-20", "top_k": "500"}, "top_k", "from 1 to 50"),
        ({"q": "   ", "as_of": "2024-02-20"}, "q", "type a question"),
    ],
)
def test_ask_page_shows_errors_next_to_their_field(client, params, field, words):
    r = client.get("/", params=params)
    assert r.status_code == 422
    error = re.search(rf'<p class="error" id="{field}-error" role="alert">([^<]*)</p>', r.text)
    assert error and words in error.group(1)
    assert f'id="{field}"' in r.text


def test_ask_page_escapes_the_question(client):
    evil = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
    r = client.get("/", params={"q": evil, "as_of": "2024-02-20"})
    assert r.status_code == 200
    assert "<script>alert(1)" not in r.text and "<img src=x" not in r.text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in r.text


def test_ask_page_before_any_index_says_so(make_settings):
    from fastapi.testclient import TestClient

    from app.main import create_app

    with TestClient(create_app(make_settings())) as c:
        r = c.get("/", params={"q": QUESTION, "as_of": "2024-02-20"})
    assert r.status_code == 503 and "sqa ingest" in r.text


# ---- the dashboard --------------------------------------------------------------------------------


def test_dashboard_needs_a_login_and_never_puts_the_token_in_a_url(client):
    r = client.get("/dashboard/evaluations", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/login?next=%2Fdashboard%2Fevaluations"
    assert client.get("/dashboard/jobs", follow_redirects=False).status_code == 303
    wrong = client.post("/dashboard/login", data={"token": "guess"})
    assert wrong.status_code == 401 and "not the admin token" in wrong.text
    r = client.post("/dashboard/login", data={"token": TOKEN, "next": "/dashboard/evaluations"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/evaluations"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/dashboard" in cookie
    assert TOKEN not in cookie and "Secure" not in cookie  # plain http in tests; production sets Secure
    assert client.get("/dashboard").status_code == 200


def test_login_refuses_to_redirect_off_site(client):
    for target in ("https://evil.example/", "//evil.example/dashboard", "/docs"):
        r = client.post("/dashboard/login", data={"token": TOKEN, "next": target}, follow_redirects=False)
        assert r.headers["location"] == "/dashboard"


def test_login_guessing_is_locked_out(make_settings, database_url):
    from fastapi.testclient import TestClient

    from app.main import create_app

    with TestClient(create_app(make_settings(database_url=database_url, admin_failure_limit="3/minute"))) as c:
        for _ in range(3):
            assert c.post("/dashboard/login", data={"token": "guess"}).status_code == 401
        r = c.post("/dashboard/login", data={"token": TOKEN})
    assert r.status_code == 429 and "too many failed logins" in r.text and "Retry-After" in r.headers


def test_dashboard_shows_index_jobs_versions_and_schedule(client):
    login(client)
    html = client.get("/dashboard").text
    months = re.findall(r"<tr><td>(2024-0[0-9])</td><td>(\d+)</td>", html)
    assert [m for m, _ in months] == ["2024-01", "2024-02", "2024-03"] and all(int(n) > 0 for _, n in months)
    assert 'id="snapshot"' in html and "first-entity" in html
    assert re.search(r'id="job-\d+" class="state-succeeded"', html)
    assert "monthly-ingest" in html and "quarterly-evaluation" in html


def test_a_state_changing_form_needs_the_csrf_token_and_a_confirmation(client, wait_job):
    csrf = login(client)
    assert client.post("/dashboard/actions/ingest", data={"value": "2024-03", "confirmed": "yes"}).status_code == 403
    other = web_session.csrf_token(TOKEN, web_session.new_session(TOKEN, now=1))
    assert (
        client.post(
            "/dashboard/actions/ingest", data={"value": "2024-03", "csrf": other, "confirmed": "yes"}
        ).status_code
        == 403
    )
    ask = client.post("/dashboard/actions/ingest", data={"value": "2024-03", "csrf": csrf})
    assert ask.status_code == 200 and "Ingest (or re-ingest) the news of 2024-03?" in ask.text
    headers = {"X-Admin-Token": TOKEN}
    before = len(client.get("/admin/jobs", headers=headers).json())
    assert before == len(client.get("/admin/jobs", headers=headers).json())  # asking started nothing
    r = client.post(
        "/dashboard/actions/ingest", data={"value": "2024-03", "csrf": csrf, "confirmed": "yes"}, follow_redirects=False
    )
    assert r.status_code == 303
    job_id = int(re.search(r"started=(\d+)", r.headers["location"]).group(1))
    assert wait_job(client, job_id)["state"] == "succeeded"
    fragment = client.get("/dashboard/jobs").text
    assert f'id="job-{job_id}" class="state-succeeded"' in fragment and 'data-active="0"' in fragment


@pytest.mark.parametrize(
    "action,value,status,words",
    [
        ("ingest", "2024-13", 422, "2024-13"),
        ("ingest", "1999-01", 422, "1999-01"),
        ("evaluate", "2024Q5", 422, "is not a quarter"),
        ("finetune", "2024-03", 422, "no trained reader to fine-tune"),
        ("activate", "no-such-version", 404, "no-such-version"),
        ("reencode", "~", 409, "SQA_ENCODER is pinned"),
        ("schedule", "nightly-nothing", 404, "nightly-nothing"),
    ],
)
def test_a_refused_action_says_why_next_to_its_form(client, action, value, status, words):
    csrf = login(client)
    r = client.post(f"/dashboard/actions/{action}", data={"value": value, "csrf": csrf, "confirmed": "yes"})
    assert r.status_code == status, r.text[-500:]
    error = re.search(r'<p class="error"[^>]*role="alert">([^<]*)</p>', r.text)
    assert error and words in error.group(1).replace("&#39;", "'")


def test_logout_ends_the_session(client):
    csrf = login(client)
    assert client.post("/dashboard/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    assert client.get("/dashboard", follow_redirects=False).status_code == 303


def test_evaluation_pages_show_the_report_and_its_plots(client, wait_job):
    csrf = login(client)
    assert "No evaluation runs yet" in client.get("/dashboard/evaluations").text
    r = client.post(
        "/dashboard/actions/evaluate",
        data={"value": "2024Q1", "csrf": csrf, "confirmed": "yes"},
        follow_redirects=False,
    )
    job = wait_job(client, int(re.search(r"started=(\d+)", r.headers["location"]).group(1)))
    assert job["state"] == "succeeded", job
    listing = client.get("/dashboard/evaluations").text
    run_id = int(re.search(r'href="/dashboard/evaluations/(\d+)"', listing).group(1))
    trend = client.get("/dashboard/evaluations/trend.png")
    assert trend.status_code == 200 and trend.content.startswith(b"\x89PNG")
    page = client.get(f"/dashboard/evaluations/{run_id}").text
    plots = re.findall(rf'src="(/dashboard/evaluations/{run_id}/files/[\w.-]+\.png)"', page)
    assert plots and "Scores by question quarter" in page
    # how far to trust the answers: the share grounded in the list, the headline and the report's section
    assert re.search(
        r"<td>\d+\.\d</td><td>\d+\.\d</td>\s*<td>[^<]*/[^<]*</td>", listing
    )  # recall, grounded, F1 recent/past
    grounded = re.search(r"grounded (\d+\.\d) \(<a href=\"#trust\">", page)
    assert grounded and 0.0 < float(grounded.group(1)) <= 100.0
    assert '<h2 id="trust">How far to trust the answers</h2>' in page
    for src in plots:
        assert client.get(src).content.startswith(b"\x89PNG")
    assert client.get(f"/dashboard/evaluations/{run_id}/files/..%2Fsqa.db").status_code == 404
    assert client.get("/dashboard/evaluations/999").status_code == 404


def test_pages_cannot_be_framed_and_run_only_this_servers_scripts(client):
    for path in ("/", "/dashboard/login"):
        r = client.get(path)
        assert r.headers["x-frame-options"] == "DENY"
        csp = r.headers["content-security-policy"]
        assert (
            "frame-ancestors 'none'" in csp
            and "script-src 'self'" in csp
            and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
        )
    assert "content-security-policy" not in client.get("/healthz").headers  # the JSON API is left as it was
