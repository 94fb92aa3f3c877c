"""How the Gemma readers decode an answer: the vocabulary an answer copied from the passages can be
written with, greedy decoding within it, the stop at the end of the first worded line, the
probability of that line, and the output head's compact input.

A base model continues the prompt (models.gemma_prompt) with " <answer>\\n" and then keeps going
("Long answer: ..."), so generation stops at the end of the first line with a letter or digit in it
(a copied bullet "•" is no answer).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from models.reader_base import first_worded_line

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
    import torch  # noqa: PLC0415 (lazy: torch)

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
    import torch  # noqa: PLC0415 (lazy: torch)
    from transformers import StoppingCriteria, StoppingCriteriaList  # noqa: PLC0415 (lazy: transformers)

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
    import torch  # noqa: PLC0415 (lazy: torch)

    x = args[0]
    if x.dim() == 3 and not x.requires_grad:
        x = x.clone(memory_format=torch.contiguous_format)
    return (x, *args[1:])
