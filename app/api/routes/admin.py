from __future__ import annotations

import datetime as dt
import logging
import re

from fastapi import APIRouter, Query, Request, status
from sqlalchemy import select

from app.api.deps import AdminDep, JobsDep, RowId, SessionDep, SettingsDep
from app.api.schemas import (
    ADMIN_ERRORS,
    EncoderVersionPublic,
    FinetuneRequest,
    IngestRequest,
    JobPublic,
    JobStarted,
    MonthDriftPublic,
    ReaderActivatedPublic,
    ReaderModelsPublic,
    ReaderVersionPublic,
    ReencodeRequest,
    ServingReaderPublic,
    SnapshotPublic,
)
from app.bootstrap.builders import resolve_device
from indexer.dates import InvalidDateError, month_key, parse_month
from models.encoders import PACKAGED_MINILM, list_encoder_versions, load_encoder
from serving.errors import ConflictError, InvalidInputError, NotFoundError
from serving.reader_registry import (
    READER_TRAINING_LOCK,
    activate_version,
    active_version,
    check_servable,
    deactivate_versions,
    get_version,
    list_versions,
)
from store.tables import Job
from workers.after_ingest import record_after_ingest, train_after_ingest
from workers.ingest import STAGE_WEIGHTS, ingest_lock, ingest_work
from workers.ingest_plans import IngestParams, check_month_request
from workers.job_context import JobContext
from workers.month_drift import REFERENCES, drift_rows
from workers.reencode import STAGE_WEIGHTS as REENCODE_WEIGHTS
from workers.reencode import reencode_work, serving_manifest
from workers.runner import JobHandle

log = logging.getLogger(__name__)
router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS)


def _public(job: Job) -> JobPublic:
    return JobPublic.model_validate(job, from_attributes=True)


@router.post("/ingest", response_model=JobStarted, status_code=status.HTTP_202_ACCEPTED)
def start_ingest(body: IngestRequest, request: Request, session: SessionDep, jobs: JobsDep) -> JobStarted:
    """Ingest (or re-ingest) one month in the background; poll the returned job. Once it succeeded, the
    training that follows an ingest runs as the scheduler's does (`workers.after_ingest`: SQA_AUTO_TRAIN,
    then SQA_FINETUNE_POLICY), as jobs of its own; the ingest job's counts then keep what it did under
    "after_ingest"."""
    app = request.app
    encoder = _index_encoder(app)
    cfg = jobs.ingest
    plan = check_month_request(session, cfg.index_dir, encoder, body.month)  # 422 before any job exists
    params = IngestParams(month=plan.first)
    ingest_month = ingest_work(jobs.sessions, encoder, cfg, params)
    ran: list[int] = []  # the job's id, known on its own thread before `after` runs

    def work(job: JobHandle) -> None:
        ingest_month(job)
        ran.append(job.job_id)

    def after() -> None:
        app.state.answers.index_state.refresh()  # serve the new snapshot now
        _train_after_ingest(app, jobs, plan.first, ran[0])

    job_id = jobs.runner.submit(
        "ingest",
        params.to_json(),
        work,
        slot="ingest",
        lock=ingest_lock(cfg.index_dir),
        weights=STAGE_WEIGHTS,
        after=after,
        conflict="an ingest is already running; poll GET /admin/jobs and try again when it ends",
    )
    return _started(job_id)


def _train_after_ingest(app, jobs: JobContext, month: dt.date, ingest_job_id: int) -> None:
    """`train_after_ingest` on the training slot (one training at a time in this process, as
    POST /admin/finetune), then serve the reader it activated, if any."""

    def train() -> None:
        train_after_ingest(jobs, month, record_on=ingest_job_id)
        app.state.answers.reader_state.refresh()

    try:
        jobs.runner.spawn("training", train, conflict="a reader training or fine-tune is already running")
    except ConflictError as exc:
        log.warning("no training after ingest job %d: %s", ingest_job_id, exc)
        record_after_ingest(jobs, ingest_job_id, {"error": str(exc)})


def _started(job_id: int) -> JobStarted:
    return JobStarted(job_id=job_id, state="queued", status_url=f"/admin/jobs/{job_id}")


def _index_encoder(app):
    """The encoder new passages must be encoded with: the serving snapshot's own (SQA_ENCODER=auto
    follows `reencode` switches), else the service's."""
    snap = app.state.answers.index_state.current()
    return snap.encoder if snap is not None and snap.encoder is not None else app.state.answers.retriever.encoder


