from __future__ import annotations

import numpy as np
import pytest

from models.encoders import HashEncoder, load_encoder


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


@pytest.mark.parametrize("spec, fragment", [
    ("hash:colour=red", "unknown hash encoder option"),
    ("/no/such/folder", "neither 'minilm', 'hash', a trained version nor an existing model folder"),
])
def test_load_encoder_rejects_bad_specs(spec, fragment):
    with pytest.raises(ValueError, match=fragment):
        load_encoder(spec)


def test_load_encoder_hash_options():
    enc = load_encoder("hash:dim=64,delay_ms=0")
    assert enc.dim == 64 and enc.name == "hash-64"
