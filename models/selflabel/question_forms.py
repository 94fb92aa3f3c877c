"""One entity of an accepted sentence -> a question whose answer is that entity.

An entity that is the subject of the main clause gives a fronted question ("Who announced ...?");
an object or a prepositional phrase of the main verb is fronted with subject-auxiliary inversion or
do-support ("Where will Canada send ...?"); anything else is asked in situ ("... a trip to which
city?"). A reporting frame ("X said (that) ...", "..., officials said") is dropped when the entity
is inside the report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from models.selflabel.filters import (
    _answer_rejection,
    _clause_subject,
    _context_rejection,
    _is_pronoun_subject,
    _report,
)
from models.selflabel.lexicon import (
    _ASIDES,
    _CITIES,
    _CLITICS,
    _CONNECTIVES,
    _COUNTRIES,
    _MOTION_PREPS,
    _POSSESSOR_WH,
    _QUOTE_MARKS,
    _STATES,
    _WH,
    _WHEN_KEEP_PREPS,
    _WHEN_PREPS,
    _WHERE_PREPS,
)

if TYPE_CHECKING:  # importing spaCy costs about a second; only load_nlp does it
    from spacy.tokens import Span, Token


def _gpe_wh(ent: Span) -> str:
    name = ent.text.lower()
    if name in _COUNTRIES:
        return "which country"
    if name in _STATES:
        return "which state"
    if name in _CITIES:
        return "which city"
    appos = [c for c in ent.root.children if c.dep_ == "appos"]
    if appos and " ".join(t.text for t in appos[0].subtree).lower() in _COUNTRIES | _STATES:
        return "which city"  # "Edmonton, Canada"
    return "which place"


def _wh(ent: Span, *, after_prep: bool = False) -> str:
    if ent.label_ == "GPE":
        return _gpe_wh(ent)
    if ent.label_ == "PERSON" and after_prep:
        return "whom"
    return _WH[ent.label_]


@dataclass
class _Target:
    """The phrase the wh-words replace: sentence tokens [start, end) and its syntactic head."""

    head: Token
    start: int
    end: int
    wh: list  # words (str) and kept sentence tokens (Token), in order
    is_pp: bool = False  # the target includes its preposition ("in Denver" -> "where")


def _noun_phrase(ent: Span) -> _Target | str:
    """The noun phrase the wh-words replace, or the rejection reason."""
    head, label = ent.root, ent.label_
    if head.dep_ in ("conj", "appos") or any(c.dep_ in ("conj", "cc") for c in head.children):
        return "coordinated"
    if ent.end < len(ent.doc) and ent.doc[ent.end].tag_ == "POS" and head.dep_ != "poss":
        return "no_question_form"  # a possessive the parser attached elsewhere
    if any(t.dep_ in ("cc", "conj") and not ent.start <= t.i < ent.end for t in head.subtree):
        return "coordinated"  # "Health Secretary Sajid Javid and ... Rishi Sunak announced"
    if label != "PERSON" and any(c.dep_ == "compound" and c.pos_ == "PROPN" and c.i < ent.start for c in head.children):
        return "partial_entity"
    if label == "CARDINAL":
        noun = head.head  # "300 troops": ask "how many troops"
        if head.dep_ != "nummod" or noun.tag_ not in ("NNS", "NNPS") or noun.i < head.i:
            return "no_question_form"  # "a family of four": "how many" needs a counted noun
        kept = [t for t in noun.subtree if ent.end <= t.i <= noun.i]
        return _Target(noun, noun.left_edge.i, noun.right_edge.i + 1, ["how many", *kept])
    if label == "QUANTITY":
        unit = [t for t in ent if not (t.like_num or t.is_punct or t.dep_ in ("quantmod", "advmod"))]
        if head.dep_ in ("nummod", "compound", "amod", "nmod"):
            return "modifier"
        if not unit or head.tag_ != "NNS":
            return "no_question_form"
        of = [t for t in head.subtree if t.i >= ent.end]  # "10 inches of snow"
        return _Target(head, head.left_edge.i, head.right_edge.i + 1, ["how many", *unit, *of])
    if head.dep_ == "poss" and label in _POSSESSOR_WH:
        owner = head.head  # "Canada's Truth Commission" -> "which country's Truth Commission"
        kept = [t for t in owner.subtree if t.dep_ != "det" and not head.left_edge.i <= t.i <= head.right_edge.i]
        wh = "which country's" if _wh(ent) == "which country" else _POSSESSOR_WH[label]
        return _Target(owner, owner.left_edge.i, owner.right_edge.i + 1, [wh, *kept])
    if (
        head.dep_ in ("compound", "amod", "nmod", "nummod", "quantmod", "poss", "advmod")
        or label == "NORP"
        and head.pos_ not in ("PROPN", "NOUN")
    ):
        return "modifier"
    return _Target(head, head.left_edge.i, head.right_edge.i + 1, [_wh(ent)])


def _target(ent: Span) -> _Target | str:
    """Where the wh-words go: the noun phrase, or the prepositional phrase of a verb around it."""
    np = _noun_phrase(ent)
    if isinstance(np, str):
        return np
    head, label = np.head, ent.label_
    if head.dep_ in ("conj", "appos") or any(c.dep_ in ("conj", "cc") for c in head.children):
        return "coordinated"  # "had 17 points and 11 rebounds"
    simple = head == ent.root  # the wh-words replace the whole phrase
    if simple and label == "PERSON" and head.dep_ == "pobj":
        np.wh = ["whom"]
    if head.dep_ == "pobj" and head.head.dep_ in ("prep", "agent"):
        prep = head.head
        p = prep.lower_
        if prep.head.pos_ not in ("VERB", "AUX") or prep.head.lower_ == "according":
            if label == "FAC" and simple:
                np.wh = ["which place"]  # "officers at which place", not "officers at what"
            return "no_question_form" if label == "DATE" else np  # "a trip to which city"
        if simple and label == "DATE":
            wh = ["when"] if p in _WHEN_PREPS else [f"{p} when"] if p in _WHEN_KEEP_PREPS else None
        elif simple and label in ("GPE", "LOC", "FAC") and p in _WHERE_PREPS | _MOTION_PREPS | {"from"}:
            wh = ["from where"] if p == "from" else ["where"]
        else:
            wh = [f"{p} {np.wh[0]}", *np.wh[1:]]  # "at what percentage", "by whom", "in how many states"
        if wh is None:
            return "no_question_form"
        return _Target(head, prep.i, np.end, wh, is_pp=True)
    if label == "DATE" and head.dep_ != "npadvmod":
        return "no_question_form"  # "2022 was ...", "the 2022 vote": no English "when" form
    if head.dep_ == "npadvmod" and label == "PERCENT" and head.head.pos_ == "VERB":
        np.wh = ["by what percentage"]  # "rose 5 percent"
    elif head.dep_ == "npadvmod" and label != "DATE":
        return "no_question_form"
    if head.dep_ not in ("nsubj", "nsubjpass", "dobj", "pobj", "attr", "dative", "oprd", "npadvmod"):
        return "no_question_form"
    return np


# Dependencies that put a phrase inside a subordinate clause: no question is made there.
_EMBEDDING = {
    "advcl",
    "relcl",
    "acl",
    "parataxis",
    "csubj",
    "csubjpass",
    "ccomp",
    "pcomp",
    "appos",
    "dep",
    "meta",
    "intj",
}


def _own_clause(verb: Token) -> bool:
    """A conjoined clause with its own subject ('..., but the Pelicans closed to 100-92')."""
    return (
        verb.dep_ == "conj"
        and verb.pos_ in ("VERB", "AUX")
        and any(c.dep_ in ("nsubj", "nsubjpass", "expl") for c in verb.children)
    )


def _clause(sent: Span, target: _Target) -> tuple[Token, list[int]] | str:
    """The clause a question is made from: its verb and its token indices, or a rejection reason.

    The main clause, a reported clause ('Officials said (that) C.', 'C, officials said.': the frame
    is dropped) or a conjoined clause with its own subject. Other conjoined clauses with their own
    subject and parenthetical clauses are cut out; a target inside a subordinate clause is refused."""
    root, report = sent.root, _report(sent)
    token = target.head.head if target.is_pp else target.head
    while True:
        if token == root or (report is not None and token == report) or _own_clause(token):
            verb = token
            break
        if token.dep_ in _EMBEDDING or token.dep_ == "conj" and token.pos_ in ("VERB", "AUX"):
            return "embedded_clause"  # a subordinate clause, or one of several predicates
        token = token.head
    doc = sent.doc
    cut: set[int] = set()
    keep = {target.head.i, *(t.i for t in target.head.ancestors)}
    for child in verb.subtree:
        if child.i not in keep and (_own_clause(child) or child.dep_ == "parataxis"):
            cut.update(t.i for t in child.subtree)
            i = child.left_edge.i - 1  # the ", but" before it
            while i > child.head.i and (doc[i].is_punct or doc[i].dep_ == "cc"):
                cut.add(i)
                i -= 1
    indices = [t.i for t in verb.subtree if t.i not in cut]
    if verb == report:
        while indices and (doc[indices[0]].dep_ == "mark" or doc[indices[0]].is_punct):
            indices.pop(0)
    return verb, indices


def _third_singular(verb: Token) -> str:
    """'have' -> 'has' for a singular wh-subject ('Which group has ...')."""
    irregular = {"are": "is", "were": "was", "have": "has", "do": "does", "'re": "is", "'ve": "has"}
    if verb.lower_ in irregular:
        return irregular[verb.lower_]
    if verb.tag_ != "VBP":
        return verb.text
    lemma = verb.lemma_
    if re.search(r"(s|sh|ch|x|z|o)$", lemma):
        return lemma + "es"
    if re.search(r"[^aeiou]y$", lemma):
        return lemma[:-1] + "ies"
    return lemma + "s"


def _strip_edges(tokens: list) -> list:
    """Drop punctuation at both ends of a token run, and a leading conjunction."""
    while tokens and not isinstance(tokens[-1], str) and (tokens[-1].is_punct or tokens[-1].is_space):
        tokens = tokens[:-1]
    while tokens and not isinstance(tokens[0], str) and (tokens[0].is_punct or tokens[0].dep_ == "cc"):
        tokens = tokens[1:]
    return tokens


def _lower_first(tokens: list) -> list:
    """A sentence-initial word moved inside the question: 'The Pope' -> 'the Pope'."""
    if tokens and not isinstance(tokens[0], str) and tokens[0].pos_ != "PROPN" and tokens[0].text != "I":
        return [tokens[0].text.lower(), *tokens[1:]]
    return tokens


def _preposed(tokens: list) -> list:
    """An adverbial before the subject, to go at the end of the question; none if it is only a
    connective ('So,', 'Meanwhile,', 'But')."""
    tokens = _lower_first(_strip_edges(tokens))
    if all(not isinstance(t, str) and (t.dep_ in ("advmod", "cc", "punct", "intj")) for t in tokens):
        return []
    return tokens


def _subject_question(target: _Target, doc, clause: list[int], report: Token | None) -> list:
    """'Who' + predicate; a preposed adverbial moves to the end."""
    rest = _strip_edges([doc[i] for i in clause if i >= target.end])
    inside = set() if report is None or report.i > target.start else {t.i for t in report.subtree}
    reported = _lower_first(_strip_edges([doc[i] for i in clause if i < target.start and i in inside]))
    preposed = _preposed([doc[i] for i in clause if i < target.start and i not in inside])
    if rest and not isinstance(rest[0], str) and rest[0].dep_ == "advmod" and rest[0].lower_ in _CONNECTIVES:
        rest = rest[1:]  # "Lloyd Austin meanwhile offered" -> "Who offered"
    if not rest:
        return []
    if len(target.wh) == 1 and rest[0].pos_ in ("AUX", "VERB") and _third_singular(rest[0]) != rest[0].text:
        rest = [_third_singular(rest[0]), *rest[1:]]  # "Republicans have" -> "Which group has"
    if reported:  # "C, Joe Singer told the Free Press." -> "Who told the Free Press that C?"
        return [*target.wh, *rest, "that", *reported, *preposed]
    return [*target.wh, *rest, *preposed]


def _fronted_question(target: _Target, verb: Token, doc, clause: list[int]) -> list:
    """Move a non-subject target to the front with inversion or do-support; [] where unsure."""
    subject = _clause_subject(verb)
    if subject is None or subject.i > verb.i or target.start < verb.i < target.end:
        return []
    s0, s1 = subject.left_edge.i, subject.right_edge.i + 1
    if s0 < clause[0] or (target.start < s1 and target.end > s0):
        return []
    auxes = [c for c in verb.children if c.dep_ in ("aux", "auxpass") and s1 <= c.i < verb.i]
    middle = [doc[i] for i in range(s1, verb.i) if not (auxes and i == auxes[0].i)]
    if any(t.lower_ in ("n't", "wo", "ca", "to") or t.is_punct for t in [*auxes, *middle]):
        return []
    if auxes:
        front, verb_words = auxes[0].lower_, [verb]
    elif verb.lemma_ == "be":
        front, verb_words = verb.lower_, []
    elif verb.tag_ in ("VBD", "VBZ", "VBP"):
        front, verb_words = {"VBD": "did", "VBZ": "does", "VBP": "do"}[verb.tag_], [verb.lemma_.lower()]
    else:
        return []
    subj = _lower_first([doc[i] for i in range(s0, s1)])
    rest = _strip_edges([doc[i] for i in clause if i > verb.i and not target.start <= i < target.end])
    preposed = _preposed([doc[i] for i in clause if i < s0 and not target.start <= i < target.end])
    return [*target.wh, front, *subj, *middle, *verb_words, *rest, *preposed]


def _in_situ_question(target: _Target, verb: Token, doc, clause: list[int]) -> list:
    """The wh-words in place of the target: after the verb or inside the subject, never in a
    preposed phrase ('During whose presidency a tree was ...' is not a question)."""
    subject = _clause_subject(verb)
    in_subject = subject is not None and subject.left_edge.i <= target.start and target.end <= subject.right_edge.i + 1
    if not (target.start > verb.i or in_subject):
        return []
    before = _strip_edges([doc[i] for i in clause if i < target.start])
    lead = next((k for k, t in enumerate(before[:4]) if t.text == ","), None)
    if (
        lead is not None
        and all(t.dep_ in ("advmod", "prep", "pobj", "cc", "punct") for t in before[:lead])
        and " ".join(t.lower_ for t in before[:lead]) in _CONNECTIVES
    ):
        before = _lower_first(before[lead + 1 :])  # "For example, TSA officers ..." -> "TSA officers ..."
    after = _strip_edges([doc[i] for i in clause if i >= target.end])
    return [*before, *target.wh, *after] if before else []


def _render(items: list) -> str:
    """Join words and sentence tokens with the sentence's own spacing; end with '?'."""
    out = []
    for k, item in enumerate(items):
        nxt = items[k + 1] if k + 1 < len(items) else None
        if isinstance(item, str):
            text, space = item, " "
        else:
            text = item.text
            adjacent = nxt is not None and not isinstance(nxt, str) and nxt.i == item.i + 1
            space = item.whitespace_ if adjacent else " "
        if (
            nxt is not None
            and not isinstance(nxt, str)
            and (nxt.is_punct or nxt.lower_ in _CLITICS)
            and nxt.i > 0
            and not nxt.doc[nxt.i - 1].whitespace_
            and nxt.text not in "([{"
        ):
            space = ""
        out.append(text + space)
    question = re.sub(r"\s+", " ", "".join(out)).strip()
    question = re.sub(r"\s*,\s*,", ",", question).strip(" ,;:-—–")
    return question[:1].upper() + question[1:] + "?"


