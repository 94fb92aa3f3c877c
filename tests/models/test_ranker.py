"""The "ranker" reader kind: JSON save/load that predicts exactly as before, and a reader that
annotates the passages it is given with the packaged spaCy and answers their best entity."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random

import pytest

from models.candidates import CandidateRanker, RankerItem, annotate_passages, annotated
from models.ranker import CandidateReader, RankerConfig, RankerModel, passage_bodies, ranker_item
from models.readers import RetrievedPassage
from models.selflabel import load_nlp
from models.trained import load_trained_reader, write_reader_info

PEOPLE = ["Ada Brand", "Otto Fell", "Mira Quade", "Ivo Stern", "Lena Roth", "Pia Lund"]
PLACES = ["Kestrel Bay", "Port Calder", "Lowmoor", "Greyfen", "Marrowby", "Vandermere"]
DAY = dt.date(2024, 2, 7)


def _synthetic(i: int, rng: random.Random) -> RankerItem:
    person, place = rng.choice(PEOPLE), rng.choice(PLACES)
    who = i % 2 == 0
    question = f"Who opened the museum in {place}?" if who else f"Where did {person} open the museum?"
    decoy = rng.choice([p for p in PEOPLE if p != person])
    record = {
        "sentences": [
            ["museum", "opened", "the", *place.lower().split(), *person.lower().split()],
            ["weather", "was", "fine", *decoy.lower().split()],
        ],
        "mentions": [[decoy, "PERSON", 1], [place, "GPE", 0], [person, "PERSON", 0], ["Tuesday", "DATE", 1]],
    }
    return RankerItem(
        f"q{i}",
        question,
        (person if who else place,),
        (
            annotated(record, rank=0, score=rng.random(), days_old=rng.randrange(30)),
            annotated(record, rank=1, score=rng.random(), days_old=rng.randrange(30)),
        ),
    )


def _fitted(use_score: bool = False) -> tuple[CandidateRanker, list[RankerItem]]:
    rng = random.Random(0)
    items = [_synthetic(i, rng) for i in range(60)]
    return CandidateRanker(use_score=use_score).fit(items[:40]), items[40:]


def _passage(text: str, day: dt.date = DAY) -> RetrievedPassage:
    return RetrievedPassage("A headline", text, day)


# A toy news world for the real-spaCy tests: who was appointed where.
APPOINTMENTS = [
    ("Ines Okafor", "Harriers"),
    ("Tomas Berg", "Falcons"),
    ("Maria Lopez", "Broncos"),
    ("David Chen", "Rovers"),
    ("Sarah Miller", "Tigers"),
    ("James Walker", "Eagles"),
]


def _toy(i: int) -> tuple[str, list[RetrievedPassage], str]:
    person, team = APPOINTMENTS[i % len(APPOINTMENTS)]
    other, _ = APPOINTMENTS[(i + 1) % len(APPOINTMENTS)]
    ps = [
        _passage(
            f"The {team} named {person} as head coach on Tuesday. The club said 300 fans came to "
            f"the stadium in Chicago."
        ),
        _passage(f"{other} spoke to reporters in London about the new season."),
    ]
    return f"Who did the {team} name as head coach?", ps, person


@pytest.fixture(scope="module")
def toy_model() -> RankerModel:
    nlp = load_nlp()
    items = []
    for i in range(12):
        question, ps, answer = _toy(i)
        items.append(
            ranker_item(
                question,
                DAY,
                annotate_passages(nlp, passage_bodies(ps)),
                [p.published for p in ps],
                qid=f"t{i}",
                answers=(answer,),
            )
        )
    return RankerModel(CandidateRanker(use_score=False).fit(items), RankerConfig(n_passages=10))


def test_candidate_ranker_json_round_trip_predicts_exactly_the_same():
    ranker, test = _fitted()
    again = CandidateRanker.from_json(json.loads(json.dumps(ranker.to_json())))
    assert again.predict_scored(test) == ranker.predict_scored(test)
    assert again.to_json() == ranker.to_json() and again.use_score is False
    with pytest.raises(RuntimeError, match="fit the ranker before saving"):
        CandidateRanker().to_json()
    with pytest.raises(ValueError, match="one coefficient per feature"):
        CandidateRanker.from_json({**ranker.to_json(), "coef": [0.5]})


def test_ranker_model_saves_plain_json_and_reloads_exactly(tmp_path):
    ranker, test = _fitted()
    RankerModel(ranker, RankerConfig(n_passages=7, c=ranker.c)).save(tmp_path / "v")
    assert sorted(p.name for p in (tmp_path / "v").iterdir()) == ["ranker.json"]
    data = json.loads((tmp_path / "v" / "ranker.json").read_text())
    assert data["config"]["n_passages"] == 7 and len(data["ranker"]["vocabulary"]) == len(data["ranker"]["coef"])
    loaded = RankerModel.load(tmp_path / "v")
    assert loaded.config == RankerConfig(n_passages=7, c=ranker.c)
    assert loaded.ranker.predict_scored(test) == ranker.predict_scored(test)
    with pytest.raises(FileNotFoundError, match="ranker.json is missing"):
        RankerModel.load(tmp_path)


def test_ranker_model_refuses_a_ranker_that_learnt_retrieval_scores():
    ranker, _ = _fitted(use_score=True)
    with pytest.raises(ValueError, match="use_score=False"):
        RankerModel(ranker, RankerConfig())


def test_ranker_item_features_do_not_depend_on_retrieval_scores():
    ranker, test = _fitted()
    for item in test:
        zeroed = dataclasses.replace(item, passages=tuple(dataclasses.replace(p, score=0.0) for p in item.passages))
        assert ranker.rows(zeroed)[1] == ranker.rows(item)[1]
        assert all("score" not in row for row in ranker.rows(item)[1])


def test_ranker_item_ranks_passages_in_order_and_dates_them_at_as_of():
    recs = [{"sentences": [["a"]], "mentions": []}, {"sentences": [["b"]], "mentions": []}]
    item = ranker_item("Who?", DAY, recs, [DAY, DAY - dt.timedelta(days=3)], qid="q", answers=("x",))
    assert [(p.rank, p.score, p.days_old) for p in item.passages] == [(0, 0.0, 0), (1, 0.0, 3)]
    with pytest.raises(ValueError, match="annotations for"):
        ranker_item("Who?", DAY, recs, [DAY])


@pytest.mark.integration
def test_candidate_reader_answers_the_best_entity_of_its_passages(toy_model):
    reader = CandidateReader(toy_model, nlp=load_nlp())
    assert reader.n_passages == 10
    question, ps, answer = _toy(13)
    got = reader.generate(question, DAY, ps)
    assert got.text == answer and got.raw.startswith(answer + "\t")
    batch = reader.generate_batch([(question, DAY, ps), ("Who?", DAY, [])])
    assert batch[0].text == answer and batch[1].text == ""


@pytest.mark.integration
def test_candidate_reader_reads_only_its_passages_and_refuses_late_ones(toy_model):
    question, ps, _ = _toy(2)
    reader = CandidateReader(toy_model, n_passages=1, nlp=load_nlp())
    assert [len(i.passages) for i in reader.items([(question, DAY, ps)])] == [1]
    with pytest.raises(AssertionError, match="published after"):
        reader.generate(question, DAY - dt.timedelta(days=1), ps)


@pytest.mark.integration
def test_candidate_reader_loads_spacy_once_on_first_use(toy_model, monkeypatch):
    import models.ranker

    calls = []
    monkeypatch.setattr(models.ranker, "load_nlp", lambda: calls.append(1) or load_nlp())  # where the reader finds it
    reader = CandidateReader(toy_model)
    assert calls == []  # building the reader does not load spaCy
    question, ps, _ = _toy(0)
    reader.generate(question, DAY, ps)
    reader.generate(question, DAY, ps)
    assert calls == [1]


@pytest.mark.integration
def test_load_trained_reader_serves_a_ranker_folder(toy_model, tmp_path):
    folder = tmp_path / "ranker-2024-03-01-abc123"
    toy_model.save(folder)
    write_reader_info(folder, {"kind": "ranker", "version": folder.name})
    reader = load_trained_reader(folder)
    assert isinstance(reader, CandidateReader) and reader.name == f"ranker:{folder.name}"
    assert reader.n_passages == 10 and load_trained_reader(folder, max_passages=3).n_passages == 3
    question, ps, answer = _toy(1)
    assert reader.generate(question, DAY, ps).text == answer
