"""The registry of trained reader versions (`reader_models` rows) and which one is active.

A version is a folder under the models directory (SQA_HOME/models/<version>) plus a row naming
its kind, lineage (parent version, data cut-off, fine-tune month), state and metrics. At most one
row is active; servers with SQA_READER=auto serve it (serving/reader_state.py).

Functions take a session and flush; the caller commits (so an activation and whatever goes with
it are one transaction).
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from models.trained import read_reader_info, write_reader_info
from serving.errors import ConflictError, NotFoundError
from store.tables import ReaderModel

KINDS = ("fid", "extractive", "ranker", "gemma")
STATES = ("training", "ready", "failed")
# One reader training or fine-tune at a time per SQA_HOME: the job runner's lock of this name
# (workers.runner.JobRunner.lock), held by whoever runs the training.
READER_TRAINING_LOCK = "reader-training"

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_VERSION_MAX = 64  # reader_models.version is String(64)


def new_version_name(kind: str, label: str) -> str:
    """A fresh, unique-enough version name: new_version_name("fid", "2023-03-31") -> "fid-2023-03-31-1a2b3c".

    Args:
        kind: "fid", "extractive", "ranker" or "gemma".
        label: what the version is (a data cut-off day, "ft-2023-04"); letters, digits, ".", "_", "-".
    Returns:
        "<kind>-<label>-<6 hex>", at most 64 characters.
    """
    _check_kind(kind)
    if not _LABEL.match(label or ""):
        raise ValueError(f"version label {label!r} must be letters, digits, '.', '_' or '-'")
    name = f"{kind}-{label}-{secrets.token_hex(3)}"
    if len(name) > _VERSION_MAX:
        raise ValueError(f"version name {name!r} is longer than {_VERSION_MAX} characters: shorten the label")
    return name


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"reader kind {kind!r} is unknown (use {' or '.join(KINDS)})")


def version_dir(row: ReaderModel, models_dir: Path) -> Path:
    """The version's folder (row.path is relative to the models directory)."""
    return models_dir / row.path


def register_version(
    session: Session,
    *,
    version: str,
    kind: str,
    path: str | Path,
    parent_version: str | None = None,
    trained_until: dt.date | None = None,
    month: str | None = None,
    metrics: dict[str, Any] | None = None,
    job_id: int | None = None,
    state: str = "ready",
    activate: bool = False,
    models_dir: Path | None = None,
) -> ReaderModel:
    """Record a trained version; optionally make it the active one in the same transaction.

    Args:
        path: the version folder, relative to the models directory (an absolute path inside
            `models_dir` is stored relative to it).
        state: "ready" once the folder is complete; "training" or "failed" otherwise.
        activate: also activate it (needs `models_dir`, to check the folder exists).
    Raises:
        ConflictError if the version name is taken; ValueError for a bad kind or state.
    """
    _check_kind(kind)
    if state not in STATES:
        raise ValueError(f"reader version state {state!r} is unknown (use {', '.join(STATES)})")
    if not version or len(version) > _VERSION_MAX:
        raise ValueError(f"version name {version!r} must be 1..{_VERSION_MAX} characters")
    if session.scalar(select(ReaderModel.id).where(ReaderModel.version == version)) is not None:
        raise ConflictError(f"reader version {version} is already registered")
    p = Path(path)
    if p.is_absolute() and models_dir is not None and p.is_relative_to(models_dir):
        p = p.relative_to(models_dir)
    row = ReaderModel(
        version=version,
        kind=kind,
        path=p.as_posix(),
        parent_version=parent_version,
        trained_until=trained_until,
        month=month,
        state=state,
        active=False,
        metrics=dict(metrics or {}),
        job_id=job_id,
    )
    session.add(row)
    session.flush()
    if activate:
        if models_dir is None:
            raise ValueError("register_version(activate=True) needs models_dir to check the version's folder")
        return activate_version(session, version, models_dir=models_dir)
    return row


