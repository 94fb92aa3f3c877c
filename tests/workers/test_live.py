"""The live shard: pushed articles become searchable in a new snapshot without re-encoding anything,
a changed article replaces its old passages, pieces merge, and the month ingest compacts the pieces
into a month shard with the same ids and scores as a month ingested in one go."""

from __future__ import annotations

import dataclasses
import datetime as dt

import numpy as np
import pytest
from sqlalchemy import func, select

from app.bootstrap.builders import build_encoder, open_database
from app.bootstrap.job_configs import ingest_config
from indexer.manifest import read_manifest
from indexer.records import ArticleRecord
from indexer.shards import is_live_key
from serving.index_state import IndexState, latest_snapshot_row
from store.intake import intake_articles
from store.tables import LiveQueueItem, Passage
from tests import loaded
from tests.conftest import load_sample
from workers.config import LiveConfig
from workers.ingest import ingest
from workers.live_publisher import publish_live, queue_status

loaded_settings = loaded.loaded_settings  # the sample copied from a template: overrides conftest's fixture here

APRIL = dt.date(2024, 4, 10)


def article(i: int, day: dt.date = APRIL, text: str | None = None) -> ArticleRecord:
    return ArticleRecord(
        url=f"https://live.example/{i}",
        title=f"Story {i}",
        text=text or f"The harbour crane number {i} was painted bright orange{i} today. Workers in zone{i} cheered.",
        published=day,
        source="live",
    )


class Store:
    """A settings' database, encoder and index state, for pushing, publishing and searching."""

    def __init__(self, settings, live: LiveConfig = LiveConfig()):
        self.settings, self.live = settings, live
        self.db = open_database(settings)
        self.encoder = build_encoder(settings)
        self.cfg = ingest_config(settings)

    def push(self, records, via="api"):
        with self.db.sessions() as s, s.begin():
            return intake_articles(s, records, via=via)

    def publish(self):
        return publish_live(self.db.sessions, self.encoder, self.cfg, self.live)

    def manifest(self):
        with self.db.sessions() as s:
            row = latest_snapshot_row(s)
            return read_manifest(self.settings.index_dir, row.manifest_file)

    def search(self, text: str, as_of: dt.date, k: int = 10):
        state = IndexState(self.db.sessions, self.settings.index_dir, encoder=self.encoder.name, dim=self.encoder.dim)
        state.refresh()
        q = self.encoder.encode_queries([text])
        scores, ids = state.current().index.search(q, as_of, k)
        keep = ids[0] >= 0
        return ids[0][keep].tolist(), scores[0][keep].tolist()

    def passages(self, article_url: str) -> list[int]:
        """Faiss ids of the article's passages in the serving snapshot."""
        m = self.manifest()
        builds = [e.build for e in m.shards]
        with self.db.sessions() as s:
            from store.tables import Article

            art = s.scalar(select(Article.id).where(Article.url == article_url))
            return sorted(
                s.scalars(select(Passage.faiss_id).where(Passage.article_id == art, Passage.build_id.in_(builds)))
            )

    def close(self):
        self.db.close()


@pytest.fixture
def store(loaded_settings):
    s = Store(loaded_settings)
    yield s
    s.close()


def test_publish_live_makes_pushed_article_searchable_as_of_its_day(store):
    before = store.manifest()
    counts = store.push([article(1)])
    assert counts.to_dict() == {"new": 1, "updated": 0, "duplicate": 0}
    with store.db.sessions() as s:
        assert queue_status(s).waiting == 1
    result = store.publish()
    assert result["articles"] == 1 and result["passages"] == 1
    after = store.manifest()
    live = [e for e in after.shards if is_live_key(e.key)]
    assert [e.key for e in live] == ["live-2024-04-000001"]
    # The month shards are the same files: nothing was re-encoded.
    assert {e.file for e in before.shards} <= {e.file for e in after.shards}
    [pid] = store.passages("https://live.example/1")
    ids, _ = store.search("harbour crane painted orange1", APRIL)
    assert ids[0] == pid
    ids, _ = store.search("harbour crane painted orange1", APRIL - dt.timedelta(days=1))
    assert pid not in ids  # never a passage published after as_of
    with store.db.sessions() as s:
        assert queue_status(s).waiting == 0
    assert store.publish() == {"articles": 0}


def test_intake_is_idempotent_and_a_changed_text_retires_the_old_passages(store):
    store.push([article(1)])
    store.publish()
    [old] = store.passages("https://live.example/1")
    again = store.push([article(1)])
    assert again.to_dict() == {"new": 0, "updated": 0, "duplicate": 1}
    with store.db.sessions() as s:
        assert queue_status(s).waiting == 0
    changed = store.push([article(1, text="The harbour crane was repainted green today. Zone1 workers left.")])
    assert changed.to_dict() == {"new": 0, "updated": 1, "duplicate": 0}
    result = store.publish()
    assert result["retired"] == 1 and result["passages"] == 1
    [new] = store.passages("https://live.example/1")
    assert new != old
    ids = np.concatenate([store_ids for store_ids in [np.array(store.search("harbour crane", APRIL, 50)[0])]])
    assert old not in ids.tolist() and new in ids.tolist()


