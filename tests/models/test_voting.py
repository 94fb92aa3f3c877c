"""Votes across passages (models/voting.py): the joint reading and each passage read alone vote with
their confidences; answers equal under EM's normalisation are one vote; the joint reading wins ties
and gives the winner's form; the service reads deeper when SQA_READER_VOTE asks it to."""

from __future__ import annotations

import datetime as dt

import pytest

from models.reader_base import ReaderAnswer, RetrievedPassage
from models.voting import UNKNOWN_CONFIDENCE, Vote, VotingReader, tally

DAY = dt.date(2023, 3, 1)


def _p(pid: int, title: str) -> RetrievedPassage:
    return RetrievedPassage(title, f"text of {title}", DAY, pid)


class ScriptedReader:
    """Together: `joint` at `joint_conf`; alone: the answer and confidence scripted for the passage's title."""

    name, n_passages = "scripted", 3

    def __init__(self, joint, joint_conf, alone):
        self.joint, self.joint_conf, self.alone, self.calls = joint, joint_conf, alone, []
        self.hits = 7

    def generate(self, question, as_of, passages):
        self.calls.append([p.passage_id for p in passages])
        if len(passages) > 1:
            return ReaderAnswer(self.joint, "raw-joint", self.joint_conf)
        text, conf = self.alone[passages[0].title]
        return ReaderAnswer(text, f"raw-{text}", conf)


def test_passages_that_agree_outvote_an_unsure_joint_reading():
    alone = {"a": ("Rishi Sunak", 0.5), "b": ("rishi sunak", 0.3), "c": ("", 0.9)}
    reader = ScriptedReader("Boris Johnson", 0.2, alone)
    voting = VotingReader(reader, depth=3)
    out = voting.generate("Who?", DAY, [_p(1, "a"), _p(2, "b"), _p(3, "c"), _p(4, "d")])
    assert out.text == "Rishi Sunak" and out.confidence == 0.5  # the most confident reading's form
    assert reader.calls == [[1, 2, 3], [1], [2], [3]]  # together the reader's 3, then each alone
    assert voting.name == "scripted+vote3" and voting.n_passages == 3 and voting.hits == 7


def test_a_confident_joint_reading_holds_against_one_passage():
    reader = ScriptedReader("Boris Johnson", 0.6, {"a": ("Rishi Sunak", 0.9), "b": ("Boris Johnson", 0.1)})
    out = VotingReader(reader, depth=2).generate("Who?", DAY, [_p(1, "a"), _p(2, "b"), _p(3, "c")])
    assert (out.text, out.raw) == ("Boris Johnson", "raw-joint")  # 2 x 0.6 + 0.1 against 0.9


def test_deeper_votes_read_more_passages_than_the_joint_reading():
    alone = {t: (t.upper(), 0.1) for t in "abcde"}
    reader = ScriptedReader("X", 0.0, alone)
    voting = VotingReader(reader, depth=5)
    assert voting.n_passages == 5
    voting.generate("Q?", DAY, [_p(i, t) for i, t in enumerate("abcde")])
    assert reader.calls[0] == [0, 1, 2] and reader.calls[1:] == [[i] for i in range(5)]


def test_tally_ties_go_to_the_joint_reading_and_empty_answers_do_not_vote():
    joint = Vote(ReaderAnswer("Paris", "", 0.3), 0.3, True)
    other = Vote(ReaderAnswer("Lyon", "", 0.3), 0.3, False)
    won, share = tally([other, joint])
    assert won.text == "Paris" and share == pytest.approx(0.5)
    assert tally([Vote(ReaderAnswer("", "", 0.9), 0.9, True)]) is None
    unsure = ScriptedReader("", None, {"a": ("Nice", None)})
    out = VotingReader(unsure, depth=1).generate("Q?", DAY, [_p(1, "a"), _p(2, "b")])
    assert out.text == "Nice" and UNKNOWN_CONFIDENCE == 0.5
    with pytest.raises(ValueError, match="vote depth must be at least 1"):
        VotingReader(unsure, depth=0)


def test_the_service_hands_the_voting_reader_its_depth(loaded_settings):
    from app.bootstrap.builders import build_answer_service, build_encoder, open_database

    settings = loaded_settings.model_copy(update={"reader": "first-entity", "reader_vote": 4, "top_k": 2})
    db = open_database(settings, migrate=False)
    try:
        service = build_answer_service(settings, db, build_encoder(settings))
        service.index_state.refresh()
        assert isinstance(service.reader, VotingReader) and service.reader.depth == 4
        result = service.answer("Which novel won the Alder Prize for fiction?", dt.date(2024, 3, 31))
        assert result.versions["reader"].endswith("+vote4") and len(result.passages) >= 4
    finally:
        db.close()