def list_versions(session: Session) -> list[ReaderModel]:
    """Every version, newest first."""
    return list(session.scalars(select(ReaderModel).order_by(ReaderModel.id.desc())))


def get_version(session: Session, version: str) -> ReaderModel:
    row = session.scalar(select(ReaderModel).where(ReaderModel.version == version))
    if row is None:
        raise NotFoundError(f"no reader version {version!r} (see `sqa models list` or GET /admin/models)")
    return row


def active_version(session: Session) -> ReaderModel | None:
    return session.scalar(select(ReaderModel).where(ReaderModel.active.is_(True)))


def check_servable(row: ReaderModel, models_dir: Path) -> Path:
    """The version's folder if it can serve; ConflictError saying why not otherwise."""
    if row.state != "ready":
        raise ConflictError(
            f"reader version {row.version} is {row.state}, not ready: only a ready version can be activated"
        )
    folder = version_dir(row, models_dir)
    if not folder.is_dir():
        raise ConflictError(
            f"reader version {row.version}: its folder {folder} is missing; restore it or activate another version"
        )
    return folder


def activate_version(session: Session, version: str, *, models_dir: Path) -> ReaderModel:
    """Make `version` the only active version (flushes; commit to publish it).

    Raises:
        NotFoundError for an unknown version; ConflictError if it is not ready or its folder is missing.
    """
    row = get_version(session, version)
    check_servable(row, models_dir)
    # Serialise concurrent activations on PostgreSQL (SQLite has one writer anyway); the partial
    # unique index would refuse a second active row regardless.
    session.execute(select(ReaderModel.id).with_for_update())
    session.execute(
        update(ReaderModel)
        .where(ReaderModel.active.is_(True), ReaderModel.id != row.id)
        .values(active=False)
        .execution_options(synchronize_session="fetch")
    )
    row.active = True
    session.flush()
    return row


def deactivate_versions(session: Session) -> str | None:
    """Make no version active (flushes; commit to publish it): servers with SQA_READER=auto go back to
    the fallback reader (zero-shot Gemma), and the training after ingest trains from the base again.
    Returns the version that was active, or None."""
    row = active_version(session)
    session.execute(select(ReaderModel.id).with_for_update())
    session.execute(
        update(ReaderModel)
        .where(ReaderModel.active.is_(True))
        .values(active=False)
        .execution_options(synchronize_session="fetch")
    )
    session.flush()
    return row.version if row is not None else None


# The brief's name; `activate_version` reads better at call sites that also hold an `activate` flag.
activate = activate_version


