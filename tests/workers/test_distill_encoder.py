"""`sqa train passage-tower`: a passage tower distilled from MiniLM on the store's own passages,
saved as an encoder version whose questions MiniLM encodes, and served after `--switch`."""

from __future__ import annotations

import json

import pytest

from models.encoders import DualEncoder, SentenceTransformerEncoder

pytestmark = pytest.mark.integration


def test_a_distilled_tower_is_trained_switched_to_and_answers(sqa, sample_root, tmp_path, monkeypatch):
    import torch

    torch.set_num_threads(1)
    monkeypatch.setenv("SQA_ENCODER", "auto")  # follow the index's encoder after the switch
    monkeypatch.setenv("SQA_ENCODER_BACKEND", "torch")
    assert sqa("import", "realtimeqa", str(sample_root)).exit_code == 0
    assert sqa("ingest", "--through", "2024-03", "--no-train").exit_code == 0

    early = sqa("train", "passage-tower", "--until", "2024-01-04", "--layers", "0")
    assert early.exit_code == 2 and "distilling needs at least" in early.output, early.output

    r = sqa("train", "passage-tower", "--until", "2024-03-01", "--layers", "0,5", "--passages", "60", "--switch")
    assert r.exit_code == 0, r.output
    version = r.output.split("encoder version ")[1].split()[0]
    assert version.startswith("distilled-L2-2024-03-01-")
    assert "cosine to MiniLM" in r.output and f"with {version}" in r.output  # trained, then re-encoded

    folder = tmp_path / "home" / "encoders" / version
    info = json.loads((folder / "encoder.json").read_text())
    assert info["towers"] == "separate" and info["query_format"] == "bare" and info["config"]["layers"] == [0, 5]
    assert info["passages"]["train"] + info["passages"]["held_out"] <= 60 + 500
    assert info["validation"]["after"]["cos_mean"] > info["validation"]["before"]["cos_mean"]
    enc = DualEncoder(folder)
    assert enc.passage.model[0].auto_model.config.num_hidden_layers == 2
    minilm = SentenceTransformerEncoder.packaged()
    question = ["Who is the mayor of Port Calder?"]
    assert (enc.encode_queries(question) == minilm.encode_queries(question)).all()  # MiniLM asks

    listed = sqa("encoders", "list").output
    assert f"* {version}  passage tower of MiniLM's layers [0, 5]  trained until 2024-03-01  cosine to MiniLM" in listed
    again = sqa("train", "passage-tower", "--until", "2024-03-01", "--layers", "0,5", "--passages", "60")
    assert again.exit_code == 0 and f"encoder version {version}" in again.output  # kept, not trained again

    answer = sqa("ask", "Who is the mayor of Port Calder?", "--as-of", "2024-03-31", "--json")
    assert answer.exit_code == 0, answer.output
    body = json.loads(answer.output)
    assert body["versions"]["encoder"] == version and body["passages"]
    assert all(p["published"] <= "2024-03-31" for p in body["passages"])


def test_bad_layers_exit_non_zero_with_a_message(sqa):
    r = sqa("train", "passage-tower", "--until", "2024-03-01", "--layers", "0,7")
    assert r.exit_code == 2 and "increasing numbers in 0..5" in r.output, r.output
