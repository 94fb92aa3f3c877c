"""Why a sentence or a candidate entity is not used: RULES names every reason, GenerationStats
counts them, and the rules here apply them to a sentence, an answer entity or a finished question.

Quality matters more than quantity: each rule in RULES rejects a sentence or a candidate for a
named reason, and GenerationStats counts the rejections by reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from models.selflabel.lexicon import (
    _BOILERPLATE,
    _CAPTION_DATE,
    _CREDIT,
    _DATELINE,
    _FIRST_PERSON,
    _GENERIC,
    _MONTHS,
    _NAME_LABELS,
    _POSSESSIVE_PRONOUNS,
    _PRONOUNS,
    _QUOTED,
    _RELATIVE,
    _REPORTING,
    _WHAT_LABELS,
)

if TYPE_CHECKING:  # importing spaCy costs about a second; only load_nlp does it
    from spacy.tokens import Span, Token

MIN_WORDS, MAX_WORDS = 8, 45
MAX_ANSWER_TOKENS = 5
MAX_QUESTION_WORDS = 32

# Why a sentence (s) or a candidate entity (c) was not used. Sentence reasons count sentences,
# candidate reasons count entities; `candidates == accepted + sum of the candidate reasons`.
RULES: dict[str, str] = {
    "boilerplate": "(s) byline, dateline, photo credit or caption, newsletter, link or copyright line",
    "not_a_statement": "(s) a question, no final punctuation (headline, caption, list item), a "
    "'Label: text' lead-in, or no main verb with a subject (fragment, imperative)",
    "sentence_length": f"(s) fewer than {MIN_WORDS} or more than {MAX_WORDS} words",
    "direct_speech": "(s) a quotation of 3 or more words, an unbalanced quotation mark, or a first-person "
    "pronoun (unquoted speech, columns)",
    "pronoun_subject": "(s, c) the clause's subject is a pronoun or has a pronoun possessor "
    "('He said ...', 'It was ...', 'Their team ...'): ambiguous without context",
    "no_entity": "(s) no entity of a label we ask about",
    "long_answer": f"(c) the answer has more than {MAX_ANSWER_TOKENS} tokens",
    "generic_answer": "(c) the answer is a pronoun or a generic word ('today', 'one', 'this week')",
    "relative_date": "(c) a DATE with neither a month nor a year ('Tuesday', 'last year', 'two weeks')",
    "unreliable_entity": "(c) a FAC, EVENT, WORK_OF_ART, LAW or PRODUCT that is not a multi-word title-case "
    "name (the small model's weakest labels); a name the article also tags with "
    "another label ('Brooks' ORG beside 'Garth Brooks' PERSON); a credit word "
    "(Reuters, Getty); a CARDINAL that is not a count (0.38); a PERSON whose question says 'its'",
    "coordinated": "(c) the entity is a conjunct or an apposition: only part of the answer",
    "modifier": "(c) the entity modifies a noun ('the Denver-based firm', 'a $5 million deal')",
    "partial_entity": "(c) the entity misses proper-noun parts of its phrase ('Broncos' of 'Denver Broncos')",
    "embedded_clause": "(c) the entity is inside a subordinate clause (relative, adverbial, ...) or "
    "in the second of two coordinated predicates",
    "no_question_form": "(c) no grammatical question: unsupported position or preposition",
    "answer_in_question": "(c) a word of the answer also appears in the question",
    "parenthetical": "(c) the question would keep a dash or bracket aside (the parser often misattaches "
    "them) or half of a quotation",
    "little_context": "(c) the question keeps fewer than 3 content words or no other proper noun",
    "long_question": f"(c) the question has more than {MAX_QUESTION_WORDS} words",
    "duplicate": "(c) the same question was already generated",
    "same_sentence": "(c) another question from the same sentence was chosen",
    "article_limit": "(c) the article already gave max_per_article questions",
}


@dataclass
class GenerationStats:
    articles: int = 0
    sentences: int = 0
    candidates: int = 0
    accepted: int = 0
    rejected: dict[str, int] = field(default_factory=dict)

    def reject(self, reason: str) -> None:
        assert reason in RULES, reason
        self.rejected[reason] = self.rejected.get(reason, 0) + 1


def _plain(text: str) -> str:
    """The answer as a reader should give it: no leading 'the', no trailing possessive."""
    text = re.sub(r"^(?:the|this|that)\s+", "", text.strip(), flags=re.IGNORECASE)
    return re.sub(r"(?:'s|’s|')$", "", text).strip()


def _words(tokens) -> int:
    return sum(1 for t in tokens if not (t.is_punct or t.is_space))


def _clause_subject(verb: Token) -> Token | None:
    return next((c for c in verb.children if c.dep_ in ("nsubj", "nsubjpass")), None)


def _is_pronoun_subject(subject: Token | None) -> bool:
    if subject is None:
        return False
    return (
        subject.pos_ == "PRON"
        or subject.lower_ in _PRONOUNS
        or any(c.dep_ == "poss" and c.lower_ in _POSSESSIVE_PRONOUNS for c in subject.children)
    )


def _report(sent: Span) -> Token | None:
    """The reported clause's verb when the sentence is 'X said (that) C' or 'C, X said'."""
    root = sent.root
    if root.lemma_ not in _REPORTING:
        return None
    return next((c for c in root.children if c.dep_ == "ccomp"), None)


