"""Gemma readers as GGUF files, for the llama.cpp runtime (models/gemma_llama.py).

The packaged base is a GGUF already (Q4_K_M); `base_gguf` keeps the assembled file beside the
converted transformers folder. `export_gguf` writes a model as a copy of that file: every metadata
field (tokenizer, context, sliding window) as the base has it, the tensors equal to the `base_state`
it is given byte for byte as shipped, every other one in `weight_type` (f32, bf16, f16 or q8_0).
The exports served (`base_export` for the base, `GemmaModel.export_gguf` for a trained version with
its adapters merged) keep only the token embedding as shipped (`KEPT_AS_SHIPPED`) and re-write the
whole decoder: the shipped Q4_K_M decoder reads a prompt about 1.4x slower on AVX2.

Two conventions of llama.cpp's Gemma converter, the inverse of what transformers does when it reads
a Gemma GGUF (`Gemma2TensorProcessor`): norm weights are stored plus one (llama.cpp's RMS norm
multiplies by the weight, Gemma's by one plus it), and the output head is the token embedding (tied),
so `lm_head` has no tensor of its own.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np

from models.gemma_weights import DEFAULT_CACHE_DIR, _package

WEIGHT_TYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "bf16": gguf.GGMLQuantizationType.BF16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
}
ARCH = "gemma3"
BASE_FILE = "base-q4_k_m.gguf"  # inside the cache dir, beside the converted folder
# The packaged model's shape, as its converted folder's config.json gives it: a base of another
# shape (the tests' tiny Gemma) has no GGUF of its own to run or to export onto.
PACKAGED_SHAPE = {"hidden_size": 640, "num_hidden_layers": 18, "vocab_size": 262144}
# Left as shipped in every export: the token embedding (also the output head), 168M of the 268M
# parameters, read one row a prompt token and whole once an answer token.
KEPT_AS_SHIPPED = ("model.embed_tokens.weight",)


def is_packaged_base(folder: Path) -> bool:
    """Whether the converted transformers folder `folder` is the packaged Gemma 3 270M."""
    config = Path(folder) / "config.json"
    if not config.is_file():
        return False
    values = json.loads(config.read_text())
    return all(values.get(k) == v for k, v in PACKAGED_SHAPE.items())


def base_gguf(cache_dir: Path | None = None) -> Path:
    """The packaged Q4_K_M GGUF, assembled once into `cache_dir` (default ~/.cache/sqa/gemma3-270m)
    through a temporary file renamed into place (the package checks its sha256)."""
    cache = Path(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR).expanduser()
    final = cache / BASE_FILE
    if final.exists():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gguf-", dir=cache) as tmp:
        pkg = _package()
        part = pkg.assemble(Path(tmp) / pkg.MODEL_NAME)
        os.replace(part, final)
    return final


def resolve_weight_type(weight_type: str) -> str:
    """ "auto": f32 on a CPU without native bfloat16 (on AVX2 llama.cpp reads a prompt as fast in
    float32 as in q8_0, and answers as PyTorch's float32 does: 119 of 120 answers alike against
    108 for q8_0), bf16 where the CPU computes it natively. Any other name is returned as it is."""
    from models.gemma_weights import amx_cpu, native_bfloat16  # noqa: PLC0415 (lazy: imports torch)

    if weight_type == "q8_0" and amx_cpu():
        # llama-cpp-python 0.3.36 repacks q8_0 weights for its AMX kernels on such a CPU, and the first
        # prompt then ends the process (SIGSEGV in libggml-cpu; measured 2026-12-07, the same file read
        # without the extra buffer types answers). A setting must not crash the server.
        raise ValueError(
            "SQA_READER_GGUF_TYPE=q8_0 crashes llama.cpp's AMX kernels on this CPU (it has AMX): use "
            "bf16 or f32, or SQA_READER_RUNTIME=auto, which reads with PyTorch's bfloat16 here"
        )
    if weight_type != "auto":
        return weight_type

    return "bf16" if native_bfloat16("cpu") else "f32"


def base_export(cache_dir: Path | None = None, weight_type: str = "f32") -> Path:
    """The packaged base for llama.cpp: its shipped GGUF with the decoder's tensors in `weight_type`
    (the shipped Q4_K_M ones read a prompt about 1.4x slower on AVX2) and the token embedding as
    shipped (also the output head: a quarter of float32's bytes to read for each generated token).
    Written once into the cache dir (`base-<type>.gguf`, about 12 s), from the converted folder's
    float32 values (the shipped ones de-quantised)."""
    from safetensors.numpy import load_file  # noqa: PLC0415 (lazy: only exports read it)

    from models.gemma_weights import gemma_folder  # noqa: PLC0415 (lazy: imports torch)

    cache = Path(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR).expanduser()
    dest = cache / f"base-{weight_type}.gguf"
    if not dest.exists():
        state = load_file(str(gemma_folder(cache) / "model.safetensors"))
        keep = {name: state[name] for name in KEPT_AS_SHIPPED}
        export_gguf(state, keep, base_gguf(cache), dest, weight_type=weight_type)
    return dest


def gguf_names(hf_names: list[str], n_blocks: int) -> dict[str, str]:
    """transformers' Gemma 3 parameter names -> GGUF tensor names ("model.layers.0.self_attn.q_proj.weight"
    -> "blk.0.attn_q.weight"); `lm_head.weight` (tied to the embedding) is left out. A name without
    a GGUF counterpart is a ValueError: the export would drop it silently otherwise."""
    table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, n_blocks)
    out = {}
    for name in hf_names:
        if name == "lm_head.weight":
            continue
        mapped = table.get_name(name, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise ValueError(f"{name} has no GGUF tensor name for {ARCH}")
        out[name] = mapped
    return out


def to_gguf_values(hf_name: str, weight: np.ndarray) -> np.ndarray:
    """A transformers tensor as llama.cpp's Gemma reads it: norms plus one, the rest as they are."""
    return weight + 1.0 if hf_name.endswith("norm.weight") else weight


