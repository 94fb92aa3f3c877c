"""Drift between months of news: the three domain-similarity measures of Marshall et al.
("Switching Contexts: Transportability Measures for NLP"), computed from mergeable month profiles.

A `MonthProfile` is what the measures need of a set of passages, and nothing more: the passage
count, the sum and the sum of squares of their embeddings, and a Counter per lexical feature kind.
Profiles of disjoint months add up (`MonthProfile.merge`), so "all earlier months" or "what the
reader was trained on" is a merge of stored month profiles, never a pass over their passages.

The measures of a target profile T against a source profile S (`drift_between`):

- unseen_<kind>: the share of T's feature types (distinct words, distinct entity strings) that
  never occur in S; unseen_<kind>_tokens weighs each type by its count in T (the share of T's
  running tokens that S never had). Kinds: "words" (lower-cased word tokens, pure numbers and
  punctuation dropped) and "entities" (spaCy named-entity strings, lower-cased).
- cosine: 1 - cos(mean(T), mean(S)) of the mean passage embeddings (the means are normalised by
  the cosine itself). 0 for identical corpora.
- kl: KL(T || S) between two diagonal Gaussians fitted to the passage embeddings of each side
  (mean and per-dimension variance, variances floored at `var_floor`), in closed form, summed over
  dimensions, in nats:
      KL = 1/2 * sum_d [ log(var_S/var_T) + (var_T + (mu_T - mu_S)^2) / var_S - 1 ].
  The paper's exact construction of its embedding distributions could not be retrieved; a
  diagonal Gaussian is the simplest distribution that the profile's sums determine exactly, so it
  merges like the rest of the profile. It is 0 for identical corpora and grows with a mean shift.

Profiles are saved as `<stem>.npz` (the vectors' sums, loaded with allow_pickle=False) and
`<stem>.json.gz` (months, counts, provenance): never as pickles.

Example:
    >>> jan = build_profile("2024-01", vectors_jan, texts_jan, ("words",), encoder="hash-384")  # (n, 384)
    >>> feb = build_profile("2024-02", vectors_feb, texts_feb, ("words",), encoder="hash-384")
    >>> drift_between(feb, jan)
    {'unseen_words': 0.41, 'unseen_words_tokens': 0.12, 'cosine': 0.003, 'kl': 5.2}
"""

from __future__ import annotations

import gzip
import io
import json
import re
import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from indexer.atomic import write_atomic
from settings import DRIFT_FEATURE_KINDS as FEATURE_KINDS
from settings import parse_drift_features

VAR_FLOOR = 1e-6
PROFILE_FORMAT = 1

# A word: letters and digits, with inner apostrophes ("don't"); tokens of digits only are dropped.
_WORD = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)*")


def tokenize_words(text: str) -> list[str]:
    """Lower-cased word tokens; pure numbers and punctuation are dropped.

    >>> tokenize_words("Port Calder's mayor won 1,200 votes (52%).")
    ['port', "calder's", 'mayor', 'won', 'votes']
    """
    return [t for t in _WORD.findall(text.lower()) if not t.isnumeric()]


def word_counts(texts: Iterable[str]) -> Counter:
    counts: Counter = Counter()
    for text in texts:
        counts.update(tokenize_words(text))
    return counts


def entity_counts(
    texts: Sequence[str], nlp, *, batch_size: int = 64, progress: Callable[[int], None] | None = None
) -> Counter:
    """Named-entity strings (whitespace-normalised, lower-cased) over `texts`.

    Args:
        nlp: a spaCy pipeline with an "ner" component; only that component runs.
        batch_size: texts per nlp.pipe batch.
        progress: called with the number of texts done after each batch.
    """
    counts: Counter = Counter()

    def run() -> None:
        done = 0
        for doc in nlp.pipe(texts, batch_size=batch_size):
            counts.update(" ".join(ent.text.split()).lower() for ent in doc.ents)
            done += 1
            if progress is not None and (done % batch_size == 0 or done == len(texts)):
                progress(done)

    if hasattr(nlp, "select_pipes") and "ner" in getattr(nlp, "pipe_names", ()):
        with nlp.select_pipes(enable=["ner"]):  # the tagger and parser cost most of the time
            run()
    else:
        run()
    return counts


