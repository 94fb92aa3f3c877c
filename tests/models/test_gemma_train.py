"""The trainable Gemma reader: prompt fitting, answer-only labels and loss, what trains, save/load,
batched generation (a tiny random Gemma 3 and a character tokenizer), then the real packaged model."""

from __future__ import annotations

import datetime as dt
import json
import math
from unittest.mock import patch

import pytest
import torch

import models.gemma_train as gemma_train
from indexer.dates import format_long
from models.gemma_config import CONFIG_FILE, LORA_TARGETS, WEIGHTS_FILE, GemmaConfig
from models.gemma_prompt import build_prompt, build_target, fit_prompt, reader_context
from models.gemma_train import GemmaModel
from models.gemma_weights import FOLDER_NAME
from models.reader_base import RetrievedPassage
from models.training import ReaderTrainer, TrainConfig, TrainExample

AS_OF = dt.date(2023, 6, 14)


def passage(day: dt.date, body: str) -> RetrievedPassage:
    return RetrievedPassage("a title", body, day)


NBA = passage(
    dt.date(2023, 6, 13),
    "The Denver Nuggets won the NBA championship on Monday night, beating the Miami "
    "Heat 94-89 in Game 5. Nikola Jokic was named the Finals MVP.",
)
FILLER = passage(dt.date(2023, 6, 12), " ".join(f"filler{i}" for i in range(120)))


# --- a tiny Gemma 3 and a character tokenizer ---------------------------------------------------------


class CharTokenizer:
    """One id per character (ord + 4), <bos> = 2, <pad> = 0, <eos> = 1: what GemmaModel asks of a tokenizer."""

    pad_token_id, eos_token_id, bos_token_id = 0, 1, 2

    def __call__(self, text, add_special_tokens=True, return_tensors=None):
        if isinstance(text, list):  # a batch of texts: models.gemma_decoding.answer_vocabulary's call
            return {"input_ids": [self(t, add_special_tokens)["input_ids"] for t in text]}
        ids = ([self.bos_token_id] if add_special_tokens else []) + [ord(c) % 256 + 4 for c in text]
        if return_tensors == "pt":  # GemmaReader's call
            return {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
        return {"input_ids": ids}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i) - 4) for i in ids if int(i) >= 4)

    def batch_decode(self, rows, skip_special_tokens=True):
        return [self.decode(r) for r in rows]