@router.post("/index/reencode", response_model=JobStarted, status_code=status.HTTP_202_ACCEPTED)
def start_reencode(
    body: ReencodeRequest, request: Request, session: SessionDep, jobs: JobsDep, settings: SettingsDep
) -> JobStarted:
    """Re-encode every shard with another encoder version in the background; the server switches to
    the new snapshot (and its query encoder) at once when the job commits. Needs SQA_ENCODER=auto."""
    app = request.app
    cfg = jobs.ingest
    if settings.encoder != "auto":
        raise ConflictError(
            f"SQA_ENCODER is pinned to {settings.encoder!r}: this server would refuse the "
            "re-encoded index; run it with SQA_ENCODER=auto to switch encoders"
        )
    # Only names the server knows: the packaged model, a trained version, or the tests' hash fake.
    # Never a path (a request must not make the server load whatever folder it names).
    known = [i["version"] for i in list_encoder_versions(settings.encoders_dir)]
    if body.encoder not in ("minilm", *known) and not re.fullmatch(
        r"hash(-[0-9]+|:[a-z_]+=[0-9.]+(,[a-z_]+=[0-9.]+)*)?", body.encoder
    ):
        raise InvalidInputError(
            f"encoder {body.encoder!r} is not 'minilm' or a trained version "
            f"(known: {', '.join(known) or 'none yet: sqa train retriever'})"
        )
    serving_manifest(session, cfg)  # 422 when there is nothing to re-encode
    try:
        encoder = load_encoder(
            body.encoder,
            device=resolve_device(settings),
            encoders_dir=settings.encoders_dir,
            backend=settings.encoder_backend,
        )
    except (ValueError, RuntimeError) as exc:
        raise InvalidInputError(str(exc)) from None
    job_id = jobs.runner.submit(
        "reencode",
        {"encoder": encoder.name},
        reencode_work(jobs.sessions, encoder, cfg),
        slot="ingest",
        lock=ingest_lock(cfg.index_dir),
        weights=REENCODE_WEIGHTS,
        after=app.state.answers.index_state.refresh,  # serve the re-encoded snapshot now
        conflict="an ingest or re-encode is already running; poll GET /admin/jobs and try again when it ends",
    )
    return _started(job_id)


@router.get("/encoders", response_model=list[EncoderVersionPublic])
def list_encoders(request: Request, settings: SettingsDep) -> list[EncoderVersionPublic]:
    """The packaged encoder and the trained versions; `serving` marks the one the index uses."""
    snap = request.app.state.answers.index_state.current()
    serving = snap.manifest.encoder if snap is not None else None
    out = [EncoderVersionPublic(version=PACKAGED_MINILM, serving=serving == PACKAGED_MINILM)]
    for info in list_encoder_versions(settings.encoders_dir):
        out.append(
            EncoderVersionPublic(
                version=info["version"],
                towers=info.get("towers"),
                trained_until=info.get("trained_until"),
                validation=info.get("validation", {}),
                serving=serving == info["version"],
            )
        )
    return out


@router.get("/jobs", response_model=list[JobPublic])
def list_jobs(session: SessionDep, limit: int = 50) -> list[JobPublic]:
    jobs = session.scalars(select(Job).order_by(Job.id.desc()).limit(max(1, min(limit, 500))))
    return [_public(j) for j in jobs]


@router.get("/jobs/{job_id}", response_model=JobPublic)
def get_job(job_id: RowId, session: SessionDep) -> JobPublic:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFoundError(f"no job with id {job_id}")
    return _public(job)


def _month_arg(value: str | None, what: str) -> str | None:
    if value is None:
        return None
    try:
        return month_key(parse_month(value))
    except InvalidDateError:
        raise InvalidInputError(f"{what} {value!r} is not a month (use YYYY-MM)") from None


@router.get("/drift", response_model=list[MonthDriftPublic])
def list_drift(
    session: SessionDep,
    from_: str | None = Query(None, alias="from", description="YYYY-MM: first month"),
    to: str | None = Query(None, description="YYYY-MM: last month"),
    reference: str | None = Query(None, description="previous | earlier | training"),
) -> list[MonthDriftPublic]:
    """Each month's drift from its references, by month (`sqa drift` backfills months ingested before)."""
    first, last = _month_arg(from_, "from"), _month_arg(to, "to")
    if first and last and first > last:
        raise InvalidInputError(f"from {first} is after to {last}")
    if reference is not None and reference not in REFERENCES:
        raise InvalidInputError(f"reference {reference!r} is unknown (use {', '.join(REFERENCES)})")
    return [
        MonthDriftPublic.model_validate(r, from_attributes=True)
        for r in drift_rows(session, first=first, last=last, reference=reference)
    ]


