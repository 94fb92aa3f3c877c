"""Drift of each month: profiles of the month shards of the serving snapshot, and `month_drift` rows.

A month's profile (evaluation/drift.py) is made from its shard's vectors, read back from the
serving snapshot, and its passage texts (the shard build's `passages` rows, without the date
prefix). It is saved under the profiles directory as <month>.npz + <month>.json.gz, with the shard
file and checksum it came from: a re-ingested month gets a new shard file, so its old profile is
rebuilt on first use. Each month is compared with three references, each a merge of month profiles:

    previous   the latest ingested month before it (normally the calendar month before)
    earlier    every ingested month before it
    training   the months the active trained reader was trained on: every ingested month whose
               last day is on or before its `trained_until` (skipped while no trained reader is active)

Only month shards are profiled or used as references; a history backfill shard is neither.
The ingest calls `drift_after_ingest`, which logs and swallows every error: drift never fails an ingest.

Example (the lead's drift-to-drop regression):
    >>> with sf() as session:
    ...     store = ProfileStore(session, index_dir, profiles_dir, ("words",))
    ...     drift_between(store.merged(["2023-04", "2023-05", "2023-06"]), store.merged(["2023-01", "2023-02"]))
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import faiss
import numpy as np
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from evaluation.drift import MonthProfile, build_profile, drift_between, load_profile, save_profile
from indexer.dates import month_end, parse_month
from indexer.index_errors import REBUILD_HINT, IndexIntegrityError
from indexer.manifest import Manifest, ShardEntry, read_manifest
from indexer.shards import key_span
from indexer.storage import IndexStore, as_store
from models.selflabel import load_nlp
from serving.errors import InvalidInputError
from serving.index_state import latest_snapshot_row
from serving.reader_registry import active_version
from settings import parse_drift_features
from store.base import utcnow
from store.tables import MonthDrift, Passage
from workers.config import DriftConfig

log = logging.getLogger(__name__)

REFERENCES = ("previous", "earlier", "training")


# ---- the serving snapshot's months ---------------------------------------------------------------


def serving_manifest(session: Session, index_dir: Path) -> Manifest:
    """The manifest of the serving snapshot. InvalidInputError when nothing is indexed yet."""
    row = latest_snapshot_row(session)
    if row is None:
        raise InvalidInputError("no index snapshot yet: ingest some months first (`sqa ingest --through YYYY-MM`)")
    return read_manifest(index_dir, row.manifest_file, expected_sha256=row.manifest_sha256)


def ingested_months(manifest: Manifest) -> list[str]:
    """Keys of the month shards ('YYYY-MM'), oldest first; history shards are left out."""
    return sorted(e.key for e in manifest.shards if key_span(e.key)[0] is not None)


def read_shard_vectors(index_dir: Path | IndexStore, entry: ShardEntry) -> np.ndarray:
    """(count, dim) float32 vectors of a flat shard file, checked against its manifest entry."""
    store = as_store(index_dir)
    path = store.locate(entry.file)
    try:
        data = store.read(entry.file)
    except OSError as exc:
        raise IndexIntegrityError(f"shard {entry.key}: cannot read {path} ({exc.strerror}); {REBUILD_HINT}") from None
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        raise IndexIntegrityError(f"shard {entry.key}: {path} does not match its manifest checksum; {REBUILD_HINT}")
    index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap) else index
    if not isinstance(inner, faiss.IndexFlat) or inner.ntotal != entry.count:
        raise IndexIntegrityError(
            f"shard {entry.key}: expected a flat index of {entry.count} vectors, found "
            f"{type(inner).__name__} with {inner.ntotal}; drift reads vectors from flat shards"
        )
    return inner.reconstruct_n(0, inner.ntotal)  # (count, dim)


def passage_bodies(session: Session, entry: ShardEntry) -> list[str]:
    """The bodies of the shard build's passages (their stored text: no "Thursday, February 7, 2019. " prefix)."""
    build = entry.build
    rows = session.execute(
        select(Passage.text).where(Passage.build_id == build, Passage.shard_key == entry.key).order_by(Passage.id)
    ).all()
    if len(rows) != entry.count:
        raise IndexIntegrityError(
            f"shard {entry.key}: the database holds {len(rows)} passages of build {build}, "
            f"the manifest {entry.count}; {REBUILD_HINT}"
        )
    return [text for (text,) in rows]


