"""The Gemma reader on llama.cpp (models/gemma_llama.py): when it is chosen, its greedy loop and
confidence on a scripted model, and, on the packaged model, the answers PyTorch gives: zero-shot
from the shipped GGUF, and a trained version through its export."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

import models.gemma_llama as gemma_llama
from models.gemma_decoding import line_probability
from models.gemma_llama import LlamaGemmaReader, LlamaGreedy, supports, use_llama_cpp
from tests.models.test_gemma import AS_OF, NBA, NBA_Q, passage

VOCAB = 300  # the scripted model's: a token a character code below it


class CharTokenizer:
    """One token a character (its code point); 0 pads, 1 ends the text, 2 begins it."""

    pad_token_id, eos_token_id = 0, 1

    def __call__(self, text, return_tensors=None):
        import torch

        ids = [2, *(ord(c) % VOCAB for c in text[:50])]
        return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i > 2)


class ScriptedLlama:
    """Stands for a llama_cpp.Llama: after each eval, the logits put `script`'s next token first,
    at a margin that gives it probability `p` exactly."""

    def __init__(self, script: str, p: float) -> None:
        self.script = [ord(c) for c in script] + [1]  # then the end of text
        self.p, self.evals, self.step = p, [], 0
        self.logits = np.zeros(VOCAB, dtype=np.float32)
        self.ctx = None

    def n_vocab(self):
        return VOCAB

    def reset(self):
        self.step = 0

    def eval(self, tokens):
        self.evals.append(list(tokens))
        self.logits[:] = 0.0
        # softmax(top) = p with the other VOCAB-1 logits at 0: top = log(p (VOCAB-1) / (1 - p))
        self.logits[self.script[self.step]] = math.log(self.p * (VOCAB - 1) / (1 - self.p))
        self.step += 1


@pytest.fixture()
def scripted(monkeypatch, tmp_path):
    """A LlamaGreedy over a ScriptedLlama writing " Denver Nuggets\\nLong answer" at p 0.9 a token."""
    llm = ScriptedLlama(" Denver Nuggets\nLong answer", 0.9)
    llama_cpp = pytest.importorskip("llama_cpp")
    monkeypatch.setattr(
        llama_cpp, "llama_get_logits_ith", lambda ctx, i: llm.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    )
    monkeypatch.setattr(LlamaGreedy, "_context", lambda self, n: llm)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    return llm, tmp_path / "m.gguf"


def test_the_greedy_loop_stops_at_the_first_line_and_scores_each_token(scripted):
    llm, path = scripted
    runtime = LlamaGreedy(path, threads=1)
    tokenizer = CharTokenizer()
    tokens, logprobs = runtime.generate(
        [2, 5, 6], max_new_tokens=40, eos={1}, stop=lambda t: "\n" in tokenizer.decode(t)
    )
    assert tokenizer.decode(tokens) == " Denver Nuggets\n"
    assert llm.evals[0] == [2, 5, 6] and all(len(e) == 1 for e in llm.evals[1:])  # the prompt once, then a token a step
    assert logprobs == pytest.approx([math.log(0.9)] * len(tokens), abs=1e-5)
    tokens, _ = runtime.generate([2], max_new_tokens=4, eos={1}, stop=lambda t: False)
    assert tokenizer.decode(tokens) == " Den"  # max_new_tokens


def test_the_end_of_text_ends_the_generation_without_being_kept(scripted):
    llm, path = scripted
    llm.script = [ord("Y"), ord("e"), ord("s"), 1]
    tokens, logprobs = LlamaGreedy(path).generate([2], max_new_tokens=40, eos={1}, stop=lambda t: False)
    assert tokens == [ord("Y"), ord("e"), ord("s")] and len(logprobs) == 3


def test_the_reader_answers_the_first_line_with_its_probability(scripted):
    llm, path = scripted
    reader = LlamaGemmaReader(path, CharTokenizer(), n_passages=2, name="gemma:v3")
    answer = reader.generate(NBA_Q, AS_OF, [NBA])
    assert answer.text == "Denver Nuggets" and answer.raw == " Denver Nuggets\n"
    assert answer.confidence == pytest.approx(0.9 ** len(" Denver Nuggets"), rel=1e-4)
    assert answer.confidence == pytest.approx(
        line_probability(CharTokenizer(), [ord(c) for c in " Denver Nuggets"], [math.log(0.9)] * 15), rel=1e-4
    )
    assert reader.name == "gemma:v3@llama.cpp"
    assert llm.evals[0][0] == 2  # the prompt as the transformers tokenizer writes it, <bos> first
    late = passage(AS_OF.replace(day=AS_OF.day + 1), "Late news.")
    with pytest.raises(AssertionError, match="published after"):
        reader.generate(NBA_Q, AS_OF, [NBA, late])


def test_the_reader_refuses_decoding_it_does_not_do(scripted):
    _, path = scripted
    for decoding in ({"answer_beams": 4}, {"echo_beams": 4}, {"vocabulary": "read"}):
        with pytest.raises(ValueError, match="decodes greedily over the full vocabulary"):
            LlamaGemmaReader(path, CharTokenizer(), **decoding)
    with pytest.raises(FileNotFoundError, match="no GGUF file there"):
        LlamaGemmaReader(path.parent / "missing.gguf", CharTokenizer())


def test_auto_runs_llama_cpp_on_a_cpu_without_bfloat16_with_greedy_full_vocabulary_decoding(monkeypatch):
    import models.gemma_weights as gemma_weights

    monkeypatch.setattr(gemma_llama, "llama_cpp_installed", lambda: True)
    monkeypatch.setattr(gemma_weights, "native_bfloat16", lambda device="cpu": True)
    assert not use_llama_cpp("auto", "cpu")  # PyTorch's bfloat16 is faster there
    assert use_llama_cpp("llama.cpp", "cpu")
    monkeypatch.setattr(gemma_weights, "native_bfloat16", lambda device="cpu": False)
    assert use_llama_cpp("auto", "cpu")
    assert not use_llama_cpp("auto", "cuda")
    assert not use_llama_cpp("auto", "cpu", answer_beams=2)
    assert not use_llama_cpp("auto", "cpu", vocabulary="read")
    assert not use_llama_cpp("torch", "cpu")
    assert use_llama_cpp("llama.cpp", "cpu", answer_beams=2)  # asked for: refused with a message on load
    monkeypatch.setattr(gemma_llama, "llama_cpp_installed", lambda: False)
    assert not use_llama_cpp("auto", "cpu")
    with pytest.raises(ValueError, match="reader runtime must be one of"):
        use_llama_cpp("onnx", "cpu")
    assert supports() and supports(echo_beams=1) and not supports(echo_beams=2)


# --- the packaged model -----------------------------------------------------------------------------


@pytest.mark.integration
def test_zero_shot_on_llama_cpp_answers_what_pytorch_answers(gemma_cache):
    from models.gemma_weights import amx_cpu
    from models.readers import load_reader

    weights = "bf16" if amx_cpu() else "q8_0"  # q8_0 is refused where llama.cpp's AMX kernels crash on it
    reader = load_reader("gemma", cache_dir=gemma_cache, max_passages=3, runtime="llama.cpp", gguf_type=weights)
    assert reader.runtime.path == gemma_cache / f"base-{weights}.gguf"
    gemma_reader = load_reader("gemma", cache_dir=gemma_cache, max_passages=3, runtime="torch")
    assert isinstance(reader, LlamaGemmaReader) and reader.name == "gemma3-270m@llama.cpp"
    others = [passage(AS_OF.replace(day=12), "Stock markets in Asia rose on Monday as investors waited.")]
    for passages in ([NBA], [others[0], NBA]):
        ours, theirs = reader.generate(NBA_Q, AS_OF, passages), gemma_reader.generate(NBA_Q, AS_OF, passages)
        assert "denver nuggets" in ours.text.lower()
        assert ours.text == theirs.text
        assert ours.confidence == pytest.approx(theirs.confidence, rel=0.25)  # Q4_K_M read two ways


@pytest.mark.integration
def test_a_trained_version_exported_reads_like_its_pytorch_reader(gemma_cache, tmp_path):
    import torch

    from models.gemma_config import GemmaConfig
    from models.gemma_train import GemmaModel, llama_reader
    from models.trained import export_for_serving, write_reader_info

    torch.manual_seed(0)
    model = GemmaModel.from_base(GemmaConfig(n_passages=2), cache_dir=gemma_cache)
    with torch.no_grad():  # a trained-looking change: every LoRA B small and random
        for name, p in model.named_trainable():
            if "lora_B" in name:
                p.normal_(0, 0.002)
    folder = tmp_path / "v1"
    model.save(folder)
    write_reader_info(folder, {"kind": "gemma", "version": "v1"})
    assert export_for_serving(folder, runtime="torch") is None  # PyTorch reads it: nothing to write
    exported = export_for_serving(folder, runtime="llama.cpp", gguf_type="f16")  # what a training does
    assert exported == folder / "reader-f16.gguf" and exported.exists()
    stamp = exported.stat().st_mtime_ns
    theirs = GemmaModel.load(folder, cache_dir=gemma_cache).into_reader(name="gemma:v1")
    ours = llama_reader(folder, name="gemma:v1", weight_type="f16")
    assert ours.name == "gemma:v1@llama.cpp" and exported.stat().st_mtime_ns == stamp  # read as written
    a, b = ours.generate(NBA_Q, AS_OF, [NBA]), theirs.generate(NBA_Q, AS_OF, [NBA])
    assert a.text == b.text and "denver nuggets" in a.text.lower()
    assert a.confidence == pytest.approx(b.confidence, rel=0.25)
    llama_reader(folder, name="gemma:v1", weight_type="f16")  # the export is reused
    assert exported.stat().st_mtime_ns == stamp


def test_auto_keeps_pytorch_for_a_base_that_is_not_the_packaged_model(monkeypatch, tmp_path):
    import json

    import models.gemma_weights as gemma_weights

    monkeypatch.setattr(gemma_llama, "llama_cpp_installed", lambda: True)
    monkeypatch.setattr(gemma_weights, "native_bfloat16", lambda device="cpu": False)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 1024}))
    assert not use_llama_cpp("auto", "cpu", tmp_path)
    assert not use_llama_cpp("auto", "cpu", tmp_path / "missing")
    (tmp_path / "config.json").write_text(
        json.dumps({"hidden_size": 640, "num_hidden_layers": 18, "vocab_size": 262144, "other": 1})
    )
    assert use_llama_cpp("auto", "cpu", tmp_path)


def test_export_for_serving_writes_nothing_where_pytorch_reads_the_version(monkeypatch, tmp_path):
    import models.gemma_weights as gemma_weights
    from models.trained import export_for_serving, write_reader_info

    monkeypatch.setattr(gemma_llama, "llama_cpp_installed", lambda: True)
    monkeypatch.setattr(gemma_weights, "native_bfloat16", lambda device="cpu": True)
    write_reader_info(tmp_path, {"kind": "gemma", "version": "v1"})
    assert export_for_serving(tmp_path) is None  # native bfloat16: PyTorch reads it
    monkeypatch.setattr(gemma_weights, "native_bfloat16", lambda device="cpu": False)
    assert export_for_serving(tmp_path, runtime="torch") is None
    assert export_for_serving(tmp_path, answer_beams=2) is None  # beams: PyTorch decodes them
    write_reader_info(tmp_path, {"kind": "fid", "version": "v1"})
    assert export_for_serving(tmp_path, runtime="llama.cpp") is None  # only Gemma versions run there
    assert list(tmp_path.iterdir()) == [tmp_path / "reader.json"]


def test_a_failed_export_is_logged_and_left_to_the_first_load(make_settings, tmp_path, caplog):
    import logging

    from app.bootstrap.builders import export_trained_folder
    from models.trained import write_reader_info

    write_reader_info(tmp_path, {"kind": "gemma", "version": "v1"})  # no weights: the export fails
    with caplog.at_level(logging.WARNING):
        assert export_trained_folder(make_settings(reader_runtime="llama.cpp"), tmp_path) is None
    assert f"{tmp_path.name}: not exported for the serving runtime" in caplog.text
    assert list(tmp_path.iterdir()) == [tmp_path / "reader.json"]  # nothing half-written left
