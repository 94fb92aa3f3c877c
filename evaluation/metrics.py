"""Answer metrics: SQuAD normalisation, exact match, token F1, answer recall in passages, passage age.

Normalisation follows the official SQuAD v1.1/v2.0 script (lower-case, drop punctuation, drop the
articles a/an/the, collapse whitespace), extended so that Unicode punctuation is dropped too:
curly quotes, dashes, ellipses and the like ("“Biden’s”" matches "Bidens", as "\"Biden's\"" does
in SQuAD). Punctuation is *deleted*, not replaced by a space, exactly as in SQuAD, which has these
consequences for numbers (kept on purpose, so scores stay comparable with published ones):

- "1,200" and "1200" both normalise to "1200": they match.
- "1 200" (space as thousands separator) stays "1 200": it does not match "1200".
- "1.5" and "15" both normalise to "15": a (rare) false match, as in SQuAD.
- "2020–2021" (en dash) and "2020-2021" both become "20202021".

Words are not spelled out: "five" does not match "5".
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime

PRIMARY_METRIC = "f1"
GREATER_IS_BETTER = True

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _is_punctuation(ch: str) -> bool:
    # string.punctuation is SQuAD's set (it includes $ + < = > ^ ` | ~); Unicode categories P*
    # add curly quotes, dashes, guillemets...; Sc adds currency signs so "€5" behaves like "$5".
    if ch in string.punctuation:
        return True
    category = unicodedata.category(ch)
    return category.startswith("P") or category == "Sc"


def normalize_answer(s: str) -> str:
    """Normalise an answer the SQuAD way, also removing Unicode punctuation.

    Args:
        s: a predicted or reference answer.

    Returns:
        The lower-cased text without punctuation or articles, tokens separated by single spaces.

    Example:
        >>> normalize_answer("“The Eiffel Tower’s” — top!")
        'eiffel towers top'
    """
    s = s.lower()
    s = "".join(ch for ch in s if not _is_punctuation(ch))
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _as_list(references: str | Iterable[str]) -> list[str]:
    return [references] if isinstance(references, str) else list(references)


def _gold_answers(references: str | Iterable[str]) -> list[str]:
    """Normalised references, SQuAD v2 style: empty ones dropped unless all are empty.

    A question with no (non-empty) reference is a no-answer question whose only gold answer is
    the empty string, so only an empty prediction scores on it.
    """
    normalised = [normalize_answer(r) for r in _as_list(references)]
    non_empty = [r for r in normalised if r]
    return non_empty or [""]


def exact_match(prediction: str, references: str | Iterable[str]) -> float:
    """1.0 when the normalised prediction equals some normalised reference, else 0.0.

    Args:
        prediction: the model's answer ("" for no answer).
        references: one reference or several; empty references count only if all are empty.

    Returns:
        0.0 or 1.0.
    """
    pred = normalize_answer(prediction)
    return float(any(pred == gold for gold in _gold_answers(references)))


def _f1(pred_tokens: Sequence[str], gold_tokens: Sequence[str]) -> float:
    if not pred_tokens or not gold_tokens:
        # SQuAD: if either side is empty, F1 is 1 only when both are.
        return float(len(pred_tokens) == len(gold_tokens))
    common = Counter(pred_tokens) & Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, references: str | Iterable[str]) -> float:
    """SQuAD token F1 (bag of normalised tokens), best over the references.

    Args:
        prediction: the model's answer ("" for no answer).
        references: one reference or several.

    Returns:
        F1 in [0, 1]; 1.0 for an empty prediction only when every reference is empty.

    Example:
        >>> round(token_f1("the big red dog", ["red dog"]), 4)   # P = 2/3, R = 1
        0.8
    """
    pred_tokens = normalize_answer(prediction).split()
    return max(_f1(pred_tokens, gold.split()) for gold in _gold_answers(references))


def answer_in_text(references: str | Iterable[str], text: str) -> bool:
    """Whether some reference occurs in the text as a whole-token span, both normalised.

    Used for retrieval recall ("is an answer in the top-k passages?"). "car" is not found in
    "the carpet"; "New York" is found in "in New York." but not in "new-york" (the hyphen is
    deleted, leaving the single token "newyork"). Empty references never match.

    Args:
        references: one reference or several.
        text: a passage, or several passages joined.

    Returns:
        True when a non-empty normalised reference is a contiguous token span of the text.
    """
    return answer_in_haystack(references, haystack(text))


def haystack(text: str) -> str:
    """`text` normalised and padded with a space each side: what `answer_in_haystack` searches.
    Worth keeping when one text is searched for many questions' answers."""
    return f" {normalize_answer(text)} "


