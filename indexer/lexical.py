"""BM25 over the passages of a shard (the `bm25s` library), searched under the same date filter.

A `Bm25Shard` indexes the passages of one month shard in id order. Ids sort by publication day
(`indexer.ids`), so "published on or before as_of" is a prefix of the documents: the shard scores
every document (a sparse sum over the query's terms) and ranks only that prefix. A
`LexicalIndex` is the set of BM25 shards of one snapshot; like `ShardedIndex` it searches the
shards that start on or before as_of and merges their top-k. Each shard keeps its own term
statistics (IDF), as a search engine's shards do, so scores from different months are close to,
not exactly, comparable.

Example:
    >>> shard = Bm25Shard.build("2023-04", texts, ids)              # n passages, (n,) int64 ids
    >>> index = LexicalIndex([shard])
    >>> scores, ids = index.search(["Who won the NBA final?"], dt.date(2023, 4, 14), 10)   # (1, 10) each
"""

from __future__ import annotations

import datetime as dt
import io
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from indexer.dates import from_day_number
from indexer.ids import id_day_numbers, ids_through
from indexer.index_errors import REBUILD_HINT, IndexIntegrityError
from indexer.shards import check_as_of, check_k, check_key, empty_results

if TYPE_CHECKING:
    import bm25s  # imported where used: it pulls in scipy.sparse, and importing the index should stay cheap

LEXICAL_FORMAT = 1
_FILE_PREFIX = "bm25s."  # npz members holding the files bm25s.BM25.save wrote


def tokenize(texts: Sequence[str]) -> list[list[str]]:
    """Lower-cased words of two or more characters, English stopwords removed (bm25s's tokenizer)."""
    import bm25s  # noqa: PLC0415 (lazy: bm25s pulls scipy.sparse)

    tokens: list[list[str]] = bm25s.tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)
    return tokens


