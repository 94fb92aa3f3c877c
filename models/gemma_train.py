"""Gemma 3 270M fine-tuned as a reader (kind "gemma"): the packaged base plus what training changed.

A version folder holds only what was trained (`trained.safetensors`: the LoRA matrices, about 15 MB,
or the last decoder layers) and `gemma_config.json`; the 1 GB base is rebuilt from the package by
`models.gemma_weights.gemma_folder` (once per SQA_HOME, in `$SQA_HOME/models/base`) and the saved tensors go
on top. The config is the model's only constructor argument besides the base and wins on reload.

Training sees exactly the prompt the served reader builds (`models.gemma_prompt.build_prompt`, tokenized on
its own, with <bos>), followed by the target " <answer>\\n" tokenized on its own:

    ids     <bos> Passage: ... Question (asked on ...): ... Short answer: | ▁Denver ▁Nuggets \\n
    labels  -100  -100 ...                                          -100 | ▁Denver ▁Nuggets \\n

With `max_length` 0 the prompt is the served one whole; with N, an example longer than N tokens has
its passages cut (all to the same number of words), never the question or the answer. The loss is
cross-entropy on the answer tokens only, and the logits are computed only there: 168M of the 268M
parameters are the 262k-token vocabulary, so the full B x L x 262k output head would cost three
times the rest of the step. The embeddings (tied to the output head) stay frozen.

The config is models.gemma_config's `GemmaConfig`; a soup of versions trained alike is written by
`write_soup` (the arithmetic: models.gemma_soup).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from models.gemma import GemmaReader
from models.gemma_config import CONFIG_FILE, WEIGHTS_FILE, GemmaConfig
from models.gemma_decoding import _first_line_stop
from models.gemma_prompt import build_prompt, build_target, fit_prompt, reader_context
from models.gemma_soup import soup_config, soup_state
from models.gemma_weights import FOLDER_NAME, _load, gemma_folder, resolve_training_precision
from models.reader_base import Item, RetrievedPassage, final_answer


def read_config(folder: Path) -> GemmaConfig:
    """The GemmaConfig a saved version's folder holds (`CONFIG_FILE`)."""
    return GemmaConfig.from_json(json.loads((Path(folder) / CONFIG_FILE).read_text()))


def _load_base(cache_dir: Path | None):
    """(Gemma3ForCausalLM in float32, tokenizer) of the packaged base, converted on first use."""
    return _load(gemma_folder(cache_dir))


def _base_cache(folder: Path, config: GemmaConfig, cache_dir: Path | None) -> Path | None:
    """Where the base lives for a saved version: `cache_dir` if given, else the version's sibling
    `base/` (versions live in $SQA_HOME/models, the base in $SQA_HOME/models/base), else the folder it
    was trained from when it still holds the converted base, else models.gemma_weights' default."""
    if cache_dir is not None:
        return Path(cache_dir)
    sibling = folder.parent / "base"
    if sibling.is_dir():
        return sibling
    hint = Path(config.base_cache) if config.base_cache else None
    if hint is not None and (hint / FOLDER_NAME / "model.safetensors").exists():
        return hint
    return None


