"""A smaller passage tower distilled from the packaged MiniLM, for faster ingest on a CPU.

The student is MiniLM-L6 with only some of its six transformer layers kept (by default the first
and the last), trained to write the vector MiniLM writes for the same passage (loss: 1 - cosine to
the teacher's L2-normalised vector). Questions are still encoded by MiniLM itself, so the student
only has to agree with the teacher on passages: a query's score against a passage changes by at
most the distance between the two passage vectors. Encoding cost is linear in the layers kept: two
layers of six encoded 3.03x the passages a second on 2 AVX2 cores, with the same dense recall on
2023-01..03 (`bench/bench_distilled.py`, docs/experiments/2026-12-07-distilled-passage-tower.md).

Training runs on passages and their teacher vectors only (no questions, no labels), checkpoints
every `checkpoint_every` steps and resumes from the last checkpoint; `validate` reports the mean
and the 1st percentile of the cosine between student and teacher on held-out passages.

Example:
    >>> student = student_tower(packaged_minilm_path(), layers=(0, 5))
    >>> result = distill(student, texts, teacher_vectors, held_out, held_vectors, Path("run"), DistillConfig())
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

TEACHER_LAYERS = 6  # all-MiniLM-L6-v2


@dataclass(frozen=True)
class DistillConfig:
    layers: tuple[int, ...] = (0, 5)  # teacher layers the student keeps, in order
    batch_size: int = 32
    lr: float = 5e-4  # 1e-4 reached cosine 0.83 in one epoch where 5e-4 reached 0.87 (two layers)
    epochs: int = 1
    warmup_steps: int = 50
    max_passage_len: int = 256  # the teacher's own limit: the student reads what it reads
    max_minutes: float = 0.0  # 0: no budget; else stop (keeping the state reached) when it is spent
    checkpoint_every: int = 50  # steps
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.layers or len(set(self.layers)) != len(self.layers):
            raise ValueError(f"layers {self.layers!r}: name at least one teacher layer, each once")
        if any(not 0 <= i < TEACHER_LAYERS for i in self.layers) or list(self.layers) != sorted(self.layers):
            raise ValueError(f"layers {self.layers!r} must be increasing numbers in 0..{TEACHER_LAYERS - 1}")
        if self.batch_size < 1 or self.epochs < 1 or self.lr <= 0:
            raise ValueError("batch_size and epochs must be at least 1 and lr above 0")


@dataclass
class DistillResult:
    steps: int = 0
    seconds: float = 0.0
    stopped: str = ""  # "" (every epoch ran) | "budget"
    before: dict = field(default_factory=dict)  # held-out figures of the student as first made
    after: dict = field(default_factory=dict)  # ... and as trained
    losses: list = field(default_factory=list)  # mean loss between reports (every 1-50 steps)


def parse_layers(text: str) -> tuple[int, ...]:
    """ "0,5" -> (0, 5); ValueError saying what is wrong otherwise."""
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"layers {text!r}: comma-separated layer numbers, e.g. 0,5") from None
    DistillConfig(layers=layers)  # checks the numbers
    return layers


def epoch_batches(texts: Sequence[str], batch_size: int, seed: int) -> list[np.ndarray]:
    """One epoch's batches of indices into `texts`: shuffled, then sorted by length within runs of
    50 batches so that a batch pads to similar lengths (about 1.4x fewer padded tokens than random
    batches of news passages), the batches in a seeded random order."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(texts))
    run = 50 * batch_size
    for s in range(0, len(order), run):
        part = order[s : s + run]
        order[s : s + run] = part[np.argsort([len(texts[i]) for i in part], kind="stable")]
    batches = [order[s : s + batch_size] for s in range(0, len(order), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def student_tower(teacher_folder: Path | str, *, layers: Sequence[int], device: str = "cpu"):
    """A sentence-transformers model: the teacher folder's model with only `layers` kept."""
    import torch  # noqa: PLC0415 (lazy: torch)
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415 (lazy: sentence_transformers)

    model = SentenceTransformer(str(teacher_folder), device=device, local_files_only=True)
    bert = model[0].auto_model
    bert.encoder.layer = torch.nn.ModuleList([bert.encoder.layer[i] for i in layers])
    bert.config.num_hidden_layers = len(layers)
    # the word vectors stay MiniLM's: a third of the weights not to update, and the student reads
    # words as the teacher does
    bert.embeddings.word_embeddings.weight.requires_grad_(False)
    return model


def cosine_figures(student, texts: Sequence[str], targets: np.ndarray) -> dict:
    """Mean and 1st-percentile cosine of the student's vectors of `texts` to `targets` (n, dim)."""
    if not len(texts):
        return {"cos_mean": math.nan, "cos_p1": math.nan, "passages": 0}
    vectors = student.encode(
        list(texts), batch_size=32, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
    )
    cos = (vectors * targets).sum(axis=1)
    return {
        "cos_mean": round(float(cos.mean()), 4),
        "cos_p1": round(float(np.percentile(cos, 1)), 4),
        "passages": len(texts),
    }


def distill(
    student,
    texts: Sequence[str],
    targets: np.ndarray,
    held_texts: Sequence[str],
    held_targets: np.ndarray,
    work: Path,
    cfg: DistillConfig,
    *,
    report: Callable[[float, str], None] = lambda f, m: None,
) -> DistillResult:
    """Train `student` to write `targets` (the teacher's normalised vectors, (n, dim)) for `texts`.
    Checkpoints under `work` (`ckpt.pt`) and resumes from there."""
    import torch  # noqa: PLC0415 (lazy: torch)

    if len(texts) != len(targets) or len(texts) < cfg.batch_size:
        raise ValueError(f"{len(texts)} passages for {len(targets)} targets: need as many, at least a batch")
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    student.max_seq_length = cfg.max_passage_len
    per_epoch = math.ceil(len(texts) / cfg.batch_size)
    total = per_epoch * cfg.epochs
    every = min(50, max(1, total // 20))  # steps between reports (a mean loss each)
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup_steps) * max(0.0, 1.0 - s / total)
    )
    result, step, ckpt = DistillResult(), 0, work / "ckpt.pt"
    if ckpt.exists():
        saved = torch.load(ckpt, map_location=student.device, weights_only=True)
        student.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        sched.load_state_dict(saved["sched"])
        step = int(saved["step"])
        result = DistillResult(**json.loads(saved["result"]))
        log.info("resuming the passage tower's distillation at step %d of %d", step, total)
    else:
        student.eval()
        result.before = cosine_figures(student, held_texts, held_targets)
        report(0.0, f"before training: {result.before}")

    def save_ckpt() -> None:
        tmp = ckpt.with_suffix(".tmp")
        state = {"model": student.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
        torch.save({**state, "step": step, "result": json.dumps(asdict(result))}, tmp)
        tmp.replace(ckpt)

    target = torch.from_numpy(np.ascontiguousarray(targets, dtype=np.float32))
    t0, window, batches = time.monotonic() - result.seconds, [], {}
    student.train()
    while step < total:
        epoch, offset = divmod(step, per_epoch)
        if epoch not in batches:
            batches = {epoch: epoch_batches(texts, cfg.batch_size, cfg.seed + epoch)}
        batch = batches[epoch][offset]
        features = student.preprocess([texts[i] for i in batch])
        features = {k: v.to(student.device) if hasattr(v, "to") else v for k, v in features.items()}
        out = student(features)["sentence_embedding"]
        loss = (1.0 - (out * target[batch].to(out.device)).sum(dim=1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        window.append(float(loss.detach()))
        if step % every == 0 or step == total:
            result.losses.append(round(float(np.mean(window)), 5))
            window = []
            report(step / total, f"step {step}/{total} loss {result.losses[-1]:.4f}")
        result.seconds = round(time.monotonic() - t0, 1)
        if step % cfg.checkpoint_every == 0:
            save_ckpt()
        if cfg.max_minutes and time.monotonic() - t0 > cfg.max_minutes * 60:
            result.stopped = "budget"
            break
    student.eval()
    result.steps = step
    result.after = cosine_figures(student, held_texts, held_targets)
    save_ckpt()
    return result
