"""Building the serving objects from the settings: the database, the encoder (SQA_ENCODER; "auto":
the one the index records), the reader, or the reader state that follows the registry (SQA_READER),
the index state, the retriever with its re-ranker, and the answer service; and the device the
models load on (SQA_DEVICE). The jobs' context over them is app.bootstrap's.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path

from sqlalchemy import inspect

import models.trained  # called as models.trained.X: tests replace its functions
from models.encoders import TextEncoder, describe_encoder, load_encoder, resolve_encoder
from models.readers import Reader, load_reader
from models.reranker import load_reranker
from serving.answer_forms import AnswerFormsSource
from serving.answering import AnswerLimits, AnswerService
from serving.distinct import DistinctRetriever
from serving.index_state import IndexState, latest_snapshot_row
from serving.reader_registry import check_servable, get_version
from serving.reader_state import ReaderState, RegistrySource
from serving.reranking import FOLLOW_ACTIVE, RerankerState, RerankingRetriever
from serving.retrieval import Retriever, make_retriever
from settings import ReaderSpec, Settings
from store.engine import Database, make_engine, make_session_factory
from store.engine import open_database as _open_url

log = logging.getLogger(__name__)


def open_database(settings: Settings, *, migrate: bool = True) -> Database:
    """The settings' database (SQLite under SQA_HOME by default), migrated to the newest schema
    (app.cli.common has the same for the commands that need nothing else)."""
    settings.ensure_dirs()
    return _open_url(settings.db_url, migrate=migrate)


def configure_torch(settings: Settings) -> None:
    if settings.torch_threads:
        import torch  # noqa: PLC0415 (lazy: torch)

        torch.set_num_threads(settings.torch_threads)


def build_encoder(settings: Settings) -> TextEncoder:
    """SQA_ENCODER's encoder; with "auto", the one the serving index records (MiniLM for a new index)."""
    configure_torch(settings)
    if settings.encoder == AUTO_ENCODER:
        name = index_encoder_name(settings)
        if name is not None:
            return resolve_encoder(
                name,
                encoders_dir=settings.encoders_dir,
                device=resolve_device(settings),
                backend=settings.encoder_backend,
            )
        return load_encoder("minilm", device=resolve_device(settings), backend=settings.encoder_backend)
    return load_encoder(
        settings.encoder,
        device=resolve_device(settings),
        encoders_dir=settings.encoders_dir,
        backend=settings.encoder_backend,
    )


AUTO_ENCODER = "auto"


def encoder_identity(settings: Settings) -> tuple[str, int]:
    """SQA_ENCODER's (name, dim) as `build_encoder` would give them, read from the model's files where
    they tell (no torch, no weights: `sqa index status` starts in a second); built otherwise."""
    spec = settings.encoder
    if spec == AUTO_ENCODER:
        spec = index_encoder_name(settings) or "minilm"
    found = describe_encoder(spec, encoders_dir=settings.encoders_dir)
    if found is None:
        encoder = build_encoder(settings)
        found = (encoder.name, encoder.dim)
    return found


def index_encoder_name(settings: Settings) -> str | None:
    """The encoder the newest serving snapshot was built with, None while there is none."""
    engine = make_engine(settings.db_url)
    try:
        if not inspect(engine).has_table("index_snapshots"):
            return None
        with make_session_factory(engine)() as session:
            row = latest_snapshot_row(session)
            return row.encoder if row is not None else None
    finally:
        engine.dispose()


class EncoderResolver:
    """Encoder by the name an index snapshot records, loaded once each (SQA_ENCODER=auto)."""

    def __init__(self, settings: Settings, *known: TextEncoder) -> None:
        self._settings = settings
        self._cache = {e.name: e for e in known}

    def __call__(self, name: str) -> TextEncoder:
        if name not in self._cache:
            self._cache[name] = resolve_encoder(
                name,
                encoders_dir=self._settings.encoders_dir,
                device=resolve_device(self._settings),
                backend=self._settings.encoder_backend,
            )
        return self._cache[name]