def tiny_lm(seed: int = 0):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(
        vocab_size=260,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=1024,
        max_position_embeddings=2048,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    return Gemma3ForCausalLM(cfg).eval()


def tiny(config: GemmaConfig | None = None, seed: int = 0) -> GemmaModel:
    """float32 unless the config says otherwise: the exactness tests compare with float32 references."""
    return GemmaModel(
        tiny_lm(seed), CharTokenizer(), config or GemmaConfig(max_length=400, lora_r=4, precision="float32")
    )


ITEMS = [("Who won the NBA championship?", AS_OF, [FILLER, NBA]), ("Who was named MVP?", AS_OF, [NBA])]
ANSWERS = ["Denver Nuggets", "Nikola Jokic"]


# --- the prompt ---------------------------------------------------------------------------------------


def words(text: str) -> int:
    return len(text.split())


def test_fit_prompt_keeps_a_prompt_that_fits_unchanged():
    assert fit_prompt("Q?", AS_OF, [NBA], 100, 1000, words) == build_prompt("Q?", AS_OF, [NBA], 100)


def test_fit_prompt_cuts_every_passage_to_the_same_length_and_never_the_question():
    question = "Who won the NBA championship this year after all?"
    prompt = fit_prompt(question, AS_OF, [FILLER, FILLER, NBA], 100, 120, words)
    assert words(prompt) <= 120
    lines = prompt.split("\n")
    assert lines[-2:] == build_prompt(question, AS_OF, [], 1).split("\n")  # the question is whole
    cut = words(lines[0]) - 1  # "Passage:" aside
    assert cut < 100 and words(lines[1]) - 1 == cut
    assert words(build_prompt(question, AS_OF, [FILLER, FILLER, NBA], cut + 1)) > 120  # the most words that fit


def test_fit_prompt_without_room_keeps_one_word_a_passage():
    prompt = fit_prompt("Q?", AS_OF, [FILLER, NBA], 100, 3, words)
    assert prompt == build_prompt("Q?", AS_OF, [FILLER, NBA], 1)


def test_fit_prompt_with_titles_reads_the_headlines_as_served_and_cuts_only_the_passage_words():
    titled = [RetrievedPassage("Storm hits Florida", FILLER.text, FILLER.published), NBA]
    served = build_prompt(
        "Q?", AS_OF, reader_context("Q?", titled, n_passages=2, max_passage_words=100, titles=True), None
    )
    assert fit_prompt("Q?", AS_OF, titled, 100, 1000, words, titles=True) == served
    assert "Storm hits Florida." in served and "a title." in served
    cut = fit_prompt("Q?", AS_OF, titled, 100, 60, words, titles=True)
    assert words(cut) <= 60 and "Storm hits Florida." in cut and "a title." in cut


# --- labels and loss --------------------------------------------------------------------------------


def test_encode_examples_labels_only_the_answer_after_the_served_prompt():
    model = tiny()
    tok = model.tokenizer
    ids, mask, labels = model.encode_examples(ITEMS[1:], ANSWERS[1:])  # fits: the prompt is the served one
    prompt = tok(build_prompt(ITEMS[1][0], AS_OF, [NBA], 100))["input_ids"]
    target = tok(build_target("Nikola Jokic"), add_special_tokens=False)["input_ids"]
    assert ids[0].tolist() == prompt + target
    assert labels[0].tolist() == [-100] * len(prompt) + target
    assert tok.decode(labels[0][labels[0] != -100]) == " Nikola Jokic\n"


def test_encode_examples_cuts_passages_to_max_length_and_pads_on_the_right():
    model = tiny(GemmaConfig(max_length=300, lora_r=4))
    ids, mask, labels = model.encode_examples(ITEMS, ANSWERS)
    assert 250 < ids.shape[1] <= 300 and int(mask[0].sum()) == ids.shape[1]  # cut by whole words
    answer = labels[0][labels[0] != -100]
    assert model.tokenizer.decode(answer) == " Denver Nuggets\n"  # the answer is never cut
    n = int(mask[1].sum())
    assert (labels[1, n:] == -100).all() and (ids[1, n:] == 0).all() and (mask[1, n:] == 0).all()
    text = model.tokenizer.decode(ids[0][mask[0] == 1])
    assert "Question (asked on Wednesday, June 14, 2023): Who won the NBA championship?\nShort answer:" in text


def test_loss_is_the_full_vocabulary_loss_of_the_answer_tokens():
    model = tiny().eval()
    ids, mask, labels = model.encode_examples(ITEMS, ANSWERS)
    full = model._causal_lm()(input_ids=ids, attention_mask=mask, labels=labels).loss  # B x L x V logits
    assert model.loss(ITEMS, ANSWERS).item() == pytest.approx(full.item(), abs=1e-5)


def test_only_the_lora_adapters_get_gradients_never_the_embeddings():
    model = tiny().train()
    model.loss(ITEMS, ANSWERS).backward()
    lm = model._causal_lm()
    embeddings = lm.model.embed_tokens.weight
    assert embeddings is lm.lm_head.weight and not embeddings.requires_grad and embeddings.grad is None
    trainable = model.named_trainable()
    assert trainable and all("lora_" in name for name, _ in trainable)
    targets = {name.split(".lora_")[0].rsplit(".", 1)[1] for name, _ in trainable}
    assert targets == set(LORA_TARGETS)
    assert all(p.grad is not None for name, p in trainable)
    frozen = [p for n, p in lm.named_parameters() if "lora_" not in n]
    assert all(p.grad is None and not p.requires_grad for p in frozen)


def test_last_layers_trains_the_last_decoder_layers_and_the_final_norm():
    model = tiny(GemmaConfig(method="last-layers", last_layers=1))
    names = [n for n, _ in model.named_trainable()]
    assert names and all(n.startswith(("model.layers.2.", "model.norm.")) for n in names)
    model.loss(ITEMS, ANSWERS).backward()
    assert model._causal_lm().model.embed_tokens.weight.grad is None


def test_bfloat16_training_computes_in_bfloat16_and_keeps_float32_weights_and_gradients():
    exact = tiny()
    fast = tiny(GemmaConfig(max_length=400, lora_r=4, precision="bfloat16"))
    reference = exact.loss(ITEMS, ANSWERS)
    loss = fast.loss(ITEMS, ANSWERS)
    assert loss.item() != reference.item()  # the matmuls did run in bfloat16...
    assert loss.item() == pytest.approx(reference.item(), rel=0.05)  # ...to about the same loss
    loss.backward()
    trainable = [p for _, p in fast.named_trainable()]
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32 for p in trainable)


