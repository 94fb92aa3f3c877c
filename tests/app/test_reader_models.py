"""Trained reader versions: the registry, activation, the hot swap, the admin endpoints and `sqa models`.

No real weights: `models.trained.load_trained_reader` is replaced by a fake that returns a
first-entity reader named after the version folder, and `workers.train` by a fake module.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import re
import sys
import threading
import time
import types
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

import models.trained
import tests.gemma_runs
from app.bootstrap.builders import build_answer_service, build_encoder, build_reader, open_database
from app.main import create_app
from models.readers import FirstEntityReader
from serving import reader_registry as registry
from serving.errors import ConflictError, NotFoundError
from serving.reader_state import ReaderState, RegistrySource
from settings import Settings, get_settings, parse_reader_spec
from store.base import Base
from store.tables import ReaderModel

ADMIN = {"X-Admin-Token": "test-admin-token"}
QUESTION = {"question": "Who is the mayor of Port Calder?", "as_of": "2024-03-31"}


class NamedReader(FirstEntityReader):
    def __init__(self, name: str) -> None:
        self.name = name


@pytest.fixture
def loads(monkeypatch) -> list[str]:
    """Fake trained readers: "trained-<folder name>"; a folder holding BROKEN fails to load.
    The fallback of SQA_READER=auto becomes first-entity. Returns the folders loaded, in order."""
    loaded: list[str] = []

    real = inspect.signature(models.trained.load_trained_reader).parameters

    def load_trained_reader(path: Path, **options):
        assert set(options) <= set(real), f"options the real loader does not take: {set(options) - set(real)}"
        loaded.append(path.name)
        if (path / "BROKEN").exists():
            raise RuntimeError(f"corrupt weights in {path}")
        return NamedReader(f"trained-{path.name}")

    monkeypatch.setattr(models.trained, "load_trained_reader", load_trained_reader)
    monkeypatch.setattr(models.trained, "read_reader_info", lambda path: json.loads((path / "reader.json").read_text()))
    monkeypatch.setattr("app.bootstrap.builders.FALLBACK_READER", "first-entity")
    return loaded


def make_version(
    settings: Settings,
    db,
    version: str,
    *,
    kind: str = "fid",
    state: str = "ready",
    folder: bool = True,
    broken: bool = False,
    **extra,
) -> str:
    if folder:
        d = settings.models_dir / version
        d.mkdir(parents=True, exist_ok=True)
        (d / "reader.json").write_text(json.dumps({"kind": kind}))
        if broken:
            (d / "BROKEN").write_text("")
    with db.sessions() as session, session.begin():
        registry.register_version(session, version=version, kind=kind, path=version, state=state, **extra)
    return version


def n_active(db) -> int:
    with db.sessions() as session:
        return session.scalar(select(func.count()).select_from(ReaderModel).where(ReaderModel.active.is_(True)))


@pytest.fixture
def db(settings):
    database = open_database(settings)
    yield database
    database.close()


# ---- the registry (SQLite and PostgreSQL) -------------------------------------------------------


def test_registry_activation_keeps_exactly_one_active(settings, db):
    a = make_version(settings, db, "fid-2024-01-31-aaaaaa", trained_until=dt.date(2024, 1, 31), metrics={"f1": 0.4})
    b = make_version(settings, db, "fid-ft-2024-02-bbbbbb", parent_version=a, month="2024-02")
    with db.sessions() as session:
        assert [r.version for r in registry.list_versions(session)] == [b, a]  # newest first
        row = registry.get_version(session, a)
        assert (row.trained_until, row.metrics, row.state, row.active) == (
            dt.date(2024, 1, 31),
            {"f1": 0.4},
            "ready",
            False,
        )
        assert registry.active_version(session) is None
    for version in (a, b, b, a):
        with db.sessions() as session, session.begin():
            registry.activate(session, version, models_dir=settings.models_dir)
        with db.sessions() as session:
            assert registry.active_version(session).version == version
        assert n_active(db) == 1


def test_registry_unknown_duplicate_not_ready_and_missing_folder_are_refused(settings, db):
    make_version(settings, db, "fid-ok-000001")
    with db.sessions() as session, session.begin():
        registry.activate(session, "fid-ok-000001", models_dir=settings.models_dir)
    make_version(settings, db, "fid-training-000002", state="training")
    make_version(settings, db, "fid-gone-000003", folder=False)
    with db.sessions() as session:
        with pytest.raises(NotFoundError, match="no reader version 'nope'"):
            registry.get_version(session, "nope")
        with pytest.raises(NotFoundError):
            registry.activate(session, "nope", models_dir=settings.models_dir)
        with pytest.raises(ConflictError, match="is training, not ready"):
            registry.activate(session, "fid-training-000002", models_dir=settings.models_dir)
        with pytest.raises(ConflictError, match="folder .*fid-gone-000003 is missing"):
            registry.activate(session, "fid-gone-000003", models_dir=settings.models_dir)
        with pytest.raises(ConflictError, match="already registered"):
            registry.register_version(session, version="fid-ok-000001", kind="fid", path="x")
        with pytest.raises(ValueError, match="reader kind 'bert' is unknown"):
            registry.register_version(session, version="bert-1", kind="bert", path="x")
    with db.sessions() as session:
        assert registry.active_version(session).version == "fid-ok-000001"


def test_registry_database_refuses_a_second_active_row(settings, db):
    make_version(settings, db, "fid-a-000001")
    make_version(settings, db, "fid-b-000002")
    with db.sessions() as session:
        for row in session.scalars(select(ReaderModel)):
            row.active = True
        with pytest.raises(IntegrityError):
            session.flush()


def test_registry_register_stores_paths_relative_and_can_activate(settings, db):
    (settings.models_dir / "extractive-x-000001").mkdir(parents=True)
    with db.sessions() as session, session.begin():
        row = registry.register_version(
            session,
            version="extractive-x-000001",
            kind="extractive",
            path=settings.models_dir / "extractive-x-000001",
            activate=True,
            models_dir=settings.models_dir,
        )
        assert row.path == "extractive-x-000001" and row.active


def test_migration_matches_the_orm(settings):
    database = open_database(settings)  # upgrades to head
    try:
        with database.engine.connect() as conn:
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_server_default": True}), Base.metadata
            )
    finally:
        database.close()
    assert diff == []


def test_new_version_name_is_kind_label_and_random_suffix():
    names = {registry.new_version_name("fid", "2023-03-31") for _ in range(20)}
    assert len(names) == 20
    assert all(re.fullmatch(r"fid-2023-03-31-[0-9a-f]{6}", n) for n in names)
    assert re.fullmatch(r"extractive-ft-2023-04-[0-9a-f]{6}", registry.new_version_name("extractive", "ft-2023-04"))
    with pytest.raises(ValueError, match="label"):
        registry.new_version_name("fid", "../etc")
    with pytest.raises(ValueError, match="unknown"):
        registry.new_version_name("gpt", "2023-03-31")
    with pytest.raises(ValueError, match="longer than 64"):
        registry.new_version_name("fid", "x" * 60)


# ---- SQA_READER ------------------------------------------------------------------------------------


def test_reader_setting_forms(tmp_path, make_settings):
    folder = tmp_path / "v1"
    folder.mkdir()
    assert parse_reader_spec("auto").follows_registry
    assert parse_reader_spec("gemma").kind == "builtin" and not parse_reader_spec("gemma").follows_registry
    assert parse_reader_spec("version:fid-x").value == "fid-x"
    spec = parse_reader_spec(f"fid:{folder}")
    assert (spec.kind, spec.value, spec.expect) == ("path", str(folder.resolve()), "fid")
    assert parse_reader_spec(f"trained:{folder}").expect is None
    with pytest.raises(ValueError, match="is not a folder"):
        make_settings(reader=f"extractive:{tmp_path / 'missing'}")
    with pytest.raises(ValueError, match="is not understood"):
        make_settings(reader="bert:/x")
    with pytest.raises(ValueError, match="needs a version name"):
        make_settings(reader="version:")


def test_build_reader_from_a_folder_a_version_and_auto(sqlite_settings, loads):
    db = open_database(sqlite_settings)
    try:
        make_version(sqlite_settings, db, "extractive-a-000001", kind="extractive")
        folder = sqlite_settings.models_dir / "extractive-a-000001"
        s = sqlite_settings.model_copy
        assert build_reader(s(update={"reader": f"trained:{folder}"})).name == "trained-extractive-a-000001"
        assert build_reader(s(update={"reader": f"extractive:{folder}"})).name == "trained-extractive-a-000001"
        with pytest.raises(ValueError, match="says kind 'extractive'"):
            build_reader(s(update={"reader": f"fid:{folder}"}))
        assert (
            build_reader(s(update={"reader": "version:extractive-a-000001"}), db).name == "trained-extractive-a-000001"
        )
        with pytest.raises(NotFoundError):
            build_reader(s(update={"reader": "version:nope"}), db)
        assert build_reader(s(update={"reader": "auto"}), db).name == "first-entity"  # none active: fallback
        with db.sessions() as session, session.begin():
            registry.activate(session, "extractive-a-000001", models_dir=sqlite_settings.models_dir)
        assert build_reader(s(update={"reader": "auto"})).name == "trained-extractive-a-000001"
    finally:
        db.close()


# ---- ReaderState ----------------------------------------------------------------------------------


def following_state(settings, db, loaded: list[str]) -> ReaderState:
    def load_version(folder: Path):
        loaded.append(folder.name)
        if (folder / "BROKEN").exists():
            raise RuntimeError("corrupt weights")
        return NamedReader(f"trained-{folder.name}")

    return ReaderState(
        source=RegistrySource(
            db.sessions, settings.models_dir, load_version=load_version, load_fallback=lambda: NamedReader("fallback")
        )
    )


def activate(settings, db, version: str) -> None:
    with db.sessions() as session, session.begin():
        registry.activate(session, version, models_dir=settings.models_dir)


def test_reader_state_follows_activations_and_keeps_serving_when_a_load_fails(sqlite_settings):
    s = sqlite_settings
    db = open_database(s)
    loaded: list[str] = []
    try:
        state = following_state(s, db, loaded)
        assert state.refresh() and state.reader().name == "fallback" and state.current().version is None
        assert not state.refresh()  # nothing changed: no reload
        make_version(s, db, "fid-a-000001")
        make_version(s, db, "fid-bad-000002", broken=True)
        activate(s, db, "fid-a-000001")
        assert state.refresh() and state.reader().name == "trained-fid-a-000001"
        activate(s, db, "fid-bad-000002")
        assert state.refresh() is False
        assert state.reader().name == "trained-fid-a-000001"  # still serving the old one
        assert "fid-bad-000002 could not be loaded" in state.describe()["error"]
        assert state.refresh() is False and loaded.count("fid-bad-000002") == 1  # not retried on every poll
        activate(s, db, "fid-a-000001")  # back to the one serving: nothing to load, the error is history
        assert state.refresh() is False and state.describe()["error"] is None
        assert state.reader().name == "trained-fid-a-000001" and loaded == ["fid-a-000001", "fid-bad-000002"]
    finally:
        db.close()


def test_reader_state_serves_the_fallback_when_the_active_version_cannot_load_at_start(sqlite_settings):
    s = sqlite_settings
    db = open_database(s)
    try:
        make_version(s, db, "fid-bad-000001", broken=True)
        activate(s, db, "fid-bad-000001")
        state = following_state(s, db, [])
        assert state.refresh() is True
        assert state.reader().name == "fallback" and "could not be loaded" in state.describe()["error"]
    finally:
        db.close()


def test_reader_state_fixed_never_changes(sqlite_settings):
    state = ReaderState(NamedReader("fixed"))
    assert not state.follows_registry and state.refresh() is False and state.reader().name == "fixed"
    with pytest.raises(ValueError):
        ReaderState()


def test_a_swap_during_a_request_does_not_mix_readers(loaded_settings):
    """The reader that generated the answer is the one named in versions.reader, even when the
    serving reader is swapped while it reads."""
    s = loaded_settings
    db = open_database(s, migrate=False)
    try:
        make_version(s, db, "fid-new-000001")
        generated_by: list[str] = []

        class SwappingReader(NamedReader):
            def generate(self, question, as_of, passages):
                activate(s, db, "fid-new-000001")
                assert state.refresh()  # swapped while this request reads
                generated_by.append(self.name)
                return super().generate(question, as_of, passages)

        state = ReaderState(
            source=RegistrySource(
                db.sessions,
                s.models_dir,
                load_version=lambda folder: NamedReader(f"trained-{folder.name}"),
                load_fallback=lambda: SwappingReader("old-reader"),
            )
        )
        assert state.refresh()
        service = build_answer_service(s, db, build_encoder(s), state)
        service.index_state.refresh()
        result = service.answer(QUESTION["question"], dt.date(2024, 3, 31))
        assert result.answer and generated_by == ["old-reader"]
        assert result.versions["reader"] == "old-reader" and state.reader().name == "trained-fid-new-000001"
        assert service.answer(QUESTION["question"], dt.date(2024, 3, 31)).versions["reader"] == "trained-fid-new-000001"
    finally:
        db.close()


# ---- the admin API ----------------------------------------------------------------------------------


@pytest.fixture
def auto_client(loaded_settings, loads):
    """The app with SQA_READER=auto (fallback: first-entity) and fake trained readers."""
    settings = loaded_settings.model_copy(update={"reader": "auto"})
    with TestClient(create_app(settings)) as c:
        yield c


def reader_used(client) -> str:
    r = client.post("/v1/answers", json=QUESTION)
    assert r.status_code == 200, r.text
    return r.json()["versions"]["reader"]


def test_api_lists_and_activates_versions_without_restart(auto_client, loaded_settings, loads):
    db = auto_client.app.state.db
    a = make_version(
        loaded_settings, db, "fid-2024-01-31-aaaaaa", trained_until=dt.date(2024, 1, 31), metrics={"f1": 0.5}
    )
    b = make_version(loaded_settings, db, "fid-ft-2024-02-bbbbbb", parent_version=a, month="2024-02")
    assert reader_used(auto_client) == "first-entity"  # none active yet: the fallback

    listing = auto_client.get("/admin/models", headers=ADMIN)
    assert listing.status_code == 200, listing.text
    body = listing.json()
    assert [v["version"] for v in body["versions"]] == [b, a]
    assert body["versions"][1] | {"created_at": None} == {
        "version": a,
        "kind": "fid",
        "parent_version": None,
        "trained_until": "2024-01-31",
        "month": None,
        "state": "ready",
        "active": False,
        "metrics": {"f1": 0.5},
        "job_id": None,
        "created_at": None,
    }
    assert body["serving"]["reader"] == "first-entity" and body["serving"]["version"] is None
    assert body["serving"]["follows_active"] is True

    r = auto_client.post(f"/admin/models/{a}/activate", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["version"] == a and r.json()["serving"]["version"] == a
    assert reader_used(auto_client) == f"trained-{a}"
    r = auto_client.post(f"/admin/models/{b}/activate", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert reader_used(auto_client) == f"trained-{b}"
    active = [v["version"] for v in auto_client.get("/admin/models", headers=ADMIN).json()["versions"] if v["active"]]
    assert active == [b]
    assert loads == [a, b]  # each loaded once: the refresh after activation reuses the preloaded reader


def test_api_activate_none_goes_back_to_the_fallback_at_once(auto_client, loaded_settings, loads):
    db = auto_client.app.state.db
    a = make_version(loaded_settings, db, "fid-2024-01-31-aaaaaa")
    assert auto_client.post(f"/admin/models/{a}/activate", headers=ADMIN).status_code == 200
    assert reader_used(auto_client) == f"trained-{a}"

    r = auto_client.post("/admin/models/none/activate", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["version"] == "none" and r.json()["active"] is False
    assert r.json()["serving"]["version"] is None and r.json()["notes"] == [f"{a} is no longer active"]
    assert reader_used(auto_client) == "first-entity"
    assert not any(v["active"] for v in auto_client.get("/admin/models", headers=ADMIN).json()["versions"])
    again = auto_client.post("/admin/models/none/activate", headers=ADMIN)
    assert again.status_code == 200 and again.json()["notes"] == ["no version was active"]
    assert auto_client.post("/admin/models/none/activate").status_code == 401


def test_api_activate_refuses_unknown_not_ready_missing_and_unloadable(auto_client, loaded_settings, loads):
    db = auto_client.app.state.db
    good = make_version(loaded_settings, db, "fid-good-000001")
    assert auto_client.post(f"/admin/models/{good}/activate", headers=ADMIN).status_code == 200
    make_version(loaded_settings, db, "fid-training-000002", state="training")
    make_version(loaded_settings, db, "fid-gone-000003", folder=False)
    make_version(loaded_settings, db, "fid-bad-000004", broken=True)
    for version, status, fragment in [
        ("nope", 404, "no reader version 'nope'"),
        ("fid-training-000002", 409, "not ready"),
        ("fid-gone-000003", 409, "is missing"),
        ("fid-bad-000004", 409, "could not be loaded"),
    ]:
        r = auto_client.post(f"/admin/models/{version}/activate", headers=ADMIN)
        assert r.status_code == status, r.text
        assert fragment in r.json()["detail"]
    assert auto_client.post("/admin/models/nope/activate").status_code == 401
    assert n_active(db) == 1
    with db.sessions() as session:
        assert registry.active_version(session).version == good
    assert reader_used(auto_client) == f"trained-{good}"


def test_api_a_version_activated_elsewhere_that_fails_to_load_keeps_the_old_reader(auto_client, loaded_settings, loads):
    db = auto_client.app.state.db
    make_version(loaded_settings, db, "fid-good-000001")
    make_version(loaded_settings, db, "fid-bad-000002", broken=True)
    state = auto_client.app.state.answers.reader_state
    activate(loaded_settings, db, "fid-good-000001")  # as `sqa models activate` in another process
    assert state.refresh() is True
    activate(loaded_settings, db, "fid-bad-000002")
    assert state.refresh() is False
    assert reader_used(auto_client) == "trained-fid-good-000001"
    serving = auto_client.get("/admin/models", headers=ADMIN).json()["serving"]
    assert serving["version"] == "fid-good-000001" and "fid-bad-000002 could not be loaded" in serving["error"]


def test_api_polls_for_a_version_activated_by_another_process(loaded_settings, loads):
    settings = loaded_settings.model_copy(update={"reader": "auto", "snapshot_poll_s": 0.1})
    with TestClient(create_app(settings)) as client:
        db = client.app.state.db
        make_version(settings, db, "fid-polled-000001")
        activate(settings, db, "fid-polled-000001")
        deadline = time.monotonic() + 10
        while reader_used(client) != "trained-fid-polled-000001" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reader_used(client) == "trained-fid-polled-000001"


def test_api_a_fixed_reader_process_records_the_activation_but_keeps_its_reader(client, loaded_settings, loads):
    db = client.app.state.db
    make_version(loaded_settings, db, "fid-a-000001")
    r = client.post("/admin/models/fid-a-000001/activate", headers=ADMIN)
    assert r.status_code == 200, r.text
    assert "fixed reader (SQA_READER=first-entity)" in r.json()["notes"][0]
    assert r.json()["serving"]["follows_active"] is False
    assert reader_used(client) == "first-entity" and loads == []
    assert n_active(db) == 1


# ---- POST /admin/finetune -------------------------------------------------------------------------------


@pytest.fixture
def fake_train(monkeypatch):
    """workers.train with a run_finetune_job that waits for `release`, then registers and activates
    the fine-tuned version (as the real one may); `fail` makes it raise instead."""
    module = types.ModuleType("workers.train")
    module.release = threading.Event()
    module.fail = False
    module.calls = []

    def run_finetune_job(ctx, job, *, month):
        module.calls.append((job.job_id, month))
        assert module.release.wait(20)
        if module.fail:
            raise RuntimeError("out of memory while fine-tuning")
        with ctx.sessions() as session, session.begin():
            parent = registry.active_version(session).version
            version = registry.new_version_name("fid", f"ft-{month}")
            (ctx.models_dir / version).mkdir()
            registry.register_version(
                session,
                version=version,
                kind="fid",
                path=version,
                parent_version=parent,
                month=month,
                job_id=job.job_id,
                activate=True,
                models_dir=ctx.models_dir,
            )
        return version

    module.run_finetune_job = run_finetune_job
    monkeypatch.setitem(sys.modules, "workers.train", module)
    return module


def test_api_finetune_runs_in_background_and_serves_the_new_version(
    auto_client, loaded_settings, loads, fake_train, wait_job
):
    db = auto_client.app.state.db
    r = auto_client.post("/admin/finetune", json={"month": "2024-02"}, headers=ADMIN)
    assert r.status_code == 422 and "no trained reader to fine-tune: run `sqa train reader" in r.json()["detail"]
    make_version(loaded_settings, db, "fid-base-000001")
    activate(loaded_settings, db, "fid-base-000001")
    for payload, fragment in [
        ({"month": "2024-13"}, "is not a month"),
        ({"month": "Feb"}, "is not a month"),
        ({"month": "2024-02", "epochs": 3}, "epochs"),
        ({}, "month"),
    ]:
        r = auto_client.post("/admin/finetune", json=payload, headers=ADMIN)
        assert r.status_code == 422 and fragment in r.json()["detail"], r.text
    assert fake_train.calls == []

    r = auto_client.post("/admin/finetune", json={"month": "2024-02"}, headers=ADMIN)
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    assert r.json()["status_url"] == f"/admin/jobs/{job_id}"
    busy = auto_client.post("/admin/finetune", json={"month": "2024-03"}, headers=ADMIN)
    assert busy.status_code == 409 and "already running" in busy.json()["detail"]
    fake_train.release.set()
    job = wait_job(auto_client, job_id, timeout=30.0)
    assert job["state"] == "succeeded" and job["kind"] == "finetune", job
    assert job["params"] == {"month": "2024-02", "parent_version": "fid-base-000001"}
    new = job["counts"]["version"]
    assert new.startswith("fid-ft-2024-02-") and fake_train.calls == [(job_id, "2024-02")]
    assert auto_client.get("/admin/jobs", headers=ADMIN).json()[0]["id"] == job_id
    versions = {v["version"]: v for v in auto_client.get("/admin/models", headers=ADMIN).json()["versions"]}
    assert versions[new]["parent_version"] == "fid-base-000001" and versions[new]["job_id"] == job_id
    assert versions[new]["active"] and reader_used(auto_client) == f"trained-{new}"


def test_api_finetune_failure_is_recorded_on_the_job(auto_client, loaded_settings, loads, fake_train, wait_job):
    db = auto_client.app.state.db
    make_version(loaded_settings, db, "fid-base-000001")
    assert auto_client.post("/admin/models/fid-base-000001/activate", headers=ADMIN).status_code == 200
    fake_train.fail = True
    fake_train.release.set()
    r = auto_client.post("/admin/finetune", json={"month": "2024-02"}, headers=ADMIN)
    assert r.status_code == 202, r.text
    job = wait_job(auto_client, r.json()["job_id"], timeout=30.0)
    assert job["state"] == "failed" and "out of memory while fine-tuning" in job["error"]
    assert reader_used(auto_client) == "trained-fid-base-000001"


def test_api_finetune_refuses_an_active_ranker(auto_client, loaded_settings, loads, fake_train):
    db = auto_client.app.state.db
    make_version(loaded_settings, db, "ranker-base-000001", kind="ranker")
    assert auto_client.post("/admin/models/ranker-base-000001/activate", headers=ADMIN).status_code == 200
    assert reader_used(auto_client) == "trained-ranker-base-000001"
    r = auto_client.post("/admin/finetune", json={"month": "2024-02"}, headers=ADMIN)
    assert r.status_code == 422 and "refitted rather than fine-tuned" in r.json()["detail"]
    assert fake_train.calls == []


# ---- sqa models ---------------------------------------------------------------------------------------


def test_cli_models_list_and_activate(sqa):
    r = sqa("models", "list")
    assert r.exit_code == 0 and "no trained reader versions yet" in r.output
    settings = get_settings()
    db = open_database(settings)
    try:
        make_version(settings, db, "fid-2024-01-31-aaaaaa", trained_until=dt.date(2024, 1, 31))
        make_version(settings, db, "fid-training-000002", state="training")
    finally:
        db.close()
    for args, fragment in [
        (("models", "activate", "nope"), "no reader version 'nope'"),
        (("models", "activate", "fid-training-000002"), "is training, not ready"),
    ]:
        r = sqa(*args)
        assert r.exit_code == 2 and fragment in r.output, r.output
    r = sqa("models", "activate", "fid-2024-01-31-aaaaaa")
    assert r.exit_code == 0 and "activated reader version fid-2024-01-31-aaaaaa" in r.output, r.output
    lines = sqa("models", "list").output.splitlines()
    assert any(line.startswith("* fid-2024-01-31-aaaaaa") and "2024-01-31" in line for line in lines), lines
    assert any(line.startswith("  fid-training-000002") and "training" in line for line in lines), lines
    # none: no version serves (the fallback does); said twice, the second says none was active
    r = sqa("models", "activate", "none")
    assert r.exit_code == 0 and "was fid-2024-01-31-aaaaaa" in r.output, r.output
    assert not any(line.startswith("*") for line in sqa("models", "list").output.splitlines())
    assert "none was" in sqa("models", "activate", "none").output


# ---- versions trained elsewhere (`sqa models import`) ------------------------------------------------


def trained_elsewhere(folder: Path, **info) -> Path:
    """A version folder as models.train_exported writes it on another machine (no real weights)."""
    folder.mkdir(parents=True)
    (folder / "trained.safetensors").write_bytes(b"weights")
    (folder / "reader.json").write_text(
        json.dumps(
            {
                "kind": "gemma",
                "version": None,
                "label": "2023-04-01",
                "trained_until": "2023-04-01",
                "validation": {"n": 54, "em": 31.5, "f1": 38.2},
                "steps": 900,
                "stopped": "epochs",
                "data": {"train": 9000, "val": 54},
                "trained_elsewhere": {"device": "NVIDIA H200"},
                **info,
            }
        )
    )
    return folder


def test_registry_import_copies_the_folder_under_a_new_name_and_registers_it(settings, db, tmp_path):
    src = trained_elsewhere(tmp_path / "from-gpu")
    checked: list[Path] = []
    with db.sessions() as session, session.begin():
        row = registry.import_version(session, src, models_dir=settings.models_dir, activate=True, check=checked.append)
        version = row.version
    assert checked == [src] and re.fullmatch(r"gemma-2023-04-01-[0-9a-f]{6}", version)
    with db.sessions() as session:
        row = registry.get_version(session, version)
        assert (row.kind, row.trained_until, row.active, row.state) == ("gemma", dt.date(2023, 4, 1), True, "ready")
        assert row.metrics["validation"]["em"] == 31.5 and row.metrics["trained_elsewhere"]["device"] == "NVIDIA H200"
    copied = settings.models_dir / version
    info = json.loads((copied / "reader.json").read_text())
    assert info["version"] == version and info["imported_from"] == str(src.resolve())
    assert (copied / "trained.safetensors").read_bytes() == b"weights"
    assert (src / "trained.safetensors").exists() and json.loads((src / "reader.json").read_text())["version"] is None
    assert not list(settings.models_dir.glob(".*importing"))


def test_registry_import_refuses_what_is_not_a_loadable_version_and_stores_nothing(settings, db, tmp_path):
    def broken(folder: Path) -> None:
        raise ValueError(f"{folder} does not load as a trained reader: size mismatch")

    (tmp_path / "empty").mkdir()
    cases = [
        (tmp_path / "missing", None, "is not a folder"),
        (tmp_path / "empty", None, "not a trained reader folder"),
        (trained_elsewhere(tmp_path / "bad-kind", kind="bert"), None, "kind 'bert' is unknown"),
        (trained_elsewhere(tmp_path / "bad-day", trained_until="soon"), None, "is not a date"),
        (trained_elsewhere(tmp_path / "broken"), broken, "size mismatch"),
    ]
    for folder, check, message in cases:
        with db.sessions() as session, session.begin():
            with pytest.raises(ValueError, match=message):
                registry.import_version(session, folder, models_dir=settings.models_dir, check=check)
    with db.sessions() as session:
        assert registry.list_versions(session) == []
    assert not settings.models_dir.exists() or not any(settings.models_dir.iterdir())


def test_cli_models_import_refuses_a_folder_that_is_not_a_version(sqa, tmp_path):
    r = sqa("models", "import", str(tmp_path / "nowhere"))
    assert r.exit_code == 2 and "is not a folder" in r.output, r.output
    (tmp_path / "empty").mkdir()
    r = sqa("models", "import", str(tmp_path / "empty"))
    assert r.exit_code == 2 and "reader.json is missing" in r.output, r.output
    # A folder that does not load (a ranker without its ranker.json): the check loads it, and refuses it.
    r = sqa("models", "import", str(trained_elsewhere(tmp_path / "junk", kind="ranker")))
    assert r.exit_code == 2 and "does not load as a trained reader" in r.output, r.output
    assert "no trained reader versions yet" in sqa("models", "list").output


def test_registry_import_that_fails_to_register_leaves_no_folder(settings, db, tmp_path, monkeypatch):
    src = trained_elsewhere(tmp_path / "from-gpu")

    def refuse(*args, **kwargs):
        raise ConflictError("reader version is already registered")

    monkeypatch.setattr(registry, "register_version", refuse)
    with db.sessions() as session, session.begin():
        with pytest.raises(ConflictError):
            registry.import_version(session, src, models_dir=settings.models_dir)
    assert list(settings.models_dir.iterdir()) == []


def test_cli_train_reader_export_is_for_gemma_only(sqa, tmp_path):
    r = sqa(
        "train", "reader", "--until", "2024-03-01", "--kind", "gemma", "--export", str(tmp_path / "x"), "--activate"
    )
    assert r.exit_code == 2 and "--activate does not go with --export" in r.output, r.output
    r = sqa("train", "reader", "--until", "2024-03-01", "--kind", "fid", "--export", str(tmp_path / "x"))
    assert r.exit_code == 2 and "--export is for --kind gemma" in r.output, r.output
    (tmp_path / "file").write_text("")
    r = sqa("train", "reader", "--until", "2024-03-01", "--kind", "gemma", "--export", str(tmp_path / "file"))
    assert r.exit_code == 2 and "is a file: name a folder" in r.output, r.output


def test_cli_train_reader_max_length_is_for_gemma_only_and_never_negative(sqa):
    r = sqa("train", "reader", "--until", "2024-03-01", "--kind", "ranker", "--max-length", "0")
    assert r.exit_code == 2 and "--max-length is for --kind gemma" in r.output, r.output
    r = sqa("train", "reader", "--until", "2024-03-01", "--kind", "gemma", "--max-length", "-5")
    assert r.exit_code == 2 and "--max-length" in r.output, r.output


def test_cli_train_reader_context_words_is_for_gemma_only_and_bounded(sqa):
    r = sqa("train", "reader", "--until", "2024-03-01", "--kind", "fid", "--context-words", "150")
    assert r.exit_code == 2 and "--context-words is for --kind gemma" in r.output, r.output
    r = sqa("train", "reader", "--until", "2024-03-01", "--kind", "gemma", "--context-words", "-1")
    assert r.exit_code == 2 and "--context-words" in r.output, r.output


# ---- soups of seeds (`sqa models soup`) ------------------------------------------------------------


def gemma_run(settings: Settings, db, version: str, **kw) -> str:
    """tests.gemma_runs.gemma_run under these settings and database."""
    return tests.gemma_runs.gemma_run(settings.models_dir, db.sessions, version, **kw)


def test_registry_soup_registers_the_mean_of_the_members_as_a_new_version(settings, db):
    from safetensors.torch import load_file

    a = gemma_run(settings, db, "gemma-2023-04-01-aaaaaa", seed=0)
    b = gemma_run(settings, db, "gemma-2023-04-15-bbbbbb", seed=1, until="2023-04-15")
    before = {v: (settings.models_dir / v / "trained.safetensors").read_bytes() for v in (a, b)}
    checked: list[Path] = []
    with db.sessions() as session, session.begin():
        version = registry.soup_versions(
            session, [a, b], models_dir=settings.models_dir, activate=True, check=checked.append
        ).version
    assert re.fullmatch(r"gemma-2023-04-15-[0-9a-f]{6}", version) and len(checked) == 1
    with db.sessions() as session:
        row = registry.get_version(session, version)
        assert (row.kind, row.trained_until, row.active, row.state) == ("gemma", dt.date(2023, 4, 15), True, "ready")
    folder = settings.models_dir / version
    info = json.loads((folder / "reader.json").read_text())
    assert info["soup_of"] == [a, b] and info["imported_from"] == f"soup of {a}, {b}" and info["validation"] is None
    assert info["members_validation"][b]["em"] == 51.0 and info["spec"]["seed"] == 0
    assert json.loads((folder / "gemma_config.json").read_text())["lora_r"] == 4
    # its weight change is the mean of the members' (B A), the members untouched
    st = [load_file(settings.models_dir / v / "trained.safetensors") for v in (a, b, version)]

    def delta(s):
        return s["layer.q_proj.lora_B.default.weight"] @ s["layer.q_proj.lora_A.default.weight"]

    import torch

    torch.testing.assert_close(delta(st[2]), (delta(st[0]) + delta(st[1])) / 2)
    assert all((settings.models_dir / v / "trained.safetensors").read_bytes() == before[v] for v in (a, b))
    assert not list(settings.models_dir.glob(".soup-*")) and not list(settings.models_dir.glob(".*importing"))


def test_registry_soup_refuses_what_does_not_average_and_stores_nothing(settings, db):
    a = gemma_run(settings, db, "gemma-2023-04-01-aaaaaa", seed=0)
    other = gemma_run(settings, db, "gemma-2023-04-01-cccccc", seed=2, n_passages=5)
    wide = gemma_run(settings, db, "gemma-2023-04-01-dddddd", seed=3, rank=4)
    fid = make_version(settings, db, "fid-2023-04-01-eeeeee")
    cases = [
        ([a], ValueError, "at least two"),
        ([a, a], ValueError, "named twice"),
        ([a, "gemma-nope"], NotFoundError, "no reader version 'gemma-nope'"),
        ([a, fid], ValueError, "is a fid reader"),
        ([a, other], ValueError, "differs from the first in n_passages"),
        ([a, wide], ValueError, "differs from the first in lora_r"),
    ]
    for versions, error, message in cases:
        with db.sessions() as session, session.begin():
            with pytest.raises(error, match=message):
                registry.soup_versions(session, versions, models_dir=settings.models_dir)
    with db.sessions() as session:
        assert len(registry.list_versions(session)) == 4
    assert sorted(p.name for p in settings.models_dir.iterdir()) == sorted([a, other, wide, fid])


def test_cli_models_soup_registers_a_loadable_soup_or_says_what_is_wrong(sqa, monkeypatch):
    import models.gemma_train

    loaded: list[Path] = []
    monkeypatch.setattr(
        models.gemma_train.GemmaModel, "load", classmethod(lambda cls, path, **kw: loaded.append(Path(path)))
    )
    r = sqa("models", "soup", "gemma-nope")
    assert r.exit_code == 2 and "at least two versions" in r.output, r.output
    r = sqa("models", "soup", "gemma-nope", "gemma-nada")
    assert r.exit_code == 2 and "no reader version 'gemma-nope'" in r.output, r.output
    settings = get_settings()
    db = open_database(settings)
    try:
        a = gemma_run(settings, db, "gemma-2023-04-01-aaaaaa", seed=0)
        b = gemma_run(settings, db, "gemma-2023-04-01-bbbbbb", seed=1)
    finally:
        db.close()
    r = sqa("models", "soup", a, b, "--activate")
    assert r.exit_code == 0 and f"is the soup of {a}, {b}; it is the active version" in r.output, r.output
    assert len(loaded) == 1  # loaded once, on this SQA_HOME's base, before it was registered
    lines = sqa("models", "list").output.splitlines()
    assert sum(line.startswith("* gemma-2023-04-01-") for line in lines) == 1 and len(lines) == 4, lines
