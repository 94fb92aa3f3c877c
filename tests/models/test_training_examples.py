"""Saved training examples: passages are written as bodies, and examples saved by an older version
(passage "text" with its date prefix) load as bodies too."""

from __future__ import annotations

import datetime as dt
import json

from models.reader_base import RetrievedPassage
from models.training import TrainExample, load_examples, save_examples

DAY = dt.date(2024, 2, 2)  # a Friday
PASSAGE = RetrievedPassage("Harriers", "Ines Okafor coaches the Harriers on Friday.", DAY)
EXAMPLE = TrainExample("q1", "Who coaches the Harriers?", DAY, ("Ines Okafor",), (PASSAGE,))


def test_examples_round_trip_with_passage_bodies(tmp_path):
    save_examples(tmp_path / "train.jsonl", [EXAMPLE])
    line = json.loads((tmp_path / "train.jsonl").read_text())
    assert line["passages"] == [{"title": "Harriers", "body": PASSAGE.text, "published": "2024-02-02"}]
    assert load_examples(tmp_path / "train.jsonl") == [EXAMPLE]


def test_an_example_saved_with_dated_passage_text_loads_as_the_body(tmp_path):
    old = EXAMPLE.to_json() | {
        "passages": [{"title": "Harriers", "text": PASSAGE.dated_text, "published": "2024-02-02"}]
    }
    assert PASSAGE.dated_text == "Friday, February 2, 2024. Ines Okafor coaches the Harriers on Friday."
    (tmp_path / "train.jsonl").write_text(json.dumps(old) + "\n")
    [loaded] = load_examples(tmp_path / "train.jsonl")
    assert loaded.passages == (PASSAGE,)
    assert loaded.passages[0].dated_text == PASSAGE.dated_text  # the reader reads what it read before