def test_auto_precision_trains_under_bfloat16_autocast_where_onednn_emulates_it(monkeypatch):
    import models.gemma_weights as gemma_weights

    exact = tiny()
    auto = tiny(GemmaConfig(max_length=400, lora_r=4, precision="auto"))
    monkeypatch.setattr(gemma_weights, "native_bfloat16", lambda device="cpu": False)
    monkeypatch.setattr(gemma_weights, "onednn_bfloat16", lambda device="cpu": True)
    assert auto.training_precision == "bfloat16"
    assert auto.loss(ITEMS, ANSWERS).item() != exact.loss(ITEMS, ANSWERS).item()  # under autocast
    monkeypatch.setattr(gemma_weights, "onednn_bfloat16", lambda device="cpu": False)
    assert auto.training_precision == "float32"
    assert auto.loss(ITEMS, ANSWERS).item() == exact.loss(ITEMS, ANSWERS).item()  # the same float32 model


def test_use_precision_changes_what_the_model_trains_in_and_what_a_saved_version_records(tmp_path):
    exact = tiny()
    model = tiny(GemmaConfig(max_length=400, lora_r=4, precision="bfloat16"))
    assert model.training_precision == "bfloat16"
    model.use_precision("float32")
    assert model.training_precision == "float32"
    assert model.loss(ITEMS, ANSWERS).item() == exact.loss(ITEMS, ANSWERS).item()  # no autocast any more
    model.save(tmp_path)
    assert json.loads((tmp_path / CONFIG_FILE).read_text())["precision"] == "float32"
    with pytest.raises(ValueError, match="precision must be one of"):
        model.use_precision("float16")


def test_encode_examples_with_max_length_0_train_on_the_served_prompt_whole():
    """A prompt far over what a cut would allow is kept whole: the example is the served context
    (the reader's n_passages, max_passage_words each, headlines as served) and the target."""
    titled = [RetrievedPassage("Storm hits Florida", FILLER.text, FILLER.published), NBA, NBA]
    model = tiny(GemmaConfig(max_length=0, n_passages=2, lora_r=4, titles=True))
    ids, mask, labels = model.encode_examples([("Who won?", AS_OF, titled)], ["Denver Nuggets"])
    served = build_prompt("Who won?", AS_OF, model.context("Who won?", titled), None)
    target = model.tokenizer(build_target("Denver Nuggets"), add_special_tokens=False)["input_ids"]
    assert ids[0].tolist() == model.tokenizer(served)["input_ids"] + target
    assert ids.shape[1] > 300 and served.count("Passage:") == 2 and "Storm hits Florida." in served
    cut = tiny(GemmaConfig(max_length=300, n_passages=2, lora_r=4, titles=True))
    assert cut.encode_examples([("Who won?", AS_OF, titled)], ["Denver Nuggets"])[0].shape[1] <= 300


