"""A cross-encoder re-ranker: reads the question and one passage together and scores how likely the
passage answers it, started from the packaged all-MiniLM-L6-v2 weights (BERT layers; the one-unit
scoring head is new) and trained by the project on dated question/passage groups.

Training is listwise: each group is one passage that holds the answer and several that do not (hard
negatives: the retriever's own top candidates without the answer), and the loss is the cross-entropy
of the positive among the group's scores. A version folder holds the transformers model, its
tokenizer and `reranker.json` (settings, lineage, validation figures).

    model = CrossEncoderReranker.from_packaged()
    model.train_groups(groups, epochs=1)
    model.scores("Today is 2023-04-02. Who won ...?", ["title. passage text", ...])  # (n,) float32
"""
from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

INFO_FILE = "reranker.json"


@dataclass(frozen=True)
class RerankerConfig:
    max_length: int = 224  # question + passage tokens (a 6-sentence passage is ~150)
    batch_size: int = 32  # pairs per forward pass when scoring
    groups_per_step: int = 2  # training: groups (1 positive + negatives each) per optimiser step
    negatives: int = 7
    lr: float = 3e-5
    epochs: int = 1
    max_minutes: float = 0.0  # 0: no budget
    seed: int = 0


@dataclass(frozen=True)
class Group:
    """One training group: a dated question, the passage that answers it, passages that do not."""

    query: str
    positive: str
    negatives: tuple[str, ...]


class CrossEncoderReranker:
    def __init__(self, model, tokenizer, cfg: RerankerConfig, *, name: str = "minilm-cross", device: str = "cpu",
                 info: dict | None = None) -> None:
        self.model, self.tokenizer, self.cfg, self.name, self.device = model, tokenizer, cfg, name, device
        self.info = info or {}
        self.model.to(device)
        self.model.eval()

    @classmethod
    def from_packaged(cls, cfg: RerankerConfig | None = None, *, device: str = "cpu") -> "CrossEncoderReranker":
        """The packaged MiniLM with a fresh scoring head (untrained: train it before use)."""
        from models.encoders import packaged_minilm_path

        return cls._load(packaged_minilm_path(), cfg or RerankerConfig(), device=device, name="minilm-cross")

    @classmethod
    def load(cls, folder: Path | str, *, device: str = "cpu") -> "CrossEncoderReranker":
        folder = Path(folder)
        info_path = folder / INFO_FILE
        if not info_path.exists():
            raise FileNotFoundError(f"{folder} is not a re-ranker version (no {INFO_FILE})")
        info = json.loads(info_path.read_text())
        cfg = RerankerConfig(**{k: v for k, v in info.get("config", {}).items() if k in RerankerConfig.__dataclass_fields__})
        return cls._load(folder, cfg, device=device, name=info.get("version", folder.name), info=info)

    @classmethod
    def _load(cls, path: Path, cfg: RerankerConfig, *, device: str, name: str, info: dict | None = None):
        import transformers
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        level = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # "newly initialized: classifier" is expected from MiniLM
        try:
            model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1)
        finally:
            transformers.logging.set_verbosity(level)
        return cls(model, AutoTokenizer.from_pretrained(str(path)), cfg, name=name, device=device, info=info)

    def save(self, folder: Path | str, info: dict) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(folder))
        self.tokenizer.save_pretrained(str(folder))
        (folder / INFO_FILE).write_text(json.dumps({**info, "config": asdict(self.cfg)}, indent=1, default=str))

    def _forward(self, queries: Sequence[str], passages: Sequence[str]):
        enc = self.tokenizer(list(queries), list(passages), truncation="only_second", max_length=self.cfg.max_length,
                             padding=True, return_tensors="pt").to(self.device)
        return self.model(**enc).logits[:, 0]

    def scores(self, query: str, passages: Sequence[str]) -> np.ndarray:
        """(len(passages),) float32 relevance scores, higher is better."""
        import torch

        out = []
        self.model.eval()
        with torch.inference_mode():
            for i in range(0, len(passages), self.cfg.batch_size):
                chunk = passages[i:i + self.cfg.batch_size]
                out.append(self._forward([query] * len(chunk), chunk).float().cpu().numpy())
        return np.concatenate(out).astype(np.float32) if out else np.zeros(0, dtype=np.float32)

    def train_groups(self, groups: Sequence[Group], *, progress: Callable[[float, str], None] | None = None,
                     validate: Callable[[], dict] | None = None) -> dict:
        """Listwise training over the groups (cfg.epochs, within cfg.max_minutes). Returns
        {"steps", "seconds", "stopped", "history": [validate() after each epoch]}."""
        import torch

        cfg = self.cfg
        if not groups:
            raise ValueError("no training groups")
        opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.01)
        steps_per_epoch = (len(groups) + cfg.groups_per_step - 1) // cfg.groups_per_step
        total = steps_per_epoch * cfg.epochs
        rng = random.Random(cfg.seed)
        t0, step, stopped, history = time.monotonic(), 0, "epochs", []
        order = list(groups)
        for _epoch in range(cfg.epochs):
            rng.shuffle(order)
            self.model.train()
            for s in range(steps_per_epoch):
                batch = order[s * cfg.groups_per_step:(s + 1) * cfg.groups_per_step]
                queries, passages, sizes = [], [], []
                for g in batch:
                    members = [g.positive, *g.negatives[: cfg.negatives]]
                    queries += [g.query] * len(members)
                    passages += members
                    sizes.append(len(members))
                logits = self._forward(queries, passages)
                loss, j = 0.0, 0
                for n in sizes:  # the positive is each group's first member
                    loss = loss + torch.nn.functional.cross_entropy(logits[j:j + n][None], torch.zeros(1, dtype=torch.long,
                                                                                                   device=logits.device))
                    j += n
                (loss / len(sizes)).backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                if progress and step % 10 == 0:
                    progress(step / total, f"step {step}/{total} loss {loss.item() / len(sizes):.3f}")
                if cfg.max_minutes and time.monotonic() - t0 > cfg.max_minutes * 60:
                    stopped = "budget"
                    break
            self.model.eval()
            if validate is not None:
                history.append(validate())
            if stopped != "epochs":
                break
        return {"steps": step, "seconds": round(time.monotonic() - t0, 1), "stopped": stopped, "history": history}


def load_reranker(folder: Path | str, *, device: str = "cpu"):
    """The re-ranker version in `folder`, whichever its kind (reranker.json's "kind"): a
    CrossEncoderReranker, or a models.ltr.FeatureReranker for kind "features"."""
    folder = Path(folder)
    info_path = folder / INFO_FILE
    if not info_path.exists():
        raise FileNotFoundError(f"{folder} is not a re-ranker version (no {INFO_FILE})")
    from models.ltr import KIND, FeatureReranker  # numpy only: sklearn is imported when fitting

    if json.loads(info_path.read_text()).get("kind") == KIND:
        return FeatureReranker.load(folder)
    return CrossEncoderReranker.load(folder, device=device)