# ---- profiles ------------------------------------------------------------------------------------


def profile_stem(profiles_dir: Path, month: str) -> Path:
    return Path(profiles_dir) / month


def _shard_meta(entry: ShardEntry) -> dict[str, str]:
    return {"shard_file": entry.file, "shard_sha256": entry.sha256}


def profile_month(
    session: Session,
    index_dir: Path,
    month: str,
    features: Iterable[str],
    *,
    profiles_dir: Path,
    manifest: Manifest | None = None,
    nlp=None,
    batch_size: int = 64,
    progress: Callable[[int], None] | None = None,
) -> MonthProfile:
    """Build a month's profile from the serving snapshot and the passages table, and save it.

    Args:
        month: 'YYYY-MM', a month shard of the serving snapshot.
        features: lexical feature kinds ("words", "entities").
        profiles_dir: where <month>.npz and <month>.json.gz are written.
        nlp: the spaCy pipeline for entities (default: models.selflabel.load_nlp()).
        progress: called with the number of texts done (entities only).
    Raises:
        InvalidInputError: the month is not ingested. IndexIntegrityError: files and database disagree.
    """
    kinds = parse_drift_features(features)
    manifest = manifest or serving_manifest(session, index_dir)
    entry = manifest.shard(month)
    if entry is None or month not in ingested_months(manifest):
        raise InvalidInputError(
            f"month {month} is not ingested (no month shard in the serving snapshot); "
            f"run `sqa ingest --month {month}` first"
        )
    if "entities" in kinds and nlp is None:
        nlp = load_nlp()
    t0 = time.perf_counter()
    profile = build_profile(
        month,
        read_shard_vectors(index_dir, entry),
        passage_bodies(session, entry),
        kinds,
        encoder=manifest.encoder,
        nlp=nlp,
        batch_size=batch_size,
        meta=_shard_meta(entry),
        progress=progress,
    )
    save_profile(profile, profile_stem(profiles_dir, month))
    log.info(
        "drift profile of %s: %d passages, %s, %.1f s", month, profile.n, "+".join(kinds), time.perf_counter() - t0
    )
    return profile


