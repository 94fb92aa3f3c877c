"""Rolling windows (issue 66): each quarter answered by the models a store had at the quarter's
start, trained only on what is dated before it, so that a change is judged on three quarters
nobody tuned on at once, pooled, instead of by eye on one.

One home serves every window. `build_rolling_home` ingests it window by window, as a store that
had been running since 2022-06 would have:

    sqa ingest --through 2022-10 --from 2022-06   # trains on what is dated before 2022-10
    (the reader and the re-ranker serving now are 2022Q4's: recorded in rolling.json)
    sqa ingest --through 2022-12 --no-train
    sqa ingest --through 2023-01                  # trains on what is dated before 2023-01
    ...

Each training is the one `sqa ingest` runs by itself: a re-ranker, then the reader, each activated
only if it beats what serves on the month before; a window's recorded versions are what serves
after it, `None` where nothing beat the zero-shot start. Later months in the index do not leak into
an earlier window: every question retrieves only what was published on or before its own date
(the benchmark asserts it of every passage), and its models are pinned to the window's.

`CachedReadings` keeps every reading (reader, question, date and the exact passages read) in a JSONL
file, so a variant that changes the ranking re-reads only the questions whose read passages changed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from indexer.dates import month_key
from models.reader_base import ReaderAnswer, RetrievedPassage
from serving.reader_registry import active_version
from serving.reranking import active_reranker
from settings import Settings

ROLLING_WINDOWS = "2022-10-01:2022-12-31,2023-01-01:2023-03-31,2023-04-01:2023-06-30"
RECORD_FILE = "rolling.json"  # in the home: {window's first day: {"reader", "reranker", "recorded_at"}}
FIRST_MONTH = "2022-06"  # the slice's first month of news
ROOT = Path(__file__).resolve().parent.parent


def load_record(home: Path) -> dict[str, dict[str, Any]]:
    path = home / RECORD_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def _save_record(home: Path, record: dict) -> None:
    tmp = home / f".{RECORD_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, home / RECORD_FILE)


def _sqa(home: Path, *args: str) -> None:
    """One `sqa` command over `home`, its output passed through; CalledProcessError if it fails."""
    print(f"$ SQA_HOME={home} sqa {' '.join(args)}", flush=True)
    env = {**os.environ, "SQA_HOME": str(home)}
    subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, check=True, cwd=ROOT)


def serving_versions(home: Path) -> dict[str, str | None]:
    """The reader version (None: the packaged zero-shot reader) and the re-ranker version (None:
    none) that serve in `home` now."""

    from app.bootstrap.builders import open_database  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)

    settings = Settings(home=home)
    db = open_database(settings, migrate=False)
    try:
        with db.sessions() as session:
            row = active_version(session)
            reader = row.version if row is not None else None
    finally:
        db.close()
    return {"reader": reader, "reranker": active_reranker(settings.rerankers_dir)}


def build_rolling_home(
    home: Path, windows: Sequence[tuple[dt.date, dt.date]], *, data: Path, train_minutes: float
) -> dict[str, dict[str, Any]]:
    """Import the slice into `home` and ingest it window by window (the module's docstring), each
    window's serving versions recorded in rolling.json as soon as its training ends; resumable: a
    recorded window is not trained again, months already ingested are skipped."""
    home.mkdir(parents=True, exist_ok=True)
    _sqa(home, "import", "realtimeqa", str(data), "--since", f"{FIRST_MONTH}-01", "--until", windows[-1][1].isoformat())
    record = load_record(home)
    for first, last in sorted(windows):
        key = first.isoformat()
        if key not in record:
            _sqa(
                home,
                "ingest",
                "--through",
                month_key(first),
                "--from",
                FIRST_MONTH,
                "--train-minutes",
                str(train_minutes),
            )
            record[key] = {**serving_versions(home), "recorded_at": dt.datetime.now(dt.UTC).isoformat()}
            _save_record(home, record)
            print(f"window {first}..{last}: reader {record[key]['reader']}, re-ranker {record[key]['reranker']}")
        _sqa(home, "ingest", "--through", month_key(last), "--no-train")
    return record


def window_versions(record: dict, first: dt.date) -> dict[str, str | None]:
    """The window's recorded versions; KeyError naming what to run when the window was never built."""
    try:
        return record[first.isoformat()]
    except KeyError:
        raise KeyError(
            f"no models recorded for the window starting {first} (run with --build to ingest and train it)"
        ) from None


def window_reader(version: str | None, environment: str) -> str | None:
    """The SQA_READER spec a window answers with: its recorded version; where none had been
    activated, what serves before any training (the packaged zero-shot reader, as "auto" falls back
    to), or the environment's own SQA_READER when it names a fixed reader (None: keep it)."""
    from app.bootstrap.builders import FALLBACK_READER  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)

    if version:
        return f"version:{version}"
    return FALLBACK_READER if environment.strip() == "auto" else None


def reading_key(reader_name: str, question: str, as_of: dt.date, passages: Sequence[RetrievedPassage]) -> str:
    """What a reading depends on: the reader, the question, its date and each passage read as the
    reader sees it (title, text, date), in order."""
    h = hashlib.sha256()
    for part in (reader_name, question, as_of.isoformat()):
        h.update(part.encode() + b"\0")
    for p in passages:
        h.update(f"{p.title}\0{p.text}\0{p.published.isoformat()}\0\0".encode())
    return h.hexdigest()


class CachedReadings:
    """A reader whose readings are kept in a JSONL file (appended as it goes, reloaded on start):
    the same reader, question, date and passages are read once. Everything else is the reader's.
    `hits` counts the readings taken from the file in this run."""

    def __init__(self, reader: Any, path: Path) -> None:
        self._reader, self.path, self.hits = reader, path, 0
        self.name: str = reader.name
        self._rows: dict[str, dict] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    self._rows[row["key"]] = row
        path.parent.mkdir(parents=True, exist_ok=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reader, name)

    def generate(self, question: str, as_of: dt.date, passages: Sequence[RetrievedPassage]) -> ReaderAnswer:
        key = reading_key(self._reader.name, question, as_of, passages)
        row = self._rows.get(key)
        if row is not None:
            self.hits += 1
            return ReaderAnswer(text=row["text"], raw=row["raw"], confidence=row["confidence"])
        answer = self._reader.generate(question, as_of, passages)
        row = {"key": key, "text": answer.text, "raw": answer.raw, "confidence": answer.confidence}
        self._rows[key] = row
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        return answer