def export_gguf(
    state: Mapping[str, np.ndarray],
    base_state: Mapping[str, np.ndarray],
    base: Path,
    dest: Path,
    *,
    weight_type: str = "f32",
) -> int:
    """Write `state` (float32 arrays by transformers name: the merged model) to `dest` as a copy of
    the GGUF `base` whose tensors that differ from `base_state` (the base as transformers loaded it)
    are replaced, in `weight_type`; norms stay float32, as in the base. Atomic: written beside `dest`
    and renamed. Returns how many tensors were replaced."""
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"weight_type must be one of {sorted(WEIGHT_TYPES)}, got {weight_type!r}")
    reader = gguf.GGUFReader(base)
    n_blocks = int(reader.get_field(f"{ARCH}.block_count").contents())
    names = gguf_names(list(state), n_blocks)
    missing = set(names.values()) - {t.name for t in reader.tensors}
    if missing:
        raise ValueError(f"{base} lacks the tensors {sorted(missing)[:5]}: not a Gemma 3 base of this shape")
    changed: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType]] = {}
    for hf_name, gguf_name in names.items():
        new = np.asarray(state[hf_name], dtype=np.float32)
        if hf_name in base_state and np.array_equal(new, base_state[hf_name]):
            continue
        values = to_gguf_values(hf_name, new)
        kind = gguf.GGMLQuantizationType.F32 if new.ndim == 1 else WEIGHT_TYPES[weight_type]
        changed[gguf_name] = (gguf.quants.quantize(values, kind), kind)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        writer = gguf.GGUFWriter(tmp, arch=ARCH, endianess=reader.endianess)
        for field in reader.fields.values():
            if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
                continue  # the writer writes these itself
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
        data = {}
        for tensor in reader.tensors:
            array, kind = changed.get(tensor.name, (tensor.data, tensor.tensor_type))
            data[tensor.name] = array
            writer.add_tensor_info(tensor.name, array.shape, array.dtype, array.nbytes, kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor in reader.tensors:
            writer.write_tensor_data(data[tensor.name], tensor_endianess=reader.endianess)
        writer.close()
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return len(changed)


__all__ = [
    "WEIGHT_TYPES",
    "base_export",
    "base_gguf",
    "export_gguf",
    "gguf_names",
    "is_packaged_base",
    "resolve_weight_type",
    "to_gguf_values",
]