class ProfileStore:
    """Month profiles of the serving snapshot, built once and kept for this session.

    A saved profile is used when it comes from the month's current shard file, the same encoder and
    has every feature kind asked for; otherwise (or with `rebuild`) it is built again and saved.
    """

    def __init__(
        self,
        session: Session,
        index_dir: Path,
        profiles_dir: Path,
        features: Iterable[str],
        *,
        rebuild: bool = False,
        nlp=None,
        batch_size: int = 64,
        progress: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self.session, self.index_dir, self.profiles_dir = session, Path(index_dir), Path(profiles_dir)
        self.features = parse_drift_features(features)
        self.manifest = serving_manifest(session, index_dir)
        self.months = ingested_months(self.manifest)
        self._rebuild, self._nlp, self._batch_size, self._progress = rebuild, nlp, batch_size, progress
        self._cache: dict[str, MonthProfile] = {}

    def get(self, month: str) -> MonthProfile:
        """The profile of one ingested month (InvalidInputError for a month not ingested)."""
        if month in self._cache:
            return self._cache[month]
        entry = self.manifest.shard(month)
        profile = None if self._rebuild or entry is None else self._saved(month, entry)
        if profile is None:
            total = entry.count if entry is not None else 0
            report = (lambda done: self._progress(month, done, total)) if self._progress else None
            profile = profile_month(
                self.session,
                self.index_dir,
                month,
                self.features,
                profiles_dir=self.profiles_dir,
                manifest=self.manifest,
                nlp=self._nlp,
                batch_size=self._batch_size,
                progress=report,
            )
        self._cache[month] = profile
        return profile

    def _saved(self, month: str, entry: ShardEntry) -> MonthProfile | None:
        try:
            profile = load_profile(profile_stem(self.profiles_dir, month))
        except FileNotFoundError:
            return None
        except ValueError as exc:
            log.warning("%s; building it again", exc)
            return None
        fresh = (
            profile.meta == _shard_meta(entry)
            and profile.encoder == self.manifest.encoder
            and profile.months == (month,)
            and set(self.features) <= set(profile.features)
        )
        if not fresh:
            return None
        # Keep only the kinds asked for, so every profile merged in a run has the same kinds.
        return MonthProfile(
            profile.months,
            profile.n,
            profile.sum_vec,
            profile.sum_sq,
            {k: profile.counts[k] for k in self.features},
            profile.encoder,
            profile.meta,
        )

    def merged(self, months: Sequence[str]) -> MonthProfile:
        """One profile of several ingested months."""
        return MonthProfile.merge(self.get(m) for m in months)


# ---- rows ----------------------------------------------------------------------------------------


def reference_months(
    months: Sequence[str], month: str, reference: str, trained_until: dt.date | None = None
) -> list[str]:
    """The ingested months a reference is made of (empty when it has none).

    Args:
        months: every ingested month, 'YYYY-MM'.
        reference: previous | earlier | training.
        trained_until: the active reader's cut (training only); months ending on or before it count.
    """
    before = sorted(m for m in months if m < month)
    if reference == "previous":
        return before[-1:]
    if reference == "earlier":
        return before
    if reference == "training":
        return [] if trained_until is None else sorted(m for m in months if month_end(parse_month(m)) <= trained_until)
    raise InvalidInputError(f"reference {reference!r} is unknown (use {', '.join(REFERENCES)})")


def _plan(session: Session, store: ProfileStore, month: str) -> list[tuple[str, list[str], str | None]]:
    reader = active_version(session)
    until = reader.trained_until if reader is not None else None
    version = reader.version if reader is not None and until is not None else None
    plan = []
    for ref in REFERENCES:
        months = reference_months(store.months, month, ref, until)
        if months:
            plan.append((ref, months, version if ref == "training" else None))
    return plan


def _up_to_date(rows: list[MonthDrift], plan, encoder: str, features: tuple[str, ...]) -> bool:
    have = {r.reference: r for r in rows}
    if set(have) != {ref for ref, _, _ in plan}:
        return False
    for ref, months, version in plan:
        r = have[ref]
        stored = (r.reference_first, r.reference_last, r.reader_version, r.encoder)
        if stored != (months[0], months[-1], version, encoder):
            return False
        if any(f"unseen_{k}" not in (r.measures or {}) for k in features):
            return False
    return True


def compute_month_drift(
    sf: sessionmaker[Session],
    index_dir: Path,
    month: str,
    cfg: DriftConfig,
    *,
    recompute: bool = True,
    store: ProfileStore | None = None,
) -> list[dict]:
    """Compute and store a month's drift against each reference it has (replacing its earlier rows).

    Args:
        recompute: False keeps the month's rows when they are up to date (same reference months,
            reader version, encoder and feature kinds).
        store: a ProfileStore to share between months (a backfill); default one for this call.
    Returns:
        The month's rows as dicts (see `row_dict`); empty for the first ingested month without a reader.
    """
    with sf() as session:
        store = store or ProfileStore(session, index_dir, cfg.profiles_dir, cfg.features, batch_size=cfg.batch_size)
        if month not in store.months:
            raise InvalidInputError(
                f"month {month} is not ingested (no month shard in the serving snapshot); "
                f"run `sqa ingest --month {month}` first"
            )
        plan = _plan(session, store, month)
        existing = list(session.scalars(select(MonthDrift).where(MonthDrift.month == month)))
        if not recompute and _up_to_date(existing, plan, store.manifest.encoder, store.features):
            return [row_dict(r) for r in sorted(existing, key=lambda r: REFERENCES.index(r.reference))]
        target = store.get(month)
        rows = []
        for ref, months, version in plan:
            source = store.merged(months)
            rows.append(
                MonthDrift(
                    month=month,
                    reference=ref,
                    reference_first=months[0],
                    reference_last=months[-1],
                    reader_version=version,
                    encoder=target.encoder,
                    n_target=target.n,
                    n_source=source.n,
                    measures=drift_between(target, source),
                    computed_at=utcnow(),
                )
            )
    with sf() as session, session.begin():
        session.execute(delete(MonthDrift).where(MonthDrift.month == month))
        session.add_all(rows)
    return [row_dict(r) for r in rows]


def drift_after_ingest(sf: sessionmaker[Session], index_dir: Path, month: str, cfg: DriftConfig) -> dict:
    """The ingest hook: compute the month's drift; never raises (an error is logged and returned).

    Returns:
        {"rows": n, "seconds": s} or {"error": "..."}.
    """
    t0 = time.perf_counter()
    try:
        rows = compute_month_drift(sf, index_dir, month, cfg)
    except Exception as exc:  # drift is an annotation of the ingest, never a reason to fail it
        log.exception(
            "drift of %s could not be computed (the ingest stands; `sqa drift --month %s` retries)", month, month
        )
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"rows": len(rows), "seconds": round(time.perf_counter() - t0, 3)}


