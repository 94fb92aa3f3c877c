"""bench.bench_quality --rolling (bench/rolling.py) on the shipped sample: each window answered by
the models recorded for it and pooled; readings kept so that a rerun reads nothing again; a window
never built refused; the build resumable, training each window once."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from bench import bench_quality, rolling
from evaluation.metrics import exact_match
from models.reader_base import ReaderAnswer, RetrievedPassage

WINDOWS = "2024-01-01:2024-01-31,2024-02-01:2024-03-31"


def _record(home, *firsts):
    (home / rolling.RECORD_FILE).write_text(
        json.dumps({first: {"reader": None, "reranker": None, "recorded_at": "now"} for first in firsts})
    )


def test_rolling_windows_are_pooled_and_a_rerun_reads_nothing_again(served_env, tmp_path, capsys):
    home = served_env.home
    _record(home, "2024-01-01", "2024-02-01")
    readings = tmp_path / "readings.jsonl"
    out = tmp_path / "rolling.json"
    argv = ["--home", str(home), "--rolling", "--windows", WINDOWS, "--baseline", "", "--no-gold"]
    argv += ["--readings", str(readings), "--out", str(out)]
    assert bench_quality.main(argv) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    windows = list(result["windows"].values())
    assert len(windows) == 2 and all(w["gold_passage"]["n"] == 0 for w in windows)
    pooled = result["pooled"]
    preds = {qid: p for w in windows for qid, p in w["predictions"].items()}
    assert pooled["n"] == len(preds) == sum(w["n"] for w in windows) > 0
    em = 100 * sum(exact_match(p["e2e"], p["answers"]) for p in preds.values()) / len(preds)
    assert pooled["end_to_end"]["em"] == pytest.approx(em, abs=0.05)
    recall = sum(w["recall"]["@5"] * w["n"] for w in windows) / pooled["n"]
    assert pooled["recall"]["@5"] == pytest.approx(recall, abs=0.05)
    assert f"pooled (2 windows, {pooled['n']} questions)" in printed
    assert result["config"]["rolling"]["2024-01-01"]["reader"] is None
    read = len(readings.read_text().splitlines())
    assert 0 < read <= pooled["n"] and all(w["served"]["readings_reused"] == 0 for w in windows)

    assert bench_quality.main(argv) == 0  # the same passages: every reading comes from the file
    again = json.loads(out.read_text())
    assert len(readings.read_text().splitlines()) == read
    assert sum(w["served"]["readings_reused"] for w in again["windows"].values()) == read
    assert {q: p["e2e"] for w in again["windows"].values() for q, p in w["predictions"].items()} == {
        q: p["e2e"] for q, p in preds.items()
    }


def test_rolling_refuses_a_window_without_recorded_models(served_env, capsys):
    _record(served_env.home, "2024-01-01")
    argv = ["--home", str(served_env.home), "--rolling", "--windows", WINDOWS, "--baseline", ""]
    assert bench_quality.main(argv) == 2
    assert "no models recorded for the window starting 2024-02-01 (run with --build" in capsys.readouterr().err


def test_rolling_options_that_need_rolling_are_refused(served_env):
    with pytest.raises(SystemExit):
        bench_quality.main(["--home", str(served_env.home), "--build"])


def test_rerankers_replace_a_windows_recorded_re_ranker(served_env, tmp_path, capsys):
    home = served_env.home
    (home / rolling.RECORD_FILE).write_text(
        json.dumps({"2024-01-01": {"reader": None, "reranker": "reranker-gone", "recorded_at": "now"}})
    )
    argv = ["--home", str(home), "--rolling", "--windows", "2024-01-01:2024-01-31", "--baseline", "", "--no-gold"]
    argv += ["--readings", str(tmp_path / "readings.jsonl"), "--out", str(tmp_path / "out.json")]
    assert bench_quality.main(argv) == 2  # the recorded version is not in the home
    assert "no re-ranker version 'reranker-gone'" in capsys.readouterr().err
    assert bench_quality.main([*argv, "--rerankers", "2024-01-01=none"]) == 0
    served = json.loads((tmp_path / "out.json").read_text())["windows"]
    assert [w["served"]["retriever"] for w in served.values()] == ["hybrid"]


@pytest.mark.parametrize(
    "value, message",
    [("2024-01-01", "is not FIRST=VERSION"), ("Jan=v1", "is not FIRST=VERSION"), ("2024-03-01=v1", "no window starts")],
)
def test_rerankers_refuses_what_names_no_window(served_env, value, message, capsys):
    argv = ["--home", str(served_env.home), "--rolling", "--windows", WINDOWS, "--rerankers", value]
    with pytest.raises(SystemExit):
        bench_quality.main(argv)
    assert message in capsys.readouterr().err


def test_build_trains_each_window_once_and_resumes(tmp_path, monkeypatch):
    commands, serving = [], iter(["r1", "r2", "r3"])
    monkeypatch.setattr(rolling, "_sqa", lambda home, *args: commands.append(args))
    monkeypatch.setattr(rolling, "serving_versions", lambda home: {"reader": next(serving), "reranker": None})
    windows = [(dt.date(2022, 10, 1), dt.date(2022, 12, 31)), (dt.date(2023, 1, 1), dt.date(2023, 3, 31))]
    record = rolling.build_rolling_home(tmp_path, windows, data=tmp_path, train_minutes=1)
    assert [record[k]["reader"] for k in ("2022-10-01", "2023-01-01")] == ["r1", "r2"]
    trained = [c for c in commands if c[0] == "ingest" and "--no-train" not in c]
    assert [c[2] for c in trained] == ["2022-10", "2023-01"]
    assert [c[2] for c in commands if "--no-train" in c] == ["2022-12", "2023-03"]
    commands.clear()
    rolling.build_rolling_home(tmp_path, windows, data=tmp_path, train_minutes=1)  # recorded: trained no more
    assert all(c[0] == "import" or c[2] in ("2022-12", "2023-03") for c in commands)
    assert rolling.load_record(tmp_path)["2023-01-01"]["reader"] == "r2"


def test_cached_readings_read_the_same_passages_once(tmp_path):
    calls = []

    class Reader:
        name = "fake"

        def generate(self, question, as_of, passages):
            calls.append(question)
            return ReaderAnswer(text=passages[0].title, raw="raw", confidence=0.5)

    day = dt.date(2024, 1, 5)
    a = [RetrievedPassage("Alpha", "text a", day, 1)]
    b = [RetrievedPassage("Beta", "text b", day, 2)]
    path = tmp_path / "r.jsonl"
    cached = rolling.CachedReadings(Reader(), path)
    assert cached.generate("q", day, a).text == "Alpha" and cached.generate("q", day, a).text == "Alpha"
    assert cached.generate("q", day, b).text == "Beta"  # other passages: read
    assert cached.generate("q", dt.date(2024, 1, 6), a).text == "Alpha"  # another date: read again
    assert len(calls) == 3 and cached.hits == 1 and cached.name == "fake"
    again = rolling.CachedReadings(Reader(), path)  # a new run finds them in the file
    answer = again.generate("q", day, b)
    assert (answer.text, answer.raw, answer.confidence) == ("Beta", "raw", 0.5) and len(calls) == 3


def test_window_reader_pins_the_recorded_version_or_the_zero_shot_start():
    assert rolling.window_reader("gemma-2023-01-01-ab", "auto") == "version:gemma-2023-01-01-ab"
    assert rolling.window_reader(None, "auto") == "gemma"
    assert rolling.window_reader(None, "first-entity") is None  # a fixed reader the environment chose