@router.get("/index", response_model=SnapshotPublic)
def get_index(request: Request) -> SnapshotPublic:
    """The snapshot this process serves, after loading the newest committed one: a job's row says
    succeeded in the transaction that commits its snapshot, a moment before the server swaps it in."""
    state = request.app.state.answers.index_state
    state.refresh()
    snap = state.current()
    if snap is None:
        raise NotFoundError("no index snapshot is loaded yet")
    return SnapshotPublic(
        snapshot_id=snap.snapshot_id,
        vectors=snap.index.ntotal,
        shards=[e.key for e in snap.manifest.shards],
        encoder=snap.manifest.encoder,
        newest_day=snap.newest_day,
    )


# ---- trained reader versions ---------------------------------------------------------------------


def _serving(request: Request) -> ServingReaderPublic:
    return ServingReaderPublic(**request.app.state.answers.reader_state.describe())


@router.get("/models", response_model=ReaderModelsPublic)
def list_models(request: Request, session: SessionDep) -> ReaderModelsPublic:
    """Every trained reader version (newest first) and the reader serving in this process."""
    versions = [ReaderVersionPublic.model_validate(r, from_attributes=True) for r in list_versions(session)]
    return ReaderModelsPublic(versions=versions, serving=_serving(request))


@router.post("/models/{version}/activate", response_model=ReaderActivatedPublic)
def activate_model(version: str, request: Request, session: SessionDep, settings: SettingsDep) -> ReaderActivatedPublic:
    """Make a ready version the active one; this process serves it at once, others within a poll.
    `none`: no version is active, and servers with SQA_READER=auto go back to zero-shot Gemma."""
    state = request.app.state.answers.reader_state
    if version == "none":
        was = deactivate_versions(session)
        session.commit()
        notes = [f"{was} is no longer active" if was else "no version was active"]
        if state.follows_registry:
            state.refresh()
        else:
            notes.append(f"this process serves a fixed reader (SQA_READER={settings.reader})")
        return ReaderActivatedPublic(version="none", active=False, serving=_serving(request), notes=notes)
    folder = check_servable(get_version(session, version), settings.models_dir)  # 404, 409
    notes: list[str] = []
    serving = state.current()
    preload = state.follows_registry and (serving is None or serving.version != version)
    if preload:
        # Load before activating: a version that cannot load here never becomes the active one.
        try:
            state.preload(version, folder)
        except Exception as exc:
            log.exception("reader version %s failed to load", version)
            raise ConflictError(
                f"reader version {version} could not be loaded ({type(exc).__name__}: {exc}); "
                "the active version is unchanged"
            ) from None
    try:
        activate_version(session, version, models_dir=settings.models_dir)
        session.commit()
    except BaseException:
        state.discard_preloaded()
        raise
    if state.follows_registry:
        state.refresh()
    else:
        notes.append(
            f"this process serves a fixed reader (SQA_READER={settings.reader}); "
            "servers with SQA_READER=auto serve the active version"
        )
    return ReaderActivatedPublic(version=version, active=True, serving=_serving(request), notes=notes)


@router.post("/finetune", response_model=JobStarted, status_code=status.HTTP_202_ACCEPTED)
def start_finetune(body: FinetuneRequest, request: Request, session: SessionDep, jobs: JobsDep) -> JobStarted:
    """Fine-tune the active trained reader on a month's news in the background; poll the returned job."""
    from workers.train import run_finetune_job  # noqa: PLC0415 (lazy: torch)

    month = month_key(parse_month(body.month))  # InvalidDateError: 422
    parent = active_version(session)
    if parent is None:
        raise InvalidInputError("no trained reader to fine-tune: run `sqa train reader --until YYYY-MM-DD` first")
    if parent.kind == "ranker":
        raise InvalidInputError(
            f"the active version {parent.version} is a ranker, which is refitted rather than "
            "fine-tuned: run `sqa train reader --kind ranker --until YYYY-MM-DD`"
        )
    params = {"month": month, "parent_version": parent.version}
    job_id = jobs.runner.submit(
        "finetune",
        params,
        lambda job: run_finetune_job(jobs, job, month=month),
        slot="training",
        lock=jobs.runner.lock(READER_TRAINING_LOCK),
        message=lambda version: f"new reader version {version}",
        result_key="version",
        after=request.app.state.answers.reader_state.refresh,  # serve it now if activated
        conflict="a reader training or fine-tune is already running; poll GET /admin/jobs and try again when it ends",
    )
    return _started(job_id)