def index_state(settings: Settings, db: Database, encoder: TextEncoder, *, lexical: bool = False) -> IndexState:
    """The IndexState for `encoder`: pinned to it, or (SQA_ENCODER=auto) each snapshot with its own encoder."""
    resolver = EncoderResolver(settings, encoder) if settings.encoder == AUTO_ENCODER else None
    return IndexState(
        db.sessions, settings.index_dir, encoder=encoder.name, dim=encoder.dim, lexical=lexical, resolver=resolver
    )


FALLBACK_READER = "gemma"  # what SQA_READER=auto serves while no trained version is active


def _reading(settings: Settings) -> dict:
    """How a reader is served under the settings (SQA_DEVICE, the decoding, the runtime and its
    weights): the same for a packaged reader, a trained version and a version's export."""
    return {
        "device": resolve_device(settings),
        "answer_beams": settings.reader_answer_beams,
        "vocabulary": settings.reader_vocabulary,
        "echo_beams": settings.reader_echo_beams,
        "runtime": settings.reader_runtime,
        "gguf_type": settings.reader_gguf_type,
    }


def load_builtin_reader(settings: Settings, name: str) -> Reader:
    """A packaged reader or fake by name; Gemma's converted weights are kept under SQA_HOME/models/base."""
    return load_reader(
        name,
        max_passages=settings.reader_passages or 3,
        cache_dir=settings.models_dir / "base",
        context_words=settings.reader_context_words,
        precision=settings.reader_precision,
        **_reading(settings),
    )


def load_trained_folder(settings: Settings, folder: Path, *, expect: str | None = None) -> Reader:
    """The trained reader in a version folder; `expect` ("fid", "gemma", ...) must match its reader.json."""
    if expect is not None:
        kind = models.trained.read_reader_info(folder).get("kind")
        if kind != expect:
            raise ValueError(f"SQA_READER={expect}:{folder} but {folder / 'reader.json'} says kind {kind!r}")
    return models.trained.load_trained_reader(
        folder, max_passages=settings.reader_passages or None, precision=settings.reader_precision, **_reading(settings)
    )


def export_trained_folder(settings: Settings, folder: Path) -> Path | None:
    """The GGUF file a version folder serves from on llama.cpp under these settings, written now
    (models.trained.export_for_serving); None where PyTorch serves it. A failed export is logged and
    gives None: the version is then exported at its first load, as a version copied in by hand is."""
    t0 = time.perf_counter()
    try:
        gguf = models.trained.export_for_serving(folder, **_reading(settings))
    except Exception as exc:  # a finished training is not lost for its export
        log.warning("%s: not exported for the serving runtime (%s); it will be at its first load", folder.name, exc)
        return None
    if gguf is not None:
        log.info("%s: exported for llama.cpp as %s in %.1f s", folder.name, gguf.name, time.perf_counter() - t0)
    return gguf


def build_reader_state(settings: Settings, db: Database | None) -> ReaderState:
    """The serving reader SQA_READER names; with "auto" a state that follows the active version.

    `db` may be None only for specs that need no registry (built-in names and folders).
    """
    configure_torch(settings)
    spec: ReaderSpec = settings.reader_spec
    if spec.kind == "builtin":
        return ReaderState(load_builtin_reader(settings, spec.value))
    if spec.kind == "path":
        return ReaderState(load_trained_folder(settings, Path(spec.value), expect=spec.expect))
    if db is None:
        raise ValueError(f"SQA_READER={settings.reader} reads the reader registry: it needs the database")
    if spec.kind == "version":
        with db.sessions() as session:
            row = get_version(session, spec.value)  # NotFoundError
            folder = check_servable(row, settings.models_dir)  # ConflictError: not ready, folder missing
        return ReaderState(load_trained_folder(settings, folder), version=spec.value)
    state = ReaderState(
        source=RegistrySource(
            db.sessions,
            settings.models_dir,
            load_version=lambda folder: load_trained_folder(settings, folder),
            load_fallback=lambda: load_builtin_reader(settings, FALLBACK_READER),
        )
    )
    state.refresh()  # the active version, else the fallback; raises only if nothing can serve
    return state


