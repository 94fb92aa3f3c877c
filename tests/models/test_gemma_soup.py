"""A soup of LoRA runs (models.gemma_soup.soup_state / soup_config, models.gemma_train.write_soup): one LoRA whose
weight change is the mean of the members', checked through peft itself on a small model."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file

from models.gemma_config import CONFIG_FILE, WEIGHTS_FILE, GemmaConfig
from models.gemma_soup import soup_config, soup_state
from models.gemma_train import write_soup


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(8, 6, bias=False)
        self.down_proj = torch.nn.Linear(6, 4, bias=False)

    def forward(self, x):
        return self.down_proj(torch.relu(self.q_proj(x)))


def _lora(base_state, r, alpha, seed):
    """A copy of the tiny base with LoRA adapters of rank r, A and B both random (a trained run)."""
    torch.manual_seed(0)
    net = Tiny()
    net.load_state_dict(base_state)
    model = get_peft_model(
        net, LoraConfig(r=r, lora_alpha=alpha, target_modules=["q_proj", "down_proj"], lora_dropout=0.0)
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def _adapters(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def _merged_weights(model):
    merged = model.merge_and_unload()
    return {n: p.detach().clone() for n, p in merged.state_dict().items()}


@pytest.mark.parametrize("n", [2, 3])
def test_the_soup_of_lora_runs_merges_into_the_mean_of_their_merged_weights(n):
    torch.manual_seed(0)
    base_state = Tiny().state_dict()
    r, alpha = 2, 4
    runs = [_lora(base_state, r, alpha, seed) for seed in range(n)]
    states = [_adapters(m) for m in runs]
    soup = _lora(base_state, r * n, alpha * n, 99)  # what soup_config makes of the members' config
    soup.load_state_dict(soup_state(states), strict=False)
    assert set(_adapters(soup)) == set(states[0])
    want = {k: sum(_merged_weights(m)[k] for m in runs) / n for k in _merged_weights(runs[0])}
    got = _merged_weights(soup)
    for k, w in want.items():
        torch.testing.assert_close(got[k], w)
    # and it is not a member: the soup moved every adapted weight away from the first run's
    assert not torch.allclose(got["q_proj.weight"], _merged_weights(_lora(base_state, r, alpha, 0))["q_proj.weight"])


def test_a_soup_keeps_the_members_settings_with_n_times_the_rank_and_alpha():
    a = GemmaConfig(n_passages=5, titles=True, lora_r=16, lora_alpha=32, base_cache="/here")
    b = GemmaConfig(n_passages=5, titles=True, lora_r=16, lora_alpha=32, base_cache="/there", precision="float32")
    soup = soup_config([a, b, a])
    assert (soup.lora_r, soup.lora_alpha, soup.n_passages, soup.titles) == (48, 96, 5, True)


@pytest.mark.parametrize(
    "configs, message",
    [
        ([GemmaConfig()], "at least two"),
        ([GemmaConfig(), GemmaConfig(method="last-layers")], "trained with 'last-layers'"),
        ([GemmaConfig(), GemmaConfig(n_passages=5)], "differs from the first in n_passages"),
        ([GemmaConfig(), GemmaConfig(lora_r=8)], "differs from the first in lora_r"),
    ],
)
def test_versions_that_do_not_average_are_refused(configs, message):
    with pytest.raises(ValueError, match=message):
        soup_config(configs)


def test_states_that_do_not_match_are_refused():
    a = {"x.lora_A.default.weight": torch.zeros(2, 8), "x.lora_B.default.weight": torch.zeros(6, 2)}
    with pytest.raises(ValueError, match="member 2's trained tensors do not match"):
        soup_state([a, {"x.lora_A.default.weight": torch.zeros(4, 8), "x.lora_B.default.weight": torch.zeros(6, 4)}])
    with pytest.raises(ValueError, match="not a LoRA adapter"):
        soup_state([{"layer.weight": torch.zeros(2)}, {"layer.weight": torch.zeros(2)}])


def test_write_soup_writes_the_tensors_and_config_a_version_folder_holds(tmp_path):
    folders = []
    for i in range(2):
        f = tmp_path / f"v{i}"
        f.mkdir()
        save_file(
            {
                "m.lora_A.default.weight": torch.full((2, 3), float(i + 1)),
                "m.lora_B.default.weight": torch.full((4, 2), 1.0),
            },
            f / WEIGHTS_FILE,
        )
        (f / CONFIG_FILE).write_text(json.dumps(GemmaConfig(lora_r=2, lora_alpha=4).to_json()))
        folders.append(f)
    config = write_soup(folders, tmp_path / "soup")
    from safetensors.torch import load_file

    state = load_file(tmp_path / "soup" / WEIGHTS_FILE)
    assert state["m.lora_A.default.weight"].shape == (4, 3) and state["m.lora_B.default.weight"].shape == (4, 4)
    # each member's B_i A_i is 2 * (i + 1) in every cell (2 and 4): the soup's B A is their mean, 3
    assert torch.allclose(state["m.lora_B.default.weight"] @ state["m.lora_A.default.weight"], torch.full((4, 3), 3.0))
    assert json.loads((tmp_path / "soup" / CONFIG_FILE).read_text())["lora_r"] == config.lora_r == 4
    with pytest.raises(ValueError, match="is not a Gemma reader folder"):
        write_soup([folders[0], tmp_path], tmp_path / "nope")
