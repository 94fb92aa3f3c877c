"""DPR fine-tuning (`sqa train retriever`) on the invented sample with the packaged MiniLM, tiny runs."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
import torch

from app.bootstrap.builders import open_database
from models.dpr import BiEncoder, DprConfig, Pair, train_biencoder
from models.encoders import (
    DualEncoder,
    HashEncoder,
    SentenceTransformerEncoder,
    describe_encoder,
    packaged_minilm_path,
    read_encoder_info,
    resolve_encoder,
)
from tests.conftest import load_sample
from workers.train_retriever import RetrieverDataConfig, ValItem, pool_figures, run_train_retriever_job

TINY = DprConfig(batch_size=4, epochs=1, max_query_len=32, max_passage_len=48, checkpoint_every=2)
PAIRS = [
    Pair(
        f"Today is Monday, May {d}, 2024. Who won the {sport} final?",
        f"{name} won the {sport} final.",
        f"The {sport} season starts in autumn.",
    )
    for d, (sport, name) in enumerate(
        [("chess", "Ada Quist"), ("rowing", "Bram Oyelaran"), ("curling", "Cato Venn"), ("fencing", "Dora Maelstrom")],
        start=1,
    )
]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.mark.integration
def test_the_loss_falls_and_a_saved_version_reloads_as_the_same_encoder(tmp_path):
    model = BiEncoder(
        packaged_minilm_path(),
        DprConfig(towers="separate", batch_size=4, lr=1e-4, max_query_len=32, max_passage_len=48),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses = []
    for _ in range(6):
        loss = model.loss(PAIRS)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    model.train(False)
    model.save(tmp_path / "dpr-x", {"version": "dpr-x"})
    enc = DualEncoder(tmp_path / "dpr-x")
    assert enc.name == "dpr-x" and enc.dim == 384 and read_encoder_info(tmp_path / "dpr-x")["towers"] == "separate"
    text = [PAIRS[0].positive]
    np.testing.assert_allclose(enc.encode_passages(text), model.encode_passages(text), atol=1e-5)
    np.testing.assert_allclose(enc.encode_queries(text), model.encode_queries(text), atol=1e-5)
    # two towers moved apart: the same text is encoded differently as a question and as a passage
    assert float((enc.encode_queries(text) @ enc.encode_passages(text).T)[0, 0]) < 0.9999
    assert resolve_encoder("dpr-x", encoders_dir=tmp_path).name == "dpr-x"
    # what `sqa index status` reads from the files without loading the towers
    assert describe_encoder("dpr-x", encoders_dir=tmp_path) == (enc.name, enc.dim)
    minilm = SentenceTransformerEncoder.packaged()
    assert describe_encoder("minilm") == describe_encoder(minilm.name) == (minilm.name, minilm.dim)


class _HashTowers(BiEncoder):
    """BiEncoder.loss over hash embeddings: the batch masking is under test, not MiniLM."""

    def __init__(self, cfg: DprConfig) -> None:  # no towers to load
        self.cfg, self.device = cfg, "cpu"
        self.query = self.passage = None

    def _embed(self, model, texts, max_len):
        return torch.from_numpy(HashEncoder(64).encode(list(texts)))


def _dpr_loss_by_hand(cfg: DprConfig, batch: list[Pair], *, mask_twins: bool) -> float:
    """Mean cross-entropy of scale x cosine over the batch's positives (+ hard negatives); with
    mask_twins, a column holding question i's positive text (other than column i) is left out of row i."""
    texts = [p.positive for p in batch] + ([p.negative for p in batch if p.negative] if cfg.hard_negatives else [])
    q = HashEncoder(64).encode([p.query for p in batch]).astype(np.float64)
    d = HashEncoder(64).encode(texts).astype(np.float64)
    logits = cfg.scale * q @ d.T
    total = 0.0
    for i, p in enumerate(batch):
        row = np.array([logits[i, j] for j, t in enumerate(texts) if not (mask_twins and j != i and t == p.positive)])
        total += row.max() + np.log(np.exp(row - row.max()).sum()) - logits[i, i]
    return total / len(batch)


@pytest.mark.parametrize("hard_negatives", [True, False])
def test_a_shared_batch_passage_is_not_a_negative_for_its_other_question(hard_negatives):
    twins = [PAIRS[0], Pair("Today is Monday, May 9, 2024. Who won at chess?", PAIRS[0].positive), *PAIRS[1:3]]
    cfg = DprConfig(**{**TINY.__dict__, "hard_negatives": hard_negatives})
    masked = _dpr_loss_by_hand(cfg, twins, mask_twins=True)
    unmasked = _dpr_loss_by_hand(cfg, twins, mask_twins=False)
    assert unmasked - masked > 0.1  # the case can tell: each twin's column scores exactly as its own positive
    assert float(_HashTowers(cfg).loss(twins)) == pytest.approx(masked, abs=1e-4)


