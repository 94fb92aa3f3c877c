"""A backfill's encoding spread over a Ray cluster (`sqa ingest --through M --executor ray`).

The local ingest (workers/ingest.py) encodes each month block by block. It saves every finished
block as a checkpoint under SQA_HOME/work/ingest-<month>-<digest>/, named by the encoder and the
exact passages, and a run that finds a block's checkpoint loads it instead of encoding it.

This executor only fills those checkpoints, for every planned month at once:
1. the driver chunks each month as the ingest does;
2. Ray encoder actors encode the missing blocks in parallel: one actor per GPU where the cluster
   has GPUs, else one per CPU;
3. the driver saves each block as it arrives.

The ordinary ingest job then runs and finds every block encoded. Its shards, checksums, manifests
and snapshots are the local path's own, since the same code writes them. A killed actor is
restarted and its block retried (`max_restarts`, `max_task_retries`). A killed driver loses
nothing already saved: the same command encodes only the blocks still missing.

Ray core actors (`ray.util.ActorPool`), not Ray Data: a block of checkpointed passages is the unit
of work and of resumption, and Ray Data would add pyarrow and pandas to the install for a map over
a list.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from models.encoders import TextEncoder
from workers.config import IngestConfig
from workers.ingest import checkpoint_blocks, checkpoint_dir, load_checkpoint, model_texts, save_checkpoint, shard_rows
from workers.ingest_plans import IngestParams, plans_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Block:
    path: Path  # its checkpoint file
    texts: list[str]


def pending_blocks(
    sf: sessionmaker[Session], encoder: TextEncoder, cfg: IngestConfig, params: IngestParams
) -> tuple[list[Block], int]:
    """The blocks of the planned months that have no valid checkpoint yet, and the passages planned."""
    with sf() as session:
        plans, _, _ = plans_for(session, params, cfg, encoder)
    pending, total = [], 0
    for plan in plans:
        _, rows = shard_rows(sf, plan)
        work = checkpoint_dir(cfg, encoder, plan, rows)
        work.mkdir(parents=True, exist_ok=True)
        for path, texts in checkpoint_blocks(model_texts(rows), work, cfg):
            total += len(texts)
            if load_checkpoint(path, len(texts), encoder.dim) is None:
                pending.append(Block(path, texts))
    return pending, total


def _actor_class():
    import ray  # noqa: PLC0415 (lazy: ray, an optional extra)

    @ray.remote(max_restarts=2, max_task_retries=2)
    class EncoderActor:
        """Holds one encoder (sent once through the object store) and encodes blocks with it."""

        def __init__(self, encoder: TextEncoder, threads: int) -> None:
            torch = sys.modules.get("torch")  # a model encoder brought torch with it; the hash fake did not
            if torch is not None:
                torch.set_num_threads(max(1, threads))
            self.encoder = encoder

        def encode(self, i: int, texts: list[str], batch_size: int) -> tuple[int, np.ndarray]:
            """Block `i`'s embeddings, with its index (results arrive in any order)."""
            return i, self.encoder.encode_passages(texts, batch_size=batch_size).astype(np.float32, copy=False)

    return EncoderActor


def fill_checkpoints(
    sf: sessionmaker[Session],
    encoder: TextEncoder,
    cfg: IngestConfig,
    params: IngestParams,
    *,
    address: str | None = None,
    actors: int = 0,
    advance: Callable[[int], None] | None = None,
) -> dict:
    """Encode every missing block of the planned months on Ray and save it as the ingest's checkpoint.

    Args:
        address: a Ray cluster ("ray://host:10001", "auto"); None starts a local one (or uses the
            one this process already joined).
        actors: encoder actors (0: one per GPU of the cluster, else one per CPU).
        advance: called with the passages of each block as it is saved (progress).
    Returns:
        {"passages": planned, "encoded": encoded now, "blocks": encoded blocks, "actors": n}.
    """
    import ray  # noqa: PLC0415 (lazy: ray, an optional extra)
    from ray.util import ActorPool  # noqa: PLC0415 (lazy: ray, an optional extra)

    pending, total = pending_blocks(sf, encoder, cfg, params)
    if not pending:
        return {"passages": total, "encoded": 0, "blocks": 0, "actors": 0}
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    resources = ray.cluster_resources()
    gpus, cpus = int(resources.get("GPU", 0)), max(1, int(resources.get("CPU", 1)))
    n = max(1, min(actors or gpus or cpus, len(pending)))
    options = {"num_gpus": 1} if gpus and not actors else {"num_cpus": 1}
    shared = ray.put(encoder)
    actor_cls = _actor_class()
    pool = ActorPool([actor_cls.options(**options).remote(shared, 1) for _ in range(n)])
    log.info("encoding %d blocks (%d passages) on %d Ray actor(s)", len(pending), sum(len(b.texts) for b in pending), n)
    encoded = 0
    results = pool.map_unordered(
        lambda actor, i: actor.encode.remote(i, pending[i].texts, cfg.batch_size), range(len(pending))
    )
    for i, arr in results:
        block = pending[i]
        if arr.shape != (len(block.texts), encoder.dim):
            raise RuntimeError(
                f"an actor returned {arr.shape} for {len(block.texts)} passages of {block.path.parent.name}"
            )
        save_checkpoint(block.path, arr)
        encoded += len(block.texts)
        if advance is not None:
            advance(len(block.texts))
    return {"passages": total, "encoded": encoded, "blocks": len(pending), "actors": n}