def test_config_refuses_a_negative_max_length_and_a_train_spec_passes_its_own_on():
    from workers.reader_spec import ReaderJobSpec

    with pytest.raises(ValueError, match="max_length must be 0"):
        GemmaConfig(max_length=-1)
    cfg = ReaderJobSpec.for_gemma(max_length=0).gemma_config()
    assert cfg.max_length == 0 and cfg.n_passages == 5 and cfg.titles
    assert ReaderJobSpec.for_gemma().gemma_config().max_length == ReaderJobSpec.for_gemma().max_length
    assert ReaderJobSpec.for_gemma().gemma_config().context_words == 0  # the first words of each passage
    assert ReaderJobSpec.for_gemma(context_words=150).gemma_config().context_words == 150


def test_config_refuses_an_unknown_method_and_round_trips_through_json():
    with pytest.raises(ValueError, match="method 'full' is unknown"):
        GemmaConfig(method="full")
    with pytest.raises(ValueError, match="precision must be one of"):
        GemmaConfig(precision="float16")
    cfg = GemmaConfig(lora_r=8, lora_targets=("q_proj", "v_proj"))
    assert GemmaConfig.from_json(json.loads(json.dumps(cfg.to_json()))) == cfg


# --- save and load ----------------------------------------------------------------------------------


@pytest.fixture()
def tiny_base(monkeypatch):
    """GemmaModel.load builds its base as the tiny model (same seed: the same frozen weights)."""
    calls = []

    def load_base(cache_dir):
        calls.append(cache_dir)
        return tiny_lm(), CharTokenizer()

    monkeypatch.setattr(gemma_train, "_load_base", load_base)
    return calls


def _train_a_step(model: GemmaModel) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model.train()
    model.loss(ITEMS, ANSWERS).backward()
    opt.step()