def build_reader(settings: Settings, db: Database | None = None) -> Reader:
    """The reader SQA_READER names, resolved now (one-shot commands; the server keeps a ReaderState).

    "auto" and "version:NAME" read the registry: from `db`, or a database opened for the lookup.
    """
    if db is None and settings.reader_spec.kind in ("auto", "version"):
        db = open_database(settings)
        try:
            return build_reader_state(settings, db).reader()
        finally:
            db.close()
    return build_reader_state(settings, db).reader()


@functools.cache
def _cuda_available() -> bool:
    import torch  # noqa: PLC0415 (lazy: torch)

    return bool(torch.cuda.is_available())


def resolve_device(settings: Settings) -> str:
    """SQA_DEVICE made concrete: "auto" is "cuda" when torch sees a GPU, else "cpu"."""
    if settings.device != "auto":
        return settings.device
    return "cuda" if _cuda_available() else "cpu"


def build_retriever(
    settings: Settings, encoder: TextEncoder, *, rerank: bool = True, reranker: str | None | object = FOLLOW_ACTIVE
) -> Retriever:
    """The retriever the service answers with: SQA_RETRIEVER, SQA_FUSION, SQA_FUSION_DENSE_WEIGHT,
    SQA_RECENCY_WEIGHT, then the active re-ranker version (SQA_RERANKER; `rerank=False`: the first
    stage alone, what a re-ranker is trained on; `reranker`: a version pinned instead of the active
    one, None for none), then copies collapsed (SQA_DISTINCT_EVIDENCE)."""
    first = make_retriever(
        settings.retriever,
        encoder,
        fusion=settings.fusion,
        dense_weight=settings.fusion_dense_weight,
        recency=settings.recency_weight,
    )
    ranked: Retriever = first
    if rerank and settings.reranker != "none" and reranker is not None:
        ranked = RerankingRetriever(first, reranker_state(settings, reranker), depth=settings.rerank_depth)
    if settings.distinct_evidence > 0:
        return DistinctRetriever(ranked, threshold=settings.distinct_evidence)
    return ranked


def reranker_state(settings: Settings, pinned: str | None | object = FOLLOW_ACTIVE) -> RerankerState:
    """Follows SQA_HOME/rerankers/ACTIVE (or serves the `pinned` version: RerankerState); versions
    load on the SQA_DEVICE."""

    def load(folder: Path):
        return load_reranker(folder, device=resolve_device(settings))

    return RerankerState(settings.rerankers_dir, load, poll_s=max(settings.snapshot_poll_s, 0.5), pinned=pinned)


def build_answer_service(
    settings: Settings,
    db: Database,
    encoder: TextEncoder,
    reader: Reader | ReaderState | None = None,
    *,
    reranker: str | None | object = FOLLOW_ACTIVE,
) -> AnswerService:
    """`reader`: a fixed Reader, a ReaderState, or None for the state SQA_READER names;
    `reranker`: build_retriever's."""
    if reader is None:
        reader = build_reader_state(settings, db)
    state = index_state(settings, db, encoder, lexical=settings.retriever != "dense")  # SQA_RETRIEVER
    limits = AnswerLimits(
        default_top_k=settings.top_k,
        max_top_k=settings.max_top_k,
        reader_passages=settings.reader_passages,
        max_question_chars=settings.max_question_chars,
        vote_depth=settings.reader_vote,
    )
    forms = AnswerFormsSource(db.sessions, settings.answer_forms) if settings.answer_forms != "off" else None
    retriever = build_retriever(settings, encoder, reranker=reranker)
    return AnswerService(
        encoder=encoder,
        reader=reader,
        index_state=state,
        session_factory=db.sessions,
        limits=limits,
        retriever=retriever,
        forms=forms,
        batch=settings.reader_batch,
        batch_window_s=settings.reader_batch_wait_ms / 1000,
        cache_entries=settings.answer_cache,
    )