def profile_texts(
    texts: Sequence[str],
    features: Iterable[str],
    *,
    nlp=None,
    batch_size: int = 64,
    progress: Callable[[int], None] | None = None,
) -> dict[str, Counter]:
    """{kind: Counter of features} for each requested kind ("entities" needs `nlp`)."""
    kinds = parse_drift_features(features)
    out: dict[str, Counter] = {}
    if "words" in kinds:
        out["words"] = word_counts(texts)
    if "entities" in kinds:
        if nlp is None:
            raise ValueError("entity features need a spaCy pipeline (models.selflabel.load_nlp())")
        out["entities"] = entity_counts(texts, nlp, batch_size=batch_size, progress=progress)
    return out


@dataclass(frozen=True)
class MonthProfile:
    """What the drift measures need of the passages of one or more months.

    months: the month keys covered ("2024-01", ...), sorted, no repeats.
    n: passages; sum_vec, sum_sq: (dim,) float64 sums of the embeddings and of their squares.
    counts: {feature kind: Counter}; a kind is present only if every passage was counted for it.
    encoder: the passage encoder's name (profiles of different encoders never mix).
    meta: provenance of a single month's profile (its shard file and checksum); dropped by merge.
    """

    months: tuple[str, ...]
    n: int
    sum_vec: np.ndarray
    sum_sq: np.ndarray
    counts: dict[str, Counter] = field(default_factory=dict)
    encoder: str = ""
    meta: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        if self.sum_vec.shape != self.sum_sq.shape or self.sum_vec.ndim != 1:
            raise ValueError(
                f"profile {self.label}: sum_vec {self.sum_vec.shape} and sum_sq {self.sum_sq.shape} "
                "must be (dim,) arrays of one shape"
            )
        if self.n < 0:
            raise ValueError(f"profile {self.label}: n {self.n} is negative")

    @property
    def dim(self) -> int:
        return int(self.sum_vec.shape[0])

    @property
    def label(self) -> str:
        """'2024-01', or '2024-01..2024-03' for several months."""
        if not self.months:
            return "(empty)"
        return self.months[0] if len(self.months) == 1 else f"{self.months[0]}..{self.months[-1]}"

    @property
    def features(self) -> tuple[str, ...]:
        return tuple(k for k in FEATURE_KINDS if k in self.counts)

    def mean(self) -> np.ndarray:
        """(dim,) mean embedding."""
        return self.sum_vec / max(self.n, 1)

    def variance(self, var_floor: float = VAR_FLOOR) -> np.ndarray:
        """(dim,) per-dimension variance, floored at `var_floor`."""
        mean = self.mean()
        return np.maximum(self.sum_sq / max(self.n, 1) - mean * mean, var_floor)

    @classmethod
    def merge(cls, profiles: Iterable[MonthProfile]) -> MonthProfile:
        """One profile of the union of disjoint months. A feature kind survives only if every profile has it.

        Raises:
            ValueError: no profiles, a month repeated, or dimensions or encoders that differ.
        """
        profiles = list(profiles)
        if not profiles:
            raise ValueError("nothing to merge: no month profiles given")
        months = [m for p in profiles for m in p.months]
        if len(set(months)) != len(months):
            repeated = sorted({m for m in months if months.count(m) > 1})
            raise ValueError(
                f"month(s) {', '.join(repeated)} appear in more than one profile: merging would "
                "count their passages twice"
            )
        dims, encoders = {p.dim for p in profiles}, {p.encoder for p in profiles}
        if len(dims) > 1 or len(encoders) > 1:
            raise ValueError(
                f"profiles of different encoders or dimensions cannot be merged: "
                f"{sorted(encoders)}, {sorted(dims)} dims"
            )
        kinds = [k for k in FEATURE_KINDS if all(k in p.counts for p in profiles)]
        counts = {}
        for k in kinds:
            total: Counter = Counter()
            for p in profiles:
                total.update(p.counts[k])
            counts[k] = total
        return cls(
            months=tuple(sorted(months)),
            n=sum(p.n for p in profiles),
            sum_vec=np.sum([p.sum_vec for p in profiles], axis=0),
            sum_sq=np.sum([p.sum_sq for p in profiles], axis=0),
            counts=counts,
            encoder=encoders.pop(),
        )