def test_save_writes_only_the_trained_tensors_and_load_restores_them_exactly(tmp_path, tiny_base):
    model = tiny()
    _train_a_step(model)
    models_dir = tmp_path / "models"
    (models_dir / "base").mkdir(parents=True)
    model.save(models_dir / "v1")
    assert sorted(p.name for p in (models_dir / "v1").iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    loaded = GemmaModel.load(models_dir / "v1")
    assert tiny_base == [models_dir / "base"]  # the version's sibling base/
    before, after = model.state_dict(), loaded.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert any(v.abs().sum() > 0 for k, v in after.items() if "lora_B" in k)  # really trained
    model.eval()
    ids, mask, _ = model.encode_examples(ITEMS, ANSWERS)
    with torch.no_grad():
        assert torch.equal(
            model.net(input_ids=ids, attention_mask=mask).logits, loaded.net(input_ids=ids, attention_mask=mask).logits
        )


def test_a_soup_of_saved_runs_loads_and_trains_on_as_one_lora_of_the_summed_rank(tmp_path, tiny_base):
    """What the monthly fine-tune does with a served soup (`sqa train auto` serves one): it loads the
    soup as a version of its own (rank 2r) and trains it further (that it is the mean of its members:
    tests/models/test_gemma_soup.py)."""
    models_dir = tmp_path / "models"
    (models_dir / "base").mkdir(parents=True)
    runs = []
    for seed in (1, 2):
        run = tiny()  # the same base and adapters at first...
        torch.manual_seed(seed)
        with torch.no_grad():  # ...then each run's own (two seeds)
            for p in run.parameters():
                p.add_(0.05 * torch.randn_like(p))
        _train_a_step(run)
        run.save(models_dir / f"run{seed}")
        runs.append(run)
    a, b = (r.state_dict() for r in runs)
    assert any(not torch.equal(a[k], b[k]) for k in a)  # two different runs
    gemma_train.write_soup([models_dir / "run1", models_dir / "run2"], models_dir / "soup")
    soup = GemmaModel.load(models_dir / "soup")
    assert soup.config.lora_r == 8 and soup.config.lora_alpha == 2 * runs[0].config.lora_alpha
    soup.eval()
    assert math.isfinite(soup.loss(ITEMS, ANSWERS).item())
    before = {k: v.clone() for k, v in soup.state_dict().items()}
    _train_a_step(soup)
    after = soup.state_dict()
    assert all(after[k].shape == before[k].shape for k in before)
    assert any(not torch.equal(after[k], before[k]) for k in before if "lora_A" in k)  # it trains on
    assert any(not torch.equal(after[k], before[k]) for k in before if "lora_B" in k)


def test_load_looks_for_the_base_beside_the_version_then_where_it_was_trained(tmp_path, tiny_base):
    trained_from = tmp_path / "cache"
    (trained_from / FOLDER_NAME).mkdir(parents=True)
    (trained_from / FOLDER_NAME / "model.safetensors").write_bytes(b"w")
    model = GemmaModel(tiny_lm(), CharTokenizer(), GemmaConfig(lora_r=4), base_cache=trained_from)
    model.save(tmp_path / "work" / "checkpoint")  # no base/ beside it
    GemmaModel.load(tmp_path / "work" / "checkpoint")
    explicit = tmp_path / "elsewhere"
    GemmaModel.load(tmp_path / "work" / "checkpoint", cache_dir=explicit)
    assert tiny_base == [trained_from.resolve(), explicit]


def test_load_refuses_a_folder_without_its_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a Gemma reader folder"):
        GemmaModel.load(tmp_path)


def test_load_refuses_tensors_of_another_method(tmp_path, tiny_base):
    tiny(GemmaConfig(method="last-layers", last_layers=1)).save(tmp_path / "v")
    config = json.loads((tmp_path / "v" / CONFIG_FILE).read_text())
    (tmp_path / "v" / CONFIG_FILE).write_text(json.dumps({**config, "method": "lora"}))
    with pytest.raises(ValueError, match="trained tensors do not match the model"):
        GemmaModel.load(tmp_path / "v")


# --- generation and serving --------------------------------------------------------------------------


def test_generate_in_a_batch_answers_as_one_at_a_time():
    model = tiny(GemmaConfig(max_new_tokens=6, lora_r=4)).eval()
    items = [*ITEMS, ("Q?", AS_OF, [])]
    batch = model.generate(items, batch_size=3)  # left-padded together
    assert batch[2] == ""  # no passages: no answer, the model is not asked
    assert batch[:2] == [model.generate([item])[0] for item in ITEMS] == model.generate(ITEMS)  # CPU: one by one


def test_on_a_cpu_validation_answers_through_one_served_copy_and_the_model_trains_on(tmp_path):
    model = tiny(GemmaConfig(max_new_tokens=6, lora_r=4, precision="float32"))
    _train_a_step(model)
    trainer = ReaderTrainer(model, "gemma", TrainConfig(), tmp_path)
    examples = [TrainExample(f"q{i}", q, day, ("x",), tuple(ps)) for i, (q, day, ps) in enumerate(ITEMS * 6)]
    with patch.object(GemmaModel, "served_copy", wraps=model.served_copy) as copies:
        answers = trainer.predict(examples)  # 12 questions: the trainer used to ask 8 at a time
    assert copies.call_count == 1
    assert answers == model.generate(ITEMS, batch_size=1) * 6  # what the unmerged model says, row by row
    assert any("lora_" in n for n, _ in model.net.named_parameters())  # its own adapters are not merged
    before = {n: p.clone() for n, p in model.named_trainable()}
    _train_a_step(model)
    assert any(not torch.equal(before[n], p) for n, p in model.named_trainable())  # and it trains on


def test_into_reader_merges_the_adapters_and_reads_as_the_model_does(tiny_base):
    model = tiny(GemmaConfig(max_new_tokens=6, lora_r=4, precision="float32"))  # the reader's default too
    _train_a_step(model)
    model.eval()
    expected = model.generate(ITEMS)
    reader = model.into_reader(name="gemma:v1")
    assert reader.name == "gemma:v1" and reader.n_passages == 3 and reader.max_passage_words == 100
    assert not any("lora_" in n for n, _ in reader.model.named_parameters())  # merged into the base
    assert [reader.generate(*item).text for item in ITEMS] == expected


def test_a_version_trained_with_titles_serves_with_them_and_an_older_one_without(tmp_path, tiny_base):
    titled = [RetrievedPassage("Storm hits Florida", NBA.text, NBA.published)]
    (tmp_path / "base").mkdir()
    tiny(GemmaConfig(lora_r=4, titles=True)).save(tmp_path / "new")
    config = json.loads((tmp_path / "new" / CONFIG_FILE).read_text())
    assert config["titles"] is True
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / WEIGHTS_FILE).write_bytes((tmp_path / "new" / WEIGHTS_FILE).read_bytes())
    del config["titles"]  # a config saved before headlines existed
    (tmp_path / "old" / CONFIG_FILE).write_text(json.dumps(config))
    new, old = (GemmaModel.load(tmp_path / v).into_reader(name=v) for v in ("new", "old"))
    assert new.titles and not old.titles
    assert new.context("Q?", titled)[0].dated_text.startswith(
        format_long(NBA.published) + ". Storm hits Florida. The Denver"
    )
    assert old.context("Q?", titled)[0].text == NBA.text


