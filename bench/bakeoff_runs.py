"""The reader bake-off's parts (bench/bench_readers.py runs them): reader specs (`name=spec`) and how
each loads, the retrieval done once per question with the service's retriever, each reader run over
the same passages with the answers cached as they are made (`PartialCache`, `<out>.partial.jsonl`),
the gold-passage items, and the rows of the table, the published systems' included.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from evaluation.bakeoff import baseline_files, latency_summary, load_baseline_predictions, score
from evaluation.metrics import answer_in_text
from evaluation.questions import DatedQuestion
from indexer.records import ImportReport
from models.reader_base import RetrievedPassage
from models.readers import FirstEntityReader, load_reader
from models.trained import load_trained_reader, read_reader_info
from workers.bakeoff_gold import gold_passage


@dataclass(frozen=True)
class ReaderSpec:
    label: str
    spec: str


@dataclass(frozen=True)
class Item:
    """What one reader call sees: the question and its passages."""

    question: DatedQuestion
    passages: tuple  # RetrievedPassage, ...
    passage_ids: tuple[int, ...]


def parse_reader_specs(text: str) -> list[ReaderSpec]:
    """'gemma,fid=trained:/x' -> [ReaderSpec('gemma', 'gemma'), ReaderSpec('fid', 'trained:/x')]."""
    specs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        label, _, spec = part.partition("=") if "=" in part.split(":", 1)[0] else ("", "", part)
        spec = spec.strip()
        if not label:
            label = f"trained:{Path(spec[8:]).name}" if spec.startswith("trained:") else spec
        if not (spec in ("gemma", "first-entity") or spec.startswith(("trained:", "import:"))):
            raise ValueError(
                f"reader {spec!r} is unknown (use gemma, first-entity, trained:DIR or import:module:factory)"
            )
        specs.append(ReaderSpec(label.strip(), spec))
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"reader labels must differ ({', '.join(labels)}): name them, e.g. a=gemma")
    return specs


def load_bench_reader(spec: str, *, device: str, passages: int):
    if spec.startswith("trained:"):
        return load_trained_reader(Path(spec[len("trained:") :]).expanduser(), device=device, max_passages=passages)
    if spec.startswith("import:"):
        module, _, attr = spec[len("import:") :].partition(":")
        return getattr(importlib.import_module(module), attr)(device=device, max_passages=passages)
    return load_reader(spec, device=device, max_passages=passages)


def trained_info(spec: str) -> dict | None:
    """kind, version and training cut of a `trained:DIR` reader (its reader.json), else None."""
    if not spec.startswith("trained:"):
        return None
    info = read_reader_info(Path(spec[len("trained:") :]).expanduser())
    return {k: info.get(k) for k in ("kind", "version", "trained_until", "parent_version")}


class PartialCache:
    """Answers already made, one JSON line each: {label, qid, spec, passage_ids, prediction, ms}."""

    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: kept in memory only
        self.records: dict[tuple[str, str], dict] = {}
        if path is not None and path.exists():
            for line in path.read_text().splitlines():
                try:
                    r = json.loads(line)
                    self.records[(r["label"], r["qid"])] = r
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut short by a kill: answered again
        self._handle = None

    def get(self, label: str, spec: str, item: Item) -> dict | None:
        r = self.records.get((label, item.question.qid))
        if r and r.get("spec") == spec and tuple(r.get("passage_ids", ())) == item.passage_ids:
            return r
        return None

    def add(self, record: dict) -> None:
        self.records[(record["label"], record["qid"])] = record
        if self.path is None:
            return
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.path.open("a")
        self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


def retrieve_all(settings, db, questions: list[DatedQuestion], top_k: int, passages: int, bar: bool):
    """Retrieve once per question with the service's retriever (SQA_RETRIEVER, as `sqa serve` does):
    ({qid: Item with the top `passages`}, retrieval figures)."""
    from app.bootstrap.builders import build_encoder, build_retriever, index_state  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)
    from serving.answering import AnswerLimits, AnswerService  # noqa: PLC0415 (lazy: serving.answering pulls faiss)

    encoder = build_encoder(settings)
    state = index_state(settings, db, encoder, lexical=settings.retriever != "dense")
    limits = AnswerLimits(default_top_k=top_k, max_top_k=top_k, reader_passages=passages, max_question_chars=1_000_000)
    service = AnswerService(
        encoder=encoder,
        reader=FirstEntityReader(),
        index_state=state,
        session_factory=db.sessions,
        limits=limits,
        retriever=build_retriever(settings, encoder),
    )
    state.refresh()
    snap = state.current()
    if snap is None:
        raise SystemExit(f"error: no index snapshot in {settings.home}: run `sqa ingest` first (or --baselines-only)")
    items, ms, hit_k, hit_top = {}, [], 0, 0
    for q in tqdm(questions, desc="retrieve", unit="q", disable=not bar, file=sys.stderr):
        t0 = time.perf_counter()
        found = service.answer(q.text, q.asked, top_k, snapshot=snap, read=False).passages
        ms.append((time.perf_counter() - t0) * 1000)
        assert all(p.published <= q.asked for p in found), "retrieval returned a passage after the question date"
        has = [answer_in_text(q.answers, p.text) for p in found]
        hit_k += any(has[:passages])
        hit_top += any(has)
        top = found[:passages]
        items[q.qid] = Item(q, tuple(top), tuple(p.passage_id for p in top))
    n = len(questions)
    figures = {
        "snapshot": snap.snapshot_id,
        "encoder": snap.manifest.encoder,
        "retriever": service.retriever.name,
        "newest_indexed_day": str(snap.newest_day),
        "shards": [e.file for e in snap.manifest.shards],
        f"recall@{passages}": hit_k / n if n else 0.0,
        f"recall@{top_k}": hit_top / n if n else 0.0,
        "latency": latency_summary(ms),
    }
    return items, figures


def gold_items(sessions, questions: list[DatedQuestion]) -> dict[str, Item]:
    with sessions() as session:
        pairs = [(q, gold_passage(session, q)) for q in questions]
        return {
            q.qid: Item(q, (RetrievedPassage(row.article.title, row.text, row.published),), (row.id,))
            for q, row in pairs
            if row is not None
        }


def run_reader(label: str, spec: str, items: list[Item], cache: PartialCache, get_reader, *, bar: bool) -> dict:
    """Answer every item (cached answers reused; the reader is loaded, by `get_reader()`, only when
    something is left to answer): {"predictions": {qid: text}, "ms": {qid: ms}, "load_s", "reused"}."""
    predictions, ms, todo = {}, {}, []
    for item in items:
        r = cache.get(label, spec, item)
        if r is None:
            todo.append(item)
        else:
            predictions[item.question.qid], ms[item.question.qid] = r["prediction"], r["ms"]
    out = {"predictions": predictions, "ms": ms, "load_s": None, "reused": len(items) - len(todo)}
    if not todo:
        return out
    t0 = time.perf_counter()
    reader = get_reader()
    first = todo[0]
    reader.generate(first.question.text, first.question.asked, first.passages)  # warm-up, not timed
    out["load_s"] = round(time.perf_counter() - t0, 2)
    for item in tqdm(todo, desc=label, unit="q", disable=not bar, file=sys.stderr):
        q = item.question
        t1 = time.perf_counter()
        answer = reader.generate(q.text, q.asked, item.passages)
        elapsed = round((time.perf_counter() - t1) * 1000, 2)
        predictions[q.qid], ms[q.qid] = answer.text, elapsed
        cache.add(
            {
                "label": label,
                "qid": q.qid,
                "spec": spec,
                "passage_ids": list(item.passage_ids),
                "prediction": answer.text,
                "ms": elapsed,
            }
        )
    return out


def reader_row(system: str, kind: str, spec: str, questions: list[DatedQuestion], run: dict, left_out: int = 0) -> dict:
    lat = latency_summary([run["ms"][q.qid] for q in questions if q.qid in run["ms"]])
    return {
        "system": system,
        "kind": kind,
        "spec": spec,
        **score(run["predictions"], questions),
        "p50_ms": lat["p50_ms"],
        "p95_ms": lat["p95_ms"],
        "mean_ms": lat["mean_ms"],
        "left_out": left_out,
        "load_s": run["load_s"],
        "reused_from_partial": run["reused"],
        "predictions": {q.qid: run["predictions"].get(q.qid) for q in questions},
        "ms": {q.qid: run["ms"].get(q.qid) for q in questions},
    }


def baseline_rows(data: Path, systems: list[str], questions: list[DatedQuestion]) -> tuple[list[dict], list[str]]:
    rows, notes = [], []
    for system in systems:
        report = ImportReport()
        preds = load_baseline_predictions(data, system, report)
        if not preds:
            notes.append(f"{system}: no `*_qa_{system}.jsonl[.gz]` file under {data}: row left out")
            continue
        if report.skipped or report.duplicates:
            notes.append(
                f"{system}: {len(baseline_files(data, system))} files; skipped {dict(report.skipped)}, "
                f"{report.duplicates} repeated ids (the first kept)"
            )
        covered = sum(q.qid in preds for q in questions)
        if covered < len(questions):
            notes.append(
                f"{system}: predictions for only {covered} of the {len(questions)} questions (the others score 0)"
            )
        rows.append(
            {
                "system": system,
                "kind": "baseline",
                "spec": f"baseline_results/*_qa_{system}",
                **score(preds, questions),
                "p50_ms": None,
                "p95_ms": None,
                "mean_ms": None,
                "left_out": 0,
                "predictions": {q.qid: preds.get(q.qid) for q in questions},
            }
        )
    return rows, notes


def print_table(rows: list[dict]) -> None:
    print()

    def ms(x):
        return "-" if x is None else f"{x:.0f}" if x >= 10 else f"{x:.2g}"

    print("| system | n | answered | EM | F1 | p50 ms | p95 ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['system']} | {r['n']} | {r['answered']} | {100 * r['em']:.1f} | {100 * r['f1']:.1f} | "
            f"{ms(r['p50_ms'])} | {ms(r['p95_ms'])} |"
        )
