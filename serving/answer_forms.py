"""The answer forms a serving reader may use (SQA_ANSWER_FORMS): learned from the questions asked
before that reader's training cut, so no question it is evaluated on teaches it a form.

A reader without a cut (zero-shot Gemma, a folder given by path) gets none: its answers are left as
they are. The forms of each cut are built once (a query over the questions table) and kept.
"""

from __future__ import annotations

import datetime as dt
import threading

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from models.answer_forms import AnswerForms
from serving.reader_state import ServingReader
from store.queries import answer_forms_before
from store.tables import ReaderModel


class AnswerFormsSource:
    """AnswerForms by the serving reader's cut (`forms_for`), built on first use and kept."""

    def __init__(self, session_factory: sessionmaker[Session], mode: str) -> None:
        self.session_factory, self.mode = session_factory, mode
        self._cuts: dict[str, dt.date | None] = {}
        self._forms: dict[dt.date, AnswerForms] = {}
        self._lock = threading.Lock()

    def cut_of(self, version: str) -> dt.date | None:
        """The registered version's `trained_until` (None for a name the registry does not hold)."""
        if version not in self._cuts:
            with self.session_factory() as session:
                row = session.execute(select(ReaderModel.trained_until).where(ReaderModel.version == version)).first()
            self._cuts[version] = row[0] if row is not None else None
        return self._cuts[version]

    def forms_for(self, serving: ServingReader) -> AnswerForms | None:
        """The forms of the questions asked before `serving`'s cut, or None when it has no cut."""
        cut = self.cut_of(serving.version or serving.reader.name)
        if cut is None:
            return None
        with self._lock:
            if cut not in self._forms:
                with self.session_factory() as session:
                    self._forms[cut] = AnswerForms(answer_forms_before(session, cut), mode=self.mode)
            return self._forms[cut]