def answer_in_haystack(references: str | Iterable[str], padded: str) -> bool:
    """`answer_in_text` over a text already passed through `haystack`."""
    for ref in _as_list(references):
        needle = normalize_answer(ref)
        # Tokens are single-space separated, so padding with spaces makes substring search a
        # whole-token span search.
        if needle and f" {needle} " in padded:
            return True
    return False


def answer_support(answer: str, texts: Iterable[str]) -> list[int]:
    """The positions of the `texts` that hold `answer` as a whole-token span (`answer_in_text`):
    which of the passages a reader read state its answer. An empty answer is held by none
    (`answer_in_text` never matches an empty reference).

    Example:
        >>> answer_support("Denver Nuggets", ["The Denver Nuggets won.", "Miami lost.", "denver nuggets!"])
        [0, 2]
    """
    return [i for i, text in enumerate(texts) if answer_in_text(answer, text)]


# Words a question shares with any sentence: they tell nothing about where its answer is.
_EVIDENCE_STOP = frozenset(
    """
a an the and or but if of to in on at by for with from as into about over after before between under
than then so such that this these those there here is are was were be been being am do does did has
have had it its he she they them his her their our we you your who whom whose what which when where
why how many much week weeks year years month months day days last past recent recently new news
according said says not no will would can could should may might one also more most other
""".split()
)
# A sentence ends at . ! ? (optionally closed by a quote or bracket) before a space and a capital,
# a digit or an opening quote. Abbreviations ("U.S. President") split wrongly now and then; the
# cost is a sentence kept in two halves, not a lost word. (models.reader_context splits passages with it too.)
SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)\]]?\s+(?=[A-Z0-9\"'“‘(])")


def _content_words(text: str) -> set[str]:
    return {w for w in normalize_answer(text).split() if w not in _EVIDENCE_STOP and len(w) > 2}


def answer_in_evidence(references: str | Iterable[str], question: str, text: str, *, min_shared: int = 2) -> bool:
    """Whether `text` holds a reference *as an answer to `question`*: in a sentence that also holds at
    least `min_shared` of the question's content words (or all of them, for a question with fewer).

    `answer_in_text` alone is a weak sign of evidence for short answers: "4" or "Texas" occurs in
    most long articles whatever the question. A sentence that holds the answer beside the question's
    own words is what a reader (or a person) would point to.

    Example:
        >>> q = "How many astronauts will fly around the Moon on Artemis II?"
        >>> answer_in_evidence("4", q, "Four crew members were named. The 4 astronauts of Artemis II will fly.")
        True
        >>> answer_in_evidence("4", q, "Artemis II will fly around the Moon. It costs 4 billion dollars a year.")
        False
    """
    asked = _content_words(question)
    need = min(min_shared, len(asked))
    for sentence in SENTENCE_END.split(" ".join(text.split())):
        if answer_in_text(references, sentence) and len(asked & _content_words(sentence)) >= need:
            return True
    return False


def _as_date(value: date | datetime | str) -> date:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"datetime {value.isoformat()} is naive (give a timezone-aware UTC datetime or a date)")
        return value.astimezone(UTC).date()
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(value)
    except (TypeError, ValueError):
        raise ValueError(f"{value!r} is not a date (use YYYY-MM-DD)") from None


def days_between(question_date: date | datetime | str, passage_dates: Iterable[date | datetime | str]) -> list[int]:
    """Age of each passage on the question's date, in days.

    Args:
        question_date: the question's as_of (a date, an aware datetime, or "YYYY-MM-DD").
        passage_dates: publication dates of the retrieved passages, same forms.

    Returns:
        question_date - passage_date in days for each passage: positive for older passages,
        0 for the same day, negative for a passage published after the question (a leak).
    """
    asked = _as_date(question_date)
    return [(asked - _as_date(d)).days for d in passage_dates]