def test_pieces_of_a_month_merge_without_losing_a_passage(loaded_settings):
    store = Store(loaded_settings, LiveConfig(merge_pieces=3))
    try:
        for i in range(5):
            store.push([article(10 + i, APRIL + dt.timedelta(days=i))])
            store.publish()
        live = [e for e in store.manifest().shards if is_live_key(e.key)]
        assert 1 <= len(live) < 3
        assert sum(e.count for e in live) == 5
        for i in range(5):
            [pid] = store.passages(f"https://live.example/{10 + i}")
            assert pid in store.search(f"harbour crane painted orange{10 + i}", dt.date(2024, 4, 30))[0][:3]
    finally:
        store.close()


def test_late_article_of_a_closed_month_goes_live_beside_its_month_shard(store):
    feb = dt.date(2024, 2, 12)
    store.push([article(7, feb)])
    store.publish()
    keys = [e.key for e in store.manifest().shards]
    assert "2024-02" in keys and "live-2024-02-000001" in keys
    [pid] = store.passages("https://live.example/7")
    assert store.search("harbour crane painted orange7", feb)[0][0] == pid


def test_changed_article_in_a_month_shard_is_pruned_from_it(store):
    with store.db.sessions() as s:
        from store.tables import Article

        url, day = s.execute(
            select(Article.url, Article.published)
            .where(Article.published >= dt.date(2024, 2, 1))
            .order_by(Article.id)
            .limit(1)
        ).one()
    old = store.passages(url)
    assert old
    month_file = store.manifest().shard(day.strftime("%Y-%m")).file
    store.push(
        [
            ArticleRecord(
                url=url,
                title="Corrected",
                text="A corrected story about the quay lights.",
                published=day,
                source="live",
            )
        ]
    )
    store.publish()
    m = store.manifest()
    assert m.shard(day.strftime("%Y-%m")).file != month_file  # rewritten without the old version
    new = store.passages(url)
    assert len(new) == 1 and not set(new) & set(old)


def test_month_ingest_compacts_live_pieces_with_the_same_ids_and_scores(store, make_settings, tmp_path):
    records = [article(20 + i, APRIL + dt.timedelta(days=i % 3)) for i in range(6)]
    for part in (records[:2], records[2:4], records[4:]):
        store.push(part)
        store.publish()
    queries = [f"harbour crane painted orange{20 + i}" for i in range(6)] + ["workers cheered"]
    as_of = dt.date(2024, 4, 30)
    live_results = [store.search(q, as_of) for q in queries]
    job = ingest(store.db.sessions, store.encoder, store.cfg, {"month": "2024-04"})
    assert job.state == "succeeded"
    assert job.counts["2024-04"]["from_live"] == 6
    m = store.manifest()
    assert m.shard("2024-04") is not None and not m.live
    assert [store.search(q, as_of) for q in queries] == live_results  # same ids, same scores
    with store.db.sessions() as s:
        assert s.scalar(select(func.count()).select_from(LiveQueueItem)) == 0

    # The same articles ingested in one go on another store: the same passages and scores.
    other = Store(make_settings(home=tmp_path / "other"))
    try:
        load_sample(other.settings)
        with other.db.sessions() as s, s.begin():
            from store.queries import upsert_articles

            upsert_articles(s, records)
        ingest(other.db.sessions, other.encoder, other.cfg, {"month": "2024-04"})

        def by_text(st, results):
            with st.db.sessions() as s:
                text = dict(s.execute(select(Passage.faiss_id, Passage.text)).all())
            return [[(text[i], round(sc, 6)) for i, sc in zip(ids, scores)] for ids, scores in results]

        one_go = [other.search(q, as_of) for q in queries]
        assert by_text(other, one_go) == by_text(store, live_results)
    finally:
        other.close()


def test_ingest_through_compacts_a_month_that_only_has_live_pieces(store):
    store.push([article(30), article(31, dt.date(2024, 4, 20))])
    store.publish()
    job = ingest(store.db.sessions, store.encoder, store.cfg, {"through": "2024-04"})
    assert job.counts["planned"] == ["2024-04"]
    assert [e.key for e in store.manifest().shards][-1] == "2024-04"


def test_rebuild_folds_live_pieces_into_month_shards(store):
    store.push([article(40), article(41, dt.date(2024, 2, 3))])
    store.publish()
    job = ingest(store.db.sessions, store.encoder, store.cfg, {"rebuild": True})
    assert job.state == "succeeded"
    m = store.manifest()
    assert not m.live and [e.key for e in m.shards] == ["2024-01", "2024-02", "2024-03", "2024-04"]
    assert store.passages("https://live.example/41")


def test_publish_skips_articles_a_month_ingest_indexed_meanwhile(store):
    store.push([article(50)])
    ingest(store.db.sessions, store.encoder, store.cfg, {"month": "2024-04"})
    with store.db.sessions() as s:
        assert queue_status(s).waiting == 0  # the month ingest took it off the queue
    assert store.publish() == {"articles": 0}
    assert len(store.passages("https://live.example/50")) == 1


def test_an_update_while_queued_is_published_once_in_its_newest_version(store):
    store.push([article(60)])
    store.push([article(60, text="Second version: the crane is blue.")])
    with store.db.sessions() as s:
        assert queue_status(s).waiting == 1
    store.publish()
    pids = store.passages("https://live.example/60")
    with store.db.sessions() as s:
        texts = s.scalars(select(Passage.text).where(Passage.faiss_id.in_(pids))).all()
    assert len(texts) == 1 and "blue" in texts[0]
    assert dataclasses.asdict(LiveConfig())  # the defaults are a plain frozen config
