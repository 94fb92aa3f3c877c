"""Training a Gemma reader from an exported data set (`python -m models.train_exported`), as a GPU
machine without the store runs it: a tiny random Gemma 3 stands in for the packaged one."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from unittest.mock import patch

import pytest
import torch

import models.train_exported as te
from models.gemma_config import CONFIG_FILE, WEIGHTS_FILE, GemmaConfig
from models.gemma_train import GemmaModel
from models.trained import INFO_FILE, read_reader_info
from models.training import TrainConfig, TrainExample, save_examples
from tests.models.test_gemma_train import NBA, CharTokenizer, tiny_lm

DAY = dt.date(2023, 6, 14)


def export(folder, n_train: int = 6, kind: str = "gemma"):
    """What workers.train.run_export_job writes: the examples and the job's settings."""
    folder.mkdir()
    ex = [
        TrainExample(f"q{i}", "Who won the NBA championship?", DAY, ("Denver Nuggets",), (NBA,), "self")
        for i in range(n_train)
    ]
    save_examples(folder / "train.jsonl", ex)
    save_examples(folder / "val.jsonl", ex[:2])
    job = {
        "kind": kind,
        "label": "2023-06-15",
        "trained_until": "2023-06-15",
        "spec": {"kind": kind, "lr": 0.0},
        "data": {"train": n_train, "val": 2, "gold": 0, "self_labeled": n_train},
        "model": GemmaConfig(max_length=400, lora_r=4, precision="float32").to_json(),
        "train": dataclasses.asdict(
            TrainConfig(lr=1e-3, batch_size=2, max_epochs=1, eval_every=100, eval_at_start=True)
        ),
    }
    (folder / te.JOB_FILE).write_text(json.dumps(job))
    return folder


@pytest.fixture
def tiny_base():
    """GemmaModel.from_base builds a tiny random Gemma (the packaged one takes a minute to convert)."""
    made: list[GemmaModel] = []

    def from_base(config=None, *, cache_dir=None, device="cpu"):
        made.append(GemmaModel(tiny_lm(), CharTokenizer(), config).to(device))
        return made[-1]

    with patch.object(GemmaModel, "from_base", side_effect=from_base):
        yield made


def test_train_exported_writes_a_version_folder_with_the_overrides(tmp_path, tiny_base):
    data = export(tmp_path / "data")
    out = tmp_path / "version"
    seen: list[str] = []
    info = te.train_exported(
        data,
        out,
        overrides={"batch_size": 3, "max_epochs": 2},
        model_overrides={"lora_r": 2},
        progress=lambda f, m: seen.append(m),
    )
    assert sorted(p.name for p in out.iterdir()) == sorted([CONFIG_FILE, WEIGHTS_FILE, INFO_FILE])
    assert info == read_reader_info(out)
    assert info["kind"] == "gemma" and info["trained_until"] == "2023-06-15" and info["label"] == "2023-06-15"
    assert info["steps"] == 4 and info["stopped"] == "epochs"  # 6 examples, 3 a step, 2 epochs
    assert info["spec"]["batch_size"] == 3 and info["spec"]["max_epochs"] == 2
    assert info["trained_elsewhere"]["device"] == "cpu" and info["trained_elsewhere"]["train"]["lr"] == 1e-3
    assert info["history"][0]["step"] == 0 and seen and "validation" in seen[0]
    assert json.loads((out / CONFIG_FILE).read_text())["lora_r"] == 2 and tiny_base[0].config.lora_r == 2
    assert not (tmp_path / "version.run").exists() and not (tmp_path / "version.tmp").exists()
    # the saved tensors are the trained LoRA matrices of the model that trained
    from safetensors.torch import load_file

    saved = load_file(out / WEIGHTS_FILE)
    assert saved and all("lora_" in name for name in saved)


def test_train_exported_refuses_what_is_not_an_export(tmp_path, tiny_base):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "train.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"not an exported training set \(job.json, val.jsonl missing\)"):
        te.train_exported(tmp_path / "half", tmp_path / "out")
    with pytest.raises(ValueError, match="kind 'fid' cannot be trained here"):
        te.train_exported(export(tmp_path / "fid", kind="fid"), tmp_path / "out")
    with pytest.raises(ValueError, match="holds no example"):
        te.train_exported(export(tmp_path / "none", n_train=0), tmp_path / "out")
    assert not tiny_base and not (tmp_path / "out").exists()


