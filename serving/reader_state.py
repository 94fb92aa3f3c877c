"""Which reader serves, and the atomic swap to a newly activated version.

Like IndexState for the index: requests take `current()` once and keep it, so a swap never mixes
two readers within a request. A fixed reader (SQA_READER=gemma, first-entity, a folder, a
version name) never changes. A state that follows the registry (SQA_READER=auto) serves the active
version, or the fallback (zero-shot Gemma) while none is active; `refresh` loads a newly activated version
outside any lock (loading takes seconds; requests and other refreshes must not wait on it) and then
swaps one reference. A version that fails to load is logged and the previous reader keeps serving.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from models.readers import Reader
from serving.reader_registry import active_version, version_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServingReader:
    reader: Reader
    version: str | None  # the registry version; None for a built-in reader or a folder given by path
    loaded_at: dt.datetime


@dataclass(frozen=True)
class RegistrySource:
    """Where a following state finds its readers."""

    session_factory: sessionmaker[Session]
    models_dir: Path
    load_version: Callable[[Path], Reader]  # a version folder -> its reader
    load_fallback: Callable[[], Reader]  # the reader while no version is active
    retry_after_s: float = 300.0  # a version that failed to load is tried again after this long


_FALLBACK = ""  # the in-flight/failed key of the fallback reader (version names are never empty)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class ReaderState:
    """Holds the serving reader.

    ReaderState(reader) serves one reader for good; ReaderState(source=RegistrySource(...)) follows
    the registry's active version once `refresh()` has run.
    """

    def __init__(
        self, reader: Reader | None = None, *, version: str | None = None, source: RegistrySource | None = None
    ) -> None:
        if (reader is None) == (source is None):
            raise ValueError("give either a fixed reader or a registry source to follow")
        self._source = source
        self._current = ServingReader(reader, version, _now()) if reader is not None else None
        self._lock = threading.Lock()  # guards the bookkeeping below; never held while loading
        self._wanted: str | None = None  # the active version the latest refresh read
        self._loading: set[str] = set()
        self._failed: dict[str, tuple[float, str]] = {}  # key -> (monotonic time, error)
        self._preloaded: tuple[str, Reader] | None = None
        self.last_error: str | None = None

    @property
    def follows_registry(self) -> bool:
        return self._source is not None

    def current(self) -> ServingReader | None:
        return self._current

    def reader(self) -> Reader:
        serving = self._current
        assert serving is not None, "ReaderState.refresh() must run before the first request"
        return serving.reader

    def describe(self) -> dict[str, Any]:
        serving = self._current
        return {
            "reader": serving.reader.name if serving else None,
            "version": serving.version if serving else None,
            "follows_active": self.follows_registry,
            "loaded_at": serving.loaded_at if serving else None,
            "error": self.last_error,
        }

    # ---- following the registry ------------------------------------------------------------------

    def preload(self, version: str, folder: Path) -> Reader:
        """Load a version before activating it (raises what the load raises); the refresh that next
        finds it active installs this reader instead of loading it again."""
        assert self._source is not None, "only a state that follows the registry preloads"
        reader = self._source.load_version(folder)
        with self._lock:
            self._preloaded = (version, reader)
            self._failed.pop(version, None)
        return reader

    def discard_preloaded(self) -> None:
        with self._lock:
            self._preloaded = None

    def refresh(self) -> bool:
        """Serve the active version (or the fallback while none is) if it is not serving yet.

        Returns True if it swapped. A load that fails is logged, kept in `last_error` and retried
        only after `retry_after_s`; the previous reader keeps serving. Raises only when nothing can
        serve (the first load of the fallback failed) or the database cannot be read.
        """
        src = self._source
        if src is None:
            return False
        with src.session_factory() as session:
            row = active_version(session)
            want, folder = (row.version, version_dir(row, src.models_dir)) if row is not None else (None, None)
        key = want or _FALLBACK
        with self._lock:
            self._wanted = want
            cur = self._current
            if cur is not None and cur.version == want:
                self.last_error = None  # whatever failed before is no longer wanted
                return False
            if key in self._loading:
                return False  # another refresh is loading it
            failed = self._failed.get(key)
            if failed is not None and cur is not None and time.monotonic() - failed[0] < src.retry_after_s:
                return False
            reader = None
            if self._preloaded is not None and self._preloaded[0] == want:
                reader, self._preloaded = self._preloaded[1], None
            self._loading.add(key)
        try:
            if reader is None:  # folder is set exactly when want is
                reader = src.load_version(folder) if folder is not None else src.load_fallback()
        except Exception as exc:
            message = (
                f"reader version {want} could not be loaded ({type(exc).__name__}: {exc})"
                if want
                else f"the fallback reader could not be loaded ({type(exc).__name__}: {exc})"
            )
            with self._lock:
                self._loading.discard(key)
                self._failed[key] = (time.monotonic(), message)
                self.last_error = message
                nothing_serving = self._current is None
            if nothing_serving and want is not None:
                log.error("%s; serving the fallback reader", message)
                return self._serve_fallback()
            if nothing_serving:
                raise
            assert self._current is not None  # nothing_serving is false and _current never goes back to None
            log.error("%s; still serving %s", message, self._current.reader.name)
            return False
        with self._lock:
            self._loading.discard(key)
            if self._wanted != want:  # activated and replaced while it loaded: a later refresh serves the newer one
                log.info("reader version %s loaded after it stopped being active; not serving it", want)
                return False
            self._current = ServingReader(reader, want, _now())  # one reference assignment: the swap is atomic
            self._failed.pop(key, None)
            self.last_error = None
        log.info("serving reader %s (version %s)", reader.name, want or "none active: fallback")
        return True

    def _serve_fallback(self) -> bool:
        """Nothing serves yet and the active version failed: serve the fallback rather than nothing."""
        assert self._source is not None  # called by refresh, which follows the registry
        reader = self._source.load_fallback()  # raises: with no reader at all the process cannot serve
        with self._lock:
            if self._current is not None:
                return False
            self._current = ServingReader(reader, None, _now())
        log.info("serving the fallback reader %s", reader.name)
        return True
