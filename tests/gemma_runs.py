"""A registered Gemma LoRA version with small random adapters, for tests of soups (the registry's,
the CLI's and `sqa train auto`'s): the file names of models.gemma_train, no base model needed."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path


def gemma_run(
    models_dir: Path,
    sessions,
    version: str,
    *,
    seed: int,
    until: str = "2023-04-01",
    rank: int = 2,
    kind: str = "gemma",
    info: dict | None = None,
    **config,
) -> str:
    """Write `version`'s folder under `models_dir` (adapters drawn with `seed`, validation EM 50 + seed;
    `info` overrides reader.json's fields) and register it, not active, through `sessions` (a
    sessionmaker). Returns the version."""
    import torch
    from safetensors.torch import save_file

    from models.gemma_config import CONFIG_FILE, WEIGHTS_FILE, GemmaConfig
    from serving.reader_registry import register_version

    d = models_dir / version
    d.mkdir(parents=True)
    g = torch.Generator().manual_seed(seed)
    save_file(
        {
            "layer.q_proj.lora_A.default.weight": torch.randn(rank, 8, generator=g),
            "layer.q_proj.lora_B.default.weight": torch.randn(6, rank, generator=g),
        },
        d / WEIGHTS_FILE,
    )
    (d / CONFIG_FILE).write_text(json.dumps(GemmaConfig(lora_r=rank, lora_alpha=2 * rank, **config).to_json()))
    (d / "reader.json").write_text(
        json.dumps(
            {
                "kind": kind,
                "version": version,
                "trained_until": until,
                "spec": {"kind": "gemma", "seed": seed},
                "validation": {"n": 60, "em": 50.0 + seed, "f1": 55.0 + seed},
                **(info or {}),
            }
        )
    )
    with sessions() as session, session.begin():
        register_version(session, version=version, kind=kind, path=version, trained_until=dt.date.fromisoformat(until))
    return version


def register_reader(ctx, version: str, kind: str, until: dt.date, *, activate: bool = True) -> None:
    """Register an (empty) reader version folder under the job context's models_dir, active by default."""
    from serving.reader_registry import register_version

    (ctx.models_dir / version).mkdir(parents=True, exist_ok=True)
    with ctx.sessions() as session, session.begin():
        register_version(
            session,
            version=version,
            kind=kind,
            path=version,
            trained_until=until,
            activate=activate,
            models_dir=ctx.models_dir,
        )