class GemmaModel:
    """What `ReaderTrainer` trains for kind "gemma": the base causal LM with its trainable part
    (LoRA adapters or the last layers), its tokenizer and its config.

    Construct from a loaded base (`GemmaModel(lm, tokenizer, config)`: freezes it and adds the
    adapters), `GemmaModel.from_base(config, cache_dir)` for the packaged one, `GemmaModel.load(folder)`
    for a saved version.
    """

    def __init__(self, lm, tokenizer, config: GemmaConfig, *, base_cache: Path | None = None) -> None:
        if base_cache is not None:
            config = dataclasses.replace(config, base_cache=str(Path(base_cache).expanduser().resolve()))
        self.tokenizer = tokenizer
        self.config = config
        for p in lm.parameters():
            p.requires_grad_(False)
        if config.method == "lora":
            from peft import LoraConfig, get_peft_model  # noqa: PLC0415 (lazy: peft, pulls transformers)

            lora = LoraConfig(
                r=config.lora_r,
                lora_alpha=config.lora_alpha,
                lora_dropout=config.lora_dropout,
                target_modules=list(config.lora_targets),
                bias="none",
                task_type="CAUSAL_LM",
            )
            with warnings.catch_warnings():  # peft asks transformers' deprecated is_gradient_checkpointing
                warnings.simplefilter("ignore", FutureWarning)
                self.net = get_peft_model(lm, lora)  # freezes everything but the adapters (B starts at zero)
        else:
            layers = lm.model.layers
            if config.last_layers > len(layers):
                raise ValueError(f"last_layers {config.last_layers} is more than the model's {len(layers)} layers")
            for module in (*layers[-config.last_layers :], lm.model.norm):
                for p in module.parameters():
                    p.requires_grad_(True)
            self.net = lm
        lm.model.embed_tokens.weight.requires_grad_(False)  # tied to lm_head: frozen in both methods

    # ---- construction and files -------------------------------------------------------------------
    @classmethod
    def from_base(
        cls, config: GemmaConfig | None = None, *, cache_dir: Path | None = None, device: str = "cpu"
    ) -> GemmaModel:
        """An untrained model over the packaged base (converted into `cache_dir` on first use)."""
        lm, tokenizer = _load_base(cache_dir)
        model = cls(lm, tokenizer, config or GemmaConfig(), base_cache=cache_dir)
        return model.to(device)

    @classmethod
    def load(cls, folder: Path | str, *, device: str = "cpu", cache_dir: Path | None = None) -> GemmaModel:
        """A saved version: the base (see `_base_cache` for where it is looked for) plus the saved
        tensors. The stored config decides the method and sizes."""
        folder = Path(folder)
        cfg_file = folder / CONFIG_FILE
        if not cfg_file.exists():
            raise FileNotFoundError(f"{folder} is not a Gemma reader folder ({CONFIG_FILE} is missing)")
        config = read_config(folder)
        cache = _base_cache(folder, config, cache_dir)
        lm, tokenizer = _load_base(cache)
        model = cls(lm, tokenizer, config, base_cache=cache)
        model.load_state_dict(load_file(folder / WEIGHTS_FILE))
        return model.to(device).eval()

    def save(self, folder: Path | str) -> None:
        """The trained tensors and the config; not the base (rebuilt from the package on load)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}, folder / WEIGHTS_FILE)
        (folder / CONFIG_FILE).write_text(json.dumps(self.config.to_json(), indent=2))

    # ---- what the trainer uses --------------------------------------------------------------------
    def named_trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.net.named_parameters() if p.requires_grad]

    def parameters(self) -> list[torch.nn.Parameter]:
        """The trainable parameters only (what the optimiser gets)."""
        return [p for _, p in self.named_trainable()]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The trained tensors by parameter name (the frozen base is left out)."""
        return {n: p.detach() for n, p in self.named_trainable()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        own = dict(self.named_trainable())
        if set(own) != set(state):
            missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
            raise ValueError(
                f"trained tensors do not match the model ({self.config.method}): "
                f"missing {missing[:3]}, unexpected {extra[:3]}"
            )
        with torch.no_grad():
            for name, p in own.items():
                p.copy_(state[name])

    def train(self) -> GemmaModel:
        self.net.train()
        return self

    def eval(self) -> GemmaModel:
        self.net.eval()
        return self

    def to(self, device) -> GemmaModel:
        self.net.to(device)
        return self

    @property
    def device(self) -> torch.device:
        return next(self.net.parameters()).device

    def _causal_lm(self):
        """The Gemma3ForCausalLM inside (with the adapters injected, for LoRA)."""
        return self.net.get_base_model() if hasattr(self.net, "get_base_model") else self.net

    # ---- tensors ----------------------------------------------------------------------------------
    def use_precision(self, precision: str) -> None:
        """Train (and validate) in `precision` ("auto", "float32" or "bfloat16") from now on; a version
        saved afterwards records it in its config."""
        self.config = dataclasses.replace(self.config, precision=precision)

    @property
    def training_precision(self) -> str:
        """What the config's precision resolves to for training on this device: "bfloat16" or "float32"."""
        return resolve_training_precision(self.config.precision, str(self.device))

    def _autocast(self):
        """bfloat16 autocast for the config's training precision on this device, else a no-op context."""
        bf16 = self.training_precision == "bfloat16"
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=bf16)

    def _ids(self, text: str, *, special: bool) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def encode_examples(self, items: Sequence[Item], answers: Sequence[str]):
        """(ids, mask, labels), each B x L with L <= max_length (when set), right-padded: <bos> + the
        prompt as served (passages cut to fit max_length) + the target; labels are -100 except on the
        target tokens."""
        cfg = self.config
        rows = []
        for (question, as_of, passages), answer in zip(items, answers):
            target = self._ids(build_target(answer), special=False)[: cfg.max_answer_tokens]
            if cfg.max_length:
                prompt = fit_prompt(
                    question,
                    as_of,
                    list(passages)[: cfg.n_passages],
                    cfg.max_passage_words,
                    cfg.max_length - len(target),
                    lambda t: len(self._ids(t, special=True)),
                    context_words=cfg.context_words,
                    titles=cfg.titles,
                )
            else:  # what the served reader reads, whole
                prompt = build_prompt(question, as_of, self.context(question, passages), None)
            rows.append((self._ids(prompt, special=True), target))
        length = max(len(p) + len(t) for p, t in rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(rows), length), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        labels = torch.full((len(rows), length), -100, dtype=torch.long)
        for i, (p, t) in enumerate(rows):
            ids[i, : len(p) + len(t)] = torch.tensor(p + t)
            mask[i, : len(p) + len(t)] = 1
            labels[i, len(p) : len(p) + len(t)] = torch.tensor(t)
        return ids, mask, labels

    def loss(self, items: Sequence[Item], answers: Sequence[str]) -> torch.Tensor:
        """Mean cross-entropy of the answer tokens given the prompt, with logits at those positions only."""
        ids, mask, labels = (t.to(self.device) for t in self.encode_examples(items, answers))
        lm = self._causal_lm()
        with self._autocast():
            hidden = lm.model(input_ids=ids, attention_mask=mask).last_hidden_state  # B x L x H
            # Position t predicts token t+1: keep the positions whose next token is an answer token.
            targets = labels[:, 1:]  # B x (L-1)
            at = targets != -100
            logits = lm.lm_head(hidden[:, :-1][at])  # K x V, K = answer tokens in the batch (not B x L x V)
        cap = getattr(lm.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return F.cross_entropy(logits.float(), targets[at])

    def generate(self, items: Sequence[Item], *, batch_size: int | None = None) -> list[str]:
        """Greedy answers, made final like GemmaReader's (`final_answer`), for (question, as_of,
        passages) items: the served prompt (first `n_passages`, `max_passage_words` each), stopping at
        the end of the first line. A question without passages gets "".

        On a CPU without `batch_size`: one at a time by `served_copy()`, the reader a version saved now
        would serve (2.9 s against 1.0 s a question of 5 passages on 2 cores: this model's adapters
        are not merged, and its float32 weights go through autocast, cast again at every token).
        Otherwise `batch_size` rows are generated together, left-padded (default: all; on a CPU,
        padding measured slower: 8 prompts of ~450 tokens took 20 s together against 14 s one by one)."""
        live = [i for i, (_, _, ps) in enumerate(items) if ps]
        out = [""] * len(items)
        if batch_size is None and self.device.type == "cpu":
            if live:
                reader = self.served_copy()
                for i in live:
                    out[i] = reader.generate(*items[i]).text
            return out
        size = batch_size or max(1, len(live))
        with torch.inference_mode():
            for start in range(0, len(live), size):
                chunk = live[start : start + size]
                read = [(items[i][0], items[i][1], self.context(items[i][0], items[i][2])) for i in chunk]
                for i, (question, _, passages), raw in zip(chunk, read, self._generate_rows(read)):
                    out[i] = final_answer(raw, question, passages)
        return out

    def served_copy(self, *, name: str = "gemma:in-training") -> GemmaReader:
        """A GemmaReader over a copy of this model as it stands: adapters merged into the copy, weights
        in the config's precision, as a version saved now would be served (the service's reader
        precision is "auto" by default too). This model is left as it was and can train on."""
        return copy.deepcopy(self).into_reader(name=name, precision=self.config.precision)

    def _generate_rows(self, items: Sequence[Item]) -> list[str]:
        """The raw first lines generated for items whose passages are what the reader reads
        (`context`, as cut; none empty), as one left-padded batch."""
        cfg = self.config
        prompts = [self._ids(build_prompt(q, as_of, ps, None), special=True) for q, as_of, ps in items]
        length = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(prompts), length), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), length), dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding: every prompt ends where generation starts
            ids[row, length - len(p) :] = torch.tensor(p)
            mask[row, length - len(p) :] = 1
        with self._autocast():
            gen = self.net.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                max_new_tokens=cfg.max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
                stopping_criteria=_first_line_stop(self.tokenizer, length),
            )  # B x (length + new)
        return self.tokenizer.batch_decode(gen[:, length:], skip_special_tokens=True)

    def context(self, question: str, passages: Sequence[RetrievedPassage]) -> list[RetrievedPassage]:
        """What the served reader reads of the ranked passages (GemmaReader.context)."""
        cfg = self.config
        return reader_context(
            question,
            passages,
            n_passages=cfg.n_passages,
            max_passage_words=cfg.max_passage_words,
            context_words=cfg.context_words,
            titles=cfg.titles,
        )

    # ---- serving ----------------------------------------------------------------------------------
    def into_reader(
        self,
        *,
        name: str,
        n_passages: int | None = None,
        answer_beams: int = 1,
        vocabulary: str = "full",
        precision: str = "float32",
        echo_beams: int = 0,
    ) -> GemmaReader:
        """A GemmaReader (the served prompt and decoding) over this model. LoRA adapters are merged
        into the base weights first (serving costs what the base costs), so the model is for serving
        only afterwards: do not train it again."""
        lm = self.net.merge_and_unload() if self.config.method == "lora" else self.net
        self.net = lm.eval()
        return GemmaReader(
            lm,
            self.tokenizer,
            device=str(self.device),
            name=name,
            n_passages=n_passages or self.config.n_passages,
            max_passage_words=self.config.max_passage_words,
            max_new_tokens=self.config.max_new_tokens,
            context_words=self.config.context_words,
            answer_beams=answer_beams,
            vocabulary=vocabulary,
            precision=precision,
            titles=self.config.titles,
            echo_beams=echo_beams,
        )

    def export_gguf(self, dest: Path | str, *, weight_type: str = "f32") -> Path:
        """This model, adapters merged, as a GGUF file for the llama.cpp runtime (models/gemma_gguf.py):
        the packaged base's file with every decoder tensor in `weight_type`, the token embedding as
        shipped (frozen in training). Like `into_reader`, it merges in place: the model is for
        serving only afterwards."""
        from models.gemma_gguf import KEPT_AS_SHIPPED, base_gguf, export_gguf  # noqa: PLC0415 (lazy: exports only)

        lm = self.net.merge_and_unload() if self.config.method == "lora" else self.net
        self.net = lm.eval()
        cache = Path(self.config.base_cache) if self.config.base_cache else None
        state = {k: v.detach().float().cpu().numpy() for k, v in lm.state_dict().items()}
        kept = {k: state[k] for k in KEPT_AS_SHIPPED}
        export_gguf(state, kept, base_gguf(cache), Path(dest), weight_type=weight_type)
        return Path(dest)


