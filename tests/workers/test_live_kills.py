"""kill -9 of the live publisher and of the month compaction at random points, and searches while
the live shard grows: every acknowledged article stays queued or searchable (never lost, never
indexed twice or in two versions), the previous snapshot keeps serving after a kill, a rerun ends
where an uninterrupted run does, and no search errs or returns a passage published after as_of."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import random
import signal
import threading
import time

import numpy as np
from sqlalchemy import func, select

from app.bootstrap.builders import open_database
from indexer.chunking import chunk_texts
from indexer.ids import id_day
from indexer.manifest import read_manifest
from indexer.records import ArticleRecord
from serving.index_state import IndexState, latest_snapshot_row
from store.tables import Article, Job, LiveQueueItem, Passage
from tests import forked
from tests.conftest import load_sample
from tests.forked import ForkedRun, ForkServer
from tests.workers.test_ingest import snapshot_agrees_with_database
from tests.workers.test_live import Store
from workers.config import LiveConfig
from workers.ingest import ingest

fork_server = forked.fork_server  # the module's warm fork server (a fixture)

KILLS = 10
LIVE = LiveConfig(max_batch=8, merge_pieces=3)  # a run of 40 articles: 5 publishes, pieces merged on the way
DELAY_MS = 15  # the hash encoder sleeps this long per passage in the killed processes

# One run of the publisher, as `sqa live publish` runs it: the whole queue, a batch a snapshot.
# "ready" once set up (forked warm from tests/forked.py: imported, spaCy loaded), so the parent times
# the work alone; "done" at the end.
PUBLISH = f"""
import datetime as dt
from app.bootstrap.builders import build_encoder, open_database
from app.bootstrap.job_configs import ingest_config
from settings import Settings
from indexer.chunking import chunk_texts
from workers.live_publisher import LiveConfig, publish_live
settings = Settings()
db = open_database(settings, migrate=False)
encoder, cfg = build_encoder(settings), ingest_config(settings)
chunk_texts(["Warm up. The sentencizer loads once."])
print("ready", flush=True)
live = LiveConfig(max_batch={LIVE.max_batch}, merge_pieces={LIVE.merge_pieces})
while publish_live(db.sessions, encoder, cfg, live)["articles"]:
    pass