def test_the_served_head_reads_a_compact_input_even_with_frozen_weights():
    # A slice of the prompt's hidden states made torch copy the whole frozen head at each token
    # (0.8 s a call for Gemma's 262k x 640 in bfloat16); the reader hands the head a compact copy.
    from models.gemma import GemmaReader

    lm = tiny_lm().requires_grad_(False)  # as a trained version is after its adapters are merged
    reader = GemmaReader(lm, CharTokenizer(), max_new_tokens=3)
    seen = []
    lm.get_output_embeddings().register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    reader.generate(*ITEMS[1])
    assert seen and all(x.dim() == 3 and x.is_contiguous() and x.stride(0) == x.shape[1] * x.shape[2] for x in seen)


def _examples() -> list[TrainExample]:
    """ITEMS with their ANSWERS, as training examples."""
    return [
        TrainExample(str(i), q, a_of, (ans,), tuple(ps)) for i, ((q, a_of, ps), ans) in enumerate(zip(ITEMS, ANSWERS))
    ]


def test_trainer_scores_validation_before_the_first_step(tmp_path):
    examples = _examples()
    trainer = ReaderTrainer(
        tiny(GemmaConfig(max_new_tokens=4, lora_r=4)),
        "gemma",
        TrainConfig(lr=1e-3, batch_size=2, max_epochs=2, eval_every=1, eval_at_start=True),
        tmp_path / "run",
    )
    result = trainer.train(examples, examples)
    assert [h["step"] for h in result.history] == [0, 1, 2]
    assert result.history[1]["s_per_step"] > 0
    assert (tmp_path / "run" / "best" / WEIGHTS_FILE).exists()


def test_greedy_within_the_whole_vocabulary_is_the_served_greedy_decoding():
    from models.gemma import GemmaReader

    full = GemmaReader(tiny_lm(), CharTokenizer(), max_new_tokens=8)
    within = GemmaReader(full.model, CharTokenizer(), max_new_tokens=8, vocabulary="read")
    everything = list(range(full.model.config.vocab_size))
    with patch("models.gemma.answer_vocabulary", lambda tokenizer, texts: everything):
        for item in ITEMS:
            a, b = within.generate(*item), full.generate(*item)
            assert (a.text, a.raw) == (b.text, b.raw)  # same tokens, same stop
            # the full head's scores give a probability; the restricted path scores allowed rows only: none
            assert a.confidence is None and 0 < b.confidence <= 1