def test_main_says_what_is_wrong_and_exits_2(tmp_path, tiny_base, capsys):
    assert te.main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "v")]) == 2
    assert "is not an exported training set" in capsys.readouterr().err
    data = export(tmp_path / "data")
    assert te.main([str(data), "--out", str(tmp_path / "v"), "--batch-size", "0"]) == 2
    assert "--batch-size 0 is out of range" in capsys.readouterr().err
    assert te.main([str(data), "--out", str(tmp_path / "v"), "--keep-within", "-1"]) == 2
    assert "--keep-within -1.0 is out of range" in capsys.readouterr().err
    assert te.main([str(data), "--out", str(tmp_path / "v"), "--max-steps", "-1"]) == 2
    assert "--max-steps -1 is out of range" in capsys.readouterr().err
    assert te.main([str(data), "--out", str(tmp_path / "v"), "--last-layers", "2"]) == 2
    assert "--last-layers goes with --method last-layers" in capsys.readouterr().err
    assert te.main([str(data), "--out", str(tmp_path / "v"), "--max-length", "-1"]) == 2
    assert "--max-length -1 is out of range" in capsys.readouterr().err
    assert te.main([str(data), "--out", str(data / "v")]) == 2
    assert "is the export" in capsys.readouterr().err and not (data / "v").exists()
    (tmp_path / "notes").mkdir()
    assert te.main([str(data), "--out", str(tmp_path / "notes")]) == 2
    assert "exists and is no version folder" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert te.main([str(data), "--out", str(tmp_path / "v"), "--device", "cuda"]) == 2
        assert "torch sees no GPU here" in capsys.readouterr().err
    assert not tiny_base and not (tmp_path / "v").exists()


