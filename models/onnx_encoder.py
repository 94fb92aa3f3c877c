"""Encoder towers on ONNX Runtime: the sentence-transformers model exported once, float or int8.

A sentence-transformers folder (Transformer + mean or CLS Pooling + Normalize: the packaged
MiniLM and every trained encoder version's towers) is exported to ONNX with torch's exporter,
tracing eager attention, and, for "onnx-int8", quantised with ONNX Runtime's dynamic quantisation
(int8 weights, activations quantised per batch at run time). The files are cached under
`cache_dir/<model sha256>/`, written to a temp folder and renamed into place, so a crash never
leaves half an export and a changed model gets a new export.

Encoding tokenises with the folder's own fast tokenizer (`tokenizer.json`), sorts the texts by
length so that each batch pads to similar lengths, runs the batches on one ONNX Runtime session
(one thread per run, the batches spread over a thread pool sized to the cores), mean-pools (or
takes CLS) over the attention mask and L2-normalises: the same vectors as the torch model within
float tolerance (float) or quantisation error (int8).

Example:
    >>> tower = OnnxTower(packaged_minilm_path(), name="all-MiniLM-L6-v2", quantize=True)
    >>> tower.encode(["Today is Monday, June 5, 2023. Who won?"]).shape
    (1, 384)
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

# Passages per batch when the caller leaves it to the encoder (batch_size 0) on a CPU, torch or ONNX:
# on 2 cores small batches are fastest (bench/bench_encoder.py: 8 gave 1.3-1.5x the speed of 64).
CPU_BATCH = 8

DEFAULT_CACHE_DIR = Path("~/.cache/sqa/onnx")
FLOAT_FILE, INT8_FILE = "model.onnx", "model-int8.onnx"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _weights_file(folder: Path) -> Path:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    raise ValueError(f"encoder folder {folder} has no model.safetensors or pytorch_model.bin")


# Bumped when the export itself changes, so that a cached file of the older export is not reused.
# 2: eager attention (see export_float).
EXPORT_VERSION = 2


def _model_key(folder: Path) -> str:
    """sha256 of the weights, the config and EXPORT_VERSION: a changed model or export is a new file."""
    h = hashlib.sha256(f"export {EXPORT_VERSION}\n".encode())
    for path in (_weights_file(folder), folder / "config.json"):
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def _pooling(folder: Path) -> str:
    """'mean' or 'cls', from the folder's Pooling module (mean when it does not say)."""
    try:
        modules = json.loads((folder / "modules.json").read_text())
        pooling = next(m["path"] for m in modules if m["type"].endswith("Pooling"))
        config = json.loads((folder / pooling / "config.json").read_text())
    except (OSError, ValueError, KeyError, StopIteration):
        return "mean"
    return "cls" if config.get("pooling_mode_cls_token") else "mean"


