"""Train a cross-encoder re-ranker version from exported candidates, on any machine: a GPU box needs
neither the store, the index nor the service's dependencies, only torch, transformers and the MiniLM
weights (the packaged all-MiniLM-L6-v2, or a copy named with `--base`).

    here:       sqa train reranker --until 2023-04-01 --export reranker-data --self-articles 4000
    elsewhere:  python -m models.train_exported_reranker reranker-data --out reranker-version --device cuda
    here:       sqa rerankers import reranker-version --activate

The export (workers/train_reranker.py `run_export_reranker_job`) holds the first stage's candidates
for the dated questions `sqa train reranker` would learn from and validate on: `passages.jsonl.xz`
(each candidate's text once, as the cross-encoder reads it), `train.jsonl.xz` and `val.jsonl.xz`
(one question a line: its text, date, and candidates as passage numbers with the answer flag, age
and first-stage score) and `reranker-job.json` (the cut, the held-back month, the counts). This module
trains as the job does (listwise, models/reranker.py), validates after each epoch on the held-back
month and keeps the best epoch, fits the first-stage and recency weights on the same month, and
writes a version folder that `sqa rerankers import` checks and registers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import lzma
import random
import secrets
import shutil
import sys
import time
from pathlib import Path

from models.encoders import packaged_minilm_path
from models.reranker import (
    FIRST_STAGE_GRID,
    RECENCY_GRID,
    CrossEncoderReranker,
    RerankerConfig,
    beats,
    fit_weights,
    groups_of,
    prior_alone,
    ranking_figures,
    worth_serving,
)

EXPORT_FILE = "reranker-job.json"
PASSAGES, TRAIN, VAL = "passages.jsonl.xz", "train.jsonl.xz", "val.jsonl.xz"
log = logging.getLogger(__name__)


def _write_lines(path: Path, rows) -> None:
    with lzma.open(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _read_lines(path: Path) -> list:
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_export(dest: Path, items: dict, info: dict, *, max_positives: int, negatives: int, seed: int = 0) -> dict:
    """Write `items` ({"train", "val": [{query, asked, source, cands: [{input, hit, age, score}]}]}) to
    `dest` as an export: the job file goes last (without it the folder is no export). A training
    question keeps its first `max_positives` candidates with the answer and `negatives` without, sampled
    with `seed` (it teaches nothing without both); a held-back one keeps all. Returns the job file's content."""
    rng = random.Random(seed)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / EXPORT_FILE).unlink(missing_ok=True)
    texts: dict[str, int] = {}

    def ref(c: dict) -> dict:
        return {
            "p": texts.setdefault(c["input"], len(texts)),
            "hit": bool(c["hit"]),
            "age": c["age"],
            "score": c.get("score", 0.0),
        }

    def kept(item: dict, train: bool) -> dict | None:
        cands = item["cands"]
        if train:
            pos = [c for c in cands if c["hit"]][:max_positives]
            neg = [c for c in cands if not c["hit"]]
            if not pos or not neg:
                return None
            cands = pos + rng.sample(neg, min(negatives, len(neg)))
        return {
            "query": item["query"],
            "asked": item["asked"],
            "source": item.get("source", "gold"),
            "cands": [ref(c) for c in cands],
        }

    train = [r for r in (kept(i, True) for i in items["train"]) if r is not None]
    val = [kept(i, False) for i in items["val"]]
    _write_lines(dest / TRAIN, train)
    _write_lines(dest / VAL, val)
    _write_lines(dest / PASSAGES, list(texts))
    info = {**info, "train_questions": len(train), "val_questions": len(val), "passages": len(texts)}
    tmp = dest / (EXPORT_FILE + ".tmp")
    tmp.write_text(json.dumps(info, indent=1, default=str))
    tmp.replace(dest / EXPORT_FILE)
    return info


def read_export(folder: Path) -> tuple[dict, list[dict], list[dict]]:
    """(job file, train items, held-back items), each candidate's text back under "input";
    ValueError when `folder` is not a re-ranker export."""
    missing = [name for name in (EXPORT_FILE, PASSAGES, TRAIN, VAL) if not (folder / name).exists()]
    if missing:
        raise ValueError(
            f"{folder} is not an exported re-ranker training set ({', '.join(missing)} missing): make "
            "one with `sqa train reranker --until YYYY-MM-DD --export DIR`"
        )
    job = json.loads((folder / EXPORT_FILE).read_text())
    texts = _read_lines(folder / PASSAGES)

    def items(name: str) -> list[dict]:
        rows = _read_lines(folder / name)
        for row in rows:
            row["cands"] = [{**c, "input": texts[c["p"]]} for c in row["cands"]]
        return rows

    return job, items(TRAIN), items(VAL)


