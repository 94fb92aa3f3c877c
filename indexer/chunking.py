"""Articles -> passages, as StreamingQA cuts them: up to 6 sentences each.

A passage is stored as its body, "<sentence 1> <sentence 2> ... <sentence 6>"; what a model reads
(the encoder, BM25, the readers, the re-ranker) is its dated text, `dated_text(body, published)`:

    "Thursday, February 7, 2019. <sentence 1> <sentence 2> ... <sentence 6>"

Sentences come from spaCy's rule-based sentencizer on a blank English pipeline (no model to
download). A line break is always a sentence boundary: scraped news separates paragraphs,
headlines and captions by newlines, often without a full stop. Whitespace is normalised to single
spaces, so the passage bodies of an article, joined by spaces, give back its normalised text.

Example:
    >>> split_passages("One. Two.\\n\\nThree")
    ['One. Two. Three']
    >>> dated_text("One. Two. Three", dt.date(2019, 2, 7))
    'Thursday, February 7, 2019. One. Two. Three'
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import TYPE_CHECKING

from indexer.dates import format_long

if TYPE_CHECKING:
    from spacy.language import Language
    from spacy.tokens import Doc

SENTENCES_PER_PASSAGE = 6
MAX_WORDS = 180
# Upper bound on one spaCy doc. The blank pipeline only tokenizes, so memory stays small; a longer
# paragraph (none is expected: RealTimeQA texts are capped at 100,000 characters) is cut at
# whitespace first.
_MAX_CHARS = 2_000_000
_LINE_BREAKS = re.compile(r"\s*[\n\r\u2028\u2029]\s*")


@lru_cache(maxsize=1)
def _sentencizer() -> Language:
    """spacy.blank('en') + sentencizer, built once per process (importing spaCy costs ~1 s)."""
    import spacy  # noqa: PLC0415 (lazy: spaCy takes ~1 s to import)

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    nlp.max_length = _MAX_CHARS + 1
    return nlp


def _date_prefix(published: dt.date) -> str:
    """'Thursday, February 7, 2019. ': what the dated text of every passage published that day starts with."""
    return format_long(published) + ". "


def dated_text(text: str, published: dt.date) -> str:
    """A passage body as a model reads it, its publication day first:
    "Thursday, February 7, 2019. <body>". The one place the date prefix is added: every encoder
    input, BM25 document, reader context and re-ranker input goes through it."""
    return _date_prefix(published) + text


def _check_sizes(sentences_per_passage: int, max_words: int) -> None:
    if not isinstance(sentences_per_passage, int) or sentences_per_passage < 1:
        raise ValueError(f"sentences_per_passage must be a positive integer, not {sentences_per_passage!r}")
    if not isinstance(max_words, int) or max_words < 1:
        raise ValueError(f"max_words must be a positive integer, not {max_words!r}")


def _paragraphs(text: str) -> list[str]:
    """Non-empty lines with whitespace normalised, each short enough for one spaCy doc."""
    pieces = []
    for line in _LINE_BREAKS.split(text):
        line = " ".join(line.split())
        while len(line) > _MAX_CHARS:
            cut = line.rfind(" ", 0, _MAX_CHARS)
            cut = cut if cut > 0 else _MAX_CHARS
            pieces.append(line[:cut])
            line = line[cut:].lstrip()
        if line:
            pieces.append(line)
    return pieces


def _word_windows(words: list[str], max_words: int) -> list[str]:
    """An over-long sentence -> ceil(n / max_words) windows of near-equal size, in order."""
    count = -(-len(words) // max_words)
    size, extra = divmod(len(words), count)
    windows, start = [], 0
    for i in range(count):
        end = start + size + (i < extra)
        windows.append(" ".join(words[start:end]))
        start = end
    return windows


def _pack(sentences: Iterable[str], sentences_per_passage: int, max_words: int) -> list[str]:
    """Greedy packing: add sentences until the count or the word budget would be exceeded."""
    passages: list[str] = []
    current: list[str] = []
    words = 0

    def flush() -> None:
        nonlocal current, words
        if current:
            passages.append(" ".join(current))
        current, words = [], 0

    for sentence in sentences:
        n = len(sentence.split())
        if n > max_words:  # a run-on "sentence" (a table, a list of names): cut it into windows
            flush()
            passages.extend(_word_windows(sentence.split(), max_words))
            continue
        if len(current) == sentences_per_passage or words + n > max_words:
            flush()
        current.append(sentence)
        words += n
    flush()
    return passages


def _doc_sentences(doc: Doc) -> list[str]:
    """The sentencizer's sentences, each boundary moved back to the nearest space.

    After a full stop the sentencizer keeps every punctuation token with the old sentence, opening
    quotes included ('said. "| They'): moving the start back to the space gives 'said.| "They' and
    keeps the text intact. A boundary with no space before it since the last one is dropped.
    """
    starts = [0]
    for sent in doc.sents:
        i = sent.start
        while i > starts[-1] and doc[i - 1].whitespace_ == "":
            i -= 1
        if i > starts[-1]:
            starts.append(i)
    bounds = [doc[i].idx for i in starts] + [len(doc.text)]
    spans = (doc.text[a:b].strip() for a, b in zip(bounds, bounds[1:]))
    return [span for span in spans if span]


def _sentences(docs: Iterator[Doc], counts: list[int]) -> Iterator[list[str]]:
    """Regroup the docs of all paragraphs into one sentence list per article."""
    for count in counts:
        sentences: list[str] = []
        for _ in range(count):
            sentences.extend(_doc_sentences(next(docs)))
        yield sentences


def chunk_texts(
    texts: Iterable[str],
    *,
    sentences_per_passage: int = SENTENCES_PER_PASSAGE,
    max_words: int = MAX_WORDS,
    batch_size: int = 256,
) -> list[list[str]]:
    """Split many article texts at once; one list of passage bodies per text, in input order.

    Same output as calling `split_passages` on each text, faster: all paragraphs go through one
    `nlp.pipe` stream.
    """
    _check_sizes(sentences_per_passage, max_words)
    paragraphs = [_paragraphs(text or "") for text in texts]
    flat = (p for ps in paragraphs for p in ps)
    docs = iter(_sentencizer().pipe(flat, batch_size=batch_size))
    return [
        _pack(sentences, sentences_per_passage, max_words)
        for sentences in _sentences(docs, [len(ps) for ps in paragraphs])
    ]


def split_passages(
    text: str, *, sentences_per_passage: int = SENTENCES_PER_PASSAGE, max_words: int = MAX_WORDS
) -> list[str]:
    """Cut one article into passages of up to `sentences_per_passage` consecutive sentences.

    Each passage is its body, "<sentences>" (`dated_text` puts "<Weekday, Month D, YYYY>. " before
    it for a model), and holds at most `max_words` words of article text: fewer sentences are
    packed when needed, and a single longer sentence is cut into word windows. Empty text gives [].
    """
    return chunk_texts([text], sentences_per_passage=sentences_per_passage, max_words=max_words)[0]


def strip_date_prefix(text: str, published: dt.date) -> str:
    """The body of a passage text of the older format, which carried its date prefix: "Thursday,
    February 7, 2019. <body>" -> "<body>" (anything else comes back unchanged). Only for data
    written before passages were stored as bodies: training examples saved by an older version
    (models.training.TrainExample.from_json). The database's rows are migrated instead
    (migrations/versions/0007)."""
    return text.removeprefix(_date_prefix(published))