merge_profiles = MonthProfile.merge


def profile_vectors(
    months: str | Sequence[str],
    vectors: np.ndarray,
    *,
    encoder: str = "",
    counts: dict[str, Counter] | None = None,
    meta: dict[str, str] | None = None,
) -> MonthProfile:
    """A profile of (n, dim) passage embeddings (plus the feature counts, if already made)."""
    v = np.asarray(vectors)
    if v.ndim != 2 or not np.issubdtype(v.dtype, np.floating):
        raise ValueError(f"vectors must be a 2-d float array, got shape {v.shape} and dtype {v.dtype}")
    v = v.astype(np.float64, copy=False)
    return MonthProfile(
        months=(months,) if isinstance(months, str) else tuple(sorted(months)),
        n=int(v.shape[0]),
        sum_vec=v.sum(axis=0),
        sum_sq=(v * v).sum(axis=0),
        counts=dict(counts or {}),
        encoder=encoder,
        meta=dict(meta or {}),
    )


def build_profile(
    month: str,
    vectors: np.ndarray,
    texts: Sequence[str],
    features: Iterable[str],
    *,
    encoder: str = "",
    nlp=None,
    batch_size: int = 64,
    meta: dict[str, str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> MonthProfile:
    """The profile of one month: its (n, dim) passage embeddings and the n passage texts."""
    if len(texts) != len(vectors):
        raise ValueError(f"month {month}: {len(vectors)} vectors but {len(texts)} texts")
    counts = profile_texts(texts, features, nlp=nlp, batch_size=batch_size, progress=progress)
    return profile_vectors(month, vectors, encoder=encoder, counts=counts, meta=meta)


# ---- the measures --------------------------------------------------------------------------------


def unseen_share(target: Counter, source: Counter) -> tuple[float, float]:
    """(share of target types absent from source, share of target tokens whose type is absent)."""
    unseen = [t for t in target if t not in source]
    return len(unseen) / len(target), sum(target[t] for t in unseen) / sum(target.values())


def cosine_distance(target: MonthProfile, source: MonthProfile) -> float:
    """1 - cos of the mean embeddings (0: same direction)."""
    a, b = target.mean(), source.mean()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0  # a zero mean has no direction: as far as it gets for non-negative similarity
    return float(1.0 - np.dot(a, b) / (na * nb))


def gaussian_kl(target: MonthProfile, source: MonthProfile, var_floor: float = VAR_FLOOR) -> float:
    """KL(N_T || N_S) in nats between diagonal Gaussians fitted to each side's embeddings."""
    mu_t, mu_s = target.mean(), source.mean()
    var_t, var_s = target.variance(var_floor), source.variance(var_floor)
    terms = np.log(var_s / var_t) + (var_t + (mu_t - mu_s) ** 2) / var_s - 1.0  # (dim,)
    return float(max(0.5 * terms.sum(), 0.0))  # >= 0 in exact arithmetic


def drift_between(target: MonthProfile, source: MonthProfile, *, var_floor: float = VAR_FLOOR) -> dict[str, float]:
    """How far `target` is from `source`: the measures of DRIFT_MEASURES that both profiles allow.

    Returns:
        {"unseen_words": .., "unseen_words_tokens": .., ["unseen_entities": .., "unseen_entities_tokens": ..,]
         "cosine": .., "kl": ..}; an unseen_<kind> pair only when both sides were counted for the kind
        and the target has at least one such feature.
    Raises:
        ValueError: an empty side, or encoders or dimensions that differ.
    """
    for side, p in (("target", target), ("source", source)):
        if p.n == 0:
            raise ValueError(f"the {side} profile {p.label} has no passages")
    if target.dim != source.dim or target.encoder != source.encoder:
        raise ValueError(
            f"target {target.label} ({target.encoder}, {target.dim} dims) and source {source.label} "
            f"({source.encoder}, {source.dim} dims) come from different encoders"
        )
    out: dict[str, float] = {}
    for kind in FEATURE_KINDS:
        if kind in target.counts and kind in source.counts and target.counts[kind]:
            out[f"unseen_{kind}"], out[f"unseen_{kind}_tokens"] = unseen_share(target.counts[kind], source.counts[kind])
    out["cosine"] = cosine_distance(target, source)
    out["kl"] = gaussian_kl(target, source, var_floor)
    return out


# ---- files ---------------------------------------------------------------------------------------


def profile_files(stem: Path) -> tuple[Path, Path]:
    """(<stem>.npz, <stem>.json.gz)."""
    stem = Path(stem)
    return stem.with_name(stem.name + ".npz"), stem.with_name(stem.name + ".json.gz")


def save_profile(profile: MonthProfile, stem: Path) -> tuple[Path, Path]:
    """Write `profile` as <stem>.npz (arrays) and <stem>.json.gz (months, counts, provenance).

    Both files carry one random token, so a crash between the two writes is caught by `load_profile`.
    """
    npz_path, json_path = profile_files(stem)
    npz_path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(8)
    buf = io.BytesIO()
    np.savez(
        buf,
        sum_vec=profile.sum_vec.astype(np.float64),
        sum_sq=profile.sum_sq.astype(np.float64),
        n=np.int64(profile.n),
        months=np.array(profile.months, dtype=str),
        token=np.array(token),
    )
    body = {
        "format": PROFILE_FORMAT,
        "token": token,
        "months": list(profile.months),
        "n": profile.n,
        "dim": profile.dim,
        "encoder": profile.encoder,
        "meta": profile.meta,
        "counts": {k: dict(c) for k, c in profile.counts.items()},
    }
    write_atomic(npz_path, buf.getvalue())
    write_atomic(json_path, gzip.compress(json.dumps(body, ensure_ascii=False).encode("utf-8"), mtime=0))
    return npz_path, json_path


def load_profile(stem: Path) -> MonthProfile:
    """Read what `save_profile` wrote.

    Raises:
        FileNotFoundError: a file is missing. ValueError: the files are unreadable or disagree.
    """
    npz_path, json_path = profile_files(stem)
    for p in (npz_path, json_path):
        if not p.is_file():
            raise FileNotFoundError(f"drift profile file {p} is missing")
    try:
        body = json.loads(gzip.decompress(json_path.read_bytes()))
        with np.load(npz_path, allow_pickle=False) as arrays:
            sum_vec, sum_sq = arrays["sum_vec"], arrays["sum_sq"]
            n, months, token = int(arrays["n"]), tuple(str(m) for m in arrays["months"]), str(arrays["token"])
    except (OSError, ValueError, KeyError, EOFError) as exc:
        raise ValueError(f"drift profile {stem} is unreadable ({exc})") from None
    if (
        body.get("format") != PROFILE_FORMAT
        or body.get("token") != token
        or tuple(body.get("months", ())) != months
        or body.get("n") != n
        or body.get("dim") != sum_vec.shape[0]
    ):
        raise ValueError(
            f"drift profile {stem}: {npz_path.name} and {json_path.name} disagree (an interrupted "
            "write?); build it again"
        )
    return MonthProfile(
        months=months,
        n=n,
        sum_vec=sum_vec,
        sum_sq=sum_sq,
        counts={k: Counter(v) for k, v in body["counts"].items()},
        encoder=body.get("encoder", ""),
        meta=dict(body.get("meta") or {}),
    )
