from __future__ import annotations

import datetime as dt
import json
from types import SimpleNamespace

import numpy as np
import pytest

from models.encoders import DualEncoder, HashEncoder, load_encoder, packaged_minilm_path, query_text

ASKED = dt.date(2023, 4, 4)


def test_hash_encoder_is_deterministic_normalised_and_lexical():
    enc = HashEncoder()
    a = enc.encode_passages(["Ines Okafor coaches the Harriers", "budget vote in Port Calder", ""])
    b = enc.encode_passages(["Ines Okafor coaches the Harriers", "budget vote in Port Calder", ""])
    assert a.shape == (3, 384) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a[:2], axis=1), 1.0, rtol=1e-6)
    assert not a[2].any()  # no words, no vector
    q = enc.encode_queries(["Who coaches the Harriers?"])[0]
    assert q @ a[0] > q @ a[1]


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("hash:colour=red", "unknown hash encoder option"),
        ("/no/such/folder", "neither 'minilm', 'hash', a trained version nor an existing model folder"),
    ],
)
def test_load_encoder_rejects_bad_specs(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        load_encoder(spec)


def test_load_encoder_hash_options():
    enc = load_encoder("hash:dim=64,delay_ms=0")
    assert enc.dim == 64 and enc.name == "hash-64"


class _RecordingEncoder:
    name, dim = "recording", 16

    def __init__(self, dated_queries: bool | None = None) -> None:
        self.seen: list[str] = []
        if dated_queries is not None:
            self.dated_queries = dated_queries

    def encode_queries(self, texts):
        self.seen += list(texts)
        return np.ones((len(texts), self.dim), dtype=np.float32) / 4


@pytest.mark.parametrize(
    "dated, expected",
    [
        (None, "Who won?"),  # the packaged MiniLM and every encoder that says nothing: the bare question
        (False, "Who won?"),
        (True, "Today is Tuesday, April 4, 2023. Who won?"),  # a version trained on dated questions
    ],
)
def test_the_dense_retriever_asks_the_encoder_in_the_form_it_reads(dated, expected):
    from serving.retrieval import DenseRetriever

    encoder = _RecordingEncoder(dated)
    index = SimpleNamespace(search=lambda q, as_of, k: (np.zeros((1, k), np.float32), np.full((1, k), -1)))
    assert DenseRetriever(encoder).search(SimpleNamespace(encoder=None, index=index), " Who won? ", ASKED, 3) == []
    assert encoder.seen == [expected] == [query_text(encoder, " Who won? ", ASKED)]


def _version(tmp_path, **info) -> DualEncoder:
    folder = tmp_path / "dpr-v"
    folder.mkdir()
    (folder / "shared").symlink_to(packaged_minilm_path(), target_is_directory=True)
    (folder / "encoder.json").write_text(json.dumps({"version": "dpr-v", "towers": "shared", **info}))
    return DualEncoder(folder)


@pytest.mark.integration
@pytest.mark.parametrize(
    "info, dated", [({}, True), ({"query_format": "dated"}, True), ({"query_format": "bare"}, False)]
)
def test_a_trained_version_says_which_question_form_it_reads(tmp_path, info, dated):
    # versions saved before query_format existed were all trained on dated questions
    enc = _version(tmp_path, **info)
    assert enc.dated_queries is dated
    assert query_text(enc, "Who won?", ASKED).startswith("Today is Tuesday") is dated


def test_a_version_with_an_unknown_question_form_is_refused(tmp_path):
    with pytest.raises(ValueError, match="query_format 'weekday' must be one of"):
        _version(tmp_path, query_format="weekday")


def test_the_hash_fake_reads_the_dated_question_the_test_news_is_written_around():
    assert query_text(HashEncoder(), " Who won? ", ASKED) == "Today is Tuesday, April 4, 2023. Who won?"
