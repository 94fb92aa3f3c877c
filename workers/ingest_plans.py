"""What an ingest builds, decided before any work: its parameters (`IngestParams`, parsed once at
the edge), the shards it plans (`ShardPlan`: a month, or a history backfill before one) and the
snapshot manifest a new shard is added to. The job that builds them is workers/ingest.py's.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from indexer.dates import EPOCH, month_end, month_key, month_start, next_month, parse_month
from indexer.index_errors import IndexIntegrityError
from indexer.manifest import Manifest, read_manifest
from indexer.shards import is_live_key, live_key_parts
from models.encoders import TextEncoder
from serving.errors import InvalidInputError, NoArticlesError
from serving.index_state import latest_snapshot_row
from store.queries import article_months, earliest_question_day
from store.tables import Article
from workers.config import IngestConfig


@dataclass(frozen=True)
class ShardPlan:
    key: str  # "2023-04" or "history-2023-01" (everything published before January 2023)
    first: dt.date  # inclusive
    last: dt.date  # inclusive

    @classmethod
    def month(cls, month: str) -> ShardPlan:
        first = parse_month(month)
        return cls(month_key(first), first, month_end(first))

    @classmethod
    def history(cls, before_month: str) -> ShardPlan:
        start = parse_month(before_month)
        return cls(f"history-{month_key(start)}", EPOCH, start - dt.timedelta(days=1))

    @classmethod
    def from_key(cls, key: str) -> ShardPlan:
        return cls.history(key.removeprefix("history-")) if key.startswith("history-") else cls.month(key)


@dataclass(frozen=True)
class IngestParams:
    """What an ingest does, parsed once at the edge (CLI, API, scheduler): exactly one of a month, a
    `through` month (with an optional first month `start`), a history backfill before a month, or a
    rebuild of every shard. Months are the first day of the month."""

    month: dt.date | None = None
    through: dt.date | None = None
    start: dt.date | None = None
    history_before: dt.date | None = None
    rebuild: bool = False

    def __post_init__(self) -> None:
        given = sum(x is not None for x in (self.month, self.through, self.history_before)) + int(self.rebuild)
        if given == 0:
            raise InvalidInputError("an ingest needs a month, a through month, history_before or rebuild")
        if given > 1:
            raise InvalidInputError("an ingest takes only one of a month, a through month, history_before or rebuild")
        if self.start is not None and self.through is None:
            raise InvalidInputError("a first month (--from) goes with a through month (--through)")
        for day in (self.month, self.through, self.start, self.history_before):
            if day is not None and day.day != 1:
                raise InvalidInputError(f"{day} is not the first day of a month")

    @classmethod
    def parse(cls, params: dict) -> IngestParams:
        """{"month": "2023-06"} | {"through": "2023-06", "from": "2023-01"} | {"history_before": ...}
        | {"rebuild": true} (the job row's form) -> IngestParams; InvalidDateError names a bad month."""

        def month(key: str) -> dt.date | None:
            return parse_month(params[key]) if params.get(key) else None

        return cls(
            month=month("month"),
            through=month("through"),
            start=month("from"),
            history_before=month("history_before"),
            rebuild=bool(params.get("rebuild")),
        )

    def to_json(self) -> dict:
        """The job row's params."""
        if self.month is not None:
            return {"month": month_key(self.month)}
        if self.history_before is not None:
            return {"history_before": month_key(self.history_before)}
        if self.rebuild:
            return {"rebuild": True}
        return {"through": month_key(self.through), **({"from": month_key(self.start)} if self.start else {})}


# ---- the base snapshot and the plans ---------------------------------------------------------------


def base_manifest(session: Session, index_dir: Path, encoder: TextEncoder, *, fresh: bool = False) -> Manifest:
    """The manifest a new shard is added to: the newest snapshot's, or an empty one."""
    row = None if fresh else latest_snapshot_row(session)
    if row is None:
        return Manifest.new(encoder=encoder.name, dim=encoder.dim)
    manifest = read_manifest(index_dir, row.manifest_file, expected_sha256=row.manifest_sha256)
    if manifest.encoder != encoder.name or manifest.dim != encoder.dim:
        raise IndexIntegrityError(
            f"the index was built with encoder {manifest.encoder} ({manifest.dim} dims) but the configured "
            f"encoder is {encoder.name} ({encoder.dim} dims); re-encode it with `sqa index rebuild`"
        )
    return manifest


def rebuild_plans(keys: list[str]) -> list[ShardPlan]:
    """The plans that rebuild a snapshot's shards: its month and history shards, plus the month of each
    live piece that no other plan covers (a rebuild folds the pieces into month shards)."""
    plans = [ShardPlan.from_key(k) for k in keys if not is_live_key(k)]
    for month in sorted({live_key_parts(k)[0] for k in keys if is_live_key(k)}):
        plan = ShardPlan.month(month)
        if not any(p.first <= plan.first and plan.last <= p.last for p in plans):
            plans.append(plan)
    return sorted(plans, key=lambda p: p.first)


def overlapping_keys(manifest: Manifest, plan: ShardPlan) -> list[str]:
    """Keys of shards whose days overlap the plan's (besides the plan's own key)."""
    return [
        e.key for e in manifest.shards if e.key != plan.key and not (e.span[1] < plan.first or e.span[0] > plan.last)
    ]


def check_month_request(session: Session, index_dir: Path, encoder: TextEncoder, month: str) -> ShardPlan:
    """Validate `ingest --month` before any work: the month parses, has articles, fits the index."""
    plan = ShardPlan.month(month)
    n = session.scalar(select(Article.id).where(Article.published.between(plan.first, plan.last)).limit(1))
    if n is None:
        raise NoArticlesError(f"no articles published in {plan.key}: import them first (`sqa import ...`)")
    clash = [k for k in overlapping_keys(base_manifest(session, index_dir, encoder), plan) if not is_live_key(k)]
    if clash:
        raise InvalidInputError(
            f"month {plan.key} lies inside shard(s) {', '.join(clash)}; rebuild that backfill with "
            f"`sqa ingest --history-before YYYY-MM` instead"
        )
    return plan


def plan_through(
    session: Session, manifest: Manifest, through: str, start: str | None = None
) -> tuple[list[ShardPlan], list[str]]:
    """Every month up to `through` not yet indexed, in order, plus a history backfill of
    everything before the first month when the index is empty. Returns (plans, empty months)."""
    last = parse_month(through)
    months = article_months(session)
    settled = [e for e in manifest.shards if not is_live_key(e.key)]  # live pieces are compacted, not skipped
    if start is not None:
        first = parse_month(start)
    elif settled:  # from the first month the index covers: a month skipped (or ingested out of order) is filled in
        first = min(next_month(e.span[1]) if e.key.startswith("history-") else e.span[0] for e in settled)
    else:
        q = earliest_question_day(session)
        first = month_start(q) if q else (parse_month(min(months)) if months else last)
    plans: list[ShardPlan] = []
    if not settled and any(k < month_key(first) for k in months):
        plans.append(ShardPlan.history(month_key(first)))
    empty = []
    newest = max((e.span[1] for e in settled), default=dt.date.min)
    m = first
    while m <= last:
        key = month_key(m)
        if manifest.shard(key) is None:
            if months.get(key):
                plans.append(ShardPlan.month(key))
            elif m > newest:  # an empty month is reported once, when the index first reaches it
                empty.append(key)
        m = next_month(m)
    return plans, empty


def plans_for(
    session: Session, params: IngestParams, cfg: IngestConfig, encoder: TextEncoder
) -> tuple[list[ShardPlan], list[str], bool]:
    """(plans, empty months, fresh) for what the ingest was asked to do."""
    if params.month is not None:
        return [check_month_request(session, cfg.index_dir, encoder, month_key(params.month))], [], False
    if params.history_before is not None:
        return [ShardPlan.history(month_key(params.history_before))], [], False
    if params.rebuild:
        row = latest_snapshot_row(session)
        keys = list(row.shard_keys) if row else []
        if not keys:
            raise InvalidInputError("nothing to rebuild: no index snapshot exists yet")
        return rebuild_plans(keys), [], True
    manifest = base_manifest(session, cfg.index_dir, encoder)
    plans, empty = plan_through(
        session, manifest, month_key(params.through), month_key(params.start) if params.start else None
    )
    return plans, empty, False
