"""bench/compare_quality.py: two bench_quality runs paired question by question, and clear errors
for files that are not such runs."""

from __future__ import annotations

import json

import pytest

from bench import compare_quality


def _run(path, windows: dict[str, dict[str, tuple[str, str, bool]]], config: dict | None = None):
    """A bench_quality --out file: {label: {qid: (prediction, gold, reader reads an answer)}}."""
    path.write_text(
        json.dumps(
            {
                "config": config or {},
                "windows": {
                    label: {
                        "n": len(preds),
                        "predictions": {
                            qid: {"e2e": p, "answers": [g], "read": read} for qid, (p, g, read) in preds.items()
                        },
                    }
                    for label, preds in windows.items()
                },
            }
        )
    )
    return path


def test_compare_quality_pairs_two_runs_by_question(tmp_path, capsys):
    march = {
        "q1": ("Paris", "Paris", True),
        "q2": ("Rome", "Milan", True),
        "q3": ("5", "7", False),
        "q4": ("Iowa", "Iowa", False),
        "q5": ("the Bengals", "Bengals", True),
    }
    a = _run(tmp_path / "a.json", {"2023-03-01..2023-03-31": march, "2023-04-01..2023-06-30": march})
    variant = dict(
        march, q2=("Milan", "Milan", True), q4=("Florida", "Iowa", False), q3=("7", "7", False), q6=("x", "y", False)
    )
    b = _run(tmp_path / "b.json", {"2023-03-01..2023-03-31": variant})
    out = tmp_path / "cmp.json"
    assert compare_quality.main([str(a), str(b), "--names", "default,variant", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2023-04-01..2023-06-30: in one run only, left out" in printed
    assert "variant 80.0 against default 60.0 (n 5): +20.0 EM" in printed  # B against A: B - A
    assert "only variant right 2, only default right 1" in printed
    assert "F1 variant 80.0 against default 60.0; 1 question in one run only" in printed
    assert "all windows" not in printed  # one window in common: nothing to pool
    result = json.loads(out.read_text())
    r = result["windows"]["2023-03-01..2023-03-31"]
    assert result["pooled"] is None
    assert (r["all"]["em_new"], r["all"]["em_ref"], r["f1_new"], r["f1_ref"]) == (80.0, 60.0, 80.0, 60.0)
    assert (r["all"]["gained"], r["all"]["lost"], r["all"]["difference"]) == (2, 1, 20.0)
    assert (r["read"]["n"], r["read"]["gained"], r["read"]["lost"], r["not_read"]["n"]) == (3, 1, 0, 2)
    assert (r["not_read"]["gained"], r["not_read"]["lost"]) == (1, 1)


def test_compare_quality_pools_the_windows_it_shares(tmp_path, capsys):
    a = _run(
        tmp_path / "a.json",
        {
            "w1": {"q1": ("a", "a", True), "q2": ("b", "c", True)},
            "w2": {"q3": ("d", "e", False), "q4": ("f", "f", False)},
        },
    )
    b = _run(
        tmp_path / "b.json",
        {
            "w1": {"q1": ("a", "a", True), "q2": ("c", "c", True)},
            "w2": {"q3": ("e", "e", False), "q4": ("x", "f", False)},
        },
    )
    out = tmp_path / "cmp.json"
    assert compare_quality.main([str(a), str(b), "--out", str(out)]) == 0
    pooled = json.loads(out.read_text())["pooled"]
    assert (pooled["all"]["n"], pooled["all"]["gained"], pooled["all"]["lost"]) == (4, 2, 1)
    assert (pooled["read"]["n"], pooled["not_read"]["n"]) == (2, 2)
    assert "\nall windows\n  B 75.0 against A 50.0 (n 4): +25.0 EM" in capsys.readouterr().out


def test_compare_quality_skips_a_window_without_a_shared_question_and_says_why(tmp_path, capsys):
    a = _run(
        tmp_path / "a.json",
        {"w1": {"q1": ("a", "a", True)}, "w2": {"q2": ("b", "b", True)}},
        config={"seed": 0, "max_questions": 400},
    )
    b = _run(
        tmp_path / "b.json",
        {"w1": {"q1": ("a", "a", True)}, "w2": {"q3": ("b", "b", True)}},
        config={"seed": 1, "max_questions": 400},
    )
    assert compare_quality.main([str(a), str(b)]) == 0
    printed = capsys.readouterr().out
    assert "w2: no question in both runs, left out" in printed
    assert "note: the runs were sampled differently (seed 0 against 1)" in printed
    assert "\nw1\n" in printed and "all windows" not in printed


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "cannot read it as JSON"),
        ('{"windows": {"w": {"n": 3}}}', "not a bench.bench_quality"),
        (
            '{"windows": {"w": {"predictions": {"q7": {"answers": ["x"]}}}}}',
            "window w, question q7: a prediction needs",
        ),
    ],
)
def test_compare_quality_refuses_a_file_that_is_not_a_run(tmp_path, capsys, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    good = _run(tmp_path / "good.json", {"w": {"q1": ("a", "a", True)}})
    assert compare_quality.main([str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(bad) in err


def test_compare_quality_refuses_runs_without_a_shared_question(tmp_path, capsys):
    a = _run(tmp_path / "a.json", {"w1": {"q1": ("a", "a", True)}})
    b = _run(tmp_path / "b.json", {"w2": {"q1": ("a", "a", True)}})
    assert compare_quality.main([str(a), str(b)]) == 2
    assert "share no question in any window" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compare_quality.main([str(a), str(b), "--names", "one"])
