"""Replay of the stream: ingest month by month, record the index as it stood at every quarter's end,
and evaluate every question quarter under every quarter-end state.

This gives StreamingQA's lag analysis (state quarter minus question quarter: -1Q, 0Q, +1Q, ...) for
the recent and past subsets, and Agarwal & Nenkova's grid with its deterioration and adaptation
scores. Month shards are immutable, so a quarter-end state is a manifest naming the shards that
end by that quarter: recording one costs a small file, not a re-encoding. Resumable: months
already ingested are kept, and stored results are not recomputed.

With index-only updates (one reader for every state), a state newer than the question quarter
sees exactly what the question-quarter state sees (nothing published after the question's date
reaches the reader), so +1Q equals 0Q by construction; those cells are copied, not recomputed.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from evaluation.temporal import quarter_bounds, quarter_of, quarter_range
from indexer.dates import parse_month
from indexer.manifest import Manifest, read_manifest
from serving.answering import AnswerService
from serving.index_state import LoadedSnapshot, latest_snapshot_row
from store.queries import add_snapshot
from store.tables import IndexSnapshot
from workers.config import EvalConfig, IngestConfig
from workers.evaluate import complete_run, find_or_create_run
from workers.ingest import ingest
from workers.ingest_plans import IngestParams, plans_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayPlan:
    first_month: str  # "2022-07"
    last_month: str  # "2023-06"

    @property
    def test_quarters(self) -> list[str]:
        return quarter_range(quarter_of(parse_month(self.first_month)), quarter_of(parse_month(self.last_month)))

    @property
    def state_quarters(self) -> list[str]:
        """From the quarter before the first question quarter (lag -1Q) to the last."""
        first_day, _ = quarter_bounds(self.test_quarters[0])
        return quarter_range(quarter_of(first_day - dt.timedelta(days=1)), self.test_quarters[-1])


def record_quarter_states(sf: sessionmaker[Session], index_dir, quarters: list[str]) -> dict[str, int]:
    """An IndexSnapshot of kind "quarter" per quarter: the serving manifest's shards that end by the
    quarter's last day. Reuses an identical earlier record. Returns {quarter: snapshot row id}."""
    out = {}
    with sf() as session, session.begin():
        serving = latest_snapshot_row(session)
        if serving is None:
            raise RuntimeError("nothing is indexed: the replay ingests first, so this is a bug")
        manifest = read_manifest(index_dir, serving.manifest_file, expected_sha256=serving.manifest_sha256)
        for q in quarters:
            _, end = quarter_bounds(q)
            shards = tuple(e for e in manifest.shards if e.span[1] <= end)
            if not shards:
                log.warning("no indexed passages end by %s: the %s state is empty and is skipped", end, q)
                continue
            files = sorted(e.file for e in shards)
            for row in session.scalars(
                select(IndexSnapshot).where(IndexSnapshot.kind == "quarter", IndexSnapshot.label == q)
            ):
                old = read_manifest(index_dir, row.manifest_file, expected_sha256=row.manifest_sha256)
                if sorted(e.file for e in old.shards) == files:
                    out[q] = row.id
                    break
            else:
                state = Manifest.new(encoder=manifest.encoder, dim=manifest.dim, shards=shards)
                row = add_snapshot(session, index_dir, state, kind="quarter", label=q)
                session.flush()
                out[q] = row.id
    return out


def run_replay(
    sf: sessionmaker[Session],
    service: AnswerService,
    ingest_cfg: IngestConfig,
    plan: ReplayPlan,
    cfg: EvalConfig,
    reports_dir,
    *,
    job_id: int | None = None,
    progress=None,
    bar: bool = False,
) -> int:
    """Ingest through the last month, record quarter-end states, evaluate the grid. Returns the run id."""
    encoder = service.retriever.encoder
    stream = IngestParams(through=parse_month(plan.last_month), start=parse_month(plan.first_month))
    with sf() as session:
        plans, _, _ = plans_for(session, stream, ingest_cfg, encoder)
    if plans:
        log.info("replay: ingesting %s", ", ".join(p.key for p in plans))
        ingest(sf, encoder, ingest_cfg, stream, bar=bar)
    state_rows = record_quarter_states(sf, ingest_cfg.index_dir, plan.state_quarters)
    states: dict[str, LoadedSnapshot] = {}
    with sf() as session:
        for q, row_id in state_rows.items():
            states[q] = service.index_state.open(session.get(IndexSnapshot, row_id))
    params = {
        "from": plan.first_month,
        "to": plan.last_month,
        "reader": service.reader.name,
        "encoder": encoder.name,
        "top_k": cfg.top_k,
        "reader_passages": cfg.reader_passages,
        "max_questions": cfg.max_questions,
        "seed": cfg.seed,
        "states": {q: s.snapshot_id for q, s in states.items()},
    }
    run_id = find_or_create_run(sf, "replay", params, job_id)
    return complete_run(
        sf,
        service,
        run_id,
        {t: states for t in plan.test_quarters},
        cfg,
        reports_dir,
        f"Replay {plan.first_month}..{plan.last_month}",
        progress=progress,
    )