def test_the_served_confidence_is_the_models_probability_of_the_line_it_wrote():
    # Checked against one forward pass over prompt + answer: the log-softmax at each position that
    # predicts an answer token, summed over the first line (models.gemma_decoding.line_probability).
    from models.gemma import GemmaReader
    from models.gemma_decoding import line_probability
    from models.gemma_prompt import build_prompt

    reader = GemmaReader(tiny_lm(), CharTokenizer(), max_new_tokens=6)
    question, as_of, passages = ITEMS[1]
    answer = reader.generate(question, as_of, passages)
    tok = CharTokenizer()
    prompt = tok(build_prompt(question, as_of, reader.context(question, passages), None), return_tensors="pt")[
        "input_ids"
    ]
    generated = tok(answer.raw, add_special_tokens=False)["input_ids"]
    ids = torch.cat([prompt, torch.tensor([generated])], dim=1)
    with torch.no_grad():
        logprobs = torch.log_softmax(reader.model(ids).logits[0].float(), -1)
    at = [float(logprobs[prompt.shape[1] - 1 + i, t]) for i, t in enumerate(generated)]
    assert answer.confidence == pytest.approx(line_probability(tok, generated, at), rel=1e-3)
    assert 0 < answer.confidence <= 1


def test_greedy_within_picks_the_best_allowed_token_and_copies_from_what_was_read():
    from models.gemma import GemmaReader
    from models.gemma_decoding import greedy_within

    lm, tok = tiny_lm(), CharTokenizer()
    ids = tok(build_prompt(*ITEMS[0], 100), return_tensors="pt")
    with torch.inference_mode():
        logits = lm(**ids).logits[0, -1]
        best = int(logits.argmax())
        allowed = [i for i in range(0, 260, 3) if i != best]  # the full head's favourite left out
        first = greedy_within(lm, tok, ids["input_ids"], ids["attention_mask"], allowed, max_new_tokens=1)
    assert tok(first, add_special_tokens=False)["input_ids"] == [allowed[int(logits[allowed].argmax())]]

    reader = GemmaReader(lm, tok, max_new_tokens=12, vocabulary="read")
    question, as_of, passages = ITEMS[1]
    raw = reader.generate(question, as_of, passages).raw
    read = " ".join(p.dated_text for p in reader.context(question, passages)) + " " + question
    assert raw and set(raw) <= set(read) | set(read.lower()) | set(read.upper()) | set("0123456789.,-'\"%$():\n YesNo")


def test_answer_vocabulary_holds_the_words_read_in_their_cases_and_nothing_else():
    from models.gemma_decoding import answer_vocabulary

    tok = CharTokenizer()
    allowed = {chr(i - 4) for i in answer_vocabulary(tok, ["Jokic won.", "MVP"]) if i >= 4}
    assert set("JokicwnMVPjmvp. \n") <= allowed  # "Jokic", "jokic", "MVP", "mvp", ...
    assert not set("zqxZQXBKIC") & allowed
    assert tok.eos_token_id in answer_vocabulary(tok, ["x"])
    with pytest.raises(ValueError, match="vocabulary must be one of"):
        __import__("models.gemma", fromlist=["GemmaReader"]).GemmaReader(None, None, vocabulary="copy")


# --- the real packaged model --------------------------------------------------------------------------

OTHERS = [
    passage(
        dt.date(2023, 6, 12),
        "Stock markets in Asia rose on Monday as investors awaited the Federal Reserve's decision on interest rates.",
    ),
    passage(
        dt.date(2023, 6, 11),
        "Wildfire smoke from Canada drifted across the northeastern United States, "
        "prompting air quality alerts in New York.",
    ),
]
TOY = [
    ("Who was named the Finals MVP?", [OTHERS[0], NBA], "Nikola Jokic"),
    ("Which team lost the NBA Finals?", [NBA, OTHERS[1]], "Miami Heat"),
    ("What was the final score of Game 5?", [NBA], "94-89"),
    ("Where did the wildfire smoke come from?", [OTHERS[1], OTHERS[0]], "Canada"),
]


