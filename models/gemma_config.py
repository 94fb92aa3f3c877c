"""The config of a Gemma reader version (kind "gemma", models.gemma_train): its prompt, training
length, trainable part (LoRA adapters or the last decoder layers) and number format, saved as
`CONFIG_FILE` next to the trained tensors (`WEIGHTS_FILE`) and read back on load.
"""

from __future__ import annotations

from dataclasses import dataclass

from models.gemma_weights import FOLDER_NAME, PRECISIONS
from models.saved_config import SavedConfig

CONFIG_FILE = "gemma_config.json"
WEIGHTS_FILE = "trained.safetensors"
METHODS = ("lora", "last-layers")
# Every linear projection of attention and MLP (Gemma 3: q/k/v/o and the gated MLP).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class GemmaConfig(SavedConfig):
    n_passages: int = 3  # passages read per question, in training and serving
    max_passage_words: int = 100  # per passage, its date prefix counted (the served prompt's cut)
    # Training tokens per example (<bos> + prompt + answer): passages are cut to fit. 0: none are cut,
    # training reads the served prompt whole (five 100-word passages are ~750 tokens).
    max_length: int = 320
    max_answer_tokens: int = 24  # training target, newline included
    max_new_tokens: int = 16  # generation
    # 0: the first max_passage_words of each of the first n_passages (the original prompt); else the
    # sentences of the first n_passages that bear on the question, this many words in all (models.reader_context)
    context_words: int = 0
    # Each article's headline after a passage's date (models.reader_context.add_titles). False in configs
    # saved before it existed: a version reads the prompt it was trained on.
    titles: bool = False
    method: str = "lora"  # "lora" (peft adapters) | "last-layers" (train the last decoder layers)
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_targets: tuple[str, ...] = LORA_TARGETS
    last_layers: int = 4  # "last-layers": how many decoder layers train (with the final norm)
    base: str = FOLDER_NAME  # the packaged base it was trained on
    base_cache: str = ""  # where that base was when it was trained: a hint for load()
    # The number format of training's matmuls (models.gemma_weights.resolve_training_precision): "bfloat16"
    # runs the forward and backward passes under bfloat16 autocast, the weights and the optimizer
    # staying in float32; "auto" does so on a GPU with bfloat16 and on every CPU oneDNN computes it
    # on, natively or emulated (AVX-512). Validation reads as the service would: "auto" there is
    # models.gemma_weights.resolve_precision's (bfloat16 only where it is native).
    precision: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))  # JSON gives a list
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r} is unknown (use {' or '.join(METHODS)})")
        for name in ("n_passages", "max_passage_words", "max_answer_tokens", "max_new_tokens", "lora_r", "last_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.context_words < 0:
            raise ValueError(f"context_words must be 0 or positive, got {self.context_words}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.max_length < 0:
            raise ValueError(f"max_length must be 0 (the served prompt whole) or positive, got {self.max_length}")
        if self.max_length and self.max_length < 2 * self.max_answer_tokens:
            raise ValueError(
                f"max_length {self.max_length} leaves no room for the passages and question "
                f"(max_answer_tokens is {self.max_answer_tokens})"
            )
