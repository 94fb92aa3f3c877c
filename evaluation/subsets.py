"""Question subsets used by evaluation: RealTimeQA's generation subset."""

from __future__ import annotations

import re

# Questions that only make sense with their multiple-choice options ("Which of the following ...",
# "pictured"): a generation-style evaluation leaves them out and says how many.
_NEEDS_CHOICES = re.compile(r"which of (the|these)|following|pictured|shown|this (image|photo)", re.IGNORECASE)


def needs_choices(question: str) -> bool:
    return bool(_NEEDS_CHOICES.search(question))