def train_exported(
    folder: Path,
    out: Path,
    *,
    device: str = "cpu",
    epochs: int = 3,
    lr: float = 3e-5,
    groups_per_step: int = 32,
    negatives: int = 15,
    max_positives: int = 2,
    warmup_ratio: float = 0.05,
    precision: str = "auto",
    max_minutes: float = 0.0,
    base: Path | None = None,
    half: bool = False,
    seed: int = 0,
    source: str = "all",
) -> dict:
    """Train, validate each epoch (the best kept), fit the weights, write the version folder `out`.
    Returns its info (reranker.json)."""
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty: name a new folder")
    job, train, val = read_export(folder)
    if source != "all":  # "gold" or "self": the questions of one kind only
        train = [i for i in train if i.get("source") == source]
    if not val:
        raise ValueError(f"{folder}: no held-back questions to validate on")
    groups = groups_of(train, max_positives=max_positives, negatives=negatives, seed=seed)
    if not groups:
        raise ValueError(f"{folder}: no training groups (no question has a candidate with its answer and one without)")
    if precision == "auto":
        precision = "bfloat16" if device.startswith("cuda") else "float32"
    cfg = RerankerConfig(
        lr=lr,
        epochs=epochs,
        groups_per_step=groups_per_step,
        negatives=negatives,
        max_minutes=max_minutes,
        seed=seed,
        warmup_ratio=warmup_ratio,
        precision=precision,
    )
    if base is None:
        base = packaged_minilm_path()
    t_load = time.perf_counter()
    model = CrossEncoderReranker._load(Path(base), cfg, device=device, name="minilm-cross")
    t0 = time.perf_counter()

    def scores() -> list[list[float]]:
        return [list(map(float, model.scores(i["query"], [c["input"] for c in i["cands"]]))) for i in val]

    by_epoch: list[list[list[float]]] = []  # each validation's scores: the best epoch's are reused below

    def validate() -> dict:
        by_epoch.append(scores())
        figures = ranking_figures(val, by_epoch[-1])
        log.info("validation %s", figures)
        return figures

    log.info(
        "%d groups from %d training questions, %d held-back questions; %s on %s",
        len(groups),
        len(train),
        len(val),
        precision,
        device,
    )
    result = model.train_groups(
        groups, validate=validate, better=beats, progress=lambda f, msg: log.info("%3.0f%% %s", 100 * f, msg)
    )
    t1 = time.perf_counter()
    best = result["best_epoch"]
    val_scores = by_epoch[best - 1] if best else scores()
    grid = [(w, f) for w in RECENCY_GRID for f in FIRST_STAGE_GRID]
    weight, first_weight, by_weight = fit_weights(val, val_scores, grid)
    first_stage = ranking_figures(val, None)
    until = job.get("trained_until", "unknown")
    version = f"reranker-{until}-{secrets.token_hex(3)}"
    info = {
        "version": version,
        "kind": "cross-encoder",
        "base": "all-MiniLM-L6-v2",
        "trained_until": until,
        "held_back": job.get("held_back"),
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "recency_weight": weight,
        "first_stage_weight": first_weight,
        "validation": by_weight[(weight, first_weight)],
        "first_stage": first_stage,
        "model_alone": by_weight[(0.0, 0.0)],
        "data": {**job.get("data", {}), "source": source, "questions": len(train), "groups": len(groups)},
        "depth": job.get("depth"),
        "train": result,
        "trained_elsewhere": {"device": device, "precision": precision},
        "seconds": {"load": round(t0 - t_load, 1), "train_and_validate": round(t1 - t0, 1)},
    }
    info["prior_alone"] = prior_alone(val, weight, first_weight)
    info["worth_serving"] = worth_serving(info["validation"], first_stage, info["prior_alone"])
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if half:
        model.model.half()
    model.save(tmp, info)
    if out.exists():
        out.rmdir()  # empty (checked above)
    tmp.rename(out)
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m models.train_exported_reranker",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("export", type=Path, help="a folder written by `sqa train reranker --export`")
    ap.add_argument("--out", type=Path, required=True, help="the version folder to write (new or empty)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--groups-per-step", type=int, default=32, help="groups (1 positive + negatives) a step")
    ap.add_argument("--negatives", type=int, default=15, help="negatives a group (at most the export's)")
    ap.add_argument("--max-positives", type=int, default=2, help="groups a question")
    ap.add_argument(
        "--warmup-ratio", type=float, default=0.05, help="share of the steps the learning rate warms up over"
    )
    ap.add_argument(
        "--precision",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="auto: bfloat16 autocast on a GPU, float32 on a CPU",
    )
    ap.add_argument("--max-minutes", type=float, default=0.0, help="a wall-clock budget for training (0: none)")
    ap.add_argument("--base", type=Path, default=None, help="MiniLM weights (default: the packaged all-MiniLM-L6-v2)")
    ap.add_argument("--half", action="store_true", help="save float16 weights (half the size; loaded as float32)")
    ap.add_argument(
        "--source",
        choices=("all", "gold", "self"),
        default="all",
        help="train on the gold questions, the self-labeled ones, or both",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    for name, value, low in (
        ("--epochs", args.epochs, 1),
        ("--groups-per-step", args.groups_per_step, 1),
        ("--negatives", args.negatives, 1),
        ("--max-positives", args.max_positives, 1),
    ):
        if value < low:
            ap.error(f"{name} must be >= {low} (got {value})")
    if args.lr <= 0 or not 0 <= args.warmup_ratio < 1 or args.max_minutes < 0:
        ap.error("--lr must be > 0, --warmup-ratio in [0, 1) and --max-minutes >= 0")
    try:
        info = train_exported(
            args.export,
            args.out,
            device=args.device,
            epochs=args.epochs,
            lr=args.lr,
            groups_per_step=args.groups_per_step,
            negatives=args.negatives,
            max_positives=args.max_positives,
            warmup_ratio=args.warmup_ratio,
            precision=args.precision,
            max_minutes=args.max_minutes,
            base=args.base,
            half=args.half,
            seed=args.seed,
            source=args.source,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    v, f = info["validation"], info["first_stage"]
    print(
        f"wrote {args.out} ({info['version']}): held-back {info['held_back']} recall@1/5/10 "
        f"{v['recall@1']}/{v['recall@5']}/{v['recall@10']} MRR {v['mrr']} against the first stage's "
        f"{f['recall@1']}/{f['recall@5']}/{f['recall@10']} MRR {f['mrr']} (its weights without the model: recall@5 "
        f"{info['prior_alone']['recall@5']}); best epoch {info['train']['best_epoch']}; "
        + (
            "worth serving"
            if info["worth_serving"]
            else "not worth serving (it must beat both the first stage and its own weights without the model)"
        )
        + f"; `sqa rerankers import {args.out}` registers it"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
