"""Fusion-in-Decoder reader (Izacard & Grave) over any transformers encoder-decoder.

Each "question + passage" pair is encoded on its own; the encoder outputs are concatenated, so the
decoder attends to B x (N*L) positions instead of (B*N) x L, and generates the answer from all
passages at once. Two backbones:
- "minilm": the packaged all-MiniLM-L6-v2 warm-started as a BERT-to-BERT encoder-decoder
  (`EncoderDecoderModel`); the decoder's cross-attention starts random, so it must be trained.
- "seq2seq": any local T5/BART checkpoint folder (`AutoModelForSeq2SeqLM`), e.g. flan-t5-base.
The config (`FiDConfig`) is saved beside the weights and wins on reload (nanoGPT's rule).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from models.encoders import packaged_minilm_path
from models.reader_base import BatchedReader, Item, ReaderAnswer, RetrievedPassage, dated_question
from models.saved_config import SavedConfig

CONFIG_FILE = "fid_config.json"


@dataclass(frozen=True)
class FiDConfig(SavedConfig):
    backbone: str = "minilm"  # "minilm" | "seq2seq"
    base: str = ""  # the checkpoint it was warm-started from (informational after the first save)
    n_passages: int = 10  # passages fused per question
    max_passage_tokens: int = 192  # per "question + title + passage" input
    max_answer_tokens: int = 16
    num_beams: int = 1
    tie_encoder_decoder: bool = False  # minilm only: share encoder and decoder weights


def fid_input(question: str, as_of: dt.date, passage: RetrievedPassage) -> str:
    """`question: Today is <date>. <question> title: <title> context: <dated passage>`."""
    return f"question: {dated_question(question, as_of)} title: {passage.title} context: {passage.dated_text}"


_WS = re.compile(r"\s+")


def recase(answer: str, passages: Sequence[RetrievedPassage]) -> str:
    """An uncased tokenizer generates 'joe biden' or 'u. s.'; return the passages' own spelling
    ('Joe Biden', 'U.S.') when the answer occurs in one of them, ignoring case and spaces."""
    squeezed = _WS.sub("", answer)
    if not squeezed:
        return answer
    # Every character of the answer, in order, with optional whitespace between them.
    pattern = re.compile(r"\s*".join(re.escape(c) for c in squeezed), re.IGNORECASE)
    for p in passages:
        m = pattern.search(p.dated_text)
        if m:
            return m.group(0)
    return answer


class FiDModel(torch.nn.Module):
    """The network: an encoder-decoder plus its tokenizer and the FiD reshape."""

    def __init__(self, model, tokenizer, config: FiDConfig) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.config = config

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def warm_start(cls, config: FiDConfig) -> FiDModel:
        """A new, untrained model from the backbone named in the config."""
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, EncoderDecoderModel  # noqa: PLC0415 (lazy: transformers)

        if config.backbone == "minilm":
            base = config.base or str(packaged_minilm_path())
            config = dataclasses.replace(config, base=base)
            model = EncoderDecoderModel.from_encoder_decoder_pretrained(
                base, base, tie_encoder_decoder=config.tie_encoder_decoder
            )
            tokenizer = AutoTokenizer.from_pretrained(base)
            _set_special_tokens(model, tokenizer)
        elif config.backbone == "seq2seq":
            if not config.base or not Path(config.base).is_dir():
                raise ValueError(f"seq2seq backbone needs a local checkpoint folder, got {config.base!r}")
            model = AutoModelForSeq2SeqLM.from_pretrained(config.base)
            tokenizer = AutoTokenizer.from_pretrained(config.base)
        else:
            raise ValueError(f"backbone {config.backbone!r} is unknown (use 'minilm' or 'seq2seq')")
        return cls(model, tokenizer, config)

    @classmethod
    def load(cls, path: Path | str, *, device: str = "cpu") -> FiDModel:
        """Reload a saved model exactly: the stored config decides the architecture."""
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, EncoderDecoderModel  # noqa: PLC0415 (lazy: transformers)

        path = Path(path)
        cfg_file = path / CONFIG_FILE
        if not cfg_file.exists():
            raise FileNotFoundError(f"{path} is not a FiD model folder ({CONFIG_FILE} is missing)")
        config = FiDConfig.from_json(json.loads(cfg_file.read_text()))
        loader = EncoderDecoderModel if config.backbone == "minilm" else AutoModelForSeq2SeqLM
        model = loader.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        if config.backbone == "minilm":
            _set_special_tokens(model, tokenizer)
        out = cls(model, tokenizer, config)
        out.to(device)
        out.eval()
        return out

    def save(self, path: Path | str) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        (path / CONFIG_FILE).write_text(json.dumps(self.config.to_json(), indent=2))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ---- tensors ------------------------------------------------------------------------
    def encode_inputs(
        self, items: Sequence[tuple[str, dt.date, Sequence[RetrievedPassage]]], n_passages: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and mask of shape B x N x L. Questions with fewer than N passages are padded
        with empty passages whose mask is all zero except the first token (so the decoder never
        attends to an empty row only)."""
        n = n_passages or self.config.n_passages
        texts: list[str] = []
        present: list[bool] = []
        for question, as_of, passages in items:
            ps = list(passages)[:n]
            for i in range(n):
                if i < len(ps):
                    texts.append(fid_input(question, as_of, ps[i]))
                    present.append(True)
                else:
                    texts.append(f"question: {dated_question(question, as_of)}")
                    present.append(False)
        enc = self.tokenizer(
            texts, max_length=self.config.max_passage_tokens, truncation=True, padding=True, return_tensors="pt"
        )
        ids, mask = enc["input_ids"], enc["attention_mask"]
        absent = torch.tensor([not p for p in present])
        mask[absent, 1:] = 0
        b = len(items)
        return ids.view(b, n, -1), mask.view(b, n, -1)

    def encode_answers(self, answers: Sequence[str]) -> torch.Tensor:
        """Labels (B x T) with -100 on padding; for BERT the leading [CLS] is the decoder's start
        token, so it is dropped from the labels and [SEP] ends the answer."""
        enc = self.tokenizer(
            list(answers),
            max_length=self.config.max_answer_tokens + 1,
            truncation=True,
            padding=True,
            return_tensors="pt",
        )
        labels = enc["input_ids"].clone()
        labels[enc["attention_mask"] == 0] = -100
        if self.config.backbone == "minilm":
            labels = labels[:, 1:].contiguous()
        return labels

    def fuse(self, ids: torch.Tensor, mask: torch.Tensor):
        """Encode B x N x L passages on their own, then concatenate: B x (N*L) x H."""
        from transformers.modeling_outputs import BaseModelOutput  # noqa: PLC0415 (lazy: transformers)

        b, n, length = ids.shape
        hidden = self.model.get_encoder()(
            input_ids=ids.reshape(b * n, length), attention_mask=mask.reshape(b * n, length)
        ).last_hidden_state
        hidden = hidden.reshape(b, n * length, hidden.shape[-1])
        return BaseModelOutput(last_hidden_state=hidden), mask.reshape(b, n * length)

    def loss(self, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        enc, fused_mask = self.fuse(ids.to(self.device), mask.to(self.device))
        out = self.model(encoder_outputs=enc, attention_mask=fused_mask, labels=labels.to(self.device))
        return out.loss

    @torch.inference_mode()
    def generate(
        self, items: Sequence[tuple[str, dt.date, Sequence[RetrievedPassage]]], n_passages: int | None = None
    ) -> list[str]:
        """Batched generation: one answer string per (question, as_of, passages)."""
        if not items:
            return []
        ids, mask = self.encode_inputs(items, n_passages)
        enc, fused_mask = self.fuse(ids.to(self.device), mask.to(self.device))
        out = self.model.generate(
            encoder_outputs=enc,
            attention_mask=fused_mask,
            max_new_tokens=self.config.max_answer_tokens,
            num_beams=self.config.num_beams,
            do_sample=False,
        )
        return [t.strip() for t in self.tokenizer.batch_decode(out, skip_special_tokens=True)]


def _set_special_tokens(model, tokenizer) -> None:
    """BERT-to-BERT: [CLS] starts the decoder, [SEP] ends the answer, [PAD] pads."""
    for cfg in (model.config, model.generation_config):
        cfg.decoder_start_token_id = tokenizer.cls_token_id
        cfg.bos_token_id = tokenizer.cls_token_id
        cfg.eos_token_id = tokenizer.sep_token_id
        cfg.pad_token_id = tokenizer.pad_token_id


class FiDReader(BatchedReader):
    """The `Reader` backend: a loaded FiDModel behind `generate(question, as_of, passages)`."""

    def __init__(self, model: FiDModel, *, name: str = "fid", n_passages: int | None = None) -> None:
        super().__init__(model, name=name, n_passages=n_passages)

    def _read(self, items: Sequence[Item]) -> list[ReaderAnswer]:
        raw = self.model.generate(items, self.n_passages)
        return [ReaderAnswer(text=recase(text, item[2][: self.n_passages]), raw=text) for item, text in zip(items, raw)]


__all__ = ["FiDConfig", "FiDModel", "FiDReader", "fid_input", "recase"]
