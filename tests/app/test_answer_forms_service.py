"""SQA_ANSWER_FORMS end to end: forms learned only from the questions before the serving reader's cut."""

from __future__ import annotations

import datetime as dt

from indexer.records import QuestionRecord
from models.answer_forms import FormedReader
from models.reader_base import ReaderAnswer
from serving.reader_registry import register_version
from serving.reader_state import ReaderState
from store.queries import answer_forms_before, upsert_questions

CUT = dt.date(2024, 2, 1)


class _Surname:
    """Answers "Sandor" whatever it reads, as a small generator copying a later mention might."""

    name = "surname-reader"

    def generate(self, question, as_of, passages):
        return ReaderAnswer("Sandor", raw="Sandor")


def _question(qid: str, asked: dt.date, gold: str, *others: str) -> QuestionRecord:
    return QuestionRecord(qid, f"question {qid}?", asked, (gold,), "realtimeqa", choices=(gold, *others))


def test_answers_take_the_forms_of_questions_before_the_readers_cut(loaded_settings):
    from app.bootstrap.builders import build_answer_service, build_encoder, open_database

    settings = loaded_settings.model_copy(update={"answer_forms": "expand", "top_k": 3})
    db = open_database(settings, migrate=False)
    try:
        with db.sessions.begin() as session:
            upsert_questions(
                session,
                [
                    _question("past-1", CUT - dt.timedelta(days=3), "Mirela Sandor", "Ana Varga"),
                    _question("after-cut", CUT, "Varga", "Sandor"),  # asked on the cut day: not learnt
                ],
            )
            register_version(session, version="gemma-test", kind="gemma", path="gemma-test", trained_until=CUT)
        with db.sessions() as session:
            forms = answer_forms_before(session, CUT)
        assert "Mirela Sandor" in forms and "Ana Varga" in forms and "Varga" not in forms
        state = ReaderState(_Surname(), version="gemma-test")
        service = build_answer_service(settings, db, build_encoder(settings), state)
        service.index_state.refresh()
        assert isinstance(service.reader, FormedReader)
        result = service.answer("Who wrote The Salt Orchard, winner of the Alder Prize?", dt.date(2024, 3, 31))
        assert any("Mirela Sandor" in p.text for p in result.passages[:3])
        assert result.answer == "Mirela Sandor" and result.versions["reader"] == "surname-reader+forms-expand"

        # A reader with no registered cut (zero-shot, a folder) is served as it is.
        plain = build_answer_service(settings, db, build_encoder(settings), ReaderState(_Surname()))
        plain.index_state.refresh()
        assert not isinstance(plain.reader, FormedReader)
        assert plain.answer("Who wrote The Salt Orchard?", dt.date(2024, 3, 31)).answer == "Sandor"
    finally:
        db.close()
