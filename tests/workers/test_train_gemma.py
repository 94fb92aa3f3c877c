"""`sqa train reader --kind gemma` and `sqa finetune` of a Gemma version, on the invented sample (hash
encoder) with a tiny random Gemma 3 as the base (tests/tiny_models.py: the jobs' machinery, not what
the packaged model learns; its training is tests/models/test_gemma_train.py's integration test) and
tiny budgets: a couple of steps each."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import replace
from unittest.mock import patch

import pytest
import torch

from app.bootstrap.builders import open_database
from models.gemma_config import CONFIG_FILE, WEIGHTS_FILE
from models.gemma_weights import resolve_training_precision
from models.reader_base import RetrievedPassage
from models.trained import INFO_FILE, load_trained_reader, read_reader_info
from serving.reader_registry import active_version, list_versions
from workers.reader_spec import GEMMA_KEEP_WITHIN, GEMMA_MAX_STEPS, ReaderJobSpec
from workers.train import run_finetune_job, run_train_job


def test_gemma_spec_defaults():
    spec = ReaderJobSpec.for_gemma(max_minutes=30)
    assert (spec.kind, spec.n_passages, spec.infer_passages, spec.batch_size, spec.eval_every, spec.warmup_steps) == (
        "gemma",
        5,
        5,
        4,
        50,
        10,
    )
    assert spec.learning_rate == 2e-4 and ReaderJobSpec.for_gemma(method="last-layers").learning_rate == 2e-5
    assert ReaderJobSpec(kind="extractive").learning_rate == 5e-5  # the other kinds keep theirs
    # the earliest validated model within 3 F1 points of the best is kept; the other kinds keep the best
    assert spec.keep_within == GEMMA_KEEP_WITHIN == 3.0 and spec.train_config().keep_within == 3.0
    assert ReaderJobSpec(kind="fid").train_config().keep_within == 0.0
    # a first Gemma training stops at its first validation; the other kinds are not capped
    assert spec.max_steps == GEMMA_MAX_STEPS == spec.eval_every == 50 and spec.train_config().max_steps == 50
    assert ReaderJobSpec(kind="fid").train_config().max_steps == 0


def test_a_finetune_spec_halves_the_rate_runs_one_epoch_and_is_not_capped():
    first = ReaderJobSpec.for_gemma(max_minutes=30, seed=3)
    tune = first.for_finetune()
    assert (tune.lr, tune.max_epochs, tune.patience, tune.max_steps) == (1e-4, 1, 2, 0)
    assert tune.train_config().max_steps == 0 and tune.learning_rate == first.learning_rate / 2
    # everything else is the parent's: passages, batch, validation cadence, budget, seed
    assert (
        replace(tune, lr=first.lr, max_epochs=first.max_epochs, patience=first.patience, max_steps=first.max_steps)
        == first
    )
    # a spec with its own rate halves that; overrides win over the fine-tune's values
    assert ReaderJobSpec(kind="fid", lr=1e-3).for_finetune().learning_rate == 5e-4
    assert first.for_finetune(patience=5, eval_every=100).patience == 5


def test_only_a_gemma_run_validates_before_its_first_step_and_only_when_asked():
    assert ReaderJobSpec.for_gemma().train_config().eval_at_start is True  # the zero-shot score, by hand
    assert ReaderJobSpec.for_gemma(validate_first=False).train_config().eval_at_start is False  # sqa train auto
    assert ReaderJobSpec(kind="fid").train_config().eval_at_start is False  # an untrained FiD has nothing to keep


def test_cli_train_reader_gemma_refuses_a_base(sqa, tmp_path):
    r = sqa("train", "reader", "--until", "2024-03-01", "--kind", "gemma", "--base", str(tmp_path))
    assert r.exit_code == 2 and "--base is for --kind fid only" in r.output


def test_cli_no_gold_is_refused_for_the_ranker_and_reaches_the_gemma_spec(sqa):
    from app.cli.train_commands import _reader_spec

    r = sqa("train", "reader", "--until", "2024-03-01", "--kind", "ranker", "--no-gold")
    assert r.exit_code == 2 and "--no-gold is for gemma, fid and extractive readers" in r.output
    spec = _reader_spec("gemma", 30, 1, None, None, 0, gold=False)
    assert spec.gold is False and spec.data_config().gold is False
    assert _reader_spec("gemma", 30, 1, None, None, 0).data_config().gold is True


def _handed_specs(sqa, target: str, *extras: list[str], fake=None) -> list:
    """The specs `sqa train reader --kind gemma ... EXTRA` hands to `workers.train.<target>`, one per extra."""
    specs = []
    with (
        patch("app.cli.train_commands.run_job", side_effect=lambda name, params, fn, **kw: fn(None, None)),
        patch(f"workers.train.{target}", side_effect=lambda ctx, job, **kw: specs.append(kw["spec"]) or fake or "v"),
    ):
        for extra in extras:
            r = sqa("train", "reader", "--until", "2024-03-01", "--kind", "gemma", *extra)
            assert r.exit_code == 0, r.output
    return specs


@pytest.mark.parametrize(
    "option,value,field,default",
    [("--keep-within", "1.5", "keep_within", GEMMA_KEEP_WITHIN), ("--max-steps", "120", "max_steps", GEMMA_MAX_STEPS)],
)
def test_cli_loop_options_reach_the_training_and_are_refused_for_the_ranker(sqa, option, value, field, default):
    r = sqa("train", "reader", "--until", "2024-03-01", "--kind", "ranker", option, "1")
    assert r.exit_code == 2 and f"{option} is for gemma, fid and extractive readers" in r.output
    r = sqa("train", "reader", "--until", "2024-03-01", "--kind", "gemma", option, "-1")
    assert r.exit_code == 2 and option in r.output
    specs = _handed_specs(sqa, "run_train_job", [option, "0"], [option, value], [])
    assert [getattr(s.train_config(), field) for s in specs] == [0, float(value), default]


def test_cli_an_export_is_uncapped_unless_asked(sqa, tmp_path):
    """An export is trained elsewhere, with its own batches and epochs: no step cap unless one is asked for."""
    export = ["--export", str(tmp_path / "x")]
    specs = _handed_specs(
        sqa, "run_export_job", export, [*export, "--max-steps", "80"], fake={"data": {"train": 1, "val": 1}}
    )
    assert [s.max_steps for s in specs] == [0, 80]


@pytest.mark.integration  # spaCy for the self-labeled questions
def test_train_and_finetune_a_gemma_version(loaded_production_settings, new_job, tiny_gemma_cache):
    torch.set_num_threads(1)
    loaded_production_settings.models_dir.mkdir(parents=True, exist_ok=True)
    (loaded_production_settings.models_dir / "base").symlink_to(tiny_gemma_cache)  # the base versions load
    # One epoch, not a time budget: how many steps a budget allows depends on the machine.
    spec = ReaderJobSpec.for_gemma(max_epochs=1, eval_every=2, max_self_articles=6, patience=100)
    version = run_train_job(
        *new_job(loaded_production_settings, "train"), until=dt.date(2024, 3, 1), spec=spec, activate=True
    )
    folder = loaded_production_settings.models_dir / version
    assert version.startswith("gemma-2024-03-01-")
    assert sorted(p.name for p in folder.iterdir()) == sorted([CONFIG_FILE, WEIGHTS_FILE, INFO_FILE])
    info = read_reader_info(folder)
    assert info["kind"] == "gemma" and info["data"]["gold"] > 0 and info["data"]["self_labeled"] > 0
    assert info["history"][0]["step"] == 0  # the zero-shot score comes first
    assert info["steps"] == math.ceil(info["data"]["train"] / spec.batch_size) and info["stopped"] == "epochs"
    assert info["precision"] == resolve_training_precision("auto")  # what its matmuls ran in, recorded

    # The version reloads and reads: a few steps on the invented sample (of a tiny random base here)
    # say nothing of its quality, so check the answer's form.
    reader = load_trained_reader(folder)
    assert reader.name == f"gemma:{version}" and reader.n_passages == 5
    day = dt.date(2024, 2, 2)
    p = RetrievedPassage("Harriers", "Ines Okafor coaches the Harriers.", day)
    answer = reader.generate("Who coaches the Harriers?", day, [p]).text
    assert answer and "\n" not in answer and len(answer.split()) <= 8

    # SQA_TRAIN_PRECISION reaches a fine-tune, whatever its parent trained in. The version folder is
    # exported for the serving runtime (llama.cpp's GGUF where it reads the version) before it is
    # registered, so nobody loads it first; the tiny base here is served by PyTorch (above: no GGUF).
    exact = loaded_production_settings.model_copy(update={"train_precision": "float32"})
    ctx, job = new_job(exact, "finetune")
    exported: list[tuple[str, list[str]]] = []

    def export(folder):
        with ctx.sessions() as session:
            exported.append((folder.name, [r.version for r in list_versions(session)]))
        return folder / "reader-f32.gguf"

    second = run_finetune_job(replace(ctx, export_reader_folder=export), job, month="2024-03", max_minutes=0.2)
    assert exported == [(second, [version])]
    assert read_reader_info(loaded_production_settings.models_dir / second)["precision"] == "float32"
    db = open_database(loaded_production_settings)
    try:
        with db.sessions() as session:
            rows = {r.version: r for r in list_versions(session)}
            assert rows[second].kind == "gemma" and rows[second].parent_version == version
            assert active_version(session).version == second
    finally:
        db.close()
    ft_spec = read_reader_info(loaded_production_settings.models_dir / second)["spec"]
    assert ft_spec["lr"] == pytest.approx(1e-4)
    assert info["spec"]["max_steps"] == GEMMA_MAX_STEPS and ft_spec["max_steps"] == 0  # a fine-tune is not capped


@pytest.mark.integration  # spaCy for the self-labeled questions
def test_export_train_elsewhere_and_import_a_gemma_version(
    loaded_production_settings, new_job, tiny_gemma_cache, tmp_path
):
    """What a GPU machine is for: the store exports the job's data, `models.train_exported` trains it
    without the store (here on the CPU), and `import_version` registers what comes back."""
    from models.gemma_train import GemmaModel, _load_base
    from models.train_exported import train_exported
    from models.training import load_examples
    from serving.reader_registry import get_version, import_version
    from workers.train import run_export_job

    class CharSplitter:  # a tokenizer that gives one id a character
        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": [ord(c) for c in text]}

    torch.set_num_threads(1)
    models_dir = loaded_production_settings.models_dir
    models_dir.mkdir(parents=True, exist_ok=True)
    (models_dir / "base").symlink_to(tiny_gemma_cache)  # the base the export's tokenizer comes from
    spec = ReaderJobSpec.for_gemma(max_epochs=1, eval_every=100, max_self_articles=6, self_per_article=3)
    # SQA_TRAIN_PRECISION goes into the export: the machine that trains it uses the exporting store's.
    exact = loaded_production_settings.model_copy(update={"train_precision": "float32"})
    info = run_export_job(*new_job(exact, "export"), until=dt.date(2024, 3, 1), dest=tmp_path / "data", spec=spec)
    assert info["model"]["precision"] == "float32"
    train, val = load_examples(tmp_path / "data" / "train.jsonl"), load_examples(tmp_path / "data" / "val.jsonl")
    assert (info["data"]["train"], info["data"]["val"]) == (len(train), len(val)) and train and val
    assert {ex.source for ex in train} == {"gold", "self"} and max(ex.as_of for ex in train) < dt.date(2024, 3, 1)
    assert all(dt.date(2024, 2, 1) <= ex.as_of < dt.date(2024, 3, 1) for ex in val)  # the held-back month
    assert info["model"]["titles"] is True and info["train"]["lr"] == spec.learning_rate
    # The tokenizer travels with the data, with a check of what it makes of the first prompt.
    assert (tmp_path / "data" / "tokenizer" / "tokenizer.json").exists()
    check = info["tokenizer_check"]
    assert check["text"].startswith("Passage: ") and train[0].question in check["text"] and len(check["ids"]) > 20
    assert not list((loaded_production_settings.work_dir / "export").glob("gemma-2024-03-01-*"))  # work folder gone

    out = tmp_path / "version"
    # A machine whose own conversion of the GGUF splits text otherwise still trains with the export's tokenizer.
    with patch("models.gemma_train._load_base", side_effect=lambda cache: (_load_base(cache)[0], CharSplitter())):
        trained = train_exported(tmp_path / "data", out, base_cache=tiny_gemma_cache, overrides={"batch_size": 8})
    assert trained["steps"] == math.ceil(len(train) / 8) and trained["trained_until"] == "2024-03-01"
    assert trained["precision"] == "float32"
    db = open_database(loaded_production_settings)
    try:
        with db.sessions() as session, session.begin():
            version = import_version(
                session,
                out,
                models_dir=models_dir,
                activate=True,
                check=lambda f: GemmaModel.load(f, cache_dir=tiny_gemma_cache),
            ).version
        with db.sessions() as session:
            assert active_version(session).version == version
            assert get_version(session, version).trained_until == dt.date(2024, 3, 1)
    finally:
        db.close()
    reader = load_trained_reader(models_dir / version)
    day = dt.date(2024, 2, 2)
    p = RetrievedPassage("Harriers", "Ines Okafor coaches the Harriers.", day)
    answer = reader.generate("Who coaches the Harriers?", day, [p]).text
    assert answer and "\n" not in answer


def test_forced_bfloat16_on_a_cpu_without_avx512_is_named_as_slow(monkeypatch):
    import workers.train as train
    from workers.train import slow_bfloat16

    monkeypatch.setattr(train, "onednn_bfloat16", lambda device="cpu": False)  # imported by name there
    assert "many times slower than float32" in slow_bfloat16("cpu")
    assert slow_bfloat16("cuda:0") is None  # a GPU's bfloat16 is its own
    monkeypatch.setattr(train, "onednn_bfloat16", lambda device="cpu": True)
    assert slow_bfloat16("cpu") is None  # oneDNN computes it, natively or emulated
