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
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from models.encoders import packaged_minilm_path
from models.gemma_weights import native_bfloat16
from models.ltr import KIND, FeatureReranker

log = logging.getLogger(__name__)

INFO_FILE = "reranker.json"
KS = (1, 5, 10)
RECENCY_GRID = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5)
FIRST_STAGE_GRID = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0)  # times the first stage's score (weighted fusion: 0..1)
PRECISIONS = ("float32", "bfloat16")


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
    warmup_ratio: float = 0.0  # > 0: the learning rate warms up over this share of the steps, then decays linearly
    # or "bfloat16": training autocasts (the weights stay float32); a CPU trains so only with native bfloat16
    precision: str = "float32"


@dataclass(frozen=True)
class Group:
    """One training group: a dated question, the passage that answers it, passages that do not."""

    query: str
    positive: str
    negatives: tuple[str, ...]


class CrossEncoderReranker:
    def __init__(
        self,
        model,
        tokenizer,
        cfg: RerankerConfig,
        *,
        name: str = "minilm-cross",
        device: str = "cpu",
        info: dict | None = None,
    ) -> None:
        self.model, self.tokenizer, self.cfg, self.name, self.device = model, tokenizer, cfg, name, device
        self.info = info or {}
        # scoring autocasts to bfloat16 where the device computes it natively (AVX512-BF16, AMX, a GPU)
        self.bfloat16 = native_bfloat16(device)
        self.device_type = "cuda" if str(device).startswith("cuda") else "cpu"  # torch.autocast's
        self.model.to(device)
        self.model.eval()

    @classmethod
    def from_packaged(cls, cfg: RerankerConfig | None = None, *, device: str = "cpu") -> CrossEncoderReranker:
        """The packaged MiniLM with a fresh scoring head (untrained: train it before use)."""
        return cls._load(packaged_minilm_path(), cfg or RerankerConfig(), device=device, name="minilm-cross")

    @classmethod
    def load(cls, folder: Path | str, *, device: str = "cpu") -> CrossEncoderReranker:
        folder = Path(folder)
        info_path = folder / INFO_FILE
        if not info_path.exists():
            raise FileNotFoundError(f"{folder} is not a re-ranker version (no {INFO_FILE})")
        info = json.loads(info_path.read_text())
        cfg = RerankerConfig(
            **{k: v for k, v in info.get("config", {}).items() if k in RerankerConfig.__dataclass_fields__}
        )
        return cls._load(folder, cfg, device=device, name=info.get("version", folder.name), info=info)

    @classmethod
    def _load(cls, path: Path, cfg: RerankerConfig, *, device: str, name: str, info: dict | None = None):
        import torch  # noqa: PLC0415 (lazy: torch)
        import transformers  # noqa: PLC0415 (lazy: transformers)
        from transformers import AutoModelForSequenceClassification, AutoTokenizer  # noqa: PLC0415 (lazy: transformers)

        level = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # "newly initialized: classifier" is expected from MiniLM
        try:
            # float32 whatever the folder holds (a version trained elsewhere may be saved as float16)
            model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1, dtype=torch.float32)
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
        enc = self.tokenizer(
            list(queries),
            list(passages),
            truncation="only_second",
            max_length=self.cfg.max_length,
            padding=True,
            return_tensors="pt",
        ).to(self.device)
        return self.model(**enc).logits[:, 0]

    def scores(self, query: str, passages: Sequence[str]) -> np.ndarray:
        """(len(passages),) float32 relevance scores, higher is better."""
        import torch  # noqa: PLC0415 (lazy: torch)

        out = []
        self.model.eval()
        with torch.inference_mode(), torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=self.bfloat16):
            for i in range(0, len(passages), self.cfg.batch_size):
                chunk = passages[i : i + self.cfg.batch_size]
                out.append(self._forward([query] * len(chunk), chunk).float().cpu().numpy())
        return np.concatenate(out).astype(np.float32) if out else np.zeros(0, dtype=np.float32)

    def train_groups(
        self,
        groups: Sequence[Group],
        *,
        progress: Callable[[float, str], None] | None = None,
        validate: Callable[[], dict] | None = None,
        better: Callable[[dict, dict], bool] | None = None,
        checkpoint: Path | None = None,
        checkpoint_every: int = 100,
    ) -> dict:
        """Listwise training over the groups (cfg.epochs, within cfg.max_minutes). Returns
        {"steps", "seconds", "stopped", "history": [validate() after each epoch], "best_epoch",
        "resumed_at"}. With `better(new, best)` the weights of the best epoch by it are kept (validated
        each epoch), else the last ones.

        `checkpoint`: a file the weights, optimiser and step are saved to every `checkpoint_every`
        steps and at each epoch's end; a run that finds it resumes there (the same groups in the same
        order, the budget counting the time already spent), so a killed hour-long run loses minutes."""
        import torch  # noqa: PLC0415 (lazy: torch)

        cfg = self.cfg
        if not groups:
            raise ValueError("no training groups")
        if cfg.precision not in PRECISIONS:
            raise ValueError(f"precision {cfg.precision!r} is unknown (use {' or '.join(PRECISIONS)})")
        opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=0.01)
        steps_per_epoch = (len(groups) + cfg.groups_per_step - 1) // cfg.groups_per_step
        total = steps_per_epoch * cfg.epochs
        warmup = int(cfg.warmup_ratio * total)
        sched = None
        if cfg.warmup_ratio > 0:
            sched = torch.optim.lr_scheduler.LambdaLR(
                opt,
                lambda i: (i + 1) / max(1, warmup) if i < warmup else max(0.0, (total - i) / max(1, total - warmup)),
            )
        autocast = cfg.precision == "bfloat16"
        step, spent, stopped, history = 0, 0.0, "epochs", []
        best, best_state, best_epoch = None, None, None
        if checkpoint is not None and checkpoint.exists():
            saved = torch.load(checkpoint, map_location=self.device, weights_only=True)
            if saved["groups"] != len(groups) or saved["total"] != total:
                raise ValueError(
                    f"{checkpoint} was saved over {saved['groups']} groups and {saved['total']} steps, "
                    f"not {len(groups)} and {total}: delete it to start again"
                )
            self.model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
            if sched is not None:
                sched.load_state_dict(saved["sched"])
            torch.set_rng_state(saved["rng"])  # dropout goes on as it would have
            step, spent = int(saved["step"]), float(saved["seconds"])
            history = json.loads(saved["history"])
            log.info("resuming the re-ranker's training at step %d of %d (%.0f s spent)", step, total, spent)
        resumed_at = step

        def save() -> None:
            assert checkpoint is not None
            state = {"model": self.model.state_dict(), "opt": opt.state_dict()}
            if sched is not None:
                state["sched"] = sched.state_dict()
            state.update(
                step=step, seconds=time.monotonic() - t0, history=json.dumps(history), rng=torch.get_rng_state()
            )
            tmp = checkpoint.with_suffix(".tmp")
            torch.save({**state, "groups": len(groups), "total": total}, tmp)
            tmp.replace(checkpoint)  # a kill mid-save leaves the previous checkpoint whole

        t0 = time.monotonic() - spent
        for epoch in range(step // steps_per_epoch, cfg.epochs):  # groups is not empty: steps_per_epoch >= 1
            order = list(groups)
            random.Random(cfg.seed + epoch).shuffle(order)  # an epoch's order depends on nothing else
            self.model.train()
            for s in range(step - epoch * steps_per_epoch, steps_per_epoch):
                batch = order[s * cfg.groups_per_step : (s + 1) * cfg.groups_per_step]
                queries, passages, sizes = [], [], []
                for g in batch:
                    members = [g.positive, *g.negatives[: cfg.negatives]]
                    queries += [g.query] * len(members)
                    passages += members
                    sizes.append(len(members))
                with torch.autocast(self.device_type, dtype=torch.bfloat16, enabled=autocast):
                    logits = self._forward(queries, passages).float()
                loss, j = 0.0, 0
                for n in sizes:  # the positive is each group's first member
                    loss = loss + torch.nn.functional.cross_entropy(
                        logits[j : j + n][None], torch.zeros(1, dtype=torch.long, device=logits.device)
                    )
                    j += n
                (loss / len(sizes)).backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                opt.step()
                if sched is not None:
                    sched.step()
                opt.zero_grad(set_to_none=True)
                step += 1
                if progress and step % 10 == 0:
                    progress(step / total, f"step {step}/{total} loss {loss.item() / len(sizes):.3f}")
                if checkpoint is not None and step % checkpoint_every == 0:
                    save()
                if cfg.max_minutes and time.monotonic() - t0 > cfg.max_minutes * 60:
                    stopped = "budget"
                    break
            self.model.eval()
            if validate is not None:
                history.append({"epoch": epoch + 1, "steps": step, **validate()})
                if better is not None and (best is None or better(history[-1], best)):
                    best, best_epoch = history[-1], epoch + 1
                    best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            if checkpoint is not None:
                save()
            if stopped != "epochs":
                break
        if best_state is not None:
            self.model.load_state_dict(best_state)
        return {
            "steps": step,
            "seconds": round(time.monotonic() - t0, 1),
            "stopped": stopped,
            "history": history,
            "best_epoch": best_epoch,
            "resumed_at": resumed_at,
        }


def groups_of(items: list[dict], *, max_positives: int, negatives: int, seed: int = 0) -> list[Group]:
    """Training groups from candidate lists ({"query", "cands": [{"hit", ...}]}): each of an item's
    first `max_positives` candidates that hold the answer, with `negatives` sampled from those that
    do not (hard negatives: the first stage's own). An item without both makes none."""
    rng = random.Random(seed)
    groups = []
    for item in items:
        pos = [c["input"] for c in item["cands"] if c["hit"]]
        neg = [c["input"] for c in item["cands"] if not c["hit"]]
        if not pos or not neg:
            continue
        for p in pos[:max_positives]:
            groups.append(Group(item["query"], p, tuple(rng.sample(neg, min(negatives, len(neg))))))
    return groups


def ranking_figures(
    items: list[dict], scores: list[list[float]] | None, recency: float = 0.0, first_stage: float = 0.0
) -> dict:
    """recall@k and MRR of the candidates ordered by `scores` plus `first_stage` times the first
    stage's score minus the recency prior (scores None: the first stage's own order), over all the
    items (an item without a positive counts as a miss)."""
    n = max(1, len(items))
    hits = {k: 0 for k in KS}
    rr = 0.0
    for j, item in enumerate(items):
        cands = item["cands"]
        if scores is None:
            order = list(range(len(cands)))
        else:
            final = [
                s + first_stage * c.get("score", 0.0) - recency * math.log1p(c["age"]) for s, c in zip(scores[j], cands)
            ]
            order = sorted(range(len(cands)), key=lambda i: -final[i])
        flags = [cands[i]["hit"] for i in order]
        for k in KS:
            hits[k] += any(flags[:k])
        rr += next((1 / (r + 1) for r, f in enumerate(flags) if f), 0.0)
    return {**{f"recall@{k}": round(100 * v / n, 1) for k, v in hits.items()}, "mrr": round(rr / n, 4)}


def fit_weights(items: list[dict], scores: list[list[float]], grid) -> tuple[float, float, dict]:
    """(recency weight, first-stage weight, {(w, f): figures}): the pair of `grid` with the best
    recall@5 (then MRR, then the smaller weights) of `ranking_figures` over the held-back items."""
    by_weight = {wf: ranking_figures(items, scores, *wf) for wf in grid}
    weight, first = max(grid, key=lambda wf: (by_weight[wf]["recall@5"], by_weight[wf]["mrr"], -wf[0], -wf[1]))
    return weight, first, by_weight


def beats(figures: dict, first_stage: dict) -> bool:
    """Whether re-ranked `figures` beat the first stage's: recall@5, then MRR."""
    return figures["recall@5"] > first_stage["recall@5"] or (
        figures["recall@5"] == first_stage["recall@5"] and figures["mrr"] > first_stage["mrr"]
    )


def prior_alone(items: list[dict], recency: float, first_stage: float) -> dict:
    """`ranking_figures` of the fitted weights with the model left out (every model score 0): what the
    first stage's score and the recency prior reach without it."""
    return ranking_figures(items, [[0.0] * len(i["cands"]) for i in items], recency, first_stage)


def worth_serving(figures: dict, first_stage: dict, prior: dict) -> bool:
    """Whether a version's held-back `figures` beat the first stage's (`beats`) and its recall@5
    is above what its own weights reach without the model (`prior_alone`). A gain that the fitted
    prior makes alone is no evidence for the model: on the slice, a recency weight fitted on March's
    131 questions raised recall@5 there from 45.0 to 48.9 with no help from the model, and lowered it
    from 49.0 to 45.0 on 2023-04..06."""
    return beats(figures, first_stage) and figures["recall@5"] > prior["recall@5"]


def load_reranker(folder: Path | str, *, device: str = "cpu"):
    """The re-ranker version in `folder`, whichever its kind (reranker.json's "kind"): a
    CrossEncoderReranker, or a models.ltr.FeatureReranker for kind "features"."""
    folder = Path(folder)
    info_path = folder / INFO_FILE
    if not info_path.exists():
        raise FileNotFoundError(f"{folder} is not a re-ranker version (no {INFO_FILE})")

    if json.loads(info_path.read_text()).get("kind") == KIND:
        return FeatureReranker.load(folder)
    return CrossEncoderReranker.load(folder, device=device)
