"""A trained Gemma as a GGUF file for llama.cpp (models/gemma_gguf.py), on a tiny base GGUF written
here: unchanged tensors copied byte for byte, changed ones in the asked type, norms plus one, every
metadata field kept, and a failed write leaves the file that was there."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import models.gemma_weights as gemma_weights
from models.gemma_gguf import export_gguf, gguf_names, resolve_weight_type, to_gguf_values

WIDTH = 64  # a multiple of Q8_0's block of 32
EMB, Q, NORM = (
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.input_layernorm.weight",
)


def _q8(values: np.ndarray) -> np.ndarray:
    return gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)


@pytest.fixture()
def tiny_base(tmp_path):
    """(path, base_state): a one-block gemma3 GGUF of three tensors, and the same model as
    transformers would load it (de-quantised, norms minus one)."""
    rng = np.random.default_rng(0)
    emb, q = rng.normal(size=(8, WIDTH)).astype(np.float32), rng.normal(size=(WIDTH, WIDTH)).astype(np.float32)
    norm = rng.normal(size=WIDTH).astype(np.float32)
    path = tmp_path / "base.gguf"
    writer = gguf.GGUFWriter(path, arch="gemma3")
    writer.add_block_count(1)
    writer.add_string("general.name", "tiny")
    writer.add_array("tokenizer.ggml.tokens", ["<pad>", "<eos>", "a", "b"])
    stored = {
        "token_embd.weight": (_q8(emb), gguf.GGMLQuantizationType.Q8_0),
        "blk.0.attn_q.weight": (_q8(q), gguf.GGMLQuantizationType.Q8_0),
        "blk.0.attn_norm.weight": (norm + 1.0, gguf.GGMLQuantizationType.F32),
    }
    for name, (data, kind) in stored.items():
        writer.add_tensor(name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(path)
    deq = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    base_state = {
        EMB: deq["token_embd.weight"].reshape(8, WIDTH),
        Q: deq["blk.0.attn_q.weight"].reshape(WIDTH, WIDTH),
        NORM: deq["blk.0.attn_norm.weight"] - 1.0,
    }
    return path, base_state


def _tensors(path) -> dict:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def test_only_the_changed_tensor_is_replaced_and_the_rest_is_the_bases_bytes(tiny_base, tmp_path):
    base, base_state = tiny_base
    state = dict(base_state)
    state[Q] = base_state[Q] + np.float32(0.25)
    state["lm_head.weight"] = base_state[EMB]  # tied: no tensor of its own
    dest = tmp_path / "out" / "reader-q8_0.gguf"
    assert export_gguf(state, base_state, base, dest, weight_type="q8_0") == 1
    old, new = _tensors(base), _tensors(dest)
    assert list(new) == list(old)
    for name in ("token_embd.weight", "blk.0.attn_norm.weight"):
        assert new[name].tensor_type == old[name].tensor_type
        assert bytes(new[name].data) == bytes(old[name].data)
    q = new["blk.0.attn_q.weight"]
    assert q.tensor_type == gguf.GGMLQuantizationType.Q8_0
    got = gguf.quants.dequantize(q.data, q.tensor_type).reshape(WIDTH, WIDTH)
    assert np.abs(got - state[Q]).max() < 0.05  # Q8_0's rounding, far below the 0.25 change
    fields = gguf.GGUFReader(dest).fields
    assert fields["general.name"].contents() == "tiny"
    assert fields["tokenizer.ggml.tokens"].contents() == ["<pad>", "<eos>", "a", "b"]
    assert fields["general.architecture"].contents() == "gemma3"
    assert [p.name for p in dest.parent.iterdir()] == [dest.name]  # no temp file left


def test_a_changed_norm_is_stored_plus_one_in_float32_and_f16_weights_are_f16(tiny_base, tmp_path):
    base, base_state = tiny_base
    state = dict(base_state)
    state[NORM] = base_state[NORM] * 2
    state[Q] = base_state[Q] * 3
    dest = tmp_path / "reader-f16.gguf"
    assert export_gguf(state, base_state, base, dest, weight_type="f16") == 2
    new = _tensors(dest)
    norm = new["blk.0.attn_norm.weight"]
    assert norm.tensor_type == gguf.GGMLQuantizationType.F32
    np.testing.assert_array_equal(np.asarray(norm.data), state[NORM] + 1.0)
    q = new["blk.0.attn_q.weight"]
    assert q.tensor_type == gguf.GGMLQuantizationType.F16
    np.testing.assert_allclose(np.asarray(q.data, dtype=np.float32), state[Q], rtol=1e-3)


def test_a_failed_write_leaves_the_previous_export_and_no_temp_file(tiny_base, tmp_path, monkeypatch):
    base, base_state = tiny_base
    dest = tmp_path / "reader-q8_0.gguf"
    dest.write_bytes(b"the previous export")
    state = {**base_state, Q: base_state[Q] + 1}

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", crash)
    with pytest.raises(OSError, match="disk full"):
        export_gguf(state, base_state, base, dest)
    assert dest.read_bytes() == b"the previous export"
    assert [p.name for p in tmp_path.iterdir() if p.name != "base.gguf"] == [dest.name]


def test_bad_weight_types_and_names_are_refused(tiny_base, tmp_path):
    base, base_state = tiny_base
    with pytest.raises(ValueError, match="weight_type must be one of"):
        export_gguf(base_state, base_state, base, tmp_path / "x.gguf", weight_type="q4_0")
    with pytest.raises(ValueError, match="model.layers.0.mystery.weight has no GGUF tensor name"):
        export_gguf({"model.layers.0.mystery.weight": np.zeros(4)}, {}, base, tmp_path / "x.gguf")
    with pytest.raises(ValueError, match=r"lacks the tensors \['blk.0.ffn_gate.weight'\]"):
        export_gguf({"model.layers.0.mlp.gate_proj.weight": np.zeros((4, 4))}, {}, base, tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="model.layers.1.self_attn.q_proj.weight has no GGUF tensor name"):
        export_gguf({"model.layers.1.self_attn.q_proj.weight": np.zeros((4, 4))}, {}, base, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_transformers_names_map_to_llama_cpps_gemma3_names():
    names = gguf_names(
        [EMB, Q, NORM, "model.layers.17.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight"], 18
    )
    assert names == {
        EMB: "token_embd.weight",
        Q: "blk.0.attn_q.weight",
        NORM: "blk.0.attn_norm.weight",
        "model.layers.17.mlp.down_proj.weight": "blk.17.ffn_down.weight",
        "model.norm.weight": "output_norm.weight",
    }
    weight = np.ones(3, dtype=np.float32)
    np.testing.assert_array_equal(to_gguf_values(NORM, weight), weight + 1)
    np.testing.assert_array_equal(to_gguf_values(Q, weight), weight)


def test_auto_weight_type_is_bf16_only_where_the_cpu_computes_it(monkeypatch):
    monkeypatch.setattr(gemma_weights, "native_bfloat16", lambda device="cpu": True)
    assert resolve_weight_type("auto") == "bf16"
    monkeypatch.setattr(gemma_weights, "native_bfloat16", lambda device="cpu": False)
    assert resolve_weight_type("auto") == "f32"
    assert resolve_weight_type("f16") == "f16"


def test_q8_0_is_refused_with_a_message_on_a_cpu_with_amx_and_kept_elsewhere(monkeypatch):
    """On an AMX CPU llama.cpp's q8_0 kernels ended the process at the first prompt: refused before."""
    monkeypatch.setattr(gemma_weights, "amx_cpu", lambda: True)
    with pytest.raises(ValueError, match="SQA_READER_GGUF_TYPE=q8_0 crashes.*use bf16 or f32"):
        resolve_weight_type("q8_0")
    assert resolve_weight_type("bf16") == "bf16"
    monkeypatch.setattr(gemma_weights, "amx_cpu", lambda: False)
    assert resolve_weight_type("q8_0") == "q8_0"