def _sentence_rejection(sent: Span) -> str | None:
    text = sent.text.strip()
    if (
        _BOILERPLATE.search(text)
        or _DATELINE.search(text)
        or (sent.root.tag_ in ("VBZ", "VBP") and _CAPTION_DATE.search(text))
    ):
        return "boilerplate"  # ... or a photo caption: "A villager looks at ... on November 22, 2022."
    if text.endswith("?") or not re.search(r"[.!][\"”’')]*$", text) or re.search(r"\w: ", text):
        return "not_a_statement"
    if not MIN_WORDS <= _words(sent) <= MAX_WORDS:
        return "sentence_length"
    root = sent.root
    if root.pos_ not in ("VERB", "AUX") or not any(
        c.dep_ in ("nsubj", "nsubjpass", "expl", "csubj") for c in root.children
    ):
        return "not_a_statement"  # a fragment, caption or imperative ("Select your seats ...")
    quote_marks = len(re.findall(r"[\"“”«»]", text))
    if (
        quote_marks % 2
        or any(len(q.split()) >= 3 for q in _QUOTED.findall(text))
        or any(t.lower_ in _FIRST_PERSON and t.pos_ == "PRON" or t.text == "I" for t in sent)
    ):
        return "direct_speech"  # quoted, or unquoted first-person speech ("God bless my ...")
    first = next(t for t in sent if not t.is_punct)
    first = first if first.dep_ != "cc" else first.nbor()  # "But he said ..."
    report = _report(sent)
    if (
        first.pos_ == "PRON"
        and first.lower_ in _PRONOUNS | _POSSESSIVE_PRONOUNS
        or (report is None and _is_pronoun_subject(_clause_subject(sent.root)))
    ):
        return "pronoun_subject"
    return None


def _answer_rejection(ent: Span, conflicts: set[str]) -> str | None:
    tokens = [t for t in ent if not t.is_punct]
    if len(tokens) > MAX_ANSWER_TOKENS:
        return "long_answer"
    plain = _plain(ent.text).lower()
    if plain in _GENERIC or plain in _PRONOUNS or not plain:
        return "generic_answer"
    if ent.label_ == "DATE":
        words = set(re.findall(r"[a-z]+", plain))
        anchored = bool(words & set(_MONTHS)) or re.search(r"\b(1[89]|20)\d\d(s)?\b", plain)
        if not anchored or words & _RELATIVE:
            return "relative_date"
    if ent.label_ == "CARDINAL" and re.fullmatch(r"(1[89]|20)\d\d", plain):
        return "generic_answer"  # a year mis-labelled CARDINAL
    titles = [t for t in tokens if t.is_title]
    if (
        titles
        and all(f"{t.lower_}|{ent.label_}" in conflicts for t in titles)
        or f"{plain}|{ent.label_}" in conflicts
        or (len(tokens) == 1 and tokens[0].is_upper and len(plain) > 5)
        or _CREDIT.search(ent.text)
        or ent.label_ == "CARDINAL"
        and re.search(r"\d\.\d", plain)
        and not re.search(r"illion", plain)
    ):
        return "unreliable_entity"
    if ent.label_ in _WHAT_LABELS and (
        len(tokens) < 2
        or any(t.like_num for t in tokens)
        or not all(t.is_title or t.is_stop or not t.is_alpha for t in tokens)
    ):
        return "unreliable_entity"
    return None


def _context_rejection(items: list, ent: Span, verb: Token) -> str | None:
    kept = [t for t in items if not isinstance(t, str)]  # sentence tokens: the wh-words are strings
    others = [t.lower_ for t in kept if not ent.start <= t.i < ent.end]  # "how many inches" keeps "inches"
    answer_words = {t.lower_ for t in ent if not (t.is_stop or t.is_punct)}
    if answer_words & set(others) or _plain(ent.text).lower() in " ".join(others):
        return "answer_in_question"
    content = {t.i for t in kept if t.pos_ in ("NOUN", "PROPN", "VERB", "ADJ", "NUM") and not t.is_stop}
    if verb.pos_ == "VERB":
        content.add(verb.i)  # after do-support the verb is a lemma string ("did ... replace")
    proper = [t for t in kept if t.ent_type_ in _NAME_LABELS or t.pos_ == "PROPN" and not t.ent_type_]
    if len(content) < 3 or not proper:
        return "little_context"
    if _words(kept) > MAX_QUESTION_WORDS:
        return "long_question"
    return None


def _label_conflicts(docs: list) -> set[str]:
    """Names the small model tags inconsistently within one article: 'word|LABEL' for each
    capitalised word of a PERSON name (so that 'Brooks' ORG beside 'Garth Brooks' PERSON is
    refused), and 'name|PERSON' for each whole ORG, GPE or LOC name ('Pinar del Rio')."""
    found: set[str] = set()
    for doc in docs:
        for ent in doc.ents:
            if ent.label_ == "PERSON":
                found.update(
                    f"{t.lower_}|{label}" for t in ent if t.is_title for label in ("ORG", "GPE", "LOC", "FAC", "NORP")
                )
            elif ent.label_ in ("ORG", "GPE", "LOC"):
                found.add(f"{_plain(ent.text).lower()}|PERSON")
    return found
