"""`sqa train passage-tower --until D`: distil a faster passage tower from the packaged MiniLM and
register it as an encoder version whose questions MiniLM still encodes (`models/distill.py`).

The passages are the store's own, dated before the cut (a seeded sample, each text once), read as
the index reads them (dated). The teacher's vectors are computed once by MiniLM (float) and
checkpointed block by block in the job's work folder, which is keyed by the parameters: running
the same command again resumes the encoding, then the training from its last checkpoint. The
version folder (`query/`: a copy of MiniLM, `passage/`: the student) is written whole or not at all.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select

from indexer.atomic import replace_folder
from indexer.chunking import dated_text
from models.distill import DistillConfig, distill, student_tower
from models.encoders import ENCODER_INFO, PACKAGED_MINILM, load_encoder, packaged_minilm_path
from store.tables import Passage
from workers.ingest import encode_with_checkpoints
from workers.progress import fraction_reporter

if TYPE_CHECKING:
    from workers.job_context import JobContext
    from workers.runner import JobHandle

log = logging.getLogger(__name__)

PASSAGE_TOWER_LOCK = "passage-tower-training"
HELD_OUT = 500  # passages kept out of training to measure the student's agreement with the teacher (at most)


def sample_passages(session, until: dt.date, n: int, seed: int) -> list[str]:
    """Up to `n` distinct passages published before `until`, dated as the index reads them; a
    seeded sample, in a fixed order."""
    rows = session.execute(
        select(Passage.text, Passage.published).where(Passage.published < until).order_by(Passage.id)
    ).all()
    texts = list(dict.fromkeys(dated_text(r.text, r.published) for r in rows))
    random.Random(seed).shuffle(texts)
    return texts[:n]


def version_name(until: dt.date, cfg: DistillConfig, max_passages: int) -> str:
    key = hashlib.sha256(json.dumps([asdict(cfg), max_passages], sort_keys=True).encode()).hexdigest()[:6]
    return f"distilled-L{len(cfg.layers)}-{until}-{key}"


def run_distill_job(
    ctx: JobContext, job: JobHandle, *, until: dt.date, cfg: DistillConfig, max_passages: int = 8000
) -> str:
    """Distil a passage tower on what is dated before `until`; returns the encoder version's name.
    Run it under `PASSAGE_TOWER_LOCK` (the CLI does, through the job runner)."""
    version = version_name(until, cfg, max_passages)
    dest = ctx.encoders_dir / version
    if (dest / ENCODER_INFO).exists():
        job.update(counts={"version": version, "already": True})
        return version
    work = ctx.work_dir / "passage-tower" / version
    t0 = time.perf_counter()
    with ctx.db.sessions() as session:
        texts = sample_passages(session, until, max_passages + HELD_OUT, cfg.seed)
    n_held = min(HELD_OUT, max(1, len(texts) // 10))
    held, train = texts[:n_held], texts[n_held:]
    if len(train) < cfg.batch_size:
        raise ValueError(
            f"{len(texts)} passages are dated before {until}: distilling needs at least "
            f"{cfg.batch_size + n_held} (ingest more months first)"
        )
    device = ctx.torch_device()
    teacher = load_encoder("minilm", device=device, backend="torch" if device.startswith("cuda") else "onnx")
    # what the teacher wrote, checkpointed in blocks: an interrupted job does not encode them again
    targets = encode_with_checkpoints(teacher, train + held, work / "teacher", ctx.ingest, job)
    t1 = time.perf_counter()
    student = student_tower(packaged_minilm_path(), layers=cfg.layers, device=device)
    report = fraction_reporter(job, log)
    result = distill(
        student, train, targets[: len(train)], held, targets[len(train) :], work / "run", cfg, report=report
    )
    info = {
        "version": version,
        "kind": "distilled",
        "base": PACKAGED_MINILM,
        "towers": "separate",
        "query_format": "bare",  # the query tower is the packaged MiniLM, which reads the bare question
        "trained_until": until.isoformat(),
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "config": asdict(cfg),
        "passages": {"train": len(train), "held_out": len(held)},
        "validation": {"before": result.before, "after": result.after},
        "steps": result.steps,
        "stopped": result.stopped,
        "losses": result.losses,
        "train_seconds": result.seconds,
        "teacher_seconds": round(t1 - t0, 1),
    }

    def write(tmp: Path) -> None:
        shutil.copytree(packaged_minilm_path(), tmp / "query")
        student.save(str(tmp / "passage"))
        (tmp / ENCODER_INFO).write_text(json.dumps(info, indent=2) + "\n")

    replace_folder(dest, write)
    job.update(
        counts={"version": version, "validation": info["validation"], "passages": info["passages"]},
        timings={"teacher_s": info["teacher_seconds"], "train_s": result.seconds},
    )
    shutil.rmtree(work, ignore_errors=True)
    return version


def describe(info: dict) -> str:
    """The student's agreement with MiniLM on held-out passages, before and after training."""
    v = info.get("validation", {})
    return "\n".join(
        f"  {name:8s} cosine to MiniLM: mean {f.get('cos_mean', float('nan')):.4f}, 1st percentile "
        f"{f.get('cos_p1', float('nan')):.4f} ({f.get('passages', 0)} held-out passages)"
        for name, f in (("untrained", v.get("before", {})), ("trained", v.get("after", {})))
    )
