"""bench/bench_context.py: the recipes it parses, and what it counts as read."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from bench import bench_context
from models.reader_base import RetrievedPassage

DAY = dt.date(2023, 3, 1)


def test_recipes_parse_and_a_bad_one_says_which_forms_are_accepted():
    first, select = bench_context.recipes_argument("first:5x60, select:10:550")
    assert (first.passages, first.words, first.context_words) == (5, 60, 0)
    assert (select.passages, select.context_words) == (10, 550)
    for bad in ("first:5", "first:0x100", "select:5", "select:5:-1", "last:5x100", "first:fivex100"):
        with pytest.raises(ValueError, match="use first:NxW"):
            bench_context.parse_recipe(bad)


def test_an_answer_counts_as_read_only_where_the_recipe_keeps_it():
    """The answer sits late in the top passage: 100 words read it, 20 do not; a selection of the
    sentence that shares the question's words reads it in fewer words, and tokens follow the words."""
    filler = " ".join(f"word{i}" for i in range(40))
    top = RetrievedPassage("Finals", f"{filler}. The Denver Nuggets won the NBA championship.", DAY)
    other = RetrievedPassage("Other", "Rain fell in Ohio on Monday.", DAY)
    q = SimpleNamespace(qid="q1", text="Who won the NBA championship?", asked=DAY, answers=("Denver Nuggets",))
    none = SimpleNamespace(qid="q2", text="Who won the Stanley Cup?", asked=DAY, answers=("Vegas Golden Knights",))
    recipes = [bench_context.parse_recipe(r) for r in ("first:2x100", "first:2x20", "select:2:20")]
    rows = bench_context.measure(
        [q, none], lambda _: [top, other], recipes, lambda prompt: len(prompt.split()), titles=False
    )
    assert [row["held"] for row in rows] == [{"q1"}, set(), {"q1"}]
    long, short, selected = (sum(row["tokens"]) for row in rows)
    assert short < long and selected < long
