"""Request ids: in every response, in error bodies and pages, and on the log lines a request causes."""

from __future__ import annotations

import json
import logging

import pytest

from app.api.request_ids import JsonFormatter, RequestIdFilter, configure_logging
from tests import loaded

loaded_settings = loaded.loaded_settings  # the sample copied from a template: overrides conftest's fixture here


def test_every_response_carries_a_request_id_and_a_sane_given_one_is_kept(client):
    a, b = client.get("/healthz"), client.get("/healthz")
    assert len(a.headers["x-request-id"]) == 32 and a.headers["x-request-id"] != b.headers["x-request-id"]
    assert client.get("/healthz", headers={"X-Request-ID": "lb-7f3a.1"}).headers["x-request-id"] == "lb-7f3a.1"
    for bad in ("x" * 65, "a b", "<script>", "id;rm"):
        got = client.get("/healthz", headers={"X-Request-ID": bad})
        assert got.headers["x-request-id"] != bad and len(got.headers["x-request-id"]) == 32


@pytest.mark.parametrize(
    "method, path, body, status",
    [
        ("post", "/v1/answers", {"question": " "}, 422),  # a service error
        ("post", "/v1/answers", {"question": "Who?", "as_of": "2024/01/02"}, 422),  # a date error
        ("post", "/v1/answers", {"question": "Who?", "colour": 1}, 422),  # a validation error
        ("get", "/admin/jobs", None, 401),  # an HTTP error
        ("get", "/v1/nothing", None, 404),
    ],
)
def test_error_bodies_name_the_request_id(client, method, path, body, status):
    r = getattr(client, method)(path, headers={"X-Request-ID": "req-42"}, **({"json": body} if body else {}))
    assert r.status_code == status
    assert r.json()["request_id"] == "req-42" == r.headers["x-request-id"]


def test_the_body_limit_names_the_request_id_too(make_settings):
    from fastapi.testclient import TestClient

    from app.main import create_app

    with TestClient(create_app(make_settings(max_body_bytes=1024))) as c:
        r = c.post(
            "/v1/answers",
            content=b"{" + b" " * 5000 + b"}",
            headers={"X-Request-ID": "big-1", "content-type": "application/json"},
        )
    assert r.status_code == 413 and r.json()["request_id"] == "big-1" == r.headers["x-request-id"]


def test_an_error_page_shows_the_request_id(client):
    page = client.get("/dashboard/nothing", headers={"X-Request-ID": "page-9"})
    assert page.status_code == 404 and '<code id="request-id">page-9</code>' in page.text


def test_log_lines_of_a_request_carry_its_id_and_an_access_line(client, caplog):
    caplog.set_level(logging.INFO)
    client.post(
        "/v1/answers",
        json={"question": "Who is the mayor of Port Calder?", "as_of": "2024-02-20"},
        headers={"X-Request-ID": "trace-1"},
    )
    access = [r for r in caplog.records if r.name == "app.access" and r.path == "/v1/answers"]
    assert len(access) == 1 and access[0].status == 200 and access[0].duration_ms > 0
    record = access[0]
    RequestIdFilter().filter(record)  # the handler's filter runs while the request is served; here after it
    line = json.loads(JsonFormatter().format(record))
    assert line["logger"] == "app.access" and line["status"] == 200 and line["path"] == "/v1/answers"
    assert line["message"] == "POST /v1/answers 200" and line["time"].endswith("+00:00")


def test_json_logs_one_object_a_line_with_the_request_id(capfd):
    from app.api.request_ids import REQUEST_ID

    root = logging.getLogger()
    saved = (list(root.handlers), root.level)  # pytest's own capture handlers among them
    configure_logging("INFO", "json")
    try:
        token = REQUEST_ID.set("abc-123")
        try:
            logging.getLogger("app.test").warning("something %s", "odd", extra={"job_id": 7})
        finally:
            REQUEST_ID.reset(token)
        logging.getLogger("app.test").info("outside a request")
        lines = [json.loads(line) for line in capfd.readouterr().err.strip().splitlines()]
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert lines[0] == {
        **lines[0],
        "level": "WARNING",
        "logger": "app.test",
        "message": "something odd",
        "request_id": "abc-123",
        "job_id": 7,
    }
    assert lines[1]["request_id"] == "-" and lines[1]["message"] == "outside a request"
    with pytest.raises(ValueError, match="not 'text' or 'json'"):
        configure_logging("INFO", "xml")
