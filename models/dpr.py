"""DPR fine-tuning of the packaged MiniLM: in-batch negatives plus one BM25 hard negative a question.

The towers are sentence-transformers models (tokenizer, transformer, mean pooling) so a trained
version loads like any other (`models.encoders.DualEncoder`). `shared` trains one tower for
questions and passages; `separate` starts both from the same checkpoint and lets them drift apart.
The loss is DPR's (Karpukhin et al.): for a batch of B questions, the passages are the B
positives followed by the hard negatives, the score is scale x cosine, and each question's target
is its own positive; a column that holds the same passage as a question's positive is masked for
that question (two questions of a batch can share their passage).

I write the loop rather than use `SentenceTransformerTrainer`: it needs `datasets`, routes two
towers through a Router module the encoders would then have to carry, and its checkpoints do not
stop on a wall-clock budget. The loop checkpoints every `checkpoint_every` steps and resumes from
there, validates each epoch, and keeps the best.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from models.encoders import ENCODER_INFO, TOWERS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pair:
    """A training question (dated, as the service encodes it), its positive passage and a hard negative."""

    query: str
    positive: str
    negative: str | None = None
    source: str = "gold"  # gold | self

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DprConfig:
    towers: str = "shared"  # shared | separate
    batch_size: int = 16  # a CPU-sized default: a step of 16 questions and 32 passages takes 3-8 s on 2 cores
    lr: float = 2e-5
    epochs: int = 1
    warmup: float = 0.1  # share of the steps with a linear warm-up
    max_query_len: int = 64
    max_passage_len: int = 160  # passages average ~150 word pieces (180 words at most)
    scale: float = 20.0  # cosine x scale are the logits
    hard_negatives: bool = True
    max_minutes: float = 0.0  # 0: no budget; else stop (keeping the best) when it is spent
    checkpoint_every: int = 20  # steps
    seed: int = 0

    def __post_init__(self):
        if self.towers not in TOWERS:
            raise ValueError(f"towers {self.towers!r} must be one of {TOWERS}")
        if self.batch_size < 2:
            raise ValueError("batch_size must be at least 2 (in-batch negatives)")


@dataclass
class DprResult:
    best: dict = field(default_factory=dict)  # validation figures of the kept model
    history: list = field(default_factory=list)
    steps: int = 0
    stopped: str = "epochs"
    seconds: float = 0.0


class BiEncoder:
    """The towers being trained; `encode_*` give numpy arrays for validation."""

    def __init__(self, base: Path | str, cfg: DprConfig, device: str = "cpu") -> None:
        from sentence_transformers import SentenceTransformer  # noqa: PLC0415 (lazy: sentence_transformers)

        self.cfg, self.device = cfg, device
        self.query = SentenceTransformer(str(base), device=device, local_files_only=True)
        self.passage = (
            self.query
            if cfg.towers == "shared"
            else SentenceTransformer(str(base), device=device, local_files_only=True)
        )

    @property
    def modules(self):
        return [self.query] if self.passage is self.query else [self.query, self.passage]

    def parameters(self):
        return [p for m in self.modules for p in m.parameters()]

    def _embed(self, model, texts: Sequence[str], max_len: int):
        import torch.nn.functional as F  # noqa: PLC0415 (lazy: torch)

        model.max_seq_length = max_len
        prepare = getattr(model, "preprocess", None) or model.tokenize  # sentence-transformers >= 6 / older
        features = {k: v.to(self.device) if hasattr(v, "to") else v for k, v in prepare(list(texts)).items()}
        return F.normalize(model(features)["sentence_embedding"], dim=-1)  # (n, dim)

    def loss(self, batch: Sequence[Pair]):
        import torch  # noqa: PLC0415 (lazy: torch)
        import torch.nn.functional as F  # noqa: PLC0415 (lazy: torch)

        cfg = self.cfg
        texts = [p.positive for p in batch]
        if cfg.hard_negatives:
            texts += [p.negative for p in batch if p.negative]
        q = self._embed(self.query, [p.query for p in batch], cfg.max_query_len)  # (B, dim)
        d = self._embed(self.passage, texts, cfg.max_passage_len)  # (B + negatives, dim)
        logits = cfg.scale * q @ d.T  # (B, B + negatives)
        same = torch.tensor(
            [[t == p.positive and j != i for j, t in enumerate(texts)] for i, p in enumerate(batch)],
            device=logits.device,
        )
        logits = logits.masked_fill(same, float("-inf"))
        return F.cross_entropy(logits, torch.arange(len(batch), device=logits.device))

    def encode_queries(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        return self._encode(self.query, texts, self.cfg.max_query_len, batch_size)

    def encode_passages(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        return self._encode(self.passage, texts, self.cfg.max_passage_len, batch_size)

    def _encode(self, model, texts, max_len, batch_size) -> np.ndarray:
        model.max_seq_length = max_len
        return np.asarray(
            model.encode(
                list(texts),
                batch_size=batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            ),
            dtype=np.float32,
        )

    def train(self, flag: bool) -> None:
        for m in self.modules:
            m.train(flag)

    def save(self, dest: Path, info: dict) -> None:
        """Write a version folder `DualEncoder` loads: the tower(s) and encoder.json."""
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        if self.cfg.towers == "shared":  # one tower reads questions and passages: the passage length
            self.query.max_seq_length = self.cfg.max_passage_len
            self.query.save(str(tmp / "shared"))
        else:
            self.query.max_seq_length = self.cfg.max_query_len
            self.query.save(str(tmp / "query"))
            self.passage.max_seq_length = self.cfg.max_passage_len
            self.passage.save(str(tmp / "passage"))
        (tmp / ENCODER_INFO).write_text(
            json.dumps({**info, "towers": self.cfg.towers, "config": asdict(self.cfg)}, indent=2, default=str) + "\n"
        )
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)

    def state(self) -> dict:
        return {f"tower{i}": m.state_dict() for i, m in enumerate(self.modules)}

    def load_state(self, state: dict) -> None:
        for i, m in enumerate(self.modules):
            m.load_state_dict(state[f"tower{i}"])


def _batches(pairs: Sequence[Pair], size: int, seed: int) -> list[list[Pair]]:
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    return [
        [pairs[i] for i in order[s : s + size]] for s in range(0, len(order) - 1, size) if len(order[s : s + size]) >= 2
    ]


def train_biencoder(
    model: BiEncoder,
    pairs: Sequence[Pair],
    work: Path,
    validate: Callable[[BiEncoder], dict],
    *,
    metric: str,
    report: Callable[[float, str], None] = lambda f, m: None,
) -> DprResult:
    """Train `model` on `pairs`; validate before and after each epoch (`validate(model)` returns
    figures, `metric` is the one to maximise); the best state ends in `work/best.pt`. Resumes from
    `work/ckpt.pt` when it exists."""
    import torch  # noqa: PLC0415 (lazy: torch)

    cfg = model.cfg
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    per_epoch = len(_batches(pairs, cfg.batch_size, cfg.seed))
    total = max(1, per_epoch * cfg.epochs)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    warm = max(1, int(cfg.warmup * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, max(0.0, (total - s) / max(1, total - warm)))
    )
    result, step = DprResult(), 0
    ckpt, best_path = work / "ckpt.pt", work / "best.pt"
    if ckpt.exists():
        saved = torch.load(ckpt, map_location=model.device, weights_only=True)
        model.load_state(saved["model"])
        opt.load_state_dict(saved["opt"])
        sched.load_state_dict(saved["sched"])
        step = int(saved["step"])
        result.history, result.best = json.loads(saved["history"]), json.loads(saved["best"])
        log.info("resuming DPR training at step %d of %d", step, total)
    else:
        model.train(False)
        figures = validate(model)
        result.history.append({"step": 0, "epoch": 0, **figures})
        result.best = {"step": 0, **figures}
        torch.save(model.state(), best_path)
        report(0.0, f"before training: {figures}")

    def save_ckpt() -> None:
        tmp = ckpt.with_suffix(".tmp")
        torch.save(
            {
                "model": model.state(),
                "opt": opt.state_dict(),
                "sched": sched.state_dict(),
                "step": step,
                "history": json.dumps(result.history),
                "best": json.dumps(result.best),
            },
            tmp,
        )
        tmp.replace(ckpt)

    t0, losses = time.monotonic(), []
    while step < total:
        epoch, offset = divmod(step, per_epoch)
        batches = _batches(pairs, cfg.batch_size, cfg.seed + epoch)
        model.train(True)
        for batch in batches[offset:]:
            loss = model.loss(batch)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            losses.append(float(loss.detach()))
            if step % 10 == 0:
                report(step / total, f"step {step}/{total} loss {np.mean(losses[-10:]):.3f}")
            if step % cfg.checkpoint_every == 0:
                save_ckpt()
            if cfg.max_minutes and time.monotonic() - t0 > cfg.max_minutes * 60:
                result.stopped = "budget"
                break
        model.train(False)
        figures = validate(model)
        result.history.append(
            {
                "step": step,
                "epoch": round(step / per_epoch, 2),
                "loss": round(float(np.mean(losses[-per_epoch:])) if losses else math.nan, 4),
                **figures,
            }
        )
        report(step / total, f"step {step}: {figures}")
        if figures[metric] > result.best.get(metric, -1.0):
            result.best = {"step": step, **figures}
            torch.save(model.state(), best_path)
        save_ckpt()
        if result.stopped == "budget":
            break
    result.steps, result.seconds = step, round(time.monotonic() - t0, 1)
    model.load_state(torch.load(best_path, map_location=model.device, weights_only=True))
    return result
