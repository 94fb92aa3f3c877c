"""`sqa live`: push articles from a file, publish the live queue now, and see what waits."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import typer

from app.cli.common import cli, fail, guard, open_database, settings
from indexer.push import BodyError, parse_articles

live_cli = typer.Typer(no_args_is_help=True, help="Live news: push articles, publish the live shard, see the queue.")
cli.add_typer(live_cli, name="live")


@live_cli.command("push", epilog="Example: sqa live push today.ndjson --publish")
@guard
def live_push(
    path: Path = typer.Argument(..., metavar="FILE", help="a JSON array or NDJSON file of articles"),
    publish: bool = typer.Option(False, help="publish the live queue afterwards"),
) -> None:
    """Store articles as POST /admin/articles does (new, updated, duplicate; bad records listed)."""
    from app.bootstrap.builders import open_database  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from app.bootstrap.job_configs import push_limits  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from store.intake import intake_articles  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: store.intake pulls sqlalchemy)

    s = settings()
    try:
        body = path.read_bytes()
    except OSError as exc:
        fail(f"cannot read {path} ({exc.strerror})")
    try:
        batch = parse_articles(body, today=dt.datetime.now(dt.UTC).date(), limits=push_limits(s))
    except BodyError as exc:
        fail(f"{path}: {exc}")
    db = open_database(s)
    try:
        with db.sessions() as session, session.begin():
            counts = intake_articles(session, [r for _, r in batch.records], via="cli")
        typer.echo(
            f"{counts.new} new, {counts.updated} updated, {counts.duplicate} duplicate, {len(batch.rejected)} rejected"
        )
        for r in batch.rejected:
            typer.echo(f"  {path}:{r.line}: {r.field}: {r.reason}", err=True)
        if publish:
            _publish(s, db)
    finally:
        db.close()
    if not batch.records:
        fail("no article was stored", code=1)


def _publish(s, db) -> None:
    from app.bootstrap.builders import build_encoder  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from app.bootstrap.job_configs import ingest_config, live_config  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from workers.live_publisher import publish_live  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.live_publisher pulls faiss)

    while True:  # the whole queue, a batch a snapshot
        result = publish_live(db.sessions, build_encoder(s), ingest_config(s), live_config(s))
        if not result["articles"]:
            break
        typer.echo(
            f"published {result['articles']} articles ({result['passages']} passages, "
            f"{result['retired']} retired) as snapshot {result['snapshot']}"
        )


@live_cli.command("publish", epilog="Example: sqa live publish")
@guard
def live_publish() -> None:
    """Publish everything in the live queue now (`sqa worker` does it by itself within SQA_LIVE_MAX_WAIT_S)."""
    from app.bootstrap.builders import open_database  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)

    s = settings()
    db = open_database(s)
    try:
        _publish(s, db)
    finally:
        db.close()


@live_cli.command("status", epilog="Example: sqa live status")
@guard
def live_status() -> None:
    """What waits in the live queue, and the live pieces of the serving snapshot."""
    from indexer.manifest import read_manifest  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: indexer.manifest pulls faiss)
    from serving.index_state import latest_snapshot_row  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: serving.index_state pulls faiss)
    from store.queries import newest_indexed_article_at  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: store.queries pulls faiss)
    from workers.live_publisher import queue_status  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.live_publisher pulls faiss)

    s = settings()
    db = open_database(s)
    try:
        with db.sessions() as session:
            status = queue_status(session)
            row = latest_snapshot_row(session)
            manifest = read_manifest(s.index_dir, row.manifest_file) if row else None
            newest = newest_indexed_article_at(session, manifest)
        typer.echo(
            f"waiting: {status.waiting} article(s)"
            + (f", the oldest since {status.oldest:%Y-%m-%d %H:%M:%S} UTC" if status.oldest else "")
        )
        if s.nats_url:
            typer.echo(_broker_line(s))
        if manifest is None:
            typer.echo("no index snapshot yet")
            return
        typer.echo(
            f"serving snapshot {manifest.snapshot_id}, committed {manifest.created_at}"
            + (f"; newest article arrived {newest:%Y-%m-%d %H:%M:%S} UTC" if newest else "")
        )
        for e in manifest.live:
            typer.echo(f"  {e.key}  {e.count:6d} passages  {e.min_day}..{e.max_day}")
    finally:
        db.close()


def _broker_line(s) -> str:
    """The worker's NATS consumer (SQA_NATS_URL) as it last wrote its status."""
    from app.bootstrap.job_configs import nats_config  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from workers.nats_consumer import read_status  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers pull faiss)

    b = read_status(nats_config(s).status_file)
    if b is None:
        return f"nats {s.nats_subject} at {s.nats_url}: no status yet (is `sqa worker` running?)"
    line = (
        f"nats {b['subject']} at {b['url']}: {'connected' if b['connected'] else 'not connected'}; "
        f"{b['messages']} message(s), {b['new']} new, {b['updated']} updated, {b['duplicate']} duplicate, "
        f"{b['rejected']} record(s) rejected, {b['terminated']} message(s) dropped"
    )
    return line + (f"; last error: {b['last_error']}" if b.get("last_error") else "")
