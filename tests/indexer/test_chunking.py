"""Chunking: 6-sentence passage bodies, their dated text, the word budget, and that passages cover
the text in order."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from indexer.chunking import chunk_texts, dated_text, split_passages, strip_date_prefix
from indexer.importers import read_realtimeqa

SAMPLE = Path(__file__).resolve().parents[2] / "indexer" / "sample" / "realtimeqa"
DAY = dt.date(2019, 2, 7)
PREFIX = "Thursday, February 7, 2019. "


def _sentences(n: int, words: int = 4) -> str:
    """n distinct sentences of `words` words each: 'S1 w w w.' ..."""
    return " ".join(f"S{i}" + " w" * (words - 2) + " end." for i in range(1, n + 1))


def test_split_passages_gives_bodies_and_dated_text_prefixes_the_long_date():
    passages = split_passages("The harbour wall was repaired. Work took a year.")
    assert passages == ["The harbour wall was repaired. Work took a year."]  # stored: no date
    assert dated_text(passages[0], DAY) == PREFIX + "The harbour wall was repaired. Work took a year."


def test_split_passages_packs_six_sentences_per_passage():
    passages = split_passages(_sentences(14))
    counts = [len(re.findall(r"\bS\d+\b", p)) for p in passages]
    assert counts == [6, 6, 2]
    assert passages[1].startswith("S7 ") and passages[2].startswith("S13 ")


def test_split_passages_sentences_per_passage_is_a_parameter():
    passages = split_passages(_sentences(5), sentences_per_passage=2)
    assert [len(re.findall(r"\bS\d+\b", p)) for p in passages] == [2, 2, 1]


def test_split_passages_respects_max_words_by_packing_fewer_sentences():
    text = _sentences(12, words=50)  # six of them would be 300 words
    passages = split_passages(text, max_words=180)
    assert [len(p.split()) for p in passages] == [150, 150, 150, 150]


def test_split_passages_cuts_an_overlong_sentence_into_windows():
    text = "Intro sentence here. " + " ".join(f"w{i}" for i in range(400)) + ". Outro here."
    passages = split_passages(text, max_words=180)
    sizes = [len(p.split()) for p in passages]
    assert max(sizes) <= 180
    assert sizes == [3, 134, 133, 133, 2]  # the run-on sentence stands alone, in balanced windows
    assert " ".join(passages) == text


def test_split_passages_normalises_whitespace():
    passages = split_passages("  First   sentence\there.\r\n\r\n   Second\u00a0one.  ")
    assert passages == ["First sentence here. Second one."]


def test_split_passages_line_break_ends_a_sentence():
    text = "Harbour reopens\nThe ferry runs again. Fares are unchanged.\n\nPhoto: the quay"
    passages = split_passages(text, sentences_per_passage=1)
    assert passages == [
        "Harbour reopens",
        "The ferry runs again.",
        "Fares are unchanged.",
        "Photo: the quay",
    ]


def test_split_passages_keeps_opening_quote_with_its_sentence():
    text = 'He said so. "We will build," she said. Done.'
    passages = split_passages(text, sentences_per_passage=1)
    assert passages == ["He said so.", '"We will build," she said.', "Done."]


@pytest.mark.parametrize("text", ["", "   ", "\n\n \t\n"])
def test_split_passages_empty_text_returns_no_passages(text):
    assert split_passages(text) == []


@pytest.mark.parametrize("kwargs", [{"sentences_per_passage": 0}, {"max_words": 0}, {"max_words": 1.5}])
def test_split_passages_rejects_bad_sizes(kwargs):
    with pytest.raises(ValueError):
        split_passages("One. Two.", **kwargs)


def test_split_passages_covers_sample_articles_in_order_within_limits():
    articles, _, _ = read_realtimeqa(SAMPLE)
    for article in articles:
        bodies = split_passages(article.text)
        assert " ".join(bodies) == " ".join(article.text.split())
        assert all(len(b.split()) <= 180 for b in bodies)
        assert len(bodies) == 2  # 7 to 12 sentences each, short ones: one full passage and the rest


def test_chunk_texts_matches_split_passages_and_keeps_order():
    articles, _, _ = read_realtimeqa(SAMPLE)
    items = [a.text for a in articles[:10]]
    items.insert(3, "")
    batched = chunk_texts(items, batch_size=4)
    assert batched == [split_passages(text) for text in items]
    assert batched[3] == []
    assert batched == chunk_texts(items)  # deterministic


def test_strip_date_prefix_takes_off_only_the_prefix_older_passages_carried():
    old = dated_text("Mr. Smith won on Friday. He left in 2019.", DAY)  # a passage as stored before 0007
    assert strip_date_prefix(old, DAY) == "Mr. Smith won on Friday. He left in 2019."
    assert strip_date_prefix("Mr. Smith won.", DAY) == "Mr. Smith won."  # no prefix: unchanged
    assert strip_date_prefix(old, DAY + dt.timedelta(days=1)) == old  # another day's prefix stays
