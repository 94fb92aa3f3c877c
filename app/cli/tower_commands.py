"""`sqa train passage-tower`: a faster passage encoder distilled from the packaged MiniLM
(`workers/distill_encoder.py`), registered as an encoder version and, with `--switch`, served."""

from __future__ import annotations

import typer

from app.cli.common import day_option, fail, guard, run_job, settings
from app.cli.data import reencode_index
from app.cli.train_commands import train_cli


@train_cli.command("passage-tower", epilog="Example: sqa train passage-tower --until 2022-10-01 --layers 0,5 --switch")
@guard
def train_passage_tower(
    until: str = typer.Option(..., help="YYYY-MM-DD: learn from the passages dated before this day"),
    layers: str = typer.Option(
        "0,5", help="MiniLM's layers the passage tower keeps (of 0-5): fewer layers, faster ingest"
    ),
    passages: int = typer.Option(8000, min=10, help="passages to learn from (500 more are held out)"),
    epochs: int = typer.Option(1, min=1),
    lr: float = typer.Option(5e-4, min=0.0),
    max_minutes: float = typer.Option(0.0, min=0.0, help="wall-clock budget for the training (0: none)"),
    seed: int = typer.Option(0),
    switch: bool = typer.Option(
        False, "--switch/--no-switch", help="re-encode the index with the new version when done (`sqa index reencode`)"
    ),
) -> None:
    """Distil a passage tower that keeps some of MiniLM's layers, trained to write MiniLM's vectors;
    questions are still encoded by MiniLM. Run the same command again to resume an interrupted run."""
    from models.distill import DistillConfig, parse_layers  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: models.distill pulls numpy)
    from models.encoders import read_encoder_info  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: models.encoders pulls numpy)
    from workers.distill_encoder import PASSAGE_TOWER_LOCK, describe, run_distill_job  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: the job pulls torch)

    cut = day_option(until, "--until")
    try:
        cfg = DistillConfig(layers=parse_layers(layers), epochs=epochs, lr=lr, max_minutes=max_minutes, seed=seed)
    except ValueError as exc:
        fail(str(exc))
    version = run_job(
        "train-passage-tower",
        {"until": str(cut), "layers": list(cfg.layers), "passages": passages},
        lambda ctx, job: run_distill_job(ctx, job, until=cut, cfg=cfg, max_passages=passages),
        result_key="version",
        lock=PASSAGE_TOWER_LOCK,
    )
    typer.echo(f"encoder version {version} distilled:")
    typer.echo(describe(read_encoder_info(settings().encoders_dir / version)))
    if switch:
        reencode_index(version)
    else:
        typer.echo(f"switch the index to it with `sqa index reencode --encoder {version}`")
