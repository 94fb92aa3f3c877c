"""`sqa feeds`: the RSS and Atom feeds the worker polls into the live queue (workers/feed_poller.py)."""

from __future__ import annotations

import typer

from app.cli.common import cli, fail, guard, open_database, settings

feeds_cli = typer.Typer(no_args_is_help=True, help="RSS and Atom feeds the worker polls for live news.")
cli.add_typer(feeds_cli, name="feeds")


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


@feeds_cli.command("add", epilog="Example: sqa feeds add https://news.example/rss.xml --source example")
@guard
def feeds_add(
    url: str = typer.Argument(..., help="the feed's http(s) URL"),
    source: str = typer.Option("", help="the articles' source name (default: the feed's host)"),
) -> None:
    """Add a feed; `sqa worker` polls it every SQA_FEED_INTERVAL_S (`sqa feeds poll`: now)."""
    from workers.feed_poller import add_feed  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.feed_poller pulls faiss)

    s = settings()
    db = open_database(s)
    try:
        with db.sessions() as session, session.begin():
            feed = add_feed(session, url, source)
    finally:
        db.close()
    typer.echo(
        f"added feed {feed.url}: the worker polls it every {s.feed_interval_s:g} s (sqa feeds poll: poll it now)"
    )


@feeds_cli.command("list", epilog="Example: sqa feeds list")
@guard
def feeds_list() -> None:
    """The feeds with their health: last fetch, HTTP status, failures, articles."""
    from workers.feed_poller import feed_status  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.feed_poller pulls faiss)

    db = open_database(settings())
    try:
        with db.sessions() as session:
            rows = feed_status(session)
    finally:
        db.close()
    if not rows:
        typer.echo("no feeds yet (sqa feeds add URL)")
        return
    typer.echo(f"{'last fetch (UTC)':19}  {'status':>6}  {'fails':>5}  {'new':>4}  {'total':>6}  url")
    for r in rows:
        typer.echo(
            f"{_when(r['last_fetch_at']):19}  {r['last_status'] or '-':>6}  {r['failures']:>5}  "
            f"{r['last_new']:>4}  {r['articles_total']:>6}  {r['url']}"
        )
        if r["last_error"]:
            typer.echo(f"{'':19}  {r['last_error']}")


@feeds_cli.command("remove", epilog="Example: sqa feeds remove https://news.example/rss.xml")
@guard
def feeds_remove(url: str = typer.Argument(..., help="the feed's URL, as `sqa feeds list` shows it")) -> None:
    """Stop polling a feed (the articles it brought stay)."""
    from workers.feed_poller import remove_feed  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.feed_poller pulls faiss)

    db = open_database(settings())
    try:
        with db.sessions() as session, session.begin():
            remove_feed(session, url)
    finally:
        db.close()
    typer.echo(f"removed feed {url.strip()}")


@feeds_cli.command("poll", epilog="Example: sqa feeds poll --all")
@guard
def feeds_poll(every: bool = typer.Option(False, "--all", help="poll every active feed, due or not")) -> None:
    """Poll the due feeds once, now, and print what each brought; exits 2 if any failed."""
    from app.bootstrap.job_configs import feed_config  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from workers.feed_poller import FeedPoller  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.feed_poller pulls faiss)

    s = settings()
    db = open_database(s)
    poller = FeedPoller(db.sessions, feed_config(s))
    try:
        result = poller.step(every=every)
    finally:
        poller.close()
        db.close()
    if not result["feeds"]:
        typer.echo("no feed is due (sqa feeds poll --all polls them anyway; sqa feeds add URL adds one)")
        return
    for r in result["results"]:
        if r["outcome"] == "error":
            typer.echo(f"{r['url']}: failed: {r['error']}")
        elif r["outcome"] == "not-modified":
            typer.echo(f"{r['url']}: not modified (304)")
        else:
            typer.echo(
                f"{r['url']}: {r['new']} new, {r['updated']} updated, {r['duplicate']} duplicate, "
                f"{r['skipped']} skipped, {r['pages']} page(s) fetched"
            )
    if result["errors"]:
        fail(
            f"{result['errors']} of {result['feeds']} feed(s) failed (see above; `sqa feeds list` shows their "
            "errors, `sqa feeds remove URL` drops a bad one)"
        )
