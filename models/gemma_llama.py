"""The Gemma reader on llama.cpp (llama-cpp-python): the same prompt, the same greedy decoding, the
same confidence, several times faster per generated token than PyTorch on a CPU.

`GemmaReader` (models/gemma.py) builds the prompt, tokenizes it with the transformers tokenizer (so
both runtimes read the same token ids) and shortens the answer; `LlamaGemmaReader` replaces only its
`_generate`: greedy decoding over the full vocabulary, stopped at the end of text or of the first
worded line, each chosen token's log-probability taken from the full logits, exactly as
`GemmaReader._generate` computes them for `line_probability`. Beam search and the "read" vocabulary
stay PyTorch's (`supports`).

The weights are a GGUF file written by models/gemma_gguf.py: the packaged base's, or a trained
version's, the decoder in f32 or bf16 (or q8_0, f16) and the token embedding as shipped. One
llama.cpp context serves one generation at a time (the reader's lock), on every core, as the
PyTorch reader does.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from models import gemma_weights
from models.gemma import GemmaReader
from models.gemma_decoding import _eos_ids, ends_first_line, line_probability
from models.gemma_gguf import is_packaged_base

RUNTIMES = ("auto", "torch", "llama.cpp")
MIN_CONTEXT = 4096  # tokens; a longer prompt reopens the context at the next power of two
PIP_NAME = "llama-cpp-python"


def llama_cpp_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def supports(*, answer_beams: int = 1, echo_beams: int = 0, vocabulary: str = "full") -> bool:
    """Whether these decoding settings are what the llama.cpp reader does: greedy, full vocabulary."""
    return answer_beams == 1 and echo_beams <= 1 and vocabulary == "full"


def use_llama_cpp(runtime: str, device: str, base: Path | None = None, **decoding) -> bool:
    """Whether a Gemma reader runs on llama.cpp: "llama.cpp" always (an error later if it cannot),
    "torch" never, "auto" on a CPU without native bfloat16 (where PyTorch reads in float32) when
    llama-cpp-python is installed, the decoding settings are ones it supports (`supports`) and the
    base (`base`, its converted folder) is the packaged model. With native bfloat16, PyTorch's
    bfloat16 reads a trained version's prompt faster than llama.cpp (971 against 1,078 ms p50,
    docs/experiments/2026-12-06-llama-cpp-reader.md)."""
    if runtime not in RUNTIMES:
        raise ValueError(f"reader runtime must be one of {RUNTIMES}, got {runtime!r}")
    if runtime == "auto":
        if device != "cpu" or not llama_cpp_installed() or not supports(**decoding):
            return False
        return not gemma_weights.native_bfloat16("cpu") and (base is None or is_packaged_base(base))
    return runtime == "llama.cpp"


class LlamaGreedy:
    """Greedy decoding of a GGUF causal LM on llama.cpp, with each chosen token's log-probability."""

    def __init__(self, gguf_file: Path, *, threads: int = 0) -> None:
        if not llama_cpp_installed():
            raise RuntimeError(f"the llama.cpp reader runtime needs {PIP_NAME}: pip install {PIP_NAME}")
        self.path = Path(gguf_file)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no GGUF file there")
        self.threads = threads or len(os.sched_getaffinity(0))
        self._llm = None
        self._n_ctx = 0

    def _context(self, n_tokens: int):
        if self._llm is None or n_tokens > self._n_ctx:
            from llama_cpp import Llama  # noqa: PLC0415 (lazy: an optional compiled package)

            n_ctx = MIN_CONTEXT
            while n_ctx < n_tokens:
                n_ctx *= 2
            self._llm = None  # the old context's memory goes before the new one's comes
            self._llm = Llama(
                str(self.path),
                n_ctx=n_ctx,
                n_batch=n_ctx,  # the whole prompt in one llama_decode call
                n_ubatch=512,
                n_threads=self.threads,
                n_threads_batch=self.threads,
                flash_attn=True,  # bf16 prompts read in 0.91 s against 1.13 s without it (AVX512-BF16)
                verbose=False,
            )
            self._n_ctx = n_ctx
        return self._llm

    def generate(
        self, ids: Sequence[int], *, max_new_tokens: int, eos: set[int], stop: Callable[[list[int]], bool]
    ) -> tuple[list[int], list[float]]:
        """The tokens generated after `ids` (eos not included) and each one's log-probability; stops
        at an `eos` token, after `max_new_tokens`, or once `stop(generated)` holds."""
        import llama_cpp  # noqa: PLC0415 (lazy: as above)

        llm = self._context(len(ids) + max_new_tokens)
        llm.reset()
        llm.eval(list(ids))
        n_vocab = llm.n_vocab()
        tokens: list[int] = []
        logprobs: list[float] = []
        for _ in range(max_new_tokens):
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
            token = int(logits.argmax())
            top = float(logits[token])
            logprobs.append(-float(np.log(np.exp(logits - top).sum())))  # log softmax of the argmax
            if token in eos:
                break
            tokens.append(token)
            if stop(tokens):
                break
            llm.eval([token])
        return tokens, logprobs[: len(tokens)]


class LlamaGemmaReader(GemmaReader):
    """`GemmaReader` whose generations run on llama.cpp over `gguf_file`; `tokenizer` is the
    transformers tokenizer of the same model. Greedy decoding over the full vocabulary only."""

    def __init__(self, gguf_file: Path, tokenizer, *, threads: int = 0, **kwargs) -> None:
        decoding = {k: kwargs[k] for k in ("answer_beams", "echo_beams", "vocabulary") if k in kwargs}
        if not supports(**decoding):
            raise ValueError(f"the llama.cpp reader decodes greedily over the full vocabulary, not with {decoding}")
        kwargs["precision"] = "float32"  # llama.cpp's own number formats: the GGUF file's
        super().__init__(None, tokenizer, device="cpu", **kwargs)
        self.name = f"{self.name}@llama.cpp"  # answers, logs and benchmark caches tell the runtimes apart
        self.runtime = LlamaGreedy(gguf_file, threads=threads)

    def _generate(self, input_ids, attention_mask, beams: int) -> list[tuple[str, float]]:
        ids = [int(i) for i in input_ids[0]]
        eos = _eos_ids(self.tokenizer)
        with self._lock:
            tokens, logprobs = self.runtime.generate(
                ids,
                max_new_tokens=self.max_new_tokens,
                eos=eos,
                stop=lambda t: ends_first_line(self.tokenizer.decode(t, skip_special_tokens=True)),
            )
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return [(text, line_probability(self.tokenizer, tokens, logprobs))]


__all__ = ["RUNTIMES", "LlamaGemmaReader", "LlamaGreedy", "llama_cpp_installed", "supports", "use_llama_cpp"]
