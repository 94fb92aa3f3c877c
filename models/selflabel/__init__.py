"""Self-labeled questions: a dated news sentence with a named entity becomes a question whose
answer is that entity (StreamingQA's generated questions; Agarwal & Nenkova's self-labeling).

    "Trudeau said Canada will send 300 troops to Latvia in March."      (published 2023-02-14)
      -> "Which country will send 300 troops to Latvia in March?"        Canada   (GPE)
      -> "How many troops will Canada send to Latvia in March?"          300      (CARDINAL)
      -> "Where will Canada send 300 troops in March?"                   Latvia   (GPE)

spaCy's en_core_web_sm finds the entities and parses the sentence. An entity that is the subject
of the main clause gives a fronted question ("Who announced ...?"); an object or a prepositional
phrase of the main verb is fronted with subject-auxiliary inversion or do-support ("Where will
Canada send ...?"); anything else is asked in situ ("... a trip to which city?"). A reporting frame
("X said (that) ...", "..., officials said") is dropped when the entity is inside the report.

Quality matters more than quantity: each rule in RULES rejects a sentence or a candidate for a
named reason, and GenerationStats counts the rejections by reason.

Each sentence gives at most one question, chosen by the seed:
    >>> text = "Trudeau said Canada will send 300 troops to Latvia in March."
    >>> [(q.question, q.answer) for q in generate_questions([ArticleText(url, title, text, day)], seed=2)]
    [('How many troops will Canada send to Latvia in March?', '300')]

Throughput on CPU is about 8 articles/s (6,000 characters each, 2 busy cores): the parser dominates.

The package, by concern: `lexicon` (word lists and patterns), `filters` (RULES and the rules that
reject a sentence, an answer or a finished question), `questions` (turning one entity of a parsed
sentence into a question), `generate` (articles in, questions out). Sampling stored articles from
the database is a job's business: `workers/selflabel_sample.py`.
"""

from __future__ import annotations

from models.selflabel.filters import MAX_ANSWER_TOKENS, MAX_QUESTION_WORDS, MAX_WORDS, MIN_WORDS, RULES, GenerationStats
from models.selflabel.generate import ArticleLike, ArticleText, GeneratedQuestion, generate_questions, load_nlp

__all__ = [
    "MIN_WORDS",
    "MAX_WORDS",
    "MAX_ANSWER_TOKENS",
    "MAX_QUESTION_WORDS",
    "RULES",
    "ArticleLike",
    "ArticleText",
    "GeneratedQuestion",
    "GenerationStats",
    "generate_questions",
    "load_nlp",
]
