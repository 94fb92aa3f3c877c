"""SQA_DEVICE: auto | cpu | cuda | cuda:N, resolved when a model loads."""
from __future__ import annotations

import pytest


def test_device_setting_takes_auto_cpu_and_cuda_and_names_a_bad_value(tmp_path):
    from pydantic import ValidationError

    from app.bootstrap import resolve_device
    from app.core.config import Settings

    assert Settings(home=tmp_path).device == "auto"  # the default
    assert Settings(home=tmp_path, device=" CUDA:1 ").device == "cuda:1"
    assert resolve_device(Settings(home=tmp_path, device="cpu")) == "cpu"
    import torch

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(Settings(home=tmp_path, device="auto")) == expected
    with pytest.raises(ValidationError, match="device 'gpu' is not auto, cpu, cuda or cuda:N"):
        Settings(home=tmp_path, device="gpu")
