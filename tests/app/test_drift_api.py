"""Drift from the outside: `sqa drift`, GET /admin/drift, and the month_drift migration."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from settings import Settings
from store.engine import make_engine
from store.migrate import upgrade

ADMIN = {"X-Admin-Token": "test-admin-token"}


@pytest.fixture
def sqa(sqa, monkeypatch, sample_root):
    """`sqa` over the sample, imported and ingested with drift at ingest turned off."""
    monkeypatch.setenv("SQA_DRIFT_ON_INGEST", "false")
    assert sqa("import", "realtimeqa", str(sample_root)).exit_code == 0
    assert sqa("ingest", "--through", "2024-03").exit_code == 0
    return sqa


def test_cli_drift_backfills_and_prints_a_table(sqa):
    r = sqa("drift")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split()[:5] == ["month", "reference", "months", "n", "n_ref"]
    assert "unseen_words" in lines[0] and "kl" in lines[0]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["2024-02", "previous", "2024-01"],
        ["2024-02", "earlier", "2024-01"],
        ["2024-03", "previous", "2024-02"],
        ["2024-03", "earlier", "2024-01..2024-02"],
    ]
    one = sqa("drift", "--month", "2024-03", "--recompute")
    assert one.exit_code == 0, one.output
    assert len(one.output.splitlines()) == 3


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("drift", "--month", "2024-13"), "month '2024-13' is not a month (use YYYY-MM)"),
        (("drift", "--month", "2031-01"), "no ingested month in 2031-01"),
        (("drift", "--from", "2024-03", "--to", "2024-01"), "--from 2024-03 is after --to 2024-01"),
        (("drift", "--month", "2024-02", "--from", "2024-01"), "give --month, or --from/--to, not both"),
        (("drift", "--features", "topics"), "drift feature 'topics' is unknown"),
    ],
)
def test_cli_drift_bad_input_exits_non_zero_with_a_message(sqa, args, fragment):
    r = sqa(*args)
    assert r.exit_code == 2, r.output
    assert fragment in r.output


def test_settings_refuse_unknown_drift_features():
    with pytest.raises(ValueError, match="drift feature 'topics' is unknown"):
        Settings(drift_features="words,topics", env="test")
    assert Settings(drift_features="entities, words", env="test").drift_features == "words,entities"


def test_admin_drift_lists_rows_by_month_and_reference(client):
    r = client.get("/admin/drift", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert [(x["month"], x["reference"]) for x in r.json()] == [
        ("2024-02", "previous"),
        ("2024-02", "earlier"),
        ("2024-03", "previous"),
        ("2024-03", "earlier"),
    ]
    row = r.json()[-1]
    assert set(row) >= {
        "reference_first",
        "reference_last",
        "reader_version",
        "encoder",
        "n_target",
        "n_source",
        "measures",
        "computed_at",
    }
    assert set(row["measures"]) == {"unseen_words", "unseen_words_tokens", "cosine", "kl"}
    only = client.get(
        "/admin/drift", params={"from": "2024-03", "to": "2024-03", "reference": "earlier"}, headers=ADMIN
    ).json()
    assert [(x["month"], x["reference"], x["reference_first"]) for x in only] == [("2024-03", "earlier", "2024-01")]
    assert client.get("/admin/drift").status_code == 401


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"from": "2024-1"}, "from '2024-1' is not a month (use YYYY-MM)"),
        ({"to": "March"}, "to 'March' is not a month"),
        ({"from": "2024-03", "to": "2024-01"}, "from 2024-03 is after to 2024-01"),
        ({"reference": "later"}, "reference 'later' is unknown (use previous, earlier, training)"),
    ],
)
def test_admin_drift_bad_query_is_422(client, params, fragment):
    r = client.get("/admin/drift", params=params, headers=ADMIN)
    assert r.status_code == 422, r.text
    assert fragment in r.json()["detail"]


def test_month_drift_migration_upgrades_and_downgrades(database_url):
    from alembic import command

    from store.migrate import alembic_config

    upgrade(database_url)
    engine = make_engine(database_url)
    try:
        insp = inspect(engine)
        assert "month_drift" in insp.get_table_names()
        assert {c["name"] for c in insp.get_unique_constraints("month_drift")} == {"uq_month_drift_month_reference"}
        command.downgrade(alembic_config(database_url), "0003")
        assert "month_drift" not in inspect(engine).get_table_names()
        upgrade(database_url)
        assert "month_drift" in inspect(engine).get_table_names()
    finally:
        engine.dispose()
