"""The uniform soup of Gemma LoRA runs trained alike (another seed each): the soup's config and its
tensors, one LoRA of n times the rank whose weight change is the mean of the members'.
`models.gemma_train.write_soup` reads the members' version folders and writes the soup's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from models.gemma_config import GemmaConfig

# What may differ between the members of a soup: where each found its base, and how it trained.
SOUP_FREE = ("base_cache", "lora_dropout", "precision")


def soup_config(configs: Sequence[GemmaConfig]) -> GemmaConfig:
    """The config of the uniform soup of LoRA runs (`soup_state`): the members' own, with n times the
    rank and alpha (the adapters' scale alpha/r unchanged).

    Raises:
        ValueError: fewer than two members, a member not trained with LoRA, or members that differ in
        anything but `SOUP_FREE` (another base, prompt or rank: their weights do not average).
    """
    if len(configs) < 2:
        raise ValueError(f"a soup needs at least two versions, got {len(configs)}")
    first = configs[0]
    for i, c in enumerate(configs):
        if c.method != "lora":
            raise ValueError(f"member {i + 1} was trained with {c.method!r}: a soup averages LoRA adapters")
        differ = [
            f.name
            for f in dataclasses.fields(c)
            if f.name not in SOUP_FREE and getattr(c, f.name) != getattr(first, f.name)
        ]
        if differ:
            raise ValueError(
                f"member {i + 1} differs from the first in {', '.join(differ)}: only runs of the "
                "same settings (another seed) average"
            )
    n = len(configs)
    return dataclasses.replace(first, lora_r=first.lora_r * n, lora_alpha=first.lora_alpha * n)


def soup_state(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The uniform soup of LoRA runs from one base: the mean of their weight changes B_i A_i, written
    exactly as one LoRA of n times the rank (the A matrices stacked, the B matrices side by side and
    divided by n; `soup_config` keeps alpha/r). Merged for serving, it costs what one model costs.

    Raises:
        ValueError: members with other tensors or shapes, or a tensor that is not a LoRA A or B.
    """
    if len(states) < 2:
        raise ValueError(f"a soup needs at least two states, got {len(states)}")
    names = set(states[0])
    for i, st in enumerate(states[1:], 2):
        if set(st) != names or any(st[k].shape != states[0][k].shape for k in names):
            raise ValueError(f"member {i}'s trained tensors do not match the first's (another rank or targets)")
    n, out = len(states), {}
    for k in sorted(names):
        if ".lora_A." in k:
            out[k] = torch.cat([st[k] for st in states], dim=0)
        elif ".lora_B." in k:
            out[k] = torch.cat([st[k] for st in states], dim=1) / n
        else:
            raise ValueError(f"{k} is not a LoRA adapter: a soup averages LoRA runs only")
    return out
