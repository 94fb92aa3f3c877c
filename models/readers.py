"""The reader interface every backend fits (Gemma, FiD, ...), and a deterministic fake.

A reader sees the question, the date it is asked as of, and passages that were all published on
or before that date (the retriever guarantees it; `check_passages` re-asserts it). The interface
itself lives in `models/reader_base.py` and is re-exported here.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from pathlib import Path

from models.gemma import GemmaReader
from models.gemma_gguf import base_export, resolve_weight_type
from models.gemma_llama import LlamaGemmaReader, use_llama_cpp
from models.gemma_weights import gemma_folder
from models.reader_base import (
    DATE_WORDS,
    BatchedReader,
    Item,
    Reader,
    ReaderAnswer,
    RetrievedPassage,
    check_passages,
    dated_question,
    shorten_answer,
    strip_restated_question,
)

__all__ = [
    "BatchedReader",
    "Item",
    "Reader",
    "ReaderAnswer",
    "RetrievedPassage",
    "check_passages",
    "dated_question",
    "shorten_answer",
    "strip_restated_question",
    "FirstEntityReader",
    "load_reader",
]


_ENTITY = re.compile(r"\b([A-Z][a-zA-Z0-9'\-]+(?:\s+(?:of\s+|the\s+)?[A-Z][a-zA-Z0-9'\-]+)*)")
_STOP = {"Today", "The", "A", "An", "In", "On", "He", "She", "It", "They", "This", "That", "But", "And"}


class FirstEntityReader:
    """Deterministic fake: the first capitalised phrase of the top passage that the question lacks."""

    name = "first-entity"

    def generate(self, question: str, as_of: dt.date, passages: Sequence[RetrievedPassage]) -> ReaderAnswer:
        check_passages(as_of, passages)
        if not passages:
            return ReaderAnswer(text="", raw="")
        q_words = set(re.findall(r"[a-z0-9']+", question.lower()))
        body = passages[0].text  # the body: no date prefix
        for match in _ENTITY.finditer(body):
            phrase = match.group(1)
            words = [w for w in phrase.split() if w not in _STOP and w not in DATE_WORDS]
            if words and not all(w.lower() in q_words for w in words):
                answer = " ".join(words)
                return ReaderAnswer(text=answer, raw=phrase)
        return ReaderAnswer(text="", raw="")


def load_reader(
    spec: str,
    *,
    device: str = "cpu",
    max_passages: int = 3,
    cache_dir: Path | None = None,
    context_words: int = 0,
    answer_beams: int = 1,
    vocabulary: str = "full",
    precision: str = "float32",
    echo_beams: int = 0,
    runtime: str = "torch",
    gguf_type: str = "auto",
) -> Reader:
    """Build a reader from a setting: "gemma" or "first-entity". `cache_dir` is where
    "gemma" keeps its converted weights (default ~/.cache/sqa/gemma3-270m), `context_words` its
    sentence selection budget (0: none) and `vocabulary` what its answers may be written with
    ("full" or "read", models.gemma.GemmaReader), `precision` its number format ("auto",
    "float32", "bfloat16"), `runtime` what runs it ("torch", "llama.cpp", or "auto":
    models.gemma_llama.use_llama_cpp) and `gguf_type` the weight type of its llama.cpp file
    (models.gemma_gguf.base_export and resolve_weight_type); the fake ignores them."""
    if spec == "first-entity":
        return FirstEntityReader()
    decoding = {"answer_beams": answer_beams, "echo_beams": echo_beams, "vocabulary": vocabulary}
    base = gemma_folder(cache_dir) if spec == "gemma" and runtime != "torch" else None
    if base is not None and use_llama_cpp(runtime, device, base, **decoding):
        from transformers import AutoTokenizer  # noqa: PLC0415 (lazy: transformers)

        tokenizer = AutoTokenizer.from_pretrained(base)
        gguf_file = base_export(cache_dir, resolve_weight_type(gguf_type))
        return LlamaGemmaReader(gguf_file, tokenizer, n_passages=max_passages, context_words=context_words)
    if spec == "gemma":
        return GemmaReader.load(
            cache_dir=cache_dir,
            device=device,
            n_passages=max_passages,
            context_words=context_words,
            answer_beams=answer_beams,
            vocabulary=vocabulary,
            precision=precision,
            echo_beams=echo_beams,
        )
    raise ValueError(f"reader {spec!r} is unknown (use 'gemma' or 'first-entity')")
