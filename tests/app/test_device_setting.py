"""SQA_DEVICE: auto | cpu | cuda | cuda:N, resolved when a model loads."""

from __future__ import annotations

import pytest


def test_device_setting_takes_auto_cpu_and_cuda_and_names_a_bad_value(tmp_path):
    from pydantic import ValidationError

    from app.bootstrap.builders import resolve_device
    from settings import Settings

    assert Settings(home=tmp_path).device == "auto"  # the default
    assert Settings(home=tmp_path, device=" CUDA:1 ").device == "cuda:1"
    assert resolve_device(Settings(home=tmp_path, device="cpu")) == "cpu"
    import torch

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(Settings(home=tmp_path, device="auto")) == expected
    with pytest.raises(ValidationError, match="device 'gpu' is not auto, cpu, cuda or cuda:N"):
        Settings(home=tmp_path, device="gpu")


def test_the_reader_decoding_settings_reach_the_packaged_and_the_trained_readers(tmp_path, monkeypatch):
    import app.bootstrap.builders as builders
    import models.trained
    from settings import Settings

    seen: dict[str, dict] = {}
    monkeypatch.setattr(builders, "load_reader", lambda name, **kw: seen.setdefault("packaged", kw))
    monkeypatch.setattr(models.trained, "load_trained_reader", lambda folder, **kw: seen.setdefault("trained", kw))
    settings = Settings(home=tmp_path, reader_echo_beams=4, reader_answer_beams=2, device="cpu")
    builders.load_builtin_reader(settings, "gemma")
    builders.load_trained_folder(settings, tmp_path)
    for kw in seen.values():
        assert (kw["echo_beams"], kw["answer_beams"]) == (4, 2)
    assert set(seen) == {"packaged", "trained"} and Settings(home=tmp_path).reader_echo_beams == 0
    with pytest.raises(Exception, match="greater than or equal to 0"):
        Settings(home=tmp_path, reader_echo_beams=-1)


def test_the_training_precision_setting_reaches_the_jobs_and_names_a_bad_value(tmp_path):
    from pydantic import ValidationError

    from app.bootstrap import open_context
    from settings import Settings

    assert Settings(home=tmp_path).train_precision == "auto"
    with open_context(Settings(home=tmp_path, train_precision="float32")) as ctx:
        assert ctx.train_precision == "float32"  # what workers.train gives every Gemma training
    with pytest.raises(ValidationError, match="train_precision"):
        Settings(home=tmp_path, train_precision="float16")
