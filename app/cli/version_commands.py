"""`sqa encoders`, `rerankers` and `models`: the trained encoder, re-ranker and reader versions, listed,
imported from another machine, activated and (readers) souped. `sqa train` makes them
(app/cli/train_commands.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import typer

from app.cli.common import cli, fail, guard, open_database, settings

encoders_cli = typer.Typer(no_args_is_help=True, help="Retriever encoder versions (`sqa train retriever`).")
cli.add_typer(encoders_cli, name="encoders")


@encoders_cli.command("list", epilog="Example: sqa encoders list")
@guard
def encoders_list() -> None:
    """Trained encoder versions with their validation figures; * marks the one the index uses."""
    from app.bootstrap.builders import index_encoder_name  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from models.encoders import list_encoder_versions  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: models.encoders pulls numpy)

    s = settings()
    serving = index_encoder_name(s)
    typer.echo(f"{'*' if serving == 'all-MiniLM-L6-v2' else ' '} all-MiniLM-L6-v2  (packaged, untuned)")
    for info in list_encoder_versions(s.encoders_dir):
        mark = "*" if serving == info["version"] else " "
        if info.get("kind") == "distilled":  # `sqa train passage-tower`: MiniLM asks, the student reads
            after = info.get("validation", {}).get("after", {})
            typer.echo(
                f"{mark} {info['version']}  passage tower of MiniLM's layers {info.get('config', {}).get('layers')}  "
                f"trained until {info.get('trained_until')}  cosine to MiniLM {after.get('cos_mean')}"
            )
            continue
        best = info.get("validation", {}).get("best", {})
        typer.echo(
            f"{mark} {info['version']}  towers {info.get('towers')}  "
            f"trained until {info.get('trained_until')}  validation recall@5 {best.get('recall@5')} "
            f"recall@20 {best.get('recall@20')}"
        )
    if serving is None:
        typer.echo("(no index yet)")


rerankers_cli = typer.Typer(no_args_is_help=True, help="Re-ranker versions (`sqa train reranker`).")
cli.add_typer(rerankers_cli, name="rerankers")


@rerankers_cli.command("list", epilog="Example: sqa rerankers list")
@guard
def rerankers_list() -> None:
    """Re-ranker versions with their validation figures; * marks the serving one."""
    from serving.reranking import list_reranker_versions  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: serving.reranking pulls numpy)

    rows = list_reranker_versions(settings().rerankers_dir)
    for info in rows:
        v, f = info.get("validation", {}), info.get("first_stage", {})
        typer.echo(
            f"{'*' if info['active'] else ' '} {info['version']}  trained until {info.get('trained_until')}  "
            f"recall@5 {v.get('recall@5')} (first stage {f.get('recall@5')})  recency {info.get('recency_weight')}"
        )
    if not rows:
        typer.echo("no re-ranker versions yet: `sqa train reranker --until YYYY-MM-DD`")


@rerankers_cli.command("import", epilog="Example: sqa rerankers import reranker-version --activate")
@guard
def rerankers_import(
    folder: Path = typer.Argument(
        ..., help="a version folder trained elsewhere (`python -m models.train_exported_reranker`)"
    ),
    activate: bool = typer.Option(
        False, "--activate/--no-activate", help="serve it once imported (whatever its validation says)"
    ),
) -> None:
    """Register a re-ranker version trained on another machine: the folder is checked (the model must
    load and score), copied into SQA_HOME/rerankers under its version name, and listed."""
    from serving.reranking import activate_reranker, import_reranker  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: serving.reranking pulls numpy)

    s = settings()
    try:
        info = import_reranker(s.rerankers_dir, folder)
    except ValueError as exc:
        fail(str(exc))
    if activate:
        activate_reranker(s.rerankers_dir, info["version"])
    v, f = info.get("validation", {}), info.get("first_stage", {})
    typer.echo(
        f"imported {folder} as re-ranker {info['version']} (held-back recall@5 {v.get('recall@5')}, first "
        f"stage {f.get('recall@5')}); "
        + ("serving" if activate else f"`sqa rerankers activate {info['version']}` serves it")
    )


@rerankers_cli.command("activate", epilog="Example: sqa rerankers activate none")
@guard
def rerankers_activate(version: str = typer.Argument(..., help="a version, or none to stop re-ranking")) -> None:
    """Serve this re-ranker version (servers follow within seconds)."""
    from serving.reranking import activate_reranker  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: serving.reranking pulls numpy)

    activate_reranker(settings().rerankers_dir, None if version == "none" else version)
    typer.echo(f"re-ranker {version} serving" if version != "none" else "no re-ranker serving")


# ---- models: trained reader versions ----------------------------------------------------------------

models_cli = typer.Typer(no_args_is_help=True, help="Trained reader versions (the registry).")
cli.add_typer(models_cli, name="models")


@models_cli.command("list", epilog="Example: sqa models list")
@guard
def models_list() -> None:
    """Every trained reader version, newest first; * marks the active one."""
    from serving.reader_registry import list_versions  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: serving.reader_registry pulls sqlalchemy)

    db = open_database(settings())
    try:
        with db.sessions() as session:
            rows = list_versions(session)
            if not rows:
                typer.echo("no trained reader versions yet: run `sqa train reader --until YYYY-MM-DD`")
                return
            typer.echo(f"  {'version':40s} {'kind':10s} {'state':9s} {'trained until':13s} {'month':7s} parent")
            for r in rows:
                typer.echo(
                    f"{'*' if r.active else ' '} {r.version:40s} {r.kind:10s} {r.state:9s} "
                    f"{str(r.trained_until or '-'):13s} {r.month or '-':7s} {r.parent_version or '-'}"
                )
    finally:
        db.close()


@models_cli.command("activate", epilog="Example: sqa models activate gemma-2023-04-01-c3e2b4")
@guard
def models_activate(
    version: str = typer.Argument(
        ..., help="a ready version, or none: no trained version serves (zero-shot Gemma does)"
    ),
) -> None:
    """Make a ready version the active one (servers with SQA_READER=auto switch to it), or none."""
    from serving.reader_registry import activate_version, deactivate_versions  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: serving.reader_registry pulls sqlalchemy)

    s = settings()
    db = open_database(s)
    try:
        with db.sessions() as session, session.begin():
            if version == "none":
                was = deactivate_versions(session)
            else:
                activate_version(session, version, models_dir=s.models_dir)  # unknown / not ready: exit 2
    finally:
        db.close()
    if version == "none":
        typer.echo(
            f"no reader version is active ({f'was {was}' if was else 'none was'}); servers with "
            f"SQA_READER=auto serve zero-shot Gemma within SQA_SNAPSHOT_POLL_S ({s.snapshot_poll_s:g} s), "
            "and the next training after ingest starts from the base model"
        )
        return
    typer.echo(
        f"activated reader version {version}; servers with SQA_READER=auto serve it within "
        f"SQA_SNAPSHOT_POLL_S ({s.snapshot_poll_s:g} s)"
    )


@models_cli.command("import", epilog="Example: sqa models import gemma-version --activate")
@guard
def models_import(
    folder: Path = typer.Argument(..., help="a version folder trained elsewhere (`python -m models.train_exported`)"),
    activate: bool = typer.Option(False, "--activate/--no-activate", help="make it the active version"),
) -> None:
    """Register a reader version trained on another machine: the folder is checked (the tensors must
    load onto the model), copied into SQA_HOME/models under a new version name, and listed."""
    from serving.reader_registry import import_version  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: serving.reader_registry pulls sqlalchemy)

    s = settings()
    row = _register(
        s,
        lambda session, check: import_version(session, folder, models_dir=s.models_dir, activate=activate, check=check),
    )
    val = (row.metrics or {}).get("validation") or {}
    typer.echo(
        f"imported {folder} as reader version {row.version} (validation EM {val.get('em', '-')} F1 "
        f"{val.get('f1', '-')}); "
        + ("it is the active version" if activate else f"`sqa models activate {row.version}` serves it")
    )


@models_cli.command("soup", epilog="Example: sqa models soup gemma-2023-04-01-52ff5b gemma-2023-04-01-e0c66c")
@guard
def models_soup(
    versions: list[str] = typer.Argument(
        ..., help="two or more ready Gemma LoRA versions, runs of the same settings with another seed each"
    ),
    activate: bool = typer.Option(False, "--activate/--no-activate", help="make it the active version"),
) -> None:
    """Register the uniform soup of Gemma versions trained alike (another seed each, e.g. `sqa train
    reader --kind gemma --seed N`): one version whose weights are the mean of theirs, serving at the
    cost of one. docs/reader-experiments.md, "A soup of seeds", has what it measured."""
    from serving.reader_registry import soup_versions  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: serving.reader_registry pulls sqlalchemy)

    s = settings()
    row = _register(
        s,
        lambda session, check: soup_versions(
            session, versions, models_dir=s.models_dir, activate=activate, check=check
        ),
    )
    typer.echo(
        f"reader version {row.version} is the soup of {', '.join(versions)}; "
        + ("it is the active version" if activate else f"`sqa models activate {row.version}` serves it")
    )


def _register(s, make):
    """`make(session, check)` registers a version folder in one transaction (a ValueError exits 2)
    and returns its row; `check` loads a folder as this SQA_HOME would serve it. A copied folder
    whose row is not committed is removed."""
    from models.trained import load_trained_model, read_reader_info  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: models.trained pulls numpy)

    def check(path: Path) -> None:
        try:
            if read_reader_info(path)["kind"] == "gemma":  # on the base this SQA_HOME serves (converted once)
                from models.gemma_train import GemmaModel  # noqa: PLC0415 (lazy: models.gemma_train imports torch)

                GemmaModel.load(path, cache_dir=s.models_dir / "base")
            else:
                load_trained_model(path)
        except Exception as exc:  # a truncated copy raises safetensors' own error
            raise ValueError(f"{path} does not load as a trained reader: {exc}") from exc

    db = open_database(s)
    row = None
    try:
        with db.sessions() as session, session.begin():
            row = make(session, check)
            session.flush()
            session.expunge(row)
    except ValueError as exc:
        fail(str(exc))
    except Exception:
        if row is not None:  # copied but not committed: no folder without its row
            shutil.rmtree(s.models_dir / row.version, ignore_errors=True)
        raise
    finally:
        db.close()
    return row
