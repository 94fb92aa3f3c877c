"""docker-compose.yml and scripts/prestart.sh, checked without a Docker engine (none here): the file's
structure (one migration before api and worker, no secret in the file, the worker not HTTP-checked)
and the entrypoint's database URL built from the password secret."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_one_migration_runs_before_the_api_and_the_worker():
    services = compose()["services"]
    assert services["migrate"]["environment"]["SQA_MIGRATE"] == "1"
    for name in ("api", "worker"):
        s = services[name]
        assert s["environment"]["SQA_MIGRATE"] == "0", name
        assert s["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}, name
        assert s["build"] == "." and s["image"] == "streaming-qa:latest", name  # the worker builds too
    assert services["migrate"]["depends_on"] == {"db": {"condition": "service_healthy"}}


def test_api_replicas_behind_the_proxy_share_redis_and_two_workers_run_the_schedule():
    services = compose()["services"]
    api, proxy, worker = services["api"], services["proxy"], services["worker"]
    assert api["deploy"]["replicas"] == "${SQA_API_REPLICAS:-2}" and "ports" not in api  # only via the proxy
    assert api["environment"]["SQA_LIMITS_STORAGE"].startswith("redis://redis:")
    assert api["depends_on"]["redis"] == {"condition": "service_healthy"}
    assert "--forwarded-allow-ips" in api["command"]
    assert proxy["ports"] == ["8000:8000"] and proxy["depends_on"] == {"api": {"condition": "service_healthy"}}
    assert worker["deploy"]["replicas"] == "${SQA_WORKER_REPLICAS:-2}"
    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    assert "server api:8000 resolve" in conf and "resolver 127.0.0.11" in conf
    # only answers are retried on another replica; an admin POST is never sent twice
    answers = conf.split("location /v1/answers", 1)[1].split("}", 1)[0]
    rest = conf.split("location / {", 1)[1].split("}", 1)[0]
    assert "non_idempotent" in answers and "non_idempotent" not in rest


def test_no_secret_is_a_value_in_the_file_and_the_worker_is_not_http_checked():
    text = (ROOT / "docker-compose.yml").read_text()
    assert "SQA_ADMIN_TOKEN:" not in text and "POSTGRES_PASSWORD:" not in text
    c = compose()
    assert set(c["secrets"]) == {"sqa_admin_token", "postgres_password"}
    assert c["services"]["db"]["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"
    assert c["services"]["worker"]["healthcheck"] == {"disable": True}
    assert "healthcheck" not in c["services"]["api"]  # the image's GET /healthz


def test_prestart_builds_the_url_from_the_password_file_and_skips_the_migration_when_told(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sqa").write_text('#!/bin/sh\necho "sqa $*"\n')  # stands in for the real CLI
    (fake / "sqa").chmod(0o755)
    env = {
        "PATH": f"{fake}:{os.environ['PATH']}",
        "SQA_DATABASE_HOST": "db:5432/sqa",
        "SQA_DATABASE_PASSWORD_FILE": str(secret),
        "SQA_MIGRATE": "0",
        "PRESTART_DB_WAIT_S": "0",
    }
    script = ROOT / "scripts" / "prestart.sh"
    # the database cannot answer here: the script must say where it waited, never the password
    r = subprocess.run(
        ["bash", str(script), "sh", "-c", "echo $SQA_DATABASE_URL"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1 and "db:5432/sqa" in r.stderr + r.stdout and "s3cret" not in r.stderr + r.stdout
    # with a SQLite URL there is nothing to wait for: the migration is skipped, the command runs
    r = subprocess.run(
        ["bash", str(script), "sh", "-c", "echo ran"],
        env={**env, "SQA_DATABASE_URL": "sqlite:///x.db"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ran"
    r = subprocess.run(
        ["bash", str(script), "sh", "-c", "echo ran"],
        env={**env, "SQA_DATABASE_URL": "sqlite:///x.db", "SQA_MIGRATE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.split() == ["sqa", "db", "upgrade", "ran"]


def test_the_api_is_given_longer_to_stop_than_it_waits_for_its_background_jobs():
    from settings import Settings

    grace = compose()["services"]["api"]["stop_grace_period"]
    assert grace.endswith("s") and float(grace[:-1]) > Settings.model_fields["shutdown_wait_s"].default
