"""What a job is handed: the database, the job runner, the directories and configs, and factories
for the heavy things (loaded only by the jobs that need them).

The entry points (the HTTP app, the CLI, the scheduler) build one from the settings through
`app.bootstrap.build_context`; nothing under workers/ reads the settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from store.engine import Database
from workers.config import AutoTrainConfig, DriftConfig, EvalConfig, IngestConfig, TransportConfig
from workers.runner import JobRunner

if TYPE_CHECKING:  # types only: a context never loads a model by being built
    from models.encoders import TextEncoder
    from models.readers import Reader
    from serving.answering import AnswerService
    from serving.index_state import IndexState
    from serving.retrieval import Retriever


@dataclass(frozen=True)
class JobContext:
    """Frozen: a job reads it and never changes it. Field names follow the SQA_* settings."""

    db: Database
    runner: JobRunner
    home: Path
    index_dir: Path
    work_dir: Path
    models_dir: Path
    encoders_dir: Path
    rerankers_dir: Path
    reports_dir: Path
    device: str  # SQA_DEVICE: auto | cpu | cuda | cuda:N (`torch_device` resolves auto)
    reader: str  # SQA_READER ("auto": the active version serves)
    retriever: str  # SQA_RETRIEVER with its fusion, e.g. "hybrid-weighted-0.5": the first stage (cache keys)
    # The served retriever's key now: `retriever`, then the re-ranker version serving at the time of
    # the call (read live: a job that activates a re-ranker changes what it retrieves afterwards).
    served_retriever: Callable[[], str]
    news_source: str
    finetune_policy: str
    drift_measure: str
    drift_drop_threshold: float
    ingest: IngestConfig
    evaluation: EvalConfig
    transport: TransportConfig
    drift: DriftConfig
    auto_train: AutoTrainConfig
    # The encoder the serving index was built with (SQA_ENCODER), loaded on first call.
    load_encoder: Callable[[], TextEncoder]
    # The served pipeline (SQA_RETRIEVER; SQA_READER, or the reader given), on a fresh index state.
    load_answer_service: Callable[..., AnswerService]
    # An index state over `encoder` (lexical: with the BM25 files).
    open_index_state: Callable[[TextEncoder, bool], IndexState]
    # The served retriever (SQA_RETRIEVER, fusion, recency prior) over an encoder: what training data
    # retrieve with, so that a reader learns from the passages it will be given.
    # `rerank=False`: the first stage alone (what a re-ranker is trained on).
    make_retriever: Callable[..., Retriever]
    # A reader version's folder loaded as a Reader (the serving settings: device, passages).
    load_reader_folder: Callable[[Path], Reader]
    # SQA_TRAIN_PRECISION: the number format Gemma readers train in ("auto", "float32", "bfloat16").
    train_precision: str
    # Writes what a saved version folder is served from where serving reads it in another runtime
    # (llama.cpp's GGUF file) and returns it; None where the folder serves as it is.
    export_reader_folder: Callable[[Path], Path | None] = lambda folder: None

    def torch_device(self) -> str:
        """The device a job's model goes to: SQA_DEVICE, with "auto" the GPU when torch sees one."""
        if self.device != "auto":
            return self.device
        import torch  # noqa: PLC0415 (lazy: torch)

        return "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def sessions(self):
        return self.db.sessions

    def eval_config(self, max_questions: int | None = None) -> EvalConfig:
        """The evaluation settings, with another number of questions per quarter when given."""
        if max_questions is None:
            return self.evaluation
        return dataclasses.replace(self.evaluation, max_questions=max_questions)