print("done", flush=True)
"""


def _env(settings, delay_ms: int = DELAY_MS) -> dict:
    return {
        **os.environ,
        "SQA_HOME": str(settings.home),
        "SQA_DATABASE_URL": settings.db_url,
        "SQA_ENCODER": f"hash:delay_ms={delay_ms}",
        "SQA_CHECKPOINT_EVERY": "4",
        "SQA_ENCODE_BATCH_SIZE": "2",
        "SQA_READER": "first-entity",
        "SQA_ENV": "test",
        "SQA_AUTO_TRAIN": "false",
        "SQA_DEVICE": "cpu",  # no run imports torch to look for a GPU
    }


def _start_publish(server: ForkServer, settings) -> ForkedRun:
    proc = server.start(_env(settings), code=PUBLISH)
    proc.wait_for_line("ready")
    return proc


def _finish(proc: ForkedRun, timeout: float = 300) -> tuple[bool, str]:
    """Wait for a run; (whether it completed its work, its output). A crash fails the test."""
    code, text = proc.wait(timeout=timeout)
    assert code in (0, -signal.SIGKILL), text
    return "done" in text.splitlines(), text


# ---- the articles ----------------------------------------------------------------------------------


def _text(tag: str, passages: int) -> str:
    """Sentences about `tag` that chunk into `passages` passages (six sentences a passage)."""
    return " ".join(
        f"Dock report {tag} line {j}: crane{tag}q{j} lifted cargo{j} safely." for j in range(6 * passages - 3)
    )


def _new(i: int, day: dt.date | None = None) -> ArticleRecord:
    day = day or dt.date(2024, 4, 1 + i % 28)
    return ArticleRecord(
        url=f"https://kill.example/{i}", title=f"Dock {i}", text=_text(f"a{i}", 1 + i % 3), published=day, source="live"
    )


def _revised(rec: ArticleRecord, version: int) -> ArticleRecord:
    """Another version of `rec`: new text (another length), same URL and day."""
    return dataclasses.replace(
        rec,
        title=f"{rec.title} (rev {version})",
        text=_text(f"{rec.url.rsplit('/', 1)[1]}r{version}", 1 + (version + len(rec.url)) % 3),
    )


class History:
    """Every version of every article pushed (or changed by a push), by URL, oldest first."""

    def __init__(self):
        self.versions: dict[str, list[ArticleRecord]] = {}

    def seed(self, rec: ArticleRecord) -> None:  # an article of the sample, before a push changes it
        self.versions.setdefault(rec.url, [rec])

    def add(self, records) -> None:
        for rec in records:
            self.versions.setdefault(rec.url, []).append(rec)

    def latest(self, url: str) -> ArticleRecord:
        return self.versions[url][-1]

    def next_version(self, url: str) -> ArticleRecord:
        return _revised(self.versions[url][0], len(self.versions[url]) + 1)


def _chunks(rec: ArticleRecord) -> list[str]:
    return chunk_texts([rec.text])[0]


def _batches(sample: list[ArticleRecord]) -> list[list[ArticleRecord]]:
    """The pushes: 40 April articles first, then batches of new articles, changed ones (pushed
    earlier, or of the sample's month shards) and late ones of March. Deterministic."""
    history = History()
    for rec in sample:
        history.seed(rec)
    first = [_new(i) for i in range(40)]
    history.add(first)
    batches = [first]
    for k in range(1, 21):
        batch = [_new(100 + 4 * k + j) for j in range(4)]
        batch += [_new(300 + k, dt.date(2024, 3, 10 + k))] if k % 3 == 0 else []
        changed = {f"https://kill.example/{(7 * k) % 40}", f"https://kill.example/{(11 * k + 3) % 40}"}
        if k in (2, 9):
            changed.add(sample[0 if k == 2 else 1].url)
        history.add(batch)
        updates = [history.next_version(url) for url in sorted(changed)]
        history.add(updates)
        batches.append(batch + updates)
    return batches


def _sample_articles(settings) -> list[ArticleRecord]:
    """Two articles of the sample, one of the March shard and one of February's, as stored."""
    db = open_database(settings, migrate=False)
    try:
        with db.sessions() as s:
            out = []
            for first, last in (
                (dt.date(2024, 3, 1), dt.date(2024, 3, 31)),
                (dt.date(2024, 2, 1), dt.date(2024, 2, 29)),
            ):
                a = s.scalars(
                    select(Article).where(Article.published.between(first, last)).order_by(Article.id)
                ).first()
                out.append(
                    ArticleRecord(
                        url=a.url, title=a.title, text=a.text, published=a.published, source=a.source or "sample"
                    )
                )
            return out
    finally:
        db.close()


# ---- what serves -----------------------------------------------------------------------------------


def _serving(settings):
    """The serving snapshot's passages: {article url: [(ordinal, text, faiss id)]}, the snapshot's ids
    (every shard's, concatenated) and the queue ({url: version})."""
    db = open_database(settings, migrate=False)
    try:
        state = IndexState(db.sessions, settings.index_dir, encoder="hash-384", dim=384)
        state.refresh()  # checksums verified
        snap = state.current()
        ids = np.concatenate([s.ids() for s in snap.index.shards])
        builds = [e.build for e in snap.manifest.shards]
        with db.sessions() as s:
            rows = s.execute(
                select(Article.url, Passage.ordinal, Passage.text, Passage.faiss_id)
                .join(Article, Article.id == Passage.article_id)
                .where(Passage.build_id.in_(builds))
            ).all()
            queued = dict(
                s.execute(
                    select(Article.url, LiveQueueItem.version).join(Article, Article.id == LiveQueueItem.article_id)
                ).all()
            )
            versions = dict(s.execute(select(Article.url, Article.version)).all())
        passages: dict[str, list] = {}
        for url, ordinal, text, fid in rows:
            passages.setdefault(url, []).append((ordinal, text, fid))
        return {u: sorted(p) for u, p in passages.items()}, ids, queued, versions
    finally:
        db.close()


def check_acknowledged(settings, history: History, *, settled: bool = False) -> tuple[int, int]:
    """Files and database agree, and every acknowledged article is queued or searchable, never
    neither, never two versions: queued -> nothing or an older version serves; not queued -> exactly
    its newest version. `settled`: the queue must be empty."""
    row = snapshot_agrees_with_database(settings)
    passages, ids, queued, versions = _serving(settings)
    assert len(set(ids.tolist())) == len(ids), "an id is in two shards"
    assert not settled or not queued, f"still queued: {sorted(queued)}"
    for url, recs in history.versions.items():
        assert versions[url] == len(recs), url
        got = passages.get(url, [])
        assert [o for o, _, _ in got] == list(range(len(got))), f"{url}: ordinals {[o for o, _, _ in got]}"
        texts = [t for _, t, _ in got]
        if url in queued:
            assert queued[url] == len(recs), url
            assert texts == [] or texts in [_chunks(r) for r in recs[:-1]], f"{url}: queued, serving {texts}"
        else:
            assert texts == _chunks(recs[-1]), f"{url}: neither queued nor serving its newest version"
    return row


def indexed_set(settings) -> set[tuple[str, int, str]]:
    passages, ids, _, _ = _serving(settings)
    out = {(url, o, t) for url, rows in passages.items() for o, t, _ in rows}
    assert len(out) == len(ids) == sum(len(r) for r in passages.values())  # one id per distinct passage
    return out


def _queued(settings) -> int:
    db = open_database(settings, migrate=False)
    try:
        with db.sessions() as s:
            return s.scalar(select(func.count()).select_from(LiveQueueItem))
    finally:
        db.close()


# ---- 1. the publisher killed at random points ------------------------------------------------------


def test_live_publish_killed_at_random_points_loses_and_duplicates_nothing(
    production_settings, make_settings, tmp_path, fork_server
):
    settings = production_settings
    load_sample(settings)
    sample = _sample_articles(settings)
    batches = _batches(sample)

    # The reference: the same pushes on a store of its own; its first run (40 articles) timed.
    reference = Store(make_settings(home=tmp_path / "reference"), LIVE)
    try:
        load_sample(reference.settings)
        reference.push(batches[0])
        proc = _start_publish(fork_server, reference.settings)
        t0 = time.monotonic()
        done, out = _finish(proc)
        per_article = (time.monotonic() - t0) / len(batches[0])
        assert done, out
        for batch in batches[1:]:
            reference.push(batch)
            while reference.publish()["articles"]:
                pass
    finally:
        reference.close()

    store = Store(settings, LIVE)
    history = History()
    for rec in sample:
        history.seed(rec)
    rng = random.Random(20240415)
    killed_at: list[str] = []
    pending = list(batches)
    try:
        counts = store.push(pending.pop(0))
        assert counts.new == 40
        history.add(batches[0])
        for attempt in range(3 * KILLS):  # noqa: B007  (read after the loop)
            if len(killed_at) == KILLS:
                break
            waiting = _queued(settings)
            before = store.manifest().snapshot_id
            proc = _start_publish(fork_server, settings)
            pause = rng.uniform(0.0, 1.0) * waiting * per_article
            time.sleep(pause)
            proc.kill()
            done, _ = _finish(proc)
            if not done:
                killed_at.append(
                    f"{pause:.2f}s into {waiting} queued"
                    f"{'' if store.manifest().snapshot_id == before else ' (after a commit)'}"
                )
            check_acknowledged(settings, history)
            if pending:  # more pushes between the kills: new, changed, late articles
                batch = pending.pop(0)
                counts = store.push(batch)
                assert counts.duplicate == 0 and counts.new + counts.updated == len(batch)
                history.add(batch)
        assert len(killed_at) == KILLS, f"only {len(killed_at)} runs were killed before they ended"

        for batch in pending:
            store.push(batch)
            history.add(batch)
        done, out = _finish(_start_publish(fork_server, settings))  # the run that is let finish
        assert done, out
    finally:
        store.close()
    print(f"killed {len(killed_at)} of {attempt} runs at: " + " | ".join(killed_at))

    check_acknowledged(settings, history, settled=True)
    assert indexed_set(settings) == indexed_set(reference.settings)


# ---- 2. the month compaction killed half-way -------------------------------------------------------


def _ingest_month(server: ForkServer, settings) -> ForkedRun:
    return server.start(_env(settings, delay_ms=40), argv=["ingest", "--month", "2024-04", "--no-train"])


def _live_ids(store: Store) -> dict[int, tuple[str, int, str]]:
    """The live pieces' passages: faiss id -> (url, ordinal, text)."""
    builds = [e.build for e in store.manifest().live]
    with store.db.sessions() as s:
        return {
            r.faiss_id: (r.url, r.ordinal, r.text)
            for r in s.execute(
                select(Passage.faiss_id, Article.url, Passage.ordinal, Passage.text)
                .join(Article, Article.id == Passage.article_id)
                .where(Passage.build_id.in_(builds))
            )
        }


def test_month_compaction_killed_half_way_keeps_the_live_snapshot_serving(production_settings, fork_server):
    settings = production_settings
    load_sample(settings)
    store = Store(settings, LIVE)
    history = History()
    try:
        live_articles = [_new(i) for i in range(12)]
        for part in (live_articles[:4], live_articles[4:8], live_articles[8:]):
            store.push(part)
            store.publish()
        history.add(live_articles)
        live = _live_ids(store)
        assert len(store.manifest().live) >= 1 and len({u for u, _, _ in live.values()}) == 12
        probe = _chunks(live_articles[5])[0]
        as_of = dt.date(2024, 4, 30)
        found = store.search(probe, as_of)
        assert live[found[0][0]][2] == probe
        # Queued, not published: what the month ingest encodes itself (slowly), then takes off the queue.
        queued_articles = [_new(i) for i in range(12, 40)]
        store.push(queued_articles)
        history.add(queued_articles)
        waiting = len(queued_articles)
        encode_s = 0.040 * sum(len(_chunks(r)) for r in queued_articles)

        rng = random.Random(20240430)
        killed_at, committed = [], False
        for k in range(3):
            with store.db.sessions() as s:
                last = s.scalar(select(func.max(Job.id))) or 0
            proc = _ingest_month(fork_server, settings)
            job_id, deadline = None, time.monotonic() + 120
            while job_id is None:
                assert proc.poll() is None, proc.output()
                assert time.monotonic() < deadline, "the ingest never started its job"
                with store.db.sessions() as s:
                    job_id = s.scalar(select(Job.id).where(Job.id > last, Job.kind == "ingest"))
                time.sleep(0.01)
            # Somewhere in the encoding (the checkpoints are kept: each run goes further), then as it
            # reaches its commit.
            stage = "encode" if k < 2 else "commit"
            message = ""
            while not message.startswith((stage, "commit")) and proc.poll() is None:
                with store.db.sessions() as s:
                    message = s.get(Job, job_id).message or ""
                time.sleep(0.005)
            if k < 2:
                time.sleep(rng.uniform(0.1, 0.3) * encode_s)
            proc.kill()
            _finish(proc)
            blocks = len(list(settings.work_dir.glob("ingest-2024-04-*/emb-*.npy")))
            killed_at.append(f"{stage} ({blocks} blocks encoded)")
            check_acknowledged(settings, history)
            manifest = store.manifest()
            if manifest.shard("2024-04") is not None:  # it had committed before the kill landed
                committed = True
                break
            # The live snapshot still serves: the same pieces, the article found, the rest still queued.
            assert _live_ids(store) == live
            assert store.search(probe, as_of)[0][0] == found[0][0]
            assert _queued(settings) == waiting
            if k == 0:  # a publish between two runs (the 8 longest queued): folded in by the next one
                assert store.publish()["articles"] == LIVE.max_batch
                live, waiting = _live_ids(store), waiting - LIVE.max_batch
                assert store.search(probe, as_of)[0][0] == found[0][0]
        print("killed at: " + " | ".join(killed_at) + (" (committed)" if committed else ""))

        if not committed:  # the rerun resumes from the checkpoints and completes
            cfg = dataclasses.replace(store.cfg, checkpoint_every=4, batch_size=2)
            job = ingest(store.db.sessions, store.encoder, cfg, {"month": "2024-04"})
            assert job.state == "succeeded"
            assert job.counts["2024-04"]["from_live"] == len(live)
        manifest = store.manifest()
        assert not manifest.live
        state = IndexState(store.db.sessions, settings.index_dir, encoder="hash-384", dim=384)
        state.refresh()
        month_ids = set(next(s for s in state.current().index.shards if s.key == "2024-04").ids().tolist())
        assert set(live) <= month_ids  # the live pieces' ids, as they were
        with store.db.sessions() as s:
            rows = {
                r.faiss_id: (r.url, r.ordinal, r.text)
                for r in s.execute(
                    select(Passage.faiss_id, Article.url, Passage.ordinal, Passage.text)
                    .join(Article, Article.id == Passage.article_id)
                    .where(Passage.faiss_id.in_(sorted(month_ids)))
                )
            }
        assert {fid: row for fid, row in rows.items() if fid in live} == live
        live_urls = {url for url, _, _ in live.values()}
        assert {fid for fid, row in rows.items() if row[0] in live_urls} == set(live)  # nothing re-encoded
        ids, scores = store.search(probe, as_of)
        assert (ids[0], scores[0]) == (found[0][0], found[1][0])  # the same id, the same score
    finally:
        store.close()
    check_acknowledged(settings, history, settled=True)


# ---- 3. searches while the live shard grows --------------------------------------------------------


def test_queries_during_live_appends_get_no_errors(settings):
    load_sample(settings)
    store = Store(settings, LIVE)
    state = IndexState(
        store.db.sessions, settings.index_dir, encoder=store.encoder.name, dim=store.encoder.dim, lexical=True
    )
    state.refresh()
    rng = random.Random(7)
    batches = [[_new(10 * b + j, dt.date(2024, 4, rng.randint(1, 28))) for j in range(3)] for b in range(20)]
    texts = [_chunks(r)[0] for batch in batches for r in batch[:1]] + ["crane lifted cargo safely", "dock report"]
    days = [dt.date(2024, 3, 20)] + [dt.date(2024, 4, d) for d in (1, 5, 9, 14, 20, 27, 30)]
    queries = [(t, store.encoder.encode_queries([t]), days[i % len(days)]) for i, t in enumerate(texts)]
    errors: list[str] = []
    late: list[tuple] = []
    seen: list[set[str]] = [set(), set()]
    searches = [0, 0]
    done = threading.Event()

    def searcher(n: int) -> None:
        for i in range(200_000):  # bounded by count; stops a few rounds after the publishes end
            if done.is_set() and i >= 50 and searches[n] % 50 == 0:
                break
            try:
                state.refresh()
                snap = state.current()
                seen[n].add(snap.snapshot_id)
                text, q, as_of = queries[(i + n) % len(queries)]
                _, ids = snap.index.search(q, as_of, 10)
                _, lex = snap.lexical.search([text], as_of, 10)
                for fid in np.concatenate([ids[0], lex[0]]).tolist():
                    if fid >= 0 and id_day(fid) > as_of:
                        late.append((snap.snapshot_id, fid, as_of))
                searches[n] += 1
            except Exception as exc:  # noqa: BLE001 - every failure counts
                errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=searcher, args=(n,)) for n in range(2)]
    try:
        for t in threads:
            t.start()
        for b, batch in enumerate(batches):
            if b % 4 == 3:  # a changed version of an earlier article (its old passages retired)
                batch = batch + [_revised(batches[b - 3][0], 2 + b)]
            store.push(batch)
            assert store.publish()["articles"] == len(batch)
    finally:
        done.set()
        for t in threads:
            t.join(timeout=120)
    try:
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors[:5]
        assert not late, late[:5]
        print(f"searches {searches}, snapshots seen {[len(s) for s in seen]}")
        assert min(searches) > 0 and max(len(s) for s in seen) > 1, (searches, [len(s) for s in seen])
        state.refresh()
        with store.db.sessions() as s:
            row = latest_snapshot_row(s)
        assert state.current().snapshot_id == row.snapshot_id
        manifest = read_manifest(settings.index_dir, row.manifest_file)
        assert 1 <= len(manifest.live) < LIVE.merge_pieces
        for batch in batches:
            assert store.passages(batch[1].url)
    finally:
        store.close()
    snapshot_agrees_with_database(settings)