def test_main_trains_and_names_the_import_command(tmp_path, tiny_base, capsys):
    data = export(tmp_path / "data")
    assert te.main([str(data), "--out", str(tmp_path / "v"), "--device", "cpu", "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "trained on cpu: 3 steps" in out and f"sqa models import {tmp_path / 'v'}" in out
    assert (tmp_path / "v" / WEIGHTS_FILE).exists()


def test_the_export_s_precision_trains_unless_the_command_line_names_another(tmp_path, tiny_base):
    data = export(tmp_path / "data")  # exported under SQA_TRAIN_PRECISION=float32
    assert te.main([str(data), "--out", str(tmp_path / "v1"), "--device", "cpu", "--epochs", "1"]) == 0
    assert read_reader_info(tmp_path / "v1")["precision"] == "float32"
    assert json.loads((tmp_path / "v1" / CONFIG_FILE).read_text())["precision"] == "float32"
    assert (
        te.main(
            [str(data), "--out", str(tmp_path / "v2"), "--device", "cpu", "--epochs", "1", "--precision", "bfloat16"]
        )
        == 0
    )
    assert read_reader_info(tmp_path / "v2")["precision"] == "bfloat16"
    assert json.loads((tmp_path / "v2" / CONFIG_FILE).read_text())["precision"] == "bfloat16"
    assert tiny_base[1].training_precision == "bfloat16"
    with pytest.raises(SystemExit) as exited:  # argparse names the choices
        te.main([str(data), "--out", str(tmp_path / "v3"), "--precision", "float16"])
    assert exited.value.code == 2 and not (tmp_path / "v3").exists()


def test_a_tokenizer_that_splits_the_check_text_otherwise_is_refused_before_training(tmp_path, tiny_base):
    # What one GPU machine's transformers did to the GGUF's tokenizer: every word split into characters.
    data = export(tmp_path / "data")
    job = json.loads((data / te.JOB_FILE).read_text())
    good = {"text": "ab", "ids": [2, ord("a") + 4, ord("b") + 4]}  # CharTokenizer: <bos>, then one id a character
    te.check_tokenizer(CharTokenizer(), good)
    te.check_tokenizer(CharTokenizer(), None)  # an export without a check (older) is not refused
    (data / te.JOB_FILE).write_text(json.dumps({**job, "tokenizer_check": {"text": "ab", "ids": [2, 9999]}}))
    with pytest.raises(ValueError, match=r"splits text unlike the one the data were exported with \(3 ids against 2"):
        te.train_exported(data, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.run").exists()
    (data / te.JOB_FILE).write_text(json.dumps({**job, "tokenizer_check": good}))
    assert te.train_exported(data, tmp_path / "out")["steps"] == 3


def test_main_trains_the_last_layers_with_their_smaller_learning_rate(tmp_path, tiny_base, capsys):
    data = export(tmp_path / "data")
    assert te.main([str(data), "--out", str(tmp_path / "v"), "--method", "last-layers", "--last-layers", "3"]) == 0
    info = read_reader_info(tmp_path / "v")
    assert info["trained_elsewhere"]["train"]["lr"] == 2e-5 and info["spec"]["lr"] == 2e-5
    assert info["spec"]["method"] == "last-layers" and info["model_overrides"] == {
        "method": "last-layers",
        "last_layers": 3,
    }
    config = json.loads((tmp_path / "v" / CONFIG_FILE).read_text())
    assert (config["method"], config["last_layers"]) == ("last-layers", 3)
    from safetensors.torch import load_file

    names = load_file(tmp_path / "v" / WEIGHTS_FILE)
    assert names and not any("lora_" in n for n in names) and not any("embed_tokens" in n for n in names)


def test_a_run_folder_of_other_data_or_settings_is_not_resumed(tmp_path, tiny_base):
    data = export(tmp_path / "data")
    run = tmp_path / "version.run"
    (run / "checkpoint").mkdir(parents=True)
    (run / "checkpoint" / "state.pt").write_bytes(b"another run's state")  # would not load
    (run / "run.json").write_text('{"job": "another"}')
    info = te.train_exported(data, tmp_path / "version")
    assert info["steps"] == 3 and info["history"][0]["step"] == 0 and not run.exists()


def test_n_passages_trains_and_serves_the_first_n_of_an_export_of_more(tmp_path, tiny_base, capsys):
    # One export of 4 passages a question serves runs on fewer: the loop reads the first N, the version
    # serves N, and more than the export holds is refused before the base loads.
    data = tmp_path / "data"
    data.mkdir()
    others = tuple(dataclasses.replace(NBA, title=f"Other {i}") for i in range(3))
    ex = [
        TrainExample(f"q{i}", "Who won the NBA championship?", DAY, ("Denver Nuggets",), (NBA, *others), "self")
        for i in range(4)
    ]
    save_examples(data / "train.jsonl", ex)
    save_examples(data / "val.jsonl", ex[:2])
    job = json.loads((export(tmp_path / "job") / te.JOB_FILE).read_text())
    job["model"]["n_passages"] = job["train"]["n_passages"] = 4
    (data / te.JOB_FILE).write_text(json.dumps(job))

    assert te.main([str(data), "--out", str(tmp_path / "v5"), "--n-passages", "5"]) == 2
    assert "--n-passages 5: the export holds 4 passages a question" in capsys.readouterr().err
    assert te.main([str(data), "--out", str(tmp_path / "v0"), "--n-passages", "0"]) == 2
    assert not tiny_base and not (tmp_path / "v5").exists()

    seen: list[int] = []
    real = GemmaModel.loss

    def counting(self, items, answers):
        seen.extend(len(passages) for _, _, passages in items)
        return real(self, items, answers)

    with patch.object(GemmaModel, "loss", counting):
        assert te.main([str(data), "--out", str(tmp_path / "v2"), "--n-passages", "2"]) == 0
    info = read_reader_info(tmp_path / "v2")
    assert json.loads((tmp_path / "v2" / CONFIG_FILE).read_text())["n_passages"] == 2
    assert info["spec"]["n_passages"] == info["spec"]["infer_passages"] == 2
    assert info["trained_elsewhere"]["train"]["n_passages"] == 2
    assert seen and set(seen) == {2}
    assert te.main([str(data), "--out", str(tmp_path / "whole"), "--n-passages", "2", "--max-length", "0"]) == 0
    assert json.loads((tmp_path / "whole" / CONFIG_FILE).read_text())["max_length"] == 0