def _max_length(folder: Path) -> int:
    try:
        return int(json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"])
    except (OSError, ValueError, KeyError):
        return 256


def export_onnx(folder: Path | str, *, quantize: bool, cache_dir: Path | str | None = None) -> Path:
    """The cached ONNX file of the sentence-transformers folder `folder` (exported on first use).

    Returns `cache_dir/<key>/model.onnx` or, with `quantize`, `model-int8.onnx` (dynamic int8).
    """
    folder = Path(folder)
    cache = Path(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR).expanduser()
    final = cache / _model_key(folder)
    target = final / (INT8_FILE if quantize else FLOAT_FILE)
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=cache))
    try:
        if (final / FLOAT_FILE).is_file():
            shutil.copy2(final / FLOAT_FILE, tmp / FLOAT_FILE)
        else:
            export_float(folder, tmp / FLOAT_FILE)
        if quantize:
            quantize_int8(tmp / FLOAT_FILE, tmp / INT8_FILE)
        final.mkdir(exist_ok=True)
        for name in (FLOAT_FILE, INT8_FILE):
            if (tmp / name).is_file() and not (final / name).is_file():
                os.replace(tmp / name, final / name)  # each file appears whole
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def quantize_int8(source: Path, dest: Path) -> None:
    """ONNX Runtime's dynamic quantisation of `source` into `dest`: int8 weights per channel (per
    tensor, the cosine to the float vectors was 0.95 on average, per channel 0.99)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415 (lazy: onnxruntime)

    quantize_dynamic(str(source), str(dest), weight_type=QuantType.QInt8, per_channel=True)


def export_float(folder: Path, path: Path, *, attention: str = "eager") -> None:
    """The folder's transformer, float, exported to `path` (last hidden state, dynamic batch and length).

    `attention` is transformers' implementation traced: "eager" (the default, what export_onnx
    writes) or "sdpa" (transformers' own default, kept for bench/bench_onnx_export.py).
    """
    import torch  # noqa: PLC0415 (lazy: torch)
    from transformers import AutoModel  # noqa: PLC0415 (lazy: transformers)

    # Eager attention, not transformers' default (SDPA): SDPA's traced mask handling leaves Where and
    # IsNaN nodes in every layer (9% of the int8 run time on an AVX2 CPU); eager adds the mask to the
    # scores. The same function: 1.10x the passages/s (bench/bench_onnx_export.py).
    model = AutoModel.from_pretrained(str(folder), local_files_only=True, attn_implementation=attention).eval()

    class Hidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    example = tuple(torch.ones((2, 8), dtype=torch.long) for _ in INPUTS)
    axes = {name: {0: "batch", 1: "tokens"} for name in INPUTS}
    with torch.no_grad():
        torch.onnx.export(
            Hidden(model),
            example,
            str(path),
            dynamo=False,
            input_names=list(INPUTS),
            output_names=["hidden"],
            dynamic_axes={**axes, "hidden": {0: "batch", 1: "tokens"}},
            opset_version=17,
        )


class OnnxTower:
    """One sentence-transformers tower on ONNX Runtime (CPU), float or int8."""

    def __init__(
        self, folder: Path | str, *, name: str, quantize: bool, cache_dir: Path | str | None = None, threads: int = 0
    ) -> None:
        import onnxruntime as ort  # noqa: PLC0415 (lazy: onnxruntime)

        folder = Path(folder)
        self._args = (folder, name, quantize, cache_dir, threads)  # to rebuild it elsewhere (pickling: Ray actors)
        if not (folder / "tokenizer.json").is_file():
            raise ValueError(f"encoder folder {folder} has no tokenizer.json (the ONNX backend needs a fast tokenizer)")
        self.name, self.quantized = name, quantize
        self.pooling = _pooling(folder)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(_max_length(folder))
        self.tokenizer.no_padding()
        # One thread per run and the batches spread over `threads` runs at once (data parallel): on
        # 2 cores that encoded 1.1x as fast as one run at a time on 2 threads (small batches leave
        # an intra-op pool idle between its layers).
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(export_onnx(folder, quantize=quantize, cache_dir=cache_dir)),
            options,
            providers=["CPUExecutionProvider"],
        )
        self.dim = int(self.session.get_outputs()[0].shape[-1])
        self.threads = threads or (os.cpu_count() or 1)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def pool(self) -> ThreadPoolExecutor:
        """The tower's threads, started on first use and kept (daemon threads: no shutdown needed)."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="onnx-encoder")
            return self._pool

    def __reduce__(self):
        folder, name, quantize, cache_dir, threads = self._args
        return _rebuild, (str(folder), name, quantize, None if cache_dir is None else str(cache_dir), threads)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode(texts, batch_size=32)

    def encode_passages(self, texts: Sequence[str], *, batch_size: int = 0) -> np.ndarray:
        return self.encode(texts, batch_size=batch_size)

    def feeds(self, texts: Sequence[str], *, batch_size: int = 0) -> list[tuple[np.ndarray, dict]]:
        """The model's inputs for `texts`: (rows, feed) per batch of `batch_size` (0: CPU_BATCH),
        longest texts first so that each batch pads to similar lengths, each padded to its longest."""
        batch_size = batch_size or CPU_BATCH
        encodings = self.tokenizer.encode_batch(list(texts))
        order = np.argsort([-len(e.ids) for e in encodings], kind="stable")
        out = []
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            width = max(len(encodings[i].ids) for i in rows)
            feed = {name: np.zeros((len(rows), width), dtype=np.int64) for name in INPUTS}
            for r, i in enumerate(rows):
                e = encodings[i]
                n = len(e.ids)
                feed["input_ids"][r, :n] = e.ids
                feed["attention_mask"][r, :n] = e.attention_mask
                feed["token_type_ids"][r, :n] = e.type_ids
            out.append((rows, feed))
        return out

    def encode(self, texts: Sequence[str], *, batch_size: int = 0) -> np.ndarray:
        texts = list(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        batches = self.feeds(texts, batch_size=batch_size)

        def run(batch: tuple[np.ndarray, dict]) -> None:
            rows, feed = batch
            hidden = self.session.run(["hidden"], feed)[0]  # (batch, tokens, dim)
            if self.pooling == "cls":
                pooled = hidden[:, 0]
            else:
                mask = feed["attention_mask"][..., None].astype(np.float32)
                pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
            out[rows] = pooled  # each batch writes its own rows

        if self.threads > 1 and len(batches) > 1:
            list(self.pool().map(run, batches))  # runs release the GIL; list() re-raises a failure
        else:
            for batch in batches:
                run(batch)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return np.ascontiguousarray(out / np.maximum(norms, 1e-12), dtype=np.float32)


def _rebuild(folder: str, name: str, quantize: bool, cache_dir: str | None, threads: int) -> OnnxTower:
    """An unpickled tower: the same model, its session opened again (exported again if not cached there)."""
    return OnnxTower(folder, name=name, quantize=quantize, cache_dir=cache_dir, threads=threads)
