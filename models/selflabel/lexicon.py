"""Word lists and patterns of the self-labeled question generator: dates, pronouns, reporting
verbs, prepositions, countries/states/cities (for "which country"), the wh-words by entity label,
boilerplate and dateline patterns. Lower-cased unless a pattern says otherwise."""

from __future__ import annotations

import re

_MONTHS = (
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec"
).split()
_RELATIVE = set(
    "last next this that ago earlier later recent recently past coming previous current "
    "today yesterday tomorrow tonight weekend week weeks day days".split()
)
_GENERIC = {
    "god",
    "911",
    "one",
    "1",
    "today",
    "yesterday",
    "tomorrow",
    "tonight",
    "now",
    "this week",
    "this year",
    "first",
}
_PRONOUNS = set(
    "i me you he him she her it we us they them this that these those who whom what "
    "which someone somebody everyone everybody anyone nobody none".split()
)
_POSSESSIVE_PRONOUNS = {"his", "her", "its", "their", "our", "my", "your"}
_REPORTING = set(
    "say tell announce report state add confirm claim note write argue warn explain insist "
    "acknowledge tweet testify allege".split()
)
_WHERE_PREPS = {"in", "at", "near", "inside", "within", "outside"}
_MOTION_PREPS = {"to", "into", "toward", "towards"}
_WHEN_PREPS = {"in", "on", "at", "during"}
_WHEN_KEEP_PREPS = {"by", "since", "until", "till"}
_COUNTRIES = set(
    """afghanistan albania algeria angola argentina armenia australia austria azerbaijan bahrain
bangladesh belarus belgium bolivia bosnia brazil bulgaria burkina cambodia cameroon canada chad chile china
colombia congo croatia cuba cyprus czechia denmark ecuador egypt eritrea estonia ethiopia finland france
gabon georgia germany ghana greece guatemala guinea haiti honduras hungary iceland india indonesia iran iraq
ireland israel italy jamaica japan jordan kazakhstan kenya kosovo kuwait kyrgyzstan laos latvia lebanon
liberia libya lithuania luxembourg madagascar malawi malaysia mali malta mexico moldova monaco mongolia
montenegro morocco mozambique myanmar namibia nepal netherlands nicaragua niger nigeria norway oman pakistan
palestine panama paraguay peru philippines poland portugal qatar romania russia rwanda scotland senegal
serbia singapore slovakia slovenia somalia spain sudan sweden switzerland syria taiwan tajikistan tanzania
thailand tunisia turkey turkmenistan uganda ukraine uruguay uzbekistan venezuela vietnam wales yemen zambia
zimbabwe england britain u.s. us usa america u.k. uk""".split()
) | {
    "south africa",
    "south korea",
    "north korea",
    "saudi arabia",
    "new zealand",
    "sri lanka",
    "costa rica",
    "el salvador",
    "great britain",
    "the united states",
    "united states",
    "the united kingdom",
    "united kingdom",
    "the u.s.",
    "the us",
    "the uk",
    "the u.k.",
    "the netherlands",
    "the philippines",
    "united arab emirates",
    "the united arab emirates",
    "the uae",
    "uae",
    "dominican republic",
    "the dominican republic",
    "czech republic",
    "the czech republic",
    "ivory coast",
    "north macedonia",
    "puerto rico",
}
_STATES = set(
    """alabama alaska arizona arkansas california colorado connecticut delaware florida hawaii idaho
illinois indiana iowa kansas kentucky louisiana maine maryland massachusetts michigan minnesota mississippi
missouri montana nebraska nevada ohio oklahoma oregon pennsylvania tennessee texas utah vermont virginia
wisconsin wyoming""".split()
) | {
    "new hampshire",
    "new jersey",
    "new mexico",
    "new york state",
    "north carolina",
    "north dakota",
    "rhode island",
    "south carolina",
    "south dakota",
    "west virginia",
}
_CITIES = set(
    """london paris berlin moscow beijing tokyo kyiv kiev kabul baghdad tehran jerusalem cairo
rome madrid brussels geneva vienna warsaw istanbul delhi mumbai shanghai seoul sydney toronto montreal
chicago houston phoenix philadelphia dallas boston seattle denver atlanta miami detroit baltimore
minneapolis portland sacramento austin nashville memphis milwaukee pittsburgh cleveland cincinnati
tucson honolulu anchorage orlando tampa omaha albuquerque louisville""".split()
) | {
    "new york city",
    "los angeles",
    "san francisco",
    "san diego",
    "las vegas",
    "hong kong",
    "mexico city",
    "new orleans",
    "san antonio",
    "san jose",
    "salt lake city",
    "kansas city",
    "st. louis",
    "washington, d.c.",
    "rio de janeiro",
    "buenos aires",
    "tel aviv",
    "cape town",
}
_WH = {
    "PERSON": "who",
    "ORG": "which organization",
    "NORP": "which group",
    "LOC": "which region",
    "FAC": "what",
    "EVENT": "what",
    "WORK_OF_ART": "what",
    "LAW": "what",
    "PRODUCT": "what",
    "DATE": "when",
    "MONEY": "how much",
    "PERCENT": "what percentage",
    "CARDINAL": "how many",
    "QUANTITY": "how many",
    "GPE": "which place",
}
_NAME_LABELS = {"PERSON", "ORG", "GPE", "LOC", "NORP", "FAC", "EVENT", "WORK_OF_ART", "LAW", "PRODUCT"}
_WHAT_LABELS = {"FAC", "EVENT", "WORK_OF_ART", "LAW", "PRODUCT"}
_POSSESSOR_WH = {"PERSON": "whose", "ORG": "which organization's", "GPE": "which place's"}
_BOILERPLATE = re.compile(
    r"getty images|\((?:ap|reuters|afp|cnn)\)|reuters/|ap photo|afp via|\bphoto(?:graph)? (?:by|credit)|"
    r"\b(?:photo|image|caption|credit|file|related|watch|read more|listen):|click here|sign up|subscribe|"
    r"copyright|©|all rights reserved|newsletter|contributed (?:to )?(?:this )?report|reporting by|"
    r"editing by|this (?:story|article) (?:has been|was|first|originally)|follow (?:us|him|her) on|"
    r"https?://|www\.|@\w|\||hide caption|\bpictured\b|listed below|see below|shown above|"
    r"/(?:ap|afp|reuters|getty|bloomberg)\b|\bphotos?\b\s*$|^\s*\(?(?:photo|image|video)\b",
    re.IGNORECASE,
)
# "SEASIDE PARK — The holiday ...", "WASHINGTON (AP) - ...": a dateline opens the sentence
_DATELINE = re.compile(r"^[A-Z][A-Z.'’ ]{2,}(?:,\s*[A-Z][\w.]*)*\s*(?:\([^)]*\))?\s*[—–-]+\s")
_CONNECTIVES = {
    "for example",
    "for instance",
    "in addition",
    "however",
    "meanwhile",
    "still",
    "also",
    "so",
    "but",
    "and",
    "yet",
    "instead",
    "moreover",
    "furthermore",
    "in fact",
    "indeed",
    "then",
    "now",
    "nonetheless",
    "nevertheless",
    "in contrast",
    "by contrast",
    "similarly",
    "likewise",
}
_ASIDES = {"–", "—", "--", "(", ")", "[", "]"}
_QUOTE_MARKS = {'"', "“", "”", "«", "»"}
_FIRST_PERSON = {"i", "me", "my", "mine", "we", "us", "our", "ours"}
_CLITICS = {"n't", "n’t", "'s", "’s", "'re", "’re", "'ve", "’ve", "'ll", "’ll", "'d", "’d"}
_CREDIT = re.compile(r"\b(?:reuters|getty|afp|images|ap photo|shutterstock)\b", re.IGNORECASE)
_CAPTION_DATE = re.compile(r"\b[A-Z][a-z]+\.? \d{1,2}, (?:19|20)\d\d\b")
_QUOTED = re.compile(r"[\"“”«»]([^\"“”«»]*)[\"“”«»]")
