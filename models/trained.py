"""A trained reader version on disk: its weights, its model config and `reader.json` in one folder.

`reader.json` says which kind of reader the folder holds ("fid", "extractive", "ranker" or "gemma") and how it was
made (version, parent, cut-off date, data counts, validation scores); the model's own config file
beside the weights decides its architecture on reload.
"""

from __future__ import annotations

import json
from pathlib import Path

from models.gemma_gguf import resolve_weight_type
from models.gemma_llama import use_llama_cpp
from models.ranker import CandidateReader, RankerModel
from models.reader_base import Reader

INFO_FILE = "reader.json"
KINDS = ("fid", "extractive", "ranker", "gemma")


def read_reader_info(path: Path | str) -> dict:
    path = Path(path)
    info_file = path / INFO_FILE
    if not info_file.exists():
        raise FileNotFoundError(f"{path} is not a trained reader folder ({INFO_FILE} is missing)")
    info = json.loads(info_file.read_text())
    if info.get("kind") not in KINDS:
        raise ValueError(f"{info_file}: kind {info.get('kind')!r} is unknown (expected one of {KINDS})")
    return info


def write_reader_info(path: Path | str, info: dict) -> None:
    if info.get("kind") not in KINDS:
        raise ValueError(f"kind {info.get('kind')!r} is unknown (expected one of {KINDS})")
    path = Path(path)
    tmp = path / (INFO_FILE + ".tmp")
    tmp.write_text(json.dumps(info, indent=2, default=str))
    tmp.replace(path / INFO_FILE)


def load_trained_model(path: Path | str, *, device: str = "cpu"):
    """The model of a trained reader folder (FiDModel, SpanModel, RankerModel or GemmaModel; Gemma's
    base is rebuilt from the package into the folder's sibling `base/`, see models.gemma_train)."""
    info = read_reader_info(path)
    if info["kind"] == "gemma":
        from models.gemma_train import GemmaModel  # noqa: PLC0415 (lazy: models.gemma_train imports torch)

        return GemmaModel.load(path, device=device)
    if info["kind"] == "ranker":
        return RankerModel.load(path)
    if info["kind"] == "fid":
        from models.fid import FiDModel  # noqa: PLC0415 (lazy: models.fid imports torch)

        return FiDModel.load(path, device=device)
    from models.extractive import SpanModel  # noqa: PLC0415 (lazy: models.extractive imports torch)

    return SpanModel.load(path, device=device)


def llama_weight_type(
    path: Path | str, info: dict, *, device: str, runtime: str, gguf_type: str, **decoding
) -> str | None:
    """The GGUF weight type the version in `path` (its reader.json: `info`) is read in on llama.cpp
    under these settings (models.gemma_llama.use_llama_cpp), or None where PyTorch reads it."""
    if info["kind"] != "gemma" or not use_llama_cpp(runtime, device, **decoding):  # runtime, CPU, decoding
        return None
    from models.gemma_train import base_folder  # noqa: PLC0415 (lazy: models.gemma_train imports torch)

    if runtime == "auto" and not use_llama_cpp(runtime, device, base_folder(path), **decoding):  # its base
        return None
    return resolve_weight_type(gguf_type)


def export_for_serving(
    path: Path | str,
    *,
    device: str = "cpu",
    answer_beams: int = 1,
    vocabulary: str = "full",
    echo_beams: int = 0,
    runtime: str = "auto",
    gguf_type: str = "auto",
) -> Path | None:
    """Write now the GGUF file that `load_trained_reader` would write at the version's first load
    (about 20 s), where these settings read the version on llama.cpp: a training calls it when it
    saves a version, so the reader that takes over serves at once. The file written (or already
    there), or None where PyTorch reads the version (another kind, native bfloat16, `runtime`
    "torch")."""
    decoding = {"answer_beams": answer_beams, "echo_beams": echo_beams, "vocabulary": vocabulary}
    info = read_reader_info(path)
    weight_type = llama_weight_type(path, info, device=device, runtime=runtime, gguf_type=gguf_type, **decoding)
    if weight_type is None:
        return None
    from models.gemma_train import llama_export  # noqa: PLC0415 (lazy: models.gemma_train imports torch)

    return llama_export(path, weight_type=weight_type)


def load_trained_reader(
    path: Path | str,
    *,
    device: str = "cpu",
    max_passages: int | None = None,
    answer_beams: int = 1,
    vocabulary: str = "full",
    precision: str = "float32",
    echo_beams: int = 0,
    runtime: str = "torch",
    gguf_type: str = "auto",
) -> Reader:
    """A `Reader` over a trained folder, named "<kind>:<version>" so answers say what read them
    (`answer_beams`, `vocabulary`, `precision`: a Gemma version's grounded beam search, answer
    vocabulary and number format, models.gemma.GemmaReader; `runtime` and `gguf_type`: whether a
    Gemma version runs on llama.cpp, exported in that weight type, models.gemma_llama.use_llama_cpp)."""
    info = read_reader_info(path)
    name = f"{info['kind']}:{info.get('version') or Path(path).name}"
    decoding = {"answer_beams": answer_beams, "echo_beams": echo_beams, "vocabulary": vocabulary}
    if weight_type := llama_weight_type(path, info, device=device, runtime=runtime, gguf_type=gguf_type, **decoding):
        from models.gemma_train import llama_reader  # noqa: PLC0415 (lazy: models.gemma_train imports torch)

        return llama_reader(path, name=name, n_passages=max_passages, weight_type=weight_type)
    model = load_trained_model(path, device=device)
    if info["kind"] == "gemma":
        return model.into_reader(
            name=name,
            n_passages=max_passages,  # LoRA merged: serves at the base's cost
            answer_beams=answer_beams,
            vocabulary=vocabulary,
            precision=precision,
            echo_beams=echo_beams,
        )
    if info["kind"] == "fid":
        from models.fid import FiDReader  # noqa: PLC0415 (lazy: models.fid imports torch)

        return FiDReader(model, name=name, n_passages=max_passages)
    if info["kind"] == "ranker":
        return CandidateReader(model, name=name, n_passages=max_passages)
    from models.extractive import ExtractiveReader  # noqa: PLC0415 (lazy: models.extractive imports torch)

    return ExtractiveReader(model, name=name, n_passages=max_passages)