def import_version(
    session: Session,
    folder: Path,
    *,
    models_dir: Path,
    activate: bool = False,
    check: Callable[[Path], object] | None = None,
    origin: str | None = None,
) -> ReaderModel:
    """Register a version folder trained elsewhere (`python -m models.train_exported`): its
    reader.json says the kind, the cut-off and the scores; `check(folder)` (default: nothing) loads
    it to prove the tensors fit the model. The folder is copied under `models_dir` with a new
    version name (the original is left alone); the copy is registered in `session` (flushes; commit
    to publish it), and made the active version with `activate`. Its reader.json records where it
    came from: `origin`, or the folder's path.

    Raises:
        ValueError for a folder that is not a trained reader (or whose tensors do not fit).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder")
    try:
        info = read_reader_info(folder)
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from exc
    until = info.get("trained_until")
    try:
        trained_until = dt.date.fromisoformat(str(until)[:10]) if until else None
    except ValueError as exc:
        raise ValueError(f"{folder}: trained_until {until!r} is not a date") from exc
    version = new_version_name(info["kind"], str(info.get("label") or until or "imported"))
    if check is not None:  # the slow check last
        check(folder)
    dest = models_dir / version
    tmp = models_dir / f".{version}.importing"
    models_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(folder, tmp)
        write_reader_info(tmp, {**info, "version": version, "imported_from": origin or str(folder.resolve())})
        tmp.replace(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        row = register_version(
            session,
            version=version,
            kind=info["kind"],
            path=version,
            parent_version=info.get("parent_version"),
            trained_until=trained_until,
            month=info.get("month"),
            activate=activate,
            models_dir=models_dir,
            metrics={
                "validation": info.get("validation"),
                "steps": info.get("steps"),
                "stopped": info.get("stopped"),
                "train": (info.get("data") or {}).get("train"),
                "val": (info.get("data") or {}).get("val"),
                "trained_elsewhere": info.get("trained_elsewhere"),
            },
        )
    except Exception:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return row


def ready_infos(
    session: Session, models_dir: Path, kind: str = "gemma"
) -> Iterator[tuple[ReaderModel, dict[str, Any]]]:
    """(row, reader.json) of each ready version of `kind`, newest first; a folder whose reader.json is
    missing or unreadable is passed over."""
    for row in list_versions(session):
        if row.kind != kind or row.state != "ready":
            continue
        try:
            yield row, read_reader_info(version_dir(row, models_dir))
        except (OSError, ValueError):
            continue


def find_soup(session: Session, versions: list[str], *, models_dir: Path) -> str | None:
    """A ready version that is the soup of exactly these `versions`, in this order (`soup_of`), or None."""
    return next(
        (row.version for row, info in ready_infos(session, models_dir) if info.get("soup_of") == list(versions)), None
    )


def soup_versions(
    session: Session,
    versions: list[str],
    *,
    models_dir: Path,
    activate: bool = False,
    check: Callable[[Path], object] | None = None,
) -> ReaderModel:
    """Register the uniform soup of ready Gemma LoRA versions (runs of the same settings, another seed
    each: `models.gemma_train.write_soup`) as a new version, like `import_version`: its reader.json
    names the members (`soup_of`), the latest cut-off of theirs and the first member's spec; it has
    no validation score of its own (measure it: `python -m bench.bench_quality` with
    SQA_READER=gemma:<folder>, or `sqa train auto`'s check). `check(folder)` loads it.

    Raises:
        NotFoundError for an unknown version; ConflictError for one not ready; ValueError for fewer
        than two, a repeated one, a kind other than gemma or members that do not average.
    """
    from models.gemma_train import write_soup  # noqa: PLC0415 (lazy: models.gemma_train imports torch)

    if len(versions) < 2:
        raise ValueError(f"a soup needs at least two versions, got {len(versions)}")
    if len(set(versions)) != len(versions):
        raise ValueError(f"a version is named twice in {', '.join(versions)}: a soup averages distinct runs")
    rows = [get_version(session, v) for v in versions]
    folders = [check_servable(r, models_dir) for r in rows]
    for r in rows:
        if r.kind != "gemma":
            raise ValueError(f"reader version {r.version} is a {r.kind} reader: a soup averages Gemma LoRA versions")
    infos = [read_reader_info(f) for f in folders]
    untils = [str(i["trained_until"])[:10] for i in infos if i.get("trained_until")]
    tmp = models_dir / f".soup-{secrets.token_hex(4)}"
    try:
        write_soup(folders, tmp)
        first = infos[0]
        write_reader_info(
            tmp,
            {
                "kind": "gemma",
                "trained_until": max(untils) if untils else None,
                "label": max(untils) if untils else "soup",
                "soup_of": list(versions),
                "parent_version": None,
                "spec": first.get("spec"),
                "validation": None,
                "members_validation": {v: i.get("validation") for v, i in zip(versions, infos)},
                "data": first.get("data"),
                "stopped": "soup",
                **({"precision": first["precision"]} if first.get("precision") else {}),
            },
        )
        return import_version(
            session, tmp, models_dir=models_dir, activate=activate, check=check, origin=f"soup of {', '.join(versions)}"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
