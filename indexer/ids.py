"""FAISS ids that carry a passage's publication day, so a date filter is an id range.

    id = (day_number(published) << ID_SHIFT) | seq        seq = the passage's primary key

Ids sort by day first, so "published on or before as_of" is every id below `ids_through(as_of)`
and "published on or after day" every id from `ids_from(day)`: exactly the half-open range that
`faiss.IDSelectorRange(lo, hi)` selects. Day numbers come from `indexer.dates` (days since EPOCH).

Example:
    >>> make_id(dt.date(2023, 4, 2), 7) < ids_through(dt.date(2023, 4, 2)) <= make_id(dt.date(2023, 4, 3), 0)
    True
"""

from __future__ import annotations

import datetime as dt
import operator

import numpy as np

from indexer.dates import day_number, from_day_number

ID_SHIFT = 40
SEQ_LIMIT = 1 << ID_SHIFT  # seq must be in [0, SEQ_LIMIT)
DAY_LIMIT = 1 << (63 - ID_SHIFT)  # day numbers in [0, DAY_LIMIT) keep ids positive int64
_SEQ_MASK = SEQ_LIMIT - 1


def _check_seq(seq: int) -> int:
    seq = operator.index(seq)
    if not 0 <= seq < SEQ_LIMIT:
        raise ValueError(f"passage seq {seq} is out of range: it must be in [0, 2**{ID_SHIFT})")
    return seq


def _check_day_number(n: int) -> int:
    if not 0 <= n < DAY_LIMIT:
        raise ValueError(f"day number {n} is out of range: it must be in [0, 2**{63 - ID_SHIFT})")
    return n


def make_id(day: dt.date, seq: int) -> int:
    """The FAISS id of passage `seq` published on `day`."""
    return (_check_day_number(day_number(day)) << ID_SHIFT) | _check_seq(seq)


def make_ids(day_numbers: np.ndarray, seqs: np.ndarray) -> np.ndarray:
    """Vectorised `make_id`.

    Args:
        day_numbers: (n,) integer day numbers (`indexer.dates.day_number`).
        seqs: (n,) integer passage primary keys.
    Returns:
        (n,) int64 ids.
    """
    days = np.asarray(day_numbers)
    seqs = np.asarray(seqs)
    if days.shape != seqs.shape or days.ndim != 1:
        raise ValueError(f"day_numbers {days.shape} and seqs {seqs.shape} must be 1-d arrays of the same length")
    for name, arr in (("day_numbers", days), ("seqs", seqs)):
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{name} must be integers, got dtype {arr.dtype}")
    days = days.astype(np.int64, copy=False)
    seqs = seqs.astype(np.int64, copy=False)
    bad = np.flatnonzero((seqs < 0) | (seqs >= SEQ_LIMIT))
    if bad.size:
        _check_seq(int(seqs[bad[0]]))  # raises, naming the value
    bad = np.flatnonzero((days < 0) | (days >= DAY_LIMIT))
    if bad.size:
        _check_day_number(int(days[bad[0]]))
    ids: np.ndarray = (days << ID_SHIFT) | seqs
    return ids


def id_day(faiss_id: int) -> dt.date:
    """Publication day of a passage id."""
    faiss_id = operator.index(faiss_id)
    if faiss_id < 0:
        raise ValueError(f"id {faiss_id} is negative (FAISS pads missing results with -1)")
    return from_day_number(faiss_id >> ID_SHIFT)


def id_seq(faiss_id: int) -> int:
    """The passage primary key inside an id."""
    return operator.index(faiss_id) & _SEQ_MASK


def id_day_numbers(ids: np.ndarray) -> np.ndarray:
    """(n,) int64 ids -> (n,) int64 day numbers (padding ids -1 give -1)."""
    ids = np.asarray(ids, dtype=np.int64)
    return np.where(ids < 0, -1, ids >> ID_SHIFT)


def ids_from(day: dt.date) -> int:
    """Smallest id of a passage published on or after `day` (inclusive lower bound)."""
    return _check_day_number(day_number(day)) << ID_SHIFT


def ids_through(as_of: dt.date) -> int:
    """Exclusive upper id bound for "published on or before as_of"."""
    return (_check_day_number(day_number(as_of)) + 1) << ID_SHIFT
