"""The ONNX Runtime backend of the encoder gives torch's vectors (float) or close ones (int8)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from models.encoders import PACKAGED_MINILM, SentenceTransformerEncoder, load_encoder, make_tower, packaged_minilm_path
from models.onnx_encoder import FLOAT_FILE, INT8_FILE, OnnxTower, export_onnx

pytestmark = pytest.mark.integration

TEXTS = [
    "Today is Monday, June 5, 2023. Who won the NBA championship?",
    "Monday, June 12, 2023. The Denver Nuggets beat the Miami Heat 94-89 to win their first title. " * 4,
    "Rates",
    "The Federal Reserve left interest rates unchanged after ten increases in a row.",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def torch_vectors():
    return SentenceTransformerEncoder.packaged().encode(TEXTS)


def test_float_tower_gives_torchs_vectors_and_int8_close_ones(cache, torch_vectors):
    float_tower = OnnxTower(packaged_minilm_path(), name=PACKAGED_MINILM, quantize=False, cache_dir=cache)
    got = float_tower.encode(TEXTS, batch_size=3)  # batches of mixed lengths, padded per batch
    assert got.shape == (4, 384) and got.dtype == np.float32
    assert np.allclose(got, torch_vectors, atol=1e-4)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    int8 = OnnxTower(packaged_minilm_path(), name=PACKAGED_MINILM, quantize=True, cache_dir=cache)
    cos = (int8.encode(TEXTS) * torch_vectors).sum(axis=1)
    assert cos.min() > 0.97, cos  # per-channel int8 weights
    assert not np.allclose(cos, 1.0, atol=1e-4)  # it is quantised, not the float model again
    assert float_tower.encode([]).shape == (0, 384)


def test_the_export_is_cached_and_a_pickled_tower_encodes_alike(cache):
    path = export_onnx(packaged_minilm_path(), quantize=True, cache_dir=cache)
    assert path.name == INT8_FILE and (path.parent / FLOAT_FILE).is_file()
    before = {p.name: p.stat().st_mtime_ns for p in path.parent.iterdir()}
    tower = OnnxTower(packaged_minilm_path(), name=PACKAGED_MINILM, quantize=True, cache_dir=cache)
    assert {p.name: p.stat().st_mtime_ns for p in path.parent.iterdir()} == before  # not exported again
    assert not [p for p in cache.iterdir() if p.name.startswith(".export-")]  # no temp folder left
    copy = pickle.loads(pickle.dumps(tower))  # how a Ray actor receives it
    assert np.array_equal(copy.encode(TEXTS), tower.encode(TEXTS))


def test_the_export_has_no_sdpa_mask_nodes(cache):
    """Eager attention: the mask is built once and added to the scores. SDPA's export selected with
    Where and checked with IsNaN in every layer (13 Where and 6 IsNaN nodes for MiniLM's 6 layers)."""
    import onnx  # noqa: PLC0415 (lazy: only this test reads the graph)

    graph = onnx.load(str(export_onnx(packaged_minilm_path(), quantize=False, cache_dir=cache))).graph
    ops = [node.op_type for node in graph.node]
    assert ops.count("Softmax") == 6 and ops.count("IsNaN") == 0 and ops.count("Where") <= 2, sorted(set(ops))


def test_the_setting_picks_the_backend_and_refuses_an_unknown_one():
    enc = load_encoder("minilm", backend="onnx-int8")
    assert isinstance(enc, OnnxTower) and enc.quantized and enc.name == PACKAGED_MINILM and enc.dim == 384
    assert isinstance(load_encoder("minilm", backend="torch"), SentenceTransformerEncoder)
    with pytest.raises(ValueError, match="encoder backend 'tensorrt' is not one of torch, onnx, onnx-int8"):
        make_tower(packaged_minilm_path(), name="x", backend="tensorrt")
