"""The inbox watcher: a new or grown JSONL file goes to the live queue at once, a file read before is
not read again, and a missing folder is an error the loop survives."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from app.bootstrap import worker_services
from app.bootstrap.builders import open_database
from app.bootstrap.job_configs import inbox_config
from store.tables import Article, LiveQueueItem
from workers.inbox import InboxWatcher
from workers.live_publisher import LivePublisher


def line(i: int, text: str = "") -> str:
    return (
        json.dumps(
            {
                "url": f"https://inbox.example/{i}",
                "title": f"T{i}",
                "published": "2024-04-02",
                "text": text or f"Harbour story number {i}.",
            }
        )
        + "\n"
    )


def counts(db) -> tuple[int, int]:
    with db.sessions() as s:
        return (
            s.scalar(select(func.count()).select_from(Article)),
            s.scalar(select(func.count()).select_from(LiveQueueItem)),
        )


def test_inbox_watcher_reads_new_and_grown_files_once(settings, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    db = open_database(settings)
    try:
        watcher = InboxWatcher(db.sessions, inbox_config(settings, inbox))
        (inbox / "a.jsonl").write_text(line(1) + line(2))
        (inbox / "notes.txt").write_text("not news")
        first = watcher.step()
        assert first["files"] == ["a.jsonl"] and first["new"] == 2
        assert counts(db) == (2, 2)
        assert watcher.step()["files"] == []  # unchanged: not read again
        with open(inbox / "a.jsonl", "a") as fh:  # a file that grows is read again: only the new line is new
            fh.write(line(3))
        grown = watcher.step()
        assert (grown["new"], grown["duplicate"]) == (1, 2)
        (inbox / "b.jsonl").write_text(line(1, "A corrected harbour story."))
        assert watcher.step()["updated"] == 1
        assert counts(db) == (3, 3)
        # A new watcher (the worker restarted) remembers what was read.
        assert InboxWatcher(db.sessions, inbox_config(settings, inbox)).step()["files"] == []
    finally:
        db.close()


def test_inbox_watcher_missing_folder_is_an_error_the_loop_survives(settings, tmp_path):
    db = open_database(settings)
    try:
        watcher = InboxWatcher(db.sessions, inbox_config(settings, tmp_path / "nowhere"))
        with pytest.raises(FileNotFoundError, match="is not a directory"):
            watcher.step()
        watcher.stop()
        watcher.run()  # stopped already: one pass, which records the error instead of raising
        assert "is not a directory" in watcher.last_error
    finally:
        db.close()


def test_worker_services_follow_the_settings(make_settings, tmp_path):
    inbox = tmp_path / "in"
    inbox.mkdir()
    s = make_settings(news_source=f"inbox:{inbox}")
    db = open_database(s)
    try:
        kinds = [type(x) for x in worker_services(s, db)]
        assert LivePublisher in kinds and InboxWatcher in kinds
        assert worker_services(make_settings(live=False), db) == []
    finally:
        db.close()
