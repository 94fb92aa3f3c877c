"""The `sqa` command line: clear errors with a non-zero exit, idempotent imports, dated answers."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest


def test_cli_import_realtimeqa_reports_skips_and_is_idempotent(sqa, fixtures_dir):
    first = sqa("import", "realtimeqa", str(fixtures_dir / "realtimeqa_bad"))
    assert first.exit_code == 0, first.output
    assert "skipped" in first.output and "malformed json line" in first.output
    again = sqa("import", "realtimeqa", str(fixtures_dir / "realtimeqa_bad"))
    assert again.exit_code == 0
    assert " 0 new" in again.output and "unchanged" in again.output


def test_cli_import_streamingqa(sqa, fixtures_dir):
    r = sqa(
        "import",
        "streamingqa",
        str(fixtures_dir / "streamingqa" / "questions.jsonl"),
        "--articles",
        str(fixtures_dir / "streamingqa" / "articles.jsonl"),
    )
    assert r.exit_code == 0, r.output
    assert "questions:" in r.output and "skipped" in r.output


@pytest.mark.parametrize(
    "args, fragment",
    [
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
        (
            ("train", "retriever", "--until", "2024-03-01", "--query-format", "iso"),
            "query format 'iso' is not one of bare, dated",
        ),
    ],
)
def test_cli_bad_input_exits_non_zero_with_a_message(sqa, sample_root, args, fragment):
    sqa("import", "realtimeqa", str(sample_root))
    r = sqa(*[str(sample_root) if a == "SAMPLE" else a for a in args])
    assert r.exit_code == 2, r.output
    assert fragment in r.output


def test_cli_ingest_trains_through_train_after_ingest(sqa, sample_root, monkeypatch):
    """`sqa ingest` hands the last ingested month and its --no-train / --train-minutes to the one
    post-ingest function (workers/after_ingest.py) and prints what it returned."""
    import workers.after_ingest

    calls = []

    def train_after_ingest(ctx, month, **options):
        calls.append((month, options["indexed"], options["train"], options["train_minutes"]))
        tuned = {"policy": "always", "ran": True, "job_id": 9, "version": "gemma-tuned"}
        return {"auto_train": {"action": "skip", "reason": "faked"}, "finetune": tuned}

    monkeypatch.setattr(workers.after_ingest, "train_after_ingest", train_after_ingest)
    assert sqa("import", "realtimeqa", str(sample_root)).exit_code == 0
    r = sqa("ingest", "--through", "2024-02", "--train-minutes", "2.5")
    assert r.exit_code == 0, r.output
    assert "training after ingest: skipped (faked)" in r.output
    assert "fine-tune after ingest (SQA_FINETUNE_POLICY=always): version gemma-tuned (job 9)" in r.output
    assert sqa("ingest", "--month", "2024-03", "--no-train").exit_code == 0
    assert calls == [(dt.date(2024, 2, 1), True, True, 2.5), (dt.date(2024, 3, 1), True, False, None)]


def test_cli_ingest_applies_the_fine_tune_policy(sqa, sample_root, monkeypatch):
    from settings import get_settings

    monkeypatch.setenv("SQA_FINETUNE_POLICY", "always")
    get_settings.cache_clear()
    assert sqa("import", "realtimeqa", str(sample_root)).exit_code == 0
    r = sqa("ingest", "--month", "2024-01")
    assert r.exit_code == 0, r.output
    assert "training after ingest: off (--no-train or SQA_AUTO_TRAIN=false)" in r.output
    assert "fine-tune after ingest (SQA_FINETUNE_POLICY=always): skipped (no trained reader is active" in r.output


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
    assert "stated in passage [1]" in answer.output  # the fake reader copies the top passage's phrase
    as_json = json.loads(sqa("ask", "Who is the mayor of Port Calder?", "--as-of", "2024-01-31", "--json").output)
    ids = [p["passage_id"] for p in as_json["passages"]]
    assert as_json["grounded"] is True and as_json["evidence"][0] == ids[0]
    assert set(as_json["evidence"]) <= set(ids[:3])  # only passages the reader read count


def test_cli_evaluate_then_report(sqa, sample_root, tmp_path):
    assert sqa("import", "realtimeqa", str(sample_root)).exit_code == 0
    assert sqa("ingest", "--through", "2024-03").exit_code == 0
    r = sqa("evaluate", "--quarter", "2024Q1")
    assert r.exit_code == 0, r.output
    assert "evaluation run 1:" in r.output and "recall" in r.output
    assert re.search(r"how far to trust the answers of 2024Q1 \(\d+ answers", r.output)
    assert re.search(r"grounded answers  \d+\.\d % \(n \d+; a passage read states them\)", r.output)
    out = tmp_path / "report"
    rep = sqa("report", "1", "--out", str(out))
    assert rep.exit_code == 0, rep.output
    assert (out / "report.html").exists() and (out / "summary.json").exists()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("evaluate", "--quarter", "2024Q7"), "is not a quarter"),
        (("report", "99", "--out", "/tmp/nowhere"), "no evaluation run with id 99"),
        (("replay", "--from", "2024-03", "--to", "2024-01"), "--from 2024-03 is after --to 2024-01"),
        (("schedule", "--run", "weekly-party"), "weekly-party"),
    ],
)
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


def test_describe_encoder_matches_the_built_encoder_without_loading_a_model(tmp_path):
    from models.encoders import describe_encoder, load_encoder

    for spec in ("hash", "hash:dim=256", "hash:dim=64,delay_ms=1"):
        enc = load_encoder(spec)
        assert describe_encoder(spec) == (enc.name, enc.dim)
        assert describe_encoder(enc.name) == (enc.name, enc.dim)  # the name an index records
    assert describe_encoder("hash:dim=0") is None and describe_encoder("hash:size=3") is None
    assert describe_encoder("no-such-version", encoders_dir=tmp_path) is None
    assert describe_encoder(str(tmp_path)) is None  # a folder: only loading it can tell


TABLE_COMMANDS = [("index", "status"), ("jobs", "list"), ("models", "list")]


def _sqa_env(home) -> dict:
    import os

    env = {
        **os.environ,
        "SQA_HOME": str(home),
        "SQA_ENCODER": "hash",
        "SQA_READER": "first-entity",
        "SQA_AUTO_TRAIN": "0",
    }
    env.pop("SQA_DATABASE_URL", None)
    return env


@pytest.fixture(scope="module")
def table_home(tmp_path_factory):
    """A home with the sample imported and 2024-01 ingested by `sqa` itself, built once for the table
    command cases (each runs on a copy). The CPU named: the ingest need not import torch to look for a GPU."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    home = tmp_path_factory.mktemp("table") / "home"
    env = {**_sqa_env(home), "SQA_DEVICE": "cpu"}
    subprocess.run(
        [sys.executable, "-m", "app.cli", "import", "realtimeqa", str(ROOT / "indexer" / "sample" / "realtimeqa")],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [sys.executable, "-m", "app.cli", "ingest", "--month", "2024-01", "--no-train"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
    )
    return home


@pytest.mark.parametrize("args", TABLE_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("encoder", ["hash", "minilm"])
def test_table_commands_load_no_model_library(tmp_path, table_home, args, encoder):
    """`sqa index status`, `jobs list`, `models list` read the database and files only: importing
    torch, sentence-transformers, matplotlib or scipy.stats would cost them seconds at every start."""
    import shutil
    import subprocess
    import sys

    from tests.conftest import ROOT

    home = tmp_path / "home"
    shutil.copytree(table_home, home)
    env = _sqa_env(home)
    probe = (
        "import json, sys\nfrom app.cli import cli\ntry:\n    cli(sys.argv[1:])\nexcept SystemExit as e:\n"
        "    code = e.code\nheavy = ['torch', 'sentence_transformers', 'transformers', 'matplotlib', 'scipy.stats',"
        " 'spacy']\nprint(json.dumps({'code': code, 'loaded': [m for m in heavy if m in sys.modules]}))\n"
    )
    env["SQA_ENCODER"] = encoder  # minilm: the index's hash encoder is refused, by name, without loading MiniLM
    out = subprocess.run(
        [sys.executable, "-c", probe, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["loaded"] == [], out.stderr[-2000:]
    if args == ("index", "status"):
        assert result["code"] == (0 if encoder == "hash" else 2), out.stderr[-2000:]
        if encoder == "minilm":
            assert "built with encoder 'hash-384'" in out.stderr and "all-MiniLM-L6-v2" in out.stderr
    else:
        assert result["code"] in (0, None), out.stderr[-2000:]


def test_jobs_show_follows_a_job_run_elsewhere_until_it_ends(sqa, monkeypatch):
    import threading
    import time

    from app.bootstrap import open_context
    from settings import get_settings

    assert sqa("jobs", "list").exit_code == 0  # creates the database
    # The job moves one step only after the follower has looked at the step before: it waits for two
    # of the follower's sleeps after its update, so that one whole look lay between them (a single
    # sleep could end a look that read the row before the update was committed). Only the follower's
    # own sleeps count (it runs in this thread), so every step is seen however slow the machine is.
    follower, real_sleep = threading.current_thread(), time.sleep
    looks = threading.Condition()
    slept = [0]

    def counting_sleep(s):
        if threading.current_thread() is follower:
            with looks:
                slept[0] += 1
                looks.notify_all()
        real_sleep(s)

    def seen_twice_more():
        with looks:
            start = slept[0]
            assert looks.wait_for(lambda: slept[0] >= start + 2, timeout=30)

    monkeypatch.setattr(time, "sleep", counting_sleep)
    with open_context(get_settings()) as ctx:
        runner = ctx.runner
        job_id = runner.create("ingest", {"month": "2024-01"})

        def work(job):
            seen_twice_more()  # the follower has printed the job as queued/running
            for i in range(1, 4):
                job.update(progress=i / 4, message=f"encode: {i}/4")
                seen_twice_more()
            return None

        thread = threading.Thread(target=lambda: runner.run(job_id, work), daemon=True)
        thread.start()
        r = sqa("jobs", "show", str(job_id), "--follow", "--every", "0.05")
        thread.join(10)
        assert r.exit_code == 0, r.output
        lines = [line for line in r.output.splitlines() if f"job {job_id} ingest:" in line]
        assert lines[-1].split()[4] == "succeeded"
        # it printed the progress as it changed, not only the end
        assert [line.split()[5] for line in lines if "encode:" in line] == ["25.0%", "50.0%", "75.0%"]
        assert '"state": "succeeded"' in r.output

        failed_id = runner.create("ingest", {"month": "2024-02"})
        try:
            runner.run(failed_id, lambda job: 1 / 0)
        except ZeroDivisionError:
            pass
    r = sqa("jobs", "show", str(failed_id), "--follow")
    assert r.exit_code == 1 and "division by zero" in r.output
    assert sqa("jobs", "show", str(failed_id)).exit_code == 0  # without --follow: the row, whatever its state
    missing = sqa("jobs", "show", "999")
    assert missing.exit_code == 2 and "no job with id 999" in missing.output
