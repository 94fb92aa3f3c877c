"""Gemma 3 270M (the base model) as a reader, zero-shot now and the generator to fine-tune next.

`GemmaReader` reads the passages in the team's prompt (models.gemma_prompt), decodes the answer
(models.gemma_decoding: greedy, within the passages' words, or beams) and shortens it like every
generator's. `GemmaReader.load()` builds the packaged model (converted once, models.gemma_weights),
`load(folder=...)` a fine-tuned copy.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Sequence
from pathlib import Path

from models.gemma_decoding import (
    VOCABULARIES,
    _compact_input,
    _first_line_stop,
    answer_vocabulary,
    greedy_within,
    line_probability,
)
from models.gemma_prompt import build_prompt, echoes_question, reader_context
from models.gemma_weights import _load, gemma_folder, resolve_precision
from models.reader_base import Item, ReaderAnswer, RetrievedPassage, check_passages, final_answer, grounded


class GemmaReader:
    """Reads the first `n_passages` passages with greedy decoding and answers with a short phrase.

    Construct with a loaded model (tests pass fakes: the passages are checked before the model is
    touched); `GemmaReader.load()` builds the packaged model, `load(folder=...)` a fine-tuned copy.
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        device: str = "cpu",
        name: str = "gemma3-270m",
        n_passages: int = 3,
        max_passage_words: int = 100,
        max_new_tokens: int = 16,
        context_words: int = 0,
        answer_beams: int = 1,
        vocabulary: str = "full",
        precision: str = "float32",
        titles: bool = False,
        echo_beams: int = 0,
    ) -> None:
        for arg, value in (
            ("n_passages", n_passages),
            ("max_passage_words", max_passage_words),
            ("max_new_tokens", max_new_tokens),
            ("answer_beams", answer_beams),
        ):
            if value < 1:
                raise ValueError(f"{arg} must be at least 1, got {value}")
        if echo_beams < 0:
            raise ValueError(f"echo_beams must be 0 (off) or positive, got {echo_beams}")
        if context_words < 0:
            raise ValueError(f"context_words must be 0 (first words of each passage) or positive, got {context_words}")
        if vocabulary not in VOCABULARIES:
            raise ValueError(f"vocabulary must be one of {VOCABULARIES}, got {vocabulary!r}")
        # "bfloat16": the weights are cast and every matmul runs in bfloat16 (Gemma was trained in
        # it): on a CPU with AVX512-BF16 the prompt reads in about half the time of float32.
        # "auto": bfloat16 where the device has it natively (resolve_precision).
        self.precision = resolve_precision(precision, device)
        if self.precision == "bfloat16":
            import torch  # noqa: PLC0415 (lazy: torch)

            model = model.to(torch.bfloat16)
        if hasattr(model, "get_output_embeddings"):
            model.get_output_embeddings().register_forward_pre_hook(_compact_input)
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.name = name
        self.n_passages = n_passages  # what AnswerService gives it when SQA_READER_PASSAGES is 0
        self.max_passage_words = max_passage_words
        self.max_new_tokens = max_new_tokens
        self.context_words = context_words  # 0: the first max_passage_words of each; else sentence selection
        # 1: greedy. N: beam search keeps N answers and the best one found in the passages read wins
        # (an answer the passages do not hold is kept only when no beam is grounded).
        self.answer_beams = answer_beams
        # "full": any token of the vocabulary; "read": greedy over the words of the passages read and
        # the question (answer_vocabulary, greedy_within): the answer is copied, and each generated
        # token skips the full output head. Beam search (answer_beams > 1) always uses the full one.
        self.vocabulary = vocabulary
        self.titles = titles  # each article's headline after a passage's date (reader_context)
        # Greedy answers made only of the question's words are searched again with this many beams
        # (0 or 1: never): the best grounded beam that is not such an echo wins.
        self.echo_beams = echo_beams
        self._lock = threading.Lock()  # one generation at a time: no thread oversubscription

    @classmethod
    def load(
        cls, folder: Path | None = None, *, cache_dir: Path | None = None, device: str = "cpu", **kwargs
    ) -> GemmaReader:
        """The packaged model (converted into `cache_dir` on first use), or the transformers folder
        `folder` (a fine-tuned copy). kwargs: name, n_passages, max_passage_words, max_new_tokens,
        context_words, answer_beams, vocabulary, precision, titles, echo_beams."""
        model, tokenizer = _load(Path(folder) if folder is not None else gemma_folder(cache_dir))
        return cls(model.to(device), tokenizer, device=device, **kwargs)

    def context(self, question: str, passages: Sequence[RetrievedPassage]) -> list[RetrievedPassage]:
        """What this reader reads of the ranked passages (the prompt's passages, as cut)."""
        return reader_context(
            question,
            passages,
            n_passages=self.n_passages,
            max_passage_words=self.max_passage_words,
            context_words=self.context_words,
            titles=self.titles,
        )

    def generate(self, question: str, as_of: dt.date, passages: Sequence[RetrievedPassage]) -> ReaderAnswer:
        import torch  # noqa: PLC0415 (lazy: torch)

        prompted = self._prompt(question, as_of, passages)
        if prompted is None:
            return ReaderAnswer(text="", raw="")  # a base model would make something up
        read, prompt = prompted
        enc = self.tokenizer(prompt, return_tensors="pt")  # starts with <bos>
        input_ids = enc["input_ids"].to(self.device)  # (1, L)
        if self.vocabulary == "read" and self.answer_beams == 1:
            allowed = answer_vocabulary(self.tokenizer, [*(p.dated_text for p in read), question])
            with self._lock, torch.inference_mode():
                raw = greedy_within(
                    self.model,
                    self.tokenizer,
                    input_ids,
                    enc["attention_mask"].to(self.device),
                    allowed,
                    self.max_new_tokens,
                )
            return ReaderAnswer(text=final_answer(raw, question, read), raw=raw)
        found = self._generate(input_ids, enc["attention_mask"].to(self.device), self.answer_beams)  # best first
        answers = [final_answer(raw, question, read) for raw, _ in found]
        text = " ".join(p.dated_text for p in read)
        if len(found) > 1:
            for (raw, p), answer in zip(found, answers):
                if answer and grounded(answer, text):
                    return ReaderAnswer(text=answer, raw=raw, confidence=p)
        elif self.echo_beams > 1 and echoes_question(answers[0], question):
            for raw, p in self._generate(input_ids, enc["attention_mask"].to(self.device), self.echo_beams):
                answer = final_answer(raw, question, read)
                if answer and grounded(answer, text) and not echoes_question(answer, question):
                    return ReaderAnswer(text=answer, raw=raw, confidence=p)
        return ReaderAnswer(text=answers[0], raw=found[0][0], confidence=found[0][1])

    def _prompt(
        self, question: str, as_of: dt.date, passages: Sequence[RetrievedPassage]
    ) -> tuple[list[RetrievedPassage], str] | None:
        """(what is read of the passages, the prompt), or None without passages; a passage after
        `as_of` fails `check_passages` first."""
        check_passages(as_of, passages)
        if not passages:
            return None
        read = self.context(question, passages)
        return read, build_prompt(question, as_of, read, None)

    def batches(self) -> bool:
        """Whether `generate_batch` reads several questions in one model call: greedy decoding over the
        full vocabulary, with no echo search (the default). Other decodings read one at a time."""
        return self.answer_beams == 1 and self.vocabulary == "full" and self.echo_beams <= 1

    def generate_batch(self, items: Sequence[Item]) -> list[ReaderAnswer]:
        """The answers to several (question, as_of, passages) items, in their order, as `generate`
        gives each. With `batches()`, the prompts are padded on the left and decoded together: a
        decoding step reads the weights once for all of them (serving.reader_batching gathers
        concurrent questions into such a batch). Otherwise they are read one by one."""
        if not self.batches() or len(items) < 2:
            return [self.generate(*item) for item in items]
        answers: list[ReaderAnswer | None] = [None] * len(items)
        rows: list[tuple[int, str, list[RetrievedPassage]]] = []
        prompts: list[str] = []
        for i, (question, as_of, passages) in enumerate(items):
            prompted = self._prompt(question, as_of, passages)
            if prompted is None:
                answers[i] = ReaderAnswer(text="", raw="")
                continue
            rows.append((i, question, prompted[0]))
            prompts.append(prompted[1])
        if prompts:
            enc = self.tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
            found = self._generate(enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device), 1)
            for (i, question, read), (raw, p) in zip(rows, found):
                answers[i] = ReaderAnswer(text=final_answer(raw, question, read), raw=raw, confidence=p)
        return [a for a in answers if a is not None]

    def _generate(self, input_ids, attention_mask, beams: int) -> list[tuple[str, float]]:
        """(text, probability of its first line: `line_probability`) of the `beams` best
        continuations (greedy for 1), best first."""
        import torch  # noqa: PLC0415 (lazy: torch)

        pad = self.tokenizer.pad_token_id  # Gemma's is 0: test for None, not truth
        search = {} if beams == 1 else {"num_beams": beams, "num_return_sequences": beams}
        with self._lock, torch.inference_mode():
            out = self.model.generate(
                input_ids,
                attention_mask=attention_mask,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                stopping_criteria=_first_line_stop(self.tokenizer, input_ids.shape[1]),
                pad_token_id=pad if pad is not None else self.tokenizer.eos_token_id,
                output_scores=True,
                return_dict_in_generate=True,
                **search,
            )
            # (B, generated): each chosen token's log-probability (greedy: the logits normalised;
            # beams: their scores are log-probabilities already, followed along each beam)
            steps = self.model.compute_transition_scores(
                out.sequences, out.scores, getattr(out, "beam_indices", None), normalize_logits=beams == 1
            ).float()
        generated = out.sequences[:, input_ids.shape[1] :]
        texts = self.tokenizer.batch_decode(generated, skip_special_tokens=True)
        return [
            (t, line_probability(self.tokenizer, ids.tolist(), lps.tolist()))
            for t, ids, lps in zip(texts, generated, steps)
        ]
