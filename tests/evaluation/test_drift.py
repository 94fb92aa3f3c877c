"""Drift measures on hand-made inputs, mergeable profiles, and their files."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import numpy as np
import pytest

from evaluation.drift import (
    MonthProfile,
    build_profile,
    drift_between,
    entity_counts,
    load_profile,
    profile_files,
    profile_vectors,
    save_profile,
    tokenize_words,
)
from settings import DRIFT_MEASURES, parse_drift_features

TEXTS = [
    "The mayor of Port Calder won 1,200 votes.",
    "Port Calder's harbour reopened on Monday.",
    "Rain is expected in Kestrel Bay.",
]


def vectors(n: int, dim: int = 16, seed: int = 0, shift: float = 0.0, axis: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(n, dim)).astype(np.float32)
    v[:, axis] += shift
    return v


def profile(month: str, texts, vecs, kinds=("words",)) -> MonthProfile:
    return build_profile(month, vecs, texts, kinds, encoder="hash-16")


def test_tokenize_words_lowercases_and_drops_numbers_and_punctuation():
    assert tokenize_words("Port Calder's mayor won 1,200 votes (52%) -- in 2024!") == [
        "port",
        "calder's",
        "mayor",
        "won",
        "votes",
        "in",
    ]


def test_parse_features_orders_and_refuses_unknown_kinds():
    assert parse_drift_features("entities, words") == ("words", "entities")
    with pytest.raises(ValueError, match="'topics' is unknown"):
        parse_drift_features("words,topics")
    with pytest.raises(ValueError, match="no drift features"):
        parse_drift_features(" , ")


def test_drift_between_identical_corpora_is_zero():
    v = vectors(50)
    a, b = profile("2024-01", TEXTS * 10 + TEXTS[:2] * 10, v), profile("2024-02", TEXTS * 10 + TEXTS[:2] * 10, v)
    d = drift_between(a, b)
    assert set(d) == {"unseen_words", "unseen_words_tokens", "cosine", "kl"} and set(d) <= set(DRIFT_MEASURES)
    assert d["unseen_words"] == 0.0 and d["unseen_words_tokens"] == 0.0
    assert d["cosine"] == pytest.approx(0.0, abs=1e-9)
    assert d["kl"] == pytest.approx(0.0, abs=1e-9)


def test_drift_between_disjoint_vocabularies_share_is_one():
    a = profile("2024-01", ["alpha beta gamma", "beta"], vectors(2, seed=1))
    b = profile("2024-02", ["delta epsilon", "zeta"], vectors(2, seed=2))
    d = drift_between(a, b)
    assert d["unseen_words"] == 1.0 and d["unseen_words_tokens"] == 1.0


def test_drift_between_counts_types_and_tokens_apart():
    target = profile("2024-02", ["storm storm storm calder"], vectors(1))
    source = profile("2024-01", ["calder harbour"], vectors(1, seed=3))
    d = drift_between(target, source)
    assert d["unseen_words"] == pytest.approx(1 / 2)  # types: storm (unseen), calder
    assert d["unseen_words_tokens"] == pytest.approx(3 / 4)  # tokens: 3 of 4 are "storm"


def test_drift_between_kl_and_cosine_grow_with_a_mean_shift():
    base = profile_vectors("2024-01", vectors(400, seed=5, shift=3.0))  # mean near +e0
    kls, cosines = [], []
    for shift in (0.0, 1.0, 2.0, 4.0):  # the target's mean moves away along e1
        d = drift_between(profile_vectors("2024-02", vectors(400, seed=6, shift=3.0) + shift * np.eye(16)[1]), base)
        kls.append(d["kl"])
        cosines.append(d["cosine"])
    assert kls == sorted(kls) and kls[-1] > 10 * kls[0]
    assert cosines == sorted(cosines) and cosines[-1] > 0.3  # 1 - 3/5 for means 3e0 and 3e0 + 4e1


def test_drift_between_gives_entities_only_when_both_sides_have_them():
    a = MonthProfile(("2024-02",), 1, np.ones(4), np.ones(4), {"words": Counter(a=1), "entities": Counter(x=2, y=1)})
    b = MonthProfile(("2024-01",), 1, np.ones(4), np.ones(4), {"words": Counter(a=1), "entities": Counter(y=5)})
    assert drift_between(a, b)["unseen_entities"] == pytest.approx(0.5)
    assert drift_between(a, b)["unseen_entities_tokens"] == pytest.approx(2 / 3)
    words_only = MonthProfile(("2024-01",), 1, np.ones(4), np.ones(4), {"words": Counter(a=1)})
    assert "unseen_entities" not in drift_between(a, words_only)


def test_drift_between_refuses_empty_profiles_and_other_encoders():
    empty = MonthProfile(("2024-01",), 0, np.zeros(4), np.zeros(4))
    full = profile_vectors("2024-02", vectors(3, dim=4))
    with pytest.raises(ValueError, match="no passages"):
        drift_between(full, empty)
    with pytest.raises(ValueError, match="different encoders"):
        drift_between(full, profile_vectors("2024-01", vectors(3, dim=4), encoder="minilm"))


def test_merge_equals_profiling_the_union():
    texts_a, texts_b = TEXTS, ["Kestrel Bay Harriers appoint a new coach.", "The coach starts in March."]
    va, vb = vectors(3, seed=7), vectors(2, seed=8)
    merged = MonthProfile.merge([profile("2024-02", texts_b, vb), profile("2024-01", texts_a, va)])
    union = build_profile("x", np.concatenate([va, vb]), texts_a + texts_b, ("words",), encoder="hash-16")
    assert merged.months == ("2024-01", "2024-02") and merged.label == "2024-01..2024-02"
    assert merged.n == union.n == 5
    np.testing.assert_allclose(merged.sum_vec, union.sum_vec)
    np.testing.assert_allclose(merged.sum_sq, union.sum_sq)
    assert merged.counts == union.counts


def test_merge_keeps_only_kinds_every_profile_has_and_refuses_repeats():
    a = MonthProfile(("2024-01",), 1, np.ones(2), np.ones(2), {"words": Counter(a=1), "entities": Counter(e=1)})
    b = MonthProfile(("2024-02",), 1, np.ones(2), np.ones(2), {"words": Counter(b=1)})
    assert MonthProfile.merge([a, b]).features == ("words",)
    with pytest.raises(ValueError, match="2024-01 appear in more than one profile"):
        MonthProfile.merge([a, a])
    with pytest.raises(ValueError, match="nothing to merge"):
        MonthProfile.merge([])


def test_save_profile_then_load_round_trips_without_pickles(tmp_path):
    p = build_profile(
        "2024-01",
        vectors(4),
        TEXTS + ["Ünïcode wörds too"],
        ("words",),
        encoder="hash-16",
        meta={"shard_file": "shards/2024-01.abcd.faiss"},
    )
    npz, js = save_profile(p, tmp_path / "profiles" / "2024-01")
    assert npz.name == "2024-01.npz" and js.name == "2024-01.json.gz"
    np.load(npz, allow_pickle=False).close()  # plain arrays only
    back = load_profile(tmp_path / "profiles" / "2024-01")
    assert (back.months, back.n, back.encoder, back.meta) == (p.months, p.n, p.encoder, p.meta)
    np.testing.assert_array_equal(back.sum_vec, p.sum_vec)
    np.testing.assert_array_equal(back.sum_sq, p.sum_sq)
    assert back.counts == p.counts and back.counts["words"]["wörds"] == 1


def test_load_profile_refuses_files_from_two_writes(tmp_path):
    stem = tmp_path / "2024-01"
    save_profile(profile("2024-01", TEXTS, vectors(3)), stem)
    _, js = profile_files(stem)
    old_json = js.read_bytes()
    save_profile(profile("2024-01", TEXTS, vectors(3, seed=9)), stem)
    js.write_bytes(old_json)  # as if a crash came between the two writes
    with pytest.raises(ValueError, match="disagree"):
        load_profile(stem)
    js.unlink()
    with pytest.raises(FileNotFoundError, match="missing"):
        load_profile(stem)
    assert json.loads(gzip.decompress(old_json))["format"] == 1


class FakeEntities:
    """A stand-in for a spaCy pipeline: capitalised words are entities."""

    class _Doc:
        def __init__(self, text):
            self.ents = [type("Ent", (), {"text": w.strip(".,")})() for w in text.split() if w[:1].isupper()]

    def pipe(self, texts, batch_size=64):
        return (self._Doc(t) for t in texts)


def test_entity_counts_normalise_strings_and_report_progress():
    seen = []
    counts = entity_counts(
        ["Calder  votes", "calder and Kestrel", "none here"], FakeEntities(), batch_size=2, progress=seen.append
    )
    assert counts == Counter({"calder": 1, "kestrel": 1})
    assert seen == [2, 3]


@pytest.mark.integration
def test_entity_counts_with_the_packaged_spacy_model():
    from models.selflabel import load_nlp

    counts = entity_counts(["Trudeau said Canada will send 300 troops to Latvia in March."], load_nlp())
    assert {"canada", "latvia"} <= set(counts)
