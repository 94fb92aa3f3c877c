"""The inbox folder (SQA_NEWS_SOURCE=inbox:PATH), watched continuously: a new or grown article JSONL
file is read as soon as it appears and its articles go to the live queue, not only at month end.

What was read is remembered per file (size and modification time) in `<work_dir>/inbox-seen.json`,
written after the articles' transaction commits: a crash between the two reads the file again,
which stores nothing twice (intake is idempotent by URL and text). The monthly ingest still reads
the whole folder for its month, as before.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from indexer.importers import read_articles_jsonl
from indexer.jsonl import keep_longest
from indexer.records import ImportReport
from store.intake import IntakeCounts, intake_articles
from workers.config import InboxConfig

log = logging.getLogger(__name__)

SUFFIXES = (".jsonl", ".jsonl.gz")


def _load_seen(path: Path) -> dict[str, list[int]]:
    try:
        data = json.loads(path.read_text())
        return {k: list(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_seen(path: Path, seen: dict[str, list[int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(seen, sort_keys=True))
    os.replace(tmp, path)


class InboxWatcher:
    """Reads new or changed files of the inbox into the live queue (`step`), in a loop (`run`)."""

    def __init__(self, sf: sessionmaker[Session], cfg: InboxConfig):
        self._sf, self._cfg = sf, cfg
        self._stop = threading.Event()
        self.last_error: str | None = None

    def step(self) -> dict:
        """Read every file that is new or changed since it was last read; returns the counts."""
        folder = self._cfg.folder
        if not folder.is_dir():
            raise FileNotFoundError(f"the news inbox {folder} is not a directory (SQA_NEWS_SOURCE=inbox:{folder})")
        seen = _load_seen(self._cfg.state_file)
        total, report, files = IntakeCounts(), ImportReport(), []
        for path in sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(SUFFIXES)):
            stat = path.stat()
            mark = [stat.st_size, stat.st_mtime_ns]
            if seen.get(path.name) == mark:
                continue
            records, _ = read_articles_jsonl(path, report=report, source="inbox")
            merged: dict = {}
            for r in records:
                keep_longest(merged, r, report)
            with self._sf() as session, session.begin():
                total.add(intake_articles(session, list(merged.values()), via="inbox"))
            seen[path.name] = mark
            _save_seen(self._cfg.state_file, seen)  # after the commit: a crash before it reads the file again
            files.append(path.name)
        if files:
            log.info("inbox: read %s: %s, %d skipped", ", ".join(files), total.to_dict(), report.skipped_total)
        return {"files": files, **total.to_dict(), "skipped": report.skipped_total}

    def run(self) -> None:
        """Watch until `stop()` (at least one pass)."""
        while True:
            try:
                self.step()
                self.last_error = None
            except Exception as exc:  # a missing folder or an unreadable file: said, and tried again
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("inbox watch failed; trying again in %.0f s", self._cfg.poll_s)
            if self._stop.wait(self._cfg.poll_s):
                return

    def stop(self) -> None:
        self._stop.set()