def backfill_drift(
    sf: sessionmaker[Session],
    index_dir: Path,
    cfg: DriftConfig,
    *,
    first: str | None = None,
    last: str | None = None,
    recompute: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[dict]:
    """`sqa drift`: the drift of every ingested month in [first, last] (all when None).

    `recompute` rebuilds the profiles involved and replaces every row; otherwise up-to-date rows are kept.
    Raises:
        InvalidInputError: a range with no ingested month, or a single month that is not ingested.
    """
    with sf() as session:
        store = ProfileStore(
            session,
            index_dir,
            cfg.profiles_dir,
            cfg.features,
            rebuild=recompute,
            batch_size=cfg.batch_size,
            progress=progress,
        )
        months = [m for m in store.months if (first is None or m >= first) and (last is None or m <= last)]
        if not months:
            span = first if first == last else f"{first or 'the first'}..{last or 'the last'}"
            raise InvalidInputError(
                f"no ingested month in {span} (ingested: {', '.join(store.months) or 'none'}); "
                "ingest it first with `sqa ingest --month YYYY-MM`"
            )
        out = []
        for month in months:
            out.extend(compute_month_drift(sf, index_dir, month, cfg, recompute=recompute, store=store))
    return out


def drift_rows(
    session: Session, *, first: str | None = None, last: str | None = None, reference: str | None = None
) -> list[MonthDrift]:
    """Stored rows in [first, last] (months 'YYYY-MM'), by month then reference."""
    q = select(MonthDrift)
    if first:
        q = q.where(MonthDrift.month >= first)
    if last:
        q = q.where(MonthDrift.month <= last)
    if reference:
        q = q.where(MonthDrift.reference == reference)
    rows = list(session.scalars(q))
    return sorted(rows, key=lambda r: (r.month, REFERENCES.index(r.reference) if r.reference in REFERENCES else 9))


def row_dict(row: MonthDrift) -> dict:
    return {
        "month": row.month,
        "reference": row.reference,
        "reference_first": row.reference_first,
        "reference_last": row.reference_last,
        "reader_version": row.reader_version,
        "encoder": row.encoder,
        "n_target": row.n_target,
        "n_source": row.n_source,
        "measures": dict(row.measures or {}),
        "computed_at": row.computed_at,
    }
