"""Extractive span reader: answer-span start/end scoring over the packaged MiniLM encoder.

The classic strong baseline a FiD reader must beat. Each "question [SEP] title + passage" pair is
encoded on its own (B*N x L); start and end logits of all N passages of a question are normalised
together (shared normalisation, Clark & Gardner), so span scores compare across passages, and the
loss is the marginal likelihood of every occurrence of the answer in any passage.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from models.encoders import packaged_minilm_path
from models.reader_base import BatchedReader, Item, ReaderAnswer, RetrievedPassage, dated_question
from models.saved_config import SavedConfig

CONFIG_FILE = "span_config.json"
HEAD_FILE = "span_head.pt"


@dataclass(frozen=True)
class SpanConfig(SavedConfig):
    base: str = ""  # encoder folder it was warm-started from
    n_passages: int = 10
    max_passage_tokens: int = 192
    max_answer_tokens: int = 12


@dataclass
class SpanBatch:
    ids: torch.Tensor  # B x N x L
    mask: torch.Tensor  # B x N x L
    context: torch.Tensor  # B x N x L, True on passage tokens (where an answer may start or end)
    offsets: list[list[list[tuple[int, int]]]]  # [b][n][token] -> char span in the passage text
    texts: list[list[str]]  # [b][n] passage text (title + context) the offsets refer to


class SpanModel(torch.nn.Module):
    def __init__(self, encoder, tokenizer, config: SpanConfig) -> None:
        super().__init__()
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.config = config
        self.head = torch.nn.Linear(encoder.config.hidden_size, 2)  # start, end

    @classmethod
    def warm_start(cls, config: SpanConfig) -> SpanModel:
        from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415 (lazy: transformers)

        base = config.base or str(packaged_minilm_path())
        config = dataclasses.replace(config, base=base)
        return cls(AutoModel.from_pretrained(base), AutoTokenizer.from_pretrained(base), config)

    @classmethod
    def load(cls, path: Path | str, *, device: str = "cpu") -> SpanModel:
        from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415 (lazy: transformers)

        path = Path(path)
        if not (path / CONFIG_FILE).exists():
            raise FileNotFoundError(f"{path} is not a span reader folder ({CONFIG_FILE} is missing)")
        config = SpanConfig.from_json(json.loads((path / CONFIG_FILE).read_text()))
        model = cls(AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path), config)
        model.head.load_state_dict(torch.load(path / HEAD_FILE, map_location="cpu", weights_only=True))
        model.to(device)
        model.eval()
        return model

    def save(self, path: Path | str) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.encoder.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        torch.save(self.head.state_dict(), path / HEAD_FILE)
        (path / CONFIG_FILE).write_text(json.dumps(self.config.to_json(), indent=2))

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    def encode_inputs(
        self, items: Sequence[tuple[str, dt.date, Sequence[RetrievedPassage]]], n_passages: int | None = None
    ) -> SpanBatch:
        """Pairs (dated question, "title. passage"), truncating the passage only. Missing passages
        become empty pairs whose context mask is all False."""
        n = n_passages or self.config.n_passages
        questions, contexts = [], []
        for question, as_of, passages in items:
            ps = list(passages)[:n]
            for i in range(n):
                questions.append(dated_question(question, as_of))
                contexts.append(f"{ps[i].title}. {ps[i].dated_text}" if i < len(ps) else "")
        enc = self.tokenizer(
            questions,
            contexts,
            max_length=self.config.max_passage_tokens,
            truncation="only_second",
            padding=True,
            return_offsets_mapping=True,
            return_tensors="pt",
        )
        b = len(items)
        seq = [enc.sequence_ids(i) for i in range(len(questions))]
        context = torch.tensor([[s == 1 for s in row] for row in seq])
        offsets = enc["offset_mapping"].tolist()
        return SpanBatch(
            ids=enc["input_ids"].view(b, n, -1),
            mask=enc["attention_mask"].view(b, n, -1),
            context=context.view(b, n, -1),
            offsets=[[[tuple(o) for o in offsets[i * n + j]] for j in range(n)] for i in range(b)],
            texts=[contexts[i * n : (i + 1) * n] for i in range(b)],
        )

    def logits(self, batch: SpanBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end logits, B x (N*L), -inf outside passage tokens."""
        b, n, length = batch.ids.shape
        hidden = self.encoder(
            input_ids=batch.ids.reshape(b * n, length).to(self.device),
            attention_mask=batch.mask.reshape(b * n, length).to(self.device),
        ).last_hidden_state
        scores = self.head(hidden)  # (B*N) x L x 2
        scores = scores.reshape(b, n * length, 2)
        allowed = batch.context.reshape(b, n * length).to(self.device)
        scores = scores.masked_fill(~allowed.unsqueeze(-1), float("-inf"))
        return scores[..., 0], scores[..., 1]

    def answer_positions(self, batch: SpanBatch, answers: Sequence[Sequence[str]]) -> list[tuple[list[int], list[int]]]:
        """Flattened (N*L) token positions where an occurrence of a gold answer starts and ends."""
        b, n, length = batch.ids.shape
        out = []
        for i in range(b):
            starts, ends = [], []
            for j in range(n):
                text = batch.texts[i][j].lower()
                offs = batch.offsets[i][j]
                ctx = batch.context[i, j].tolist()
                for answer in answers[i]:
                    a = answer.lower().strip()
                    if not a:
                        continue
                    pos = text.find(a)
                    while pos >= 0:
                        s_tok = e_tok = None
                        for t, (cs, ce) in enumerate(offs):
                            if not ctx[t] or ce <= cs:
                                continue
                            if s_tok is None and cs <= pos < ce:
                                s_tok = t
                            if cs < pos + len(a) <= ce:
                                e_tok = t
                                break
                        if s_tok is not None and e_tok is not None and e_tok >= s_tok:
                            starts.append(j * length + s_tok)
                            ends.append(j * length + e_tok)
                        pos = text.find(a, pos + 1)
            out.append((starts, ends))
        return out

    def loss(self, batch: SpanBatch, answers: Sequence[Sequence[str]]) -> torch.Tensor | None:
        """Marginal negative log-likelihood of the answer's starts and ends; None when no question
        of the batch has its answer inside the (truncated) passages."""
        start, end = self.logits(batch)
        log_s, log_e = start.log_softmax(-1), end.log_softmax(-1)
        terms = []
        for i, (starts, ends) in enumerate(self.answer_positions(batch, answers)):
            if starts:
                terms.append(-(log_s[i, starts].logsumexp(0) + log_e[i, ends].logsumexp(0)))
        return torch.stack(terms).mean() if terms else None

    @torch.inference_mode()
    def extract(
        self, items: Sequence[tuple[str, dt.date, Sequence[RetrievedPassage]]], n_passages: int | None = None
    ) -> list[tuple[str, float]]:
        """Best span (text, score) per question over all its passages."""
        if not items:
            return []
        batch = self.encode_inputs(items, n_passages)
        start, end = self.logits(batch)
        b, n, length = batch.ids.shape
        width = self.config.max_answer_tokens
        results = []
        for i in range(b):
            s, e = start[i].cpu(), end[i].cpu()
            # score[x, y] = s[x] + e[y] for x <= y < x + width, within one passage.
            pair = s[:, None] + e[None, :]
            idx = torch.arange(n * length)
            valid = (
                (idx[None, :] >= idx[:, None])
                & (idx[None, :] < idx[:, None] + width)
                & ((idx[None, :] // length) == (idx[:, None] // length))
            )
            pair = pair.masked_fill(~valid, float("-inf"))
            flat = int(pair.argmax())
            x, y = divmod(flat, n * length)
            score = float(pair[x, y])
            if score == float("-inf"):
                results.append(("", score))
                continue
            j, xs, ys = x // length, x % length, y % length
            cs, ce = batch.offsets[i][j][xs][0], batch.offsets[i][j][ys][1]
            results.append((batch.texts[i][j][cs:ce].strip(), score))
        return results


class ExtractiveReader(BatchedReader):
    """The `Reader` backend over a loaded SpanModel."""

    def __init__(self, model: SpanModel, *, name: str = "extractive", n_passages: int | None = None) -> None:
        super().__init__(model, name=name, n_passages=n_passages)

    def _read(self, items: Sequence[Item]) -> list[ReaderAnswer]:
        return [
            ReaderAnswer(text=text, raw=f"{text}\t{score:.3f}")
            for text, score in self.model.extract(items, self.n_passages)
        ]
