"""Migration 0007: stored passages lose the date prefix they carried, and a downgrade puts it back
(on SQLite, and on PostgreSQL when SQA_TEST_POSTGRES_URL is set)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from alembic import command
from sqlalchemy import insert, select

from store.engine import make_engine
from store.migrate import alembic_config
from store.tables import Article, Passage

DAY = dt.date(2019, 2, 7)  # a Thursday
OLD = "Thursday, February 7, 2019. Mr. Smith won on Friday. He left in 2019."  # as 0006 stored it
BODY = "Mr. Smith won on Friday. He left in 2019."


def _texts(engine) -> dict[int, str]:
    with engine.connect() as conn:
        return dict(conn.execute(select(Passage.id, Passage.text).order_by(Passage.id)).all())


def test_upgrade_strips_the_exact_date_prefix_and_downgrade_restores_it(database_url):
    if database_url.startswith("sqlite:///"):
        Path(database_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    cfg = alembic_config(database_url)
    command.upgrade(cfg, "0006")
    engine = make_engine(database_url)
    try:
        with engine.begin() as conn:
            art = conn.execute(
                insert(Article).returning(Article.id),
                dict(url="https://x.example/a", title="t", text=BODY, published=DAY, source="test", content_hash="h"),
            ).scalar_one()
            rows = [
                dict(ordinal=0, text=OLD, published=DAY),
                # another day's prefix is not this row's: left alone (and prefixed again by the downgrade)
                dict(ordinal=1, text="Friday, February 8, 2019. Later.", published=DAY),
            ]
            rows += [
                dict(ordinal=2 + i, text=f"Thursday, February 7, 2019. Row {i}.", published=DAY) for i in range(4100)
            ]
            conn.execute(
                insert(Passage),
                [
                    dict(article_id=art, faiss_id=i + 1, shard_key="2019-02", build_id="b", **row)
                    for i, row in enumerate(rows)
                ],
            )
        before = _texts(engine)

        command.upgrade(cfg, "0007")  # more rows than one batch
        after = _texts(engine)
        first, second, *rest = after.values()
        assert first == BODY
        assert second == "Friday, February 8, 2019. Later."
        assert rest == [f"Row {i}." for i in range(4100)]

        command.downgrade(cfg, "0006")
        restored = _texts(engine)
        ids = list(before)
        # every row is its day's prefix + its body again; the row that had another day's kept it under its own
        assert restored == {**before, ids[1]: "Thursday, February 7, 2019. Friday, February 8, 2019. Later."}
    finally:
        engine.dispose()