def base_folder(folder: Path | str) -> Path:
    """The converted base folder a saved version loads onto (`_base_cache`), converted on first use."""
    folder = Path(folder)
    return gemma_folder(_base_cache(folder, read_config(folder), None))


def llama_export(folder: Path | str, *, weight_type: str = "f32") -> Path:
    """The saved version in `folder` as `reader-<weight_type>.gguf` in that folder: written (about
    20 s, atomically) unless it is there already."""
    gguf_file = Path(folder) / f"reader-{weight_type}.gguf"
    if not gguf_file.exists():
        GemmaModel.load(folder).export_gguf(gguf_file, weight_type=weight_type)
    return gguf_file


def llama_reader(folder: Path | str, *, name: str, n_passages: int | None = None, weight_type: str = "f32"):
    """The saved version in `folder` served on llama.cpp (models.gemma_llama.LlamaGemmaReader): its
    GGUF export, `reader-<weight_type>.gguf` in the folder (`llama_export`: written by the training
    that saved the version, or here on first use), read as it is; the tokenizer is the base's."""
    from transformers import AutoTokenizer  # noqa: PLC0415 (lazy: transformers)

    from models.gemma_llama import LlamaGemmaReader  # noqa: PLC0415 (lazy: imports this module's reader)

    folder = Path(folder)
    config = read_config(folder)
    gguf_file = llama_export(folder, weight_type=weight_type)
    tokenizer = AutoTokenizer.from_pretrained(gemma_folder(_base_cache(folder, config, None)))
    return LlamaGemmaReader(
        gguf_file,
        tokenizer,
        name=name,
        n_passages=n_passages or config.n_passages,
        max_passage_words=config.max_passage_words,
        max_new_tokens=config.max_new_tokens,
        context_words=config.context_words,
        titles=config.titles,
    )


def write_soup(folders: Sequence[Path | str], dest: Path | str) -> GemmaConfig:
    """Write the soup of the Gemma version folders `folders` (trained tensors and config, as
    `GemmaModel.save` writes them) to `dest`; returns its config. `GemmaModel.load(dest)` serves it."""
    folders = [Path(f) for f in folders]
    configs = []
    for f in folders:
        if not (f / CONFIG_FILE).exists():
            raise ValueError(f"{f} is not a Gemma reader folder ({CONFIG_FILE} is missing)")
        configs.append(read_config(f))
    config = soup_config(configs)
    state = soup_state([load_file(f / WEIGHTS_FILE) for f in folders])
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, dest / WEIGHTS_FILE)
    (dest / CONFIG_FILE).write_text(json.dumps(config.to_json(), indent=2))
    return config


__all__ = ["GemmaModel", "base_folder", "llama_export", "llama_reader", "read_config", "write_soup"]