class Bm25Shard:
    """BM25 (Lucene variant, k1=1.5, b=0.75) over one shard's passages, documents in id order."""

    def __init__(self, key: str, retriever: bm25s.BM25, ids: np.ndarray):
        self.key = check_key(key)
        if ids.ndim != 1 or ids.size == 0 or (ids.size > 1 and not (np.diff(ids) > 0).all()):
            raise ValueError(f"BM25 shard {key}: ids must be a non-empty, strictly ascending 1-d array")
        self._bm25 = retriever
        self._ids = ids  # (n,) int64 ascending: document i is passage ids[i]
        days = id_day_numbers(ids)
        self.min_day, self.max_day = from_day_number(days[0]), from_day_number(days[-1])

    def __repr__(self) -> str:
        return f"Bm25Shard({self.key!r}, {self.ntotal} passages, {self.min_day}..{self.max_day})"

    @property
    def ntotal(self) -> int:
        return int(self._ids.size)

    def ids(self) -> np.ndarray:
        return self._ids.copy()

    @classmethod
    def build(cls, key: str, texts: Sequence[str], ids: np.ndarray) -> Bm25Shard:
        """Index `texts` (n passages) under `ids` ((n,) int64, any order, unique)."""
        ids = np.asarray(ids)
        if ids.dtype != np.int64 or ids.ndim != 1 or ids.size != len(texts) or ids.size == 0:
            raise ValueError(
                f"BM25 shard {key}: need one int64 id per text, got {len(texts)} texts and ids "
                f"of shape {ids.shape} and dtype {ids.dtype}"
            )
        import bm25s  # noqa: PLC0415 (lazy: bm25s pulls scipy.sparse)

        order = np.argsort(ids, kind="stable")
        retriever = bm25s.BM25()
        retriever.index(tokenize([texts[i] for i in order]), show_progress=False)
        return cls(key, retriever, np.ascontiguousarray(ids[order]))

    def search_tokens(self, tokens: list[str], k: int, as_of: dt.date | None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k documents by BM25 among those published on or before `as_of` (all if None).

        Returns scores (<=k,) float32 best first and ids (<=k,) int64; documents sharing no term
        with the query (score 0) are never returned.
        """
        n = self.ntotal if as_of is None else int(np.searchsorted(self._ids, ids_through(as_of)))
        term_ids = self._bm25.get_tokens_ids(tokens)
        if n == 0 or not term_ids:
            return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
        scores = self._bm25.get_scores_from_ids(term_ids)[:n]  # (n,) the in-range prefix
        top = np.flatnonzero(scores > 0)
        if top.size > k:
            top = top[np.argpartition(-scores[top], k - 1)[:k]]
        top = top[np.lexsort((top, -scores[top]))]  # best first; ties by id order
        return scores[top].astype(np.float32), self._ids[top]

    def to_bytes(self) -> bytes:
        """One .npz: the ids and the files `bm25s.BM25.save` writes (its own format, loaded by its `load`)."""
        with tempfile.TemporaryDirectory() as tmp:
            self._bm25.save(tmp, show_progress=False)
            files = {
                f"{_FILE_PREFIX}{p.name}": np.frombuffer(p.read_bytes(), dtype=np.uint8)
                for p in sorted(Path(tmp).iterdir())
            }
        buf = io.BytesIO()
        # numpy's stub lets mypy match **files against savez's `allow_pickle: bool`; the keys all start with "bm25s."
        np.savez(buf, format=np.int64(LEXICAL_FORMAT), ids=self._ids, **files)  # type: ignore[arg-type]
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, key: str, expected_count: int, *, source: str = "<bytes>") -> Bm25Shard:
        """Read `to_bytes` output; checks the format and the passage count the manifest records."""
        import bm25s  # noqa: PLC0415 (lazy: bm25s pulls scipy.sparse)

        where = f"BM25 index of shard {key} ({source})"
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz, tempfile.TemporaryDirectory() as tmp:
                if int(npz["format"]) != LEXICAL_FORMAT:
                    raise ValueError(f"format {int(npz['format'])}, expected {LEXICAL_FORMAT}")
                ids = npz["ids"].astype(np.int64, copy=False)
                for name in npz.files:
                    if name.startswith(_FILE_PREFIX):
                        (Path(tmp) / name[len(_FILE_PREFIX) :]).write_bytes(npz[name].tobytes())
                retriever = bm25s.BM25.load(tmp, show_progress=False)
            shard = cls(key, retriever, ids)
        except (ValueError, KeyError, OSError, zipfile.BadZipFile) as exc:
            raise IndexIntegrityError(f"{where} is not readable ({exc}); {REBUILD_HINT}") from None
        if shard.ntotal != expected_count or retriever.scores["num_docs"] != expected_count:
            raise IndexIntegrityError(
                f"{where} holds {shard.ntotal} passages, the manifest says {expected_count}; {REBUILD_HINT}"
            )
        return shard


class LexicalIndex:
    """The BM25 shards of one snapshot, searched as one index restricted to `as_of`. Immutable."""

    def __init__(self, shards: Iterable[Bm25Shard]):
        self._shards = tuple(sorted(shards, key=lambda s: s.min_day))

    @property
    def shards(self) -> tuple[Bm25Shard, ...]:
        return self._shards

    @property
    def ntotal(self) -> int:
        return sum(s.ntotal for s in self._shards)

    def search(self, queries: Sequence[str], as_of: dt.date, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k passages by BM25 published on or before `as_of` (the argument order of ShardedIndex.search).

        Args:
            queries: nq question texts.
            as_of: the last publication day that may be returned.
            k: results per query; missing results are id -1 with score -inf.
        Returns:
            scores (nq, k) float32 best first, ids (nq, k) int64.
        """
        if isinstance(queries, str):
            raise TypeError("queries must be a sequence of strings, not one string")
        as_of, k = check_as_of(as_of), check_k(k)
        out_scores, out_ids = empty_results(len(queries), k)
        for qi, tokens in enumerate(tokenize(queries) if len(queries) else []):
            parts = [
                s.search_tokens(tokens, k, as_of if as_of < s.max_day else None)
                for s in self._shards
                if s.min_day <= as_of
            ]
            if not parts:
                continue
            scores = np.concatenate([p[0] for p in parts])
            ids = np.concatenate([p[1] for p in parts])
            best = np.lexsort((ids, -scores))[:k]  # best first; ties by id
            out_scores[qi, : best.size], out_ids[qi, : best.size] = scores[best], ids[best]
        return out_scores, out_ids
