"""Property-based fuzzing of the JSON API against its own OpenAPI schema (schemathesis).

Every operation, admin ones with the right token, gets generated requests, valid and invalid; each
response must be no 5xx, have a documented status code and content type, and match the documented
body (errors: `ErrorPublic`). SQA_FUZZ_EXAMPLES sets the examples per operation (bench/bench_fuzz.py
runs 10,000 in all).
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, seed
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = int(os.environ.get("SQA_FUZZ_EXAMPLES", "20"))
COUNT_FILE = os.environ.get("SQA_FUZZ_COUNT_FILE")  # the benchmark counts the calls made
SEED = int(os.environ.get("SQA_FUZZ_SEED", "0"))  # 0: the same examples every run (make test)
TOKEN = "fuzz-admin-token"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _settings():
    import tempfile
    from pathlib import Path

    from settings import Settings

    home = Path(tempfile.mkdtemp(prefix="sqa-fuzz-")) / "home"
    return Settings(
        home=home,
        encoder="hash",
        reader="first-entity",
        env="test",
        snapshot_poll_s=0,
        admin_token=TOKEN,
        auto_train=False,
        rate_limit="1000000/minute",
        admin_failure_limit="1000000/minute",
    )


def _app():
    from app.main import create_app

    return create_app(_settings())


# The schema is read from the app itself (no lifespan needed for that); the fixture below loads the
# sample into its home and runs its lifespan around the module's tests.
APP = _app()
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.fixture(scope="module", autouse=True)
def served_app():
    """The app over the sample data (hash encoder, first-entity reader), its lifespan entered."""
    import shutil

    from fastapi.testclient import TestClient

    from tests.conftest import load_sample

    settings = APP.state.settings
    load_sample(settings)
    try:
        with TestClient(APP):
            yield APP
            APP.state.jobs.runner.wait_all(timeout=120)  # jobs the fuzzing started end before the store closes
    finally:
        shutil.rmtree(settings.home.parent, ignore_errors=True)


@schema.parametrize()
@seed(SEED)
@hypothesis_settings(
    max_examples=EXAMPLES, deadline=None, derandomize=not SEED, suppress_health_check=list(HealthCheck)
)
def test_no_server_error_and_every_response_as_documented(case):
    if case.operation.path.startswith("/admin"):
        case.headers = {**(case.headers or {}), "X-Admin-Token": TOKEN}
    response = case.call()
    if COUNT_FILE:
        with open(COUNT_FILE, "a") as f:
            f.write(f"{response.status_code}\n")
    case.validate_response(response, checks=CHECKS)
    if response.status_code >= 400:
        body = response.json()
        assert isinstance(body.get("detail"), str) and body["detail"], body
        assert [body.get("request_id")] == response.headers.get("x-request-id")


def test_the_schema_documents_errors_as_error_public(served_app):
    spec = served_app.openapi()
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            if path.startswith(("/v1", "/admin")):
                assert {"413", "422", "429"} <= codes, (method, path, codes)
                ref = operation["responses"]["422"]["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorPublic"), (method, path)
            if path.startswith("/admin"):
                assert {"401", "404", "409"} <= codes, (method, path, codes)
    assert "HTTPValidationError" not in str(spec)