def _candidate(sent: Span, ent: Span, conflicts: set[str] = frozenset()) -> tuple[str, bool] | str:
    """(question, fronted) for one entity of an accepted sentence, or the rejection reason."""
    reason = _answer_rejection(ent, conflicts)
    if reason:
        return reason
    target = _target(ent)
    if isinstance(target, str):
        return target
    clause = _clause(sent, target)
    if isinstance(clause, str):
        return clause
    verb, indices = clause
    if _is_pronoun_subject(_clause_subject(verb)):
        return "pronoun_subject"  # "He told CNN that ...": the frame of a reported clause
    doc = sent.doc
    in_frame = verb == sent.root and _report(sent) is not None  # "..., officials in Denver said"
    items = []
    if target.head.dep_ in ("nsubj", "nsubjpass") and target.head.head == verb and not target.is_pp:
        items = _subject_question(target, doc, indices, _report(sent) if verb == sent.root else None)
    elif any(c.dep_ == "conj" and c.i in indices for c in verb.children):
        return "coordinated"  # "had 17 points and 11 rebounds", "covered 4,375 acres and was contained"
    elif (target.head.head.head if target.is_pp else target.head.head) == verb:
        items = _fronted_question(target, verb, doc, indices)
    fronted = bool(items)
    if not items and not in_frame:
        items = _in_situ_question(target, verb, doc, indices)
    if not items:
        return "no_question_form"
    kept = [t for t in items if not isinstance(t, str)]
    if any(t.text in _ASIDES for t in kept) or sum(t.text in _QUOTE_MARKS for t in kept) % 2:
        return "parenthetical"
    if ent.label_ == "PERSON" and any(t.lower_ == "its" for t in kept):
        return "unreliable_entity"  # "Who laid off half of its workforce?": Twitter tagged PERSON
    return _context_rejection(items, ent, verb) or (_render(items), fronted)