@pytest.mark.integration
def test_training_resumes_from_its_checkpoint(tmp_path):
    calls = {"n": 0}
    model = BiEncoder(packaged_minilm_path(), DprConfig(**{**TINY.__dict__, "epochs": 3, "batch_size": 2}))
    real = model.loss

    def crash(batch):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt("killed")
        return real(batch)

    model.loss = crash

    def validate(m):
        return {"recall@5": 1.0}

    with pytest.raises(KeyboardInterrupt):
        train_biencoder(model, PAIRS, tmp_path, validate, metric="recall@5")
    assert (tmp_path / "ckpt.pt").exists()
    model.loss = real
    calls["n"] = 0
    result = train_biencoder(model, PAIRS, tmp_path, validate, metric="recall@5")
    assert result.steps == 6  # 2 batches x 3 epochs, the first 4 not repeated
    assert [h["step"] for h in result.history][0] == 0


def test_pool_figures_count_an_answer_in_the_top_k():
    items = [ValItem("q1", 0, (2,), ()), ValItem("q2", 0, (), ())]
    figures = pool_figures([[0, 1, 2], [0, 1]], items)
    assert (
        figures["recall@1"] == 0.0 and figures["recall@5"] == 50.0 and figures["mrr"] == pytest.approx(1 / 6, abs=1e-4)
    )


@pytest.mark.integration
def test_train_retriever_job_registers_a_version_the_index_can_switch_to(sqlite_settings, new_job):
    loaded_settings = sqlite_settings  # one database is enough: this trains a real MiniLM
    load_sample(loaded_settings)
    job = new_job(loaded_settings, "train-retriever")
    stages, open_stage = [], job[1].progress.stage
    job[1].progress.stage = lambda name, total: (stages.append(name), open_stage(name, total))
    version = run_train_retriever_job(
        *job, until=dt.date(2024, 3, 1), cfg=TINY, data=RetrieverDataConfig(max_self_articles=12, max_val=10)
    )
    assert stages[:3] == ["self-label", "data", "train"]  # the minutes of spaCy show as a stage of their own
    folder = loaded_settings.encoders_dir / version
    info = read_encoder_info(folder)
    assert info["trained_until"] == "2024-03-01" and info["data"]["gold_pairs"] + info["data"]["self_pairs"] >= 4
    assert {"bm25", "untuned", "best"} <= set(info["validation"]) and info["validation"]["best"]["recall@20"] >= 0
    assert info["query_format"] == "dated"  # trained on dated questions, so served them (models.encoders.query_text)
    assert not list((loaded_settings.work_dir / "train-retriever").glob("run-*"))  # checkpoints go after success
    data = next((loaded_settings.work_dir / "train-retriever").glob("data-*/pairs.jsonl"))  # kept for reuse
    import json

    pairs = [json.loads(line) for line in data.read_text().splitlines()]
    days = [dt.datetime.strptime(p["query"].split(". ", 1)[0], "Today is %A, %B %d, %Y").date() for p in pairs]
    assert days and max(days) < dt.date(2024, 2, 1)  # nothing from the validation month or after the cut
    assert all(p["query"].split(". ", 1)[1] and p["positive"] != p["negative"] for p in pairs)

    from app.bootstrap.job_configs import ingest_config
    from workers.reencode import reencode

    db = open_database(loaded_settings)
    try:
        job = reencode(db.sessions, DualEncoder(folder), ingest_config(loaded_settings))
        assert job.state == "succeeded" and job.counts["encoder"] == version
    finally:
        db.close()
    from app.bootstrap.builders import build_encoder

    auto = loaded_settings.model_copy(update={"encoder": "auto"})
    assert build_encoder(auto).name == version  # ingests after the switch use the index's encoder


def test_the_data_config_writes_the_question_in_its_format_and_refuses_another():
    day = dt.date(2024, 5, 6)
    assert RetrieverDataConfig().query(" Who won? ", day) == "Today is Monday, May 6, 2024. Who won?"
    assert RetrieverDataConfig(query_format="bare").query(" Who won? ", day) == "Who won?"
    with pytest.raises(ValueError, match="query format 'iso' is not one of bare, dated"):
        RetrieverDataConfig(query_format="iso")


@pytest.mark.integration
def test_a_version_trained_on_bare_questions_is_served_bare_questions(sqlite_settings, new_job):
    import json

    from models.encoders import query_text

    load_sample(sqlite_settings)
    version = run_train_retriever_job(
        *new_job(sqlite_settings, "train-retriever"),
        until=dt.date(2024, 3, 1),
        cfg=TINY,
        data=RetrieverDataConfig(max_self_articles=12, max_val=10, query_format="bare"),
    )
    folder = sqlite_settings.encoders_dir / version
    assert read_encoder_info(folder)["query_format"] == "bare"
    pairs = next((sqlite_settings.work_dir / "train-retriever").glob("data-*/pairs.jsonl")).read_text().splitlines()
    assert pairs and not any(json.loads(line)["query"].startswith("Today is") for line in pairs)
    assert query_text(DualEncoder(folder), "Who won?", dt.date(2024, 5, 6)) == "Who won?"
