"""`sqa train` (reader, retriever, auto, reranker), `finetune` and `selflabel`: training the readers,
encoders and re-rankers, and the self-labeled questions they learn from. The versions they make are
listed, imported and activated by app/cli/version_commands.py's commands."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

from app.cli.common import cli, context, day_option, fail, guard, month_option, open_database, run_job, settings
from app.cli.data import reencode_index, run_auto_train
from models.selflabel import RULES

train_cli = typer.Typer(no_args_is_help=True, help="Train models on what is dated before a cut.")
cli.add_typer(train_cli, name="train")


def _check_export(export: Path, *, kind: str, allowed: str, why: str, activate: bool, importer: str) -> None:
    """Exit with a message unless `--export` goes with the other options: the kind that trains
    elsewhere, no `--activate`, and a folder (not a file) to write to."""
    if kind != allowed:
        fail(f"--export is for --kind {allowed} ({why})")
    if activate:
        fail(
            f"--activate does not go with --export (nothing is trained here): `{importer} DIR --activate` "
            "activates the version trained elsewhere"
        )
    if export.exists() and not export.is_dir():
        fail(f"--export {export} is a file: name a folder")


def _reader_spec(
    kind: str, max_minutes: float, epochs: int, n_passages: int | None, base: str | None, seed: int, gold: bool = True
):
    from workers.reader_spec import ReaderJobSpec  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.reader_spec pulls torch)

    if kind not in ("fid", "extractive", "gemma", "ranker"):
        fail(f"--kind {kind!r} is unknown (use fid, extractive, gemma or ranker)")
    if kind == "ranker" and not gold:
        fail("--no-gold is for gemma, fid and extractive readers (the ranker validates on gold questions)")
    if kind == "ranker":  # reads the same number of passages in training and serving
        from workers.train_ranker import PASSAGES, SELF_ARTICLES  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.train_ranker pulls numpy)

        n = n_passages or PASSAGES
        return ReaderJobSpec(kind=kind, n_passages=n, infer_passages=n, max_self_articles=SELF_ARTICLES, seed=seed)
    if kind == "gemma":  # reads the same number of passages in training and serving
        if base:
            fail("--base is for --kind fid only (gemma fine-tunes the packaged Gemma 3 270M)")
        n = n_passages or ReaderJobSpec.for_gemma().n_passages
        return ReaderJobSpec.for_gemma(
            max_minutes=max_minutes, max_epochs=epochs, n_passages=n, infer_passages=n, seed=seed, gold=gold
        )
    if base and not Path(base).is_dir():
        fail(f"--base {base} is not a folder (a local T5/BART checkpoint is expected)")
    return ReaderJobSpec(
        kind=kind,
        max_minutes=max_minutes,
        max_epochs=epochs,
        n_passages=n_passages or 5,
        backbone="seq2seq" if base else "minilm",
        base=base or "",
        seed=seed,
        gold=gold,
    )


@train_cli.command("reader", epilog="Example: sqa train reader --kind gemma --until 2023-04-01 --max-minutes 30")
@guard
def train_reader(
    until: str = typer.Option(..., help="YYYY-MM-DD: train on what is dated before this day"),
    kind: str = typer.Option(
        "ranker",
        help="ranker | gemma | extractive | fid (ranker: an entity "
        "ranker that fits in seconds; gemma: the packaged Gemma "
        "3 270M fine-tuned with LoRA, give it --max-minutes)",
    ),
    base: str | None = typer.Option(
        None, help="fid: a local T5/BART folder (default: warm start from the packaged MiniLM)"
    ),
    max_minutes: float = typer.Option(0.0, help="wall-clock budget (0: none); the best checkpoint is kept"),
    epochs: int = typer.Option(3, min=1),
    n_passages: int | None = typer.Option(
        None,
        min=1,
        max=100,
        help="passages per training question (default 5; ranker: 10; ranker and gemma read as many when serving)",
    ),
    seed: int = typer.Option(0),
    activate: bool = typer.Option(False, "--activate/--no-activate", help="make it the active version when done"),
    gold: bool = typer.Option(
        True,
        "--gold/--no-gold",
        help="learn from the imported questions with "
        "answers too (--no-gold: only from questions generated from the news, "
        "validated on the last month's)",
    ),
    self_articles: int | None = typer.Option(
        None, min=0, help="articles sampled for self-labeled questions (default: the kind's, 300 for gemma)"
    ),
    self_per_article: int = typer.Option(
        2, min=1, max=50, help="self-labeled questions asked of each sampled article (at most one a sentence)"
    ),
    max_length: int | None = typer.Option(
        None,
        min=0,
        help="gemma: training tokens per example, "
        "passages cut to fit (default 320; 0: the served prompt "
        "whole, no cut)",
    ),
    context_words: int | None = typer.Option(
        None,
        min=0,
        max=2000,
        help="gemma: read the sentences of the passages that bear on the question, this many words in all, "
        "in training and serving (default SQA_READER_CONTEXT_WORDS; 0: the first 100 words of each passage)",
    ),
    keep_within: float | None = typer.Option(
        None,
        min=0.0,
        help="F1 points: keep the earliest "
        "validated model within this of the best validation F1 "
        "(default: 3 for gemma, 0 for the others: the best)",
    ),
    max_steps: int | None = typer.Option(
        None,
        min=0,
        help="stop after this many steps, validating "
        "there (default: 50 for gemma, its first validation; 0: no "
        "cap, the epochs, early stopping and --max-minutes decide)",
    ),
    export: Path | None = typer.Option(
        None,
        help="gemma: write the training data and settings to "
        "this folder instead of training, for `python -m "
        "models.train_exported` on another machine (a GPU)",
    ),
) -> None:
    """Train a reader version; run the same command again to resume an interrupted run."""
    from serving.reader_registry import READER_TRAINING_LOCK  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: serving.reader_registry pulls sqlalchemy)
    from workers.train import run_export_job, run_train_job  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.train pulls torch)

    cut = day_option(until, "--until")
    spec = _reader_spec(kind, max_minutes, epochs, n_passages, base, seed, gold)
    if max_length is not None and kind != "gemma":
        fail("--max-length is for --kind gemma")
    if context_words is not None and kind != "gemma":
        fail("--context-words is for --kind gemma")
    if keep_within is not None and kind == "ranker":
        fail("--keep-within is for gemma, fid and extractive readers (the ranker keeps its best fit)")
    if max_steps is not None and kind == "ranker":
        fail("--max-steps is for gemma, fid and extractive readers (the ranker is fitted, not stepped)")
    spec = replace(
        spec,
        self_per_article=self_per_article,
        **({} if self_articles is None else {"max_self_articles": self_articles}),
        **({} if max_length is None else {"max_length": max_length}),
        **({} if keep_within is None else {"keep_within": keep_within}),
        **({} if max_steps is None else {"max_steps": max_steps}),
    )
    if kind == "gemma":
        spec = replace(spec, context_words=settings().reader_context_words if context_words is None else context_words)
    if export is not None:
        _check_export(
            export,
            kind=kind,
            allowed="gemma",
            why="models.train_exported trains Gemma readers",
            activate=activate,
            importer="sqa models import",
        )
        if max_steps is None:  # trained elsewhere with other batches and epochs: no cap unless asked for
            spec = replace(spec, max_steps=0)
        info = run_job(
            "export-training-data",
            {"until": str(cut), "kind": kind, "to": str(export)},
            lambda ctx, job: run_export_job(ctx, job, until=cut, dest=export, spec=spec),
        )
        d = info["data"]
        typer.echo(
            f"exported {d['train']} training examples ({d.get('gold', '?')} gold, "
            f"{d.get('self_labeled', '?')} self-labeled) and {d['val']} validation questions to {export}; "
            f"train them with `python -m models.train_exported {export} --out VERSION_DIR --device cuda`, "
            f"then `sqa models import VERSION_DIR`"
        )
        return
    version = run_job(
        "train",
        {"until": str(cut), "kind": kind, **({} if gold else {"gold": False})},
        lambda ctx, job: run_train_job(ctx, job, until=cut, spec=spec, activate=activate),
        result_key="version",
        lock=READER_TRAINING_LOCK,
    )
    typer.echo(f"reader version {version} trained; `sqa models list` shows it")


@train_cli.command("retriever", epilog="Example: sqa train retriever --until 2023-04-01")
@guard
def train_retriever(
    until: str = typer.Option(..., help="YYYY-MM-DD: train on what is dated before this day"),
    towers: str = typer.Option(
        "shared",
        help="shared (one encoder for questions and passages) | separate (a question tower and a passage tower)",
    ),
    epochs: int = typer.Option(1, min=1),
    batch_size: int = typer.Option(
        16, min=2, help="questions a step (in-batch negatives; larger is better where there is a GPU)"
    ),
    lr: float = typer.Option(2e-5, min=0.0),
    max_minutes: float = typer.Option(
        0.0, min=0.0, help="wall-clock budget (0: none); the best validated state is kept"
    ),
    self_articles: int = typer.Option(1500, min=0, help="articles sampled for self-labeled questions"),
    self_ratio: float = typer.Option(2.0, min=0.0, help="self-labeled pairs kept per gold pair"),
    hard_negatives: bool = typer.Option(
        True, "--hard-negatives/--no-hard-negatives", help="add each question's best BM25 passage without the answer"
    ),
    seed: int = typer.Option(0),
    query_format: str = typer.Option(
        "dated",
        help="how questions are written for the encoder, "
        'in training and when serving: dated ("Today is <date>. '
        '<question>") | bare',
    ),
    switch: bool = typer.Option(
        False, "--switch/--no-switch", help="re-encode the index with the new version when done (`sqa index reencode`)"
    ),
) -> None:
    """Fine-tune the question and passage encoders (DPR) and save them as an encoder version;
    run the same command again to resume an interrupted run."""
    from models.dpr import DprConfig  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: models.dpr pulls numpy)
    from models.encoders import read_encoder_info  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: models.encoders pulls numpy)
    from workers.train_retriever import RETRIEVER_TRAINING_LOCK, RetrieverDataConfig, describe, run_train_retriever_job  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.train_retriever pulls torch)

    cut = day_option(until, "--until")
    try:
        cfg = DprConfig(
            towers=towers,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            max_minutes=max_minutes,
            hard_negatives=hard_negatives,
            seed=seed,
        )
    except ValueError as exc:
        fail(str(exc))
    try:
        data = RetrieverDataConfig(
            max_self_articles=self_articles, max_self_ratio=self_ratio, seed=seed, query_format=query_format
        )
    except ValueError as exc:
        fail(str(exc))
    version = run_job(
        "train-retriever",
        {"until": str(cut), "towers": towers},
        lambda ctx, job: run_train_retriever_job(ctx, job, until=cut, cfg=cfg, data=data),
        result_key="version",
        lock=RETRIEVER_TRAINING_LOCK,
    )
    typer.echo(
        f"encoder version {version} trained; validation (gold questions of the month before the cut, "
        "pooled BM25 + dense candidates):"
    )
    typer.echo(describe(read_encoder_info(settings().encoders_dir / version)))
    if switch:
        reencode_index(version)
    else:
        typer.echo(f"switch the index to it with `sqa index reencode --encoder {version}`")


@train_cli.command("auto", epilog="Example: sqa train auto --until 2023-04-01 --max-minutes 30")
@guard
def train_auto(
    until: str = typer.Option(..., help="YYYY-MM-DD, a month's first day: learn what is dated before it"),
    max_minutes: float | None = typer.Option(
        None, min=0.1, help="the reader's budget (default SQA_AUTO_TRAIN_MINUTES)"
    ),
) -> None:
    """What `sqa ingest` runs when it ends: a re-ranker, then the reader, each activated only if it
    beats what serves on the month before the cut. Run it again to resume."""
    cut = day_option(until, "--until")
    if cut.day != 1:
        fail(f"--until {cut} must be the first day of a month (the held-back month is the one before)")
    with context() as ctx:
        cfg = ctx.auto_train if max_minutes is None else replace(ctx.auto_train, max_minutes=max_minutes)
        run_auto_train(ctx, cut, cfg)


@train_cli.command("reranker", epilog="Example: sqa train reranker --until 2023-04-01 --max-minutes 25")
@guard
def train_reranker(
    until: str = typer.Option(
        ..., help="YYYY-MM-DD: train on what is dated before this day (the month before it is held back for validation)"
    ),
    max_minutes: float = typer.Option(0.0, min=0.0, help="wall-clock budget (0: none)"),
    epochs: int = typer.Option(1, min=1),
    depth: int = typer.Option(
        30, min=2, max=500, help="first-stage candidates per question (serve with the same SQA_RERANK_DEPTH)"
    ),
    self_articles: int = typer.Option(300, min=0, help="articles sampled for self-labeled questions"),
    self_per_article: int = typer.Option(1, min=1, help="self-labeled questions kept from each"),
    seed: int = typer.Option(0),
    kind: str = typer.Option(
        "cross-encoder",
        help="cross-encoder (MiniLM reads each question and "
        "passage) or features (a logistic model over cheap features: "
        "seconds to train, microseconds a candidate to serve)",
    ),
    activate: bool = typer.Option(
        False,
        "--activate/--no-activate",
        help="serve it when done, if it beats the first stage's recall@5 on the held-back month",
    ),
    export: Path | None = typer.Option(
        None,
        help="cross-encoder: write the candidates to this "
        "folder instead of training, for `python -m "
        "models.train_exported_reranker` on another machine (a GPU)",
    ),
) -> None:
    """Train a re-ranker on the first stage's candidates for the dated gold and self-labeled questions
    before the cut, and fit its recency prior; run it again to reuse the data."""
    from workers.train_reranker import (  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.train_reranker pulls torch)
        KINDS,
        RERANKER_TRAINING_LOCK,
        RerankerDataConfig,
        run_export_reranker_job,
        run_train_reranker_job,
    )

    if kind not in KINDS:
        fail(f"--kind {kind!r} is unknown: use {' or '.join(KINDS)}")
    cut = day_option(until, "--until")
    data = RerankerDataConfig(
        depth=depth, max_self_articles=self_articles, self_per_article=self_per_article, seed=seed
    )
    if export is not None:
        _check_export(
            export,
            kind=kind,
            allowed="cross-encoder",
            why="the feature re-ranker trains in seconds here",
            activate=activate,
            importer="sqa rerankers import",
        )
        info = run_job(
            "export-reranker-data",
            {"until": str(cut), "to": str(export)},
            lambda ctx, job: run_export_reranker_job(ctx, job, until=cut, dest=export, data=data),
            lock=RERANKER_TRAINING_LOCK,
        )
        d = info["data"]
        typer.echo(
            f"exported {info['train_questions']} training questions ({d['gold']} gold, {d['self']} "
            f"self-labeled asked; those without a candidate holding the answer and one without are left out) "
            f"and {info['val_questions']} held-back questions of {info['held_back']}, {info['passages']} "
            f"passages, to {export}; train them with `python -m models.train_exported_reranker {export} "
            f"--out VERSION_DIR --device cuda`, then `sqa rerankers import VERSION_DIR`"
        )
        return
    info = run_job(
        "train-reranker",
        {"until": str(cut)},
        lambda ctx, job: run_train_reranker_job(
            ctx, job, until=cut, max_minutes=max_minutes, epochs=epochs, data=data, activate=activate, kind=kind
        ),
        lock=RERANKER_TRAINING_LOCK,
    )
    v, f = info["validation"], info["first_stage"]
    size = (
        f"{info['data']['groups']} groups, {info['train']['steps']} steps"
        if kind == "cross-encoder"
        else f"{info['data']['questions_used']} questions"
    )
    typer.echo(
        f"{kind} re-ranker {info['version']} trained ({size}, {info['seconds']['train_and_validate']} s); "
        f"on {info['data']['val']} questions of {info['held_back']}: recall@1/5/10 "
        f"{v['recall@1']}/{v['recall@5']}/{v['recall@10']} (first stage {f['recall@1']}/{f['recall@5']}/"
        f"{f['recall@10']}), first-stage weight {info['first_stage_weight']}, recency weight "
        f"{info['recency_weight']}; "
        + ("activated" if info["activated"] else f"not activated (`sqa rerankers activate {info['version']}`)")
    )


@cli.command("finetune", epilog="Example: sqa finetune --month 2023-03 --max-minutes 20")
@guard
def finetune(
    month: str = typer.Option(..., help="YYYY-MM: fine-tune the active reader on this month's news"),
    max_minutes: float = typer.Option(0.0, help="wall-clock budget (0: none)"),
) -> None:
    """Continue the active reader on the month's self-labeled questions plus a replay sample of
    older ones; the new version becomes active."""
    from serving.reader_registry import READER_TRAINING_LOCK  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: serving.reader_registry pulls sqlalchemy)
    from workers.train import run_finetune_job  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.train pulls torch)

    month_option(month, "--month")
    version = run_job(
        "finetune",
        {"month": month},
        lambda ctx, job: run_finetune_job(ctx, job, month=month, max_minutes=max_minutes),
        result_key="version",
        lock=READER_TRAINING_LOCK,
    )
    typer.echo(f"reader version {version} fine-tuned on {month} and activated")


@cli.command("selflabel", epilog="Example: sqa selflabel --month 2023-03")
@guard
def selflabel(
    month: str | None = typer.Option(None, help="YYYY-MM: articles published in this month"),
    until: str | None = typer.Option(None, help="YYYY-MM-DD: articles published before this day"),
    n: int = typer.Option(30, help="how many generated questions to print"),
    seed: int = typer.Option(0, help="the same seed prints the same questions"),
    max_articles: int = typer.Option(200, help="generate from this many random articles"),
) -> None:
    """Print self-labeled questions generated from random stored articles, and why others were rejected."""
    from workers.selflabel_sample import sample_from_database  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.selflabel_sample pulls sqlalchemy)

    if month and until:
        fail("give at most one of --month or --until")
    month_option(month, "--month")
    cut = day_option(until, "--until")
    db = open_database(settings(), migrate=False)  # read only: never migrates someone's database
    try:
        with db.sessions() as session:
            questions, stats = sample_from_database(
                session, until=cut, month=month, n=n, seed=seed, max_articles=max_articles
            )
    finally:
        db.close()
    for q in questions:
        typer.echo(f"{q.published} | {q.question} | {q.answer} ({q.answer_label})")
    typer.echo(
        f"articles {stats.articles}, sentences {stats.sentences}, candidate entities {stats.candidates}, "
        f"accepted {stats.accepted}"
    )
    for reason, count in sorted(stats.rejected.items(), key=lambda kv: -kv[1]):
        typer.echo(f"  rejected {count:6d}  {reason}: {RULES[reason]}")