@pytest.mark.integration
def test_two_steps_lower_the_loss_and_the_saved_version_answers(gemma_cache, tmp_path):
    from models.trained import load_trained_reader, write_reader_info

    torch.manual_seed(0)
    model = GemmaModel.from_base(GemmaConfig(), cache_dir=gemma_cache)
    items = [(q, AS_OF, ps) for q, ps, _ in TOY]
    answers = [a for _, _, a in TOY]
    with torch.no_grad():
        before = model.eval().loss(items, answers).item()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4)
    model.train()
    for batch in (slice(0, 2), slice(2, 4)):  # one epoch of the toy set, two questions a step
        model.loss(items[batch], answers[batch]).backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        after = model.eval().loss(items, answers).item()
    assert after < 0.5 * before, (before, after)

    models_dir = tmp_path / "models"
    model.save(models_dir / "gemma-v1")
    (models_dir / "base").symlink_to(gemma_cache)  # where versions find the base in an SQA_HOME
    assert sum(f.stat().st_size for f in (models_dir / "gemma-v1").iterdir()) < 50e6  # not the 1 GB base
    write_reader_info(models_dir / "gemma-v1", {"kind": "gemma", "version": "gemma-v1"})
    reader = load_trained_reader(models_dir / "gemma-v1")
    assert reader.name == "gemma:gemma-v1"
    answer = reader.generate("Who was named the Finals MVP?", AS_OF, [OTHERS[0], NBA])
    assert "jokic" in answer.text.lower() and "\n" not in answer.raw.strip()


def _timed_trainer(tmp_path, *, step_s: float, validate_s: float, eval_at_start: bool = True):
    """A trainer on a clock that moves only by what each step and each validation are said to cost."""
    examples = _examples()
    now = [0.0]
    trainer = ReaderTrainer(
        tiny(GemmaConfig(max_new_tokens=2, lora_r=4)),
        "gemma",
        TrainConfig(
            lr=1e-3,
            batch_size=1,
            max_epochs=50,
            eval_every=10,
            patience=100,
            max_minutes=1,
            eval_at_start=eval_at_start,
        ),
        tmp_path / "run",
        clock=lambda: now[0],
    )
    loss, evaluate = trainer.batch_loss, trainer.evaluate

    def step(batch):
        now[0] += step_s
        return loss(batch)

    def validate(val):
        now[0] += validate_s
        return evaluate(val)

    trainer.batch_loss, trainer.evaluate = step, validate
    return trainer, examples


def test_a_budget_that_ends_just_after_a_validation_is_not_spent_on_another(tmp_path):
    # The demo's 10 minutes: 4.6 spent scoring zero-shot Gemma, then one more validation for one step.
    trainer, examples = _timed_trainer(tmp_path, step_s=0.0, validate_s=100.0)
    result = trainer.train(examples, examples)
    assert result.stopped == "budget" and result.steps == 1
    assert [h["step"] for h in result.history] == [0]  # the step-0 score stands, no second validation
    assert (tmp_path / "run" / "best" / WEIGHTS_FILE).exists() and (tmp_path / "run" / "checkpoint").exists()


def test_a_budget_that_ends_well_after_a_validation_scores_the_last_steps(tmp_path):
    trainer, examples = _timed_trainer(tmp_path, step_s=7.0, validate_s=0.0)  # over 60 s at step 9
    result = trainer.train(examples, examples)
    assert result.stopped == "budget" and [h["step"] for h in result.history] == [0, 9]
    # without a score yet, the budget never ends a run unscored
    trainer, examples = _timed_trainer(tmp_path / "b", step_s=100.0, validate_s=0.0, eval_at_start=False)
    result = trainer.train(examples, examples)
    assert result.steps == 1 and [h["step"] for h in result.history] == [1]
