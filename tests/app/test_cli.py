"""The `sqa` command line: clear errors with a non-zero exit, idempotent imports, dated answers."""
from __future__ import annotations

import pytest




def test_cli_import_realtimeqa_reports_skips_and_is_idempotent(sqa, fixtures_dir):
    first = sqa("import", "realtimeqa", str(fixtures_dir / "realtimeqa_bad"))
    assert first.exit_code == 0, first.output
    assert "skipped" in first.output and "malformed json line" in first.output
    again = sqa("import", "realtimeqa", str(fixtures_dir / "realtimeqa_bad"))
    assert again.exit_code == 0
    assert " 0 new" in again.output and "unchanged" in again.output


def test_cli_import_streamingqa(sqa, fixtures_dir):
    r = sqa("import", "streamingqa", str(fixtures_dir / "streamingqa" / "questions.jsonl"),
            "--articles", str(fixtures_dir / "streamingqa" / "articles.jsonl"))
    assert r.exit_code == 0, r.output
    assert "questions:" in r.output and "skipped" in r.output


@pytest.mark.parametrize("args, fragment", [
    (("import", "realtimeqa", "/no/such/dir"), "/no/such/dir does not exist"),
    (("import", "realtimeqa", "SAMPLE", "--since", "2024-02-31"), "--since '2024-02-31' is not a date"),
    (("ingest",), "give exactly one of --month, --through or --history-before"),
    (("ingest", "--month", "2024-02", "--through", "2024-03"), "give exactly one"),
    (("ingest", "--month", "24-02"), "month '24-02' is not a month (use YYYY-MM)"),
    (("ingest", "--month", "2031-01"), "no articles published in 2031-01"),
    (("ingest", "--from", "2024-01", "--month", "2024-02"), "--from goes with --through"),
    (("ask", "Who?", "--as-of", "2024-13-01"), "--as-of '2024-13-01' is not a date"),
    (("ask", "Who?", "--as-of", "2024-01-01"), "no index has been built yet"),
    (("jobs", "show", "424242"), "no job with id 424242"),
])
def test_cli_bad_input_exits_non_zero_with_a_message(sqa, sample_root, args, fragment):
    sqa("import", "realtimeqa", str(sample_root))
    r = sqa(*[str(sample_root) if a == "SAMPLE" else a for a in args])
    assert r.exit_code == 2, r.output
    assert fragment in r.output


def test_cli_ingest_then_ask_prints_dated_passages(sqa, sample_root):
    assert sqa("import", "realtimeqa", str(sample_root)).exit_code == 0
    r = sqa("ingest", "--through", "2024-03")
    assert r.exit_code == 0, r.output
    assert "2024-01: 12 articles" in r.output and "2024-03: 12 articles" in r.output
    again = sqa("ingest", "--through", "2024-03")
    assert "nothing to ingest" in again.output
    status = sqa("index", "status")
    assert status.exit_code == 0 and "files and database agree" in status.output
    answer = sqa("ask", "Who is the mayor of Port Calder?", "--as-of", "2024-01-31", "--top-k", "3")
    assert answer.exit_code == 0, answer.output
    assert "Q (2024-01-31)" in answer.output and "[1] 2024-01" in answer.output
    assert "2024-02-" not in answer.output and "2024-03-" not in answer.output


def test_cli_evaluate_then_report(sqa, sample_root, tmp_path):
    assert sqa("import", "realtimeqa", str(sample_root)).exit_code == 0
    assert sqa("ingest", "--through", "2024-03").exit_code == 0
    r = sqa("evaluate", "--quarter", "2024Q1")
    assert r.exit_code == 0, r.output
    assert "evaluation run 1:" in r.output and "recall" in r.output
    out = tmp_path / "report"
    rep = sqa("report", "1", "--out", str(out))
    assert rep.exit_code == 0, rep.output
    assert (out / "report.html").exists() and (out / "summary.json").exists()


@pytest.mark.parametrize("args, fragment", [
    (("evaluate", "--quarter", "2024Q7"), "is not a quarter"),
    (("report", "99", "--out", "/tmp/nowhere"), "no evaluation run with id 99"),
    (("replay", "--from", "2024-03", "--to", "2024-01"), "--from 2024-03 is after --to 2024-01"),
    (("schedule", "--run", "weekly-party"), "weekly-party"),
])
def test_cli_evaluation_bad_input(sqa, args, fragment):
    r = sqa(*args)
    assert r.exit_code == 2, r.output
    assert fragment in r.output


def test_cli_jobs_list_shows_the_newest_jobs_and_filters(sqa, sample_root):
    assert sqa("import", "realtimeqa", str(sample_root)).exit_code == 0
    assert sqa("ingest", "--through", "2024-01").exit_code == 0
    r = sqa("jobs", "list")
    assert r.exit_code == 0, r.output
    [line] = [x for x in r.output.splitlines() if " ingest " in x]
    assert "succeeded" in line and "100.0%" in line
    assert "no jobs of that kind/state" in sqa("jobs", "list", "--state", "failed").output
