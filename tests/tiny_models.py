"""Tiny random models with the real architectures, saved as the folders the product loads, for tests
of the machinery around a model (a job trains, saves, registers, resumes, reloads exactly, activates
only what is better) where the packaged weights are beside the point and cost minutes.

- `write_tiny_gemma(cache_dir)`: a Gemma3ForCausalLM of a few hundred thousand parameters and a
  byte-level BPE tokenizer with Gemma's special tokens, saved where `models.gemma_weights.gemma_folder`
  looks (`cache_dir/FOLDER_NAME`, model.safetensors, config and tokenizer files): everything that
  takes a Gemma cache dir (`$SQA_HOME/models/base`, `GemmaModel.from_base`, `GemmaReader.load`,
  `train_exported`'s `base_cache`) loads it through the real code path.
- `write_tiny_bert(folder)`: a 2-layer BERT with the packaged MiniLM's tokenizer, a folder to warm
  start FiD and the extractive reader from (`FiDConfig.base`, `SpanConfig.base`, or
  `models.encoders.packaged_minilm_path` patched to return it).

Each is written once per test session by a fixture of tests/conftest.py (`tiny_gemma_cache`,
`tiny_bert`); the tests that must see the real packaged model are marked `integration`.
"""

from __future__ import annotations

from pathlib import Path

import tokenizers

from indexer.importers import read_realtimeqa
from models.encoders import packaged_minilm_path
from models.gemma_weights import FOLDER_NAME

SAMPLE = Path(__file__).resolve().parent.parent / "indexer" / "sample" / "realtimeqa"

GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")  # ids 0, 1, 2, 3, as in Gemma's vocabulary
GEMMA_VOCAB = 1024


def _corpus() -> list[str]:
    """What the tokenizer's merges are learnt from: the shipped sample's articles and questions and
    the prompt's own words (a fixed text: the same tokenizer every run)."""
    articles, questions, _ = read_realtimeqa(SAMPLE)
    texts = [f"{a.title}. {a.text}" for a in articles]
    texts += [f"{q.text} {' '.join(q.answers)}" for q in questions]
    texts.append(
        "Passage: Question (asked on Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday): Short answer:"
    )
    return texts


def gemma_tokenizer():
    """A byte-level BPE tokenizer (GEMMA_VOCAB ids, any text encodes and decodes back) with Gemma's
    <pad>, <eos>, <bos> and <unk> at ids 0-3 and <bos> put before each text, as Gemma's does."""
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415 (lazy: transformers)

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=GEMMA_VOCAB,
        special_tokens=list(GEMMA_SPECIALS),
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", GEMMA_SPECIALS.index("<bos>"))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>"
    )


def tiny_gemma_lm(vocab_size: int = GEMMA_VOCAB, seed: int = 0):
    """A random Gemma3ForCausalLM (2 layers, width 64; tied embeddings like the real one), in eval mode."""
    import torch  # noqa: PLC0415 (lazy: torch)
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig  # noqa: PLC0415 (lazy: transformers)

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=512,
        max_position_embeddings=8192,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    return Gemma3ForCausalLM(config).eval()


def write_tiny_gemma(cache_dir: Path, seed: int = 0) -> Path:
    """Save a tiny Gemma 3 and its tokenizer as the converted base in `cache_dir` (the folder
    `gemma_folder(cache_dir)` returns); returns `cache_dir`."""
    folder = Path(cache_dir) / FOLDER_NAME
    tiny_gemma_lm(seed=seed).save_pretrained(folder)
    gemma_tokenizer().save_pretrained(folder)
    return Path(cache_dir)


def write_tiny_bert(folder: Path, seed: int = 0) -> Path:
    """Save a random 2-layer BERT (width 32) with the packaged MiniLM's tokenizer in `folder`; returns it."""
    import torch  # noqa: PLC0415 (lazy: torch)
    from transformers import AutoTokenizer, BertConfig, BertModel  # noqa: PLC0415 (lazy: transformers)

    tokenizer = AutoTokenizer.from_pretrained(packaged_minilm_path())
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)
