"""Reader bake-off: EM/F1 and CPU latency of several readers on the same dated questions, next to
the published RealTimeQA systems scored on exactly the same question ids.

    .venv/bin/python -m bench.bench_readers --home "$SQA_HOME" --from 2023-04-01 --to 2023-06-30 \
        --readers gemma,first-entity,fid=trained:/path/to/checkpoint --gold-for fid \
        --passages 10 --top-k 20 --threads 1 --out results.json
    .venv/bin/python -m bench.bench_readers --home "$SQA_HOME" --from 2022-01-01 --to 2022-12-31 \
        --baselines-only                                  # the published systems alone, no index needed

Questions: those of the window in the home's database, cut to RealTimeQA's generation subset
(first gold answer of at most --max-answer-tokens normalised tokens, and making sense without its
choices; how many were left out, and why, is printed), optionally a --seed sample of
--max-questions. Each question is retrieved once with the service's retriever (SQA_RETRIEVER, hybrid
by default; time-filtered: nothing published after the question date), and every reader gets the
same top --passages passages. Readers named in --gold-for are also run on the gold-containing
passage alone (`workers.bakeoff_gold.gold_passage`): an upper bound that separates reading from
retrieval; questions without one are left out of that row. Latency is the reader's own call
(`generate`, perf_counter), after one warm-up call.

Every answer is appended to `<out>.partial.jsonl` as it is made; a rerun with the same --out
reuses an answer when the reader spec and the passages it saw are the same, so a long run can be
killed and resumed. Reader specs: `gemma`, `first-entity`, `trained:DIR` (models.trained), or
`import:package.module:factory` (any callable `factory(device=..., max_passages=...)` returning a
Reader); each may carry a label, `name=spec`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from evaluation.bakeoff import (
    MAX_ANSWER_TOKENS,
    baseline_files,
    generation_subset,
    latency_summary,
    load_baseline_predictions,
    score,
)
from evaluation.metrics import answer_in_text
from indexer.chunking import passage_body
from workers.bakeoff_gold import BenchQuestion, load_questions

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "realtimeqa"
DEFAULT_BASELINES = "open_rag_gcs_gen,open_gpt3_gcs_gen,closed_t5_gen"


@dataclass(frozen=True)
class ReaderSpec:
    label: str
    spec: str


@dataclass(frozen=True)
class Item:
    """What one reader call sees: the question and its passages."""

    question: BenchQuestion
    passages: tuple  # ReaderPassage, ...
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
        from models.trained import load_trained_reader  # lazily: only when a trained reader is asked for

        return load_trained_reader(Path(spec[len("trained:") :]).expanduser(), device=device, max_passages=passages)
    if spec.startswith("import:"):
        import importlib

        module, _, attr = spec[len("import:") :].partition(":")
        return getattr(importlib.import_module(module), attr)(device=device, max_passages=passages)
    from models.readers import load_reader

    return load_reader(spec, device=device, max_passages=passages)


def trained_info(spec: str) -> dict | None:
    """kind, version and training cut of a `trained:DIR` reader (its reader.json), else None."""
    if not spec.startswith("trained:"):
        return None
    from models.trained import read_reader_info

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


def retrieve_all(settings, db, questions: list[BenchQuestion], top_k: int, passages: int, bar: bool):
    """Retrieve once per question with the service's retriever (SQA_RETRIEVER, as `sqa serve` does):
    ({qid: Item with the top `passages`}, retrieval figures)."""
    from tqdm import tqdm

    from app.bootstrap import build_encoder, build_retriever, index_state
    from models.readers import FirstEntityReader, ReaderPassage
    from serving.answering import AnswerLimits, AnswerService

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
        has = [answer_in_text(q.answers, passage_body(p.text, p.published)) for p in found]
        hit_k += any(has[:passages])
        hit_top += any(has)
        top = found[:passages]
        items[q.qid] = Item(
            q, tuple(ReaderPassage(p.title, p.text, p.published) for p in top), tuple(p.passage_id for p in top)
        )
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


def gold_items(sessions, questions: list[BenchQuestion]) -> dict[str, Item]:
    from models.readers import ReaderPassage
    from workers.bakeoff_gold import gold_passage

    with sessions() as session:
        pairs = [(q, gold_passage(session, q)) for q in questions]
        return {
            q.qid: Item(q, (ReaderPassage(row.article.title, row.text, row.published),), (row.id,))
            for q, row in pairs
            if row is not None
        }


def run_reader(label: str, spec: str, items: list[Item], cache: PartialCache, get_reader, *, bar: bool) -> dict:
    """Answer every item (cached answers reused; the reader is loaded, by `get_reader()`, only when
    something is left to answer): {"predictions": {qid: text}, "ms": {qid: ms}, "load_s", "reused"}."""
    from tqdm import tqdm

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


def reader_row(system: str, kind: str, spec: str, questions: list[BenchQuestion], run: dict, left_out: int = 0) -> dict:
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


def baseline_rows(data: Path, systems: list[str], questions: list[BenchQuestion]) -> tuple[list[dict], list[str]]:
    from indexer.records import ImportReport

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


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--home",
        default=os.environ.get("SQA_HOME", ".sqa"),
        help="SQA_HOME with the questions imported and the window's months ingested (read only)",
    )
    ap.add_argument(
        "--database-url", default=None, help="SQA_DATABASE_URL (default: the env's, else the home's SQLite)"
    )
    ap.add_argument("--from", dest="first", default="2023-04-01", help="first question day, YYYY-MM-DD")
    ap.add_argument("--to", dest="last", default="2023-06-30", help="last question day, YYYY-MM-DD")
    ap.add_argument(
        "--readers",
        default="first-entity",
        help="comma list of reader specs, each optionally label=spec (default first-entity)",
    )
    ap.add_argument("--gold-for", default="", help="comma list of reader labels also run on the gold passage alone")
    ap.add_argument("--passages", type=int, default=10, help="passages each reader gets (default 10)")
    ap.add_argument("--top-k", type=int, default=20, help="retrieval depth; recall is reported at both (default 20)")
    ap.add_argument("--max-questions", type=int, default=0, help="a --seed sample of this many (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--max-answer-tokens",
        type=int,
        default=MAX_ANSWER_TOKENS,
        help="generation subset: longest first gold answer kept, in tokens (0: any)",
    )
    ap.add_argument("--baselines", default=DEFAULT_BASELINES, help="comma list of published systems ('' for none)")
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="RealTimeQA tree holding baseline_results/")
    ap.add_argument(
        "--baselines-only", action="store_true", help="score the published systems only: no index, no reader"
    )
    ap.add_argument("--encoder", default=os.environ.get("SQA_ENCODER", "minilm"), help="must be the index's encoder")
    ap.add_argument("--device", default=os.environ.get("SQA_DEVICE", "cpu"))
    ap.add_argument(
        "--threads",
        type=int,
        default=int(os.environ.get("SQA_TORCH_THREADS", "0") or 0),
        help="torch and FAISS threads (0: their defaults)",
    )
    ap.add_argument("--out", help="write everything here (JSON); answers are cached in <out>.partial.jsonl")
    args = ap.parse_args(argv)
    try:
        args.first, args.last = dt.date.fromisoformat(args.first), dt.date.fromisoformat(args.last)
    except ValueError as exc:
        ap.error(f"{exc} (use YYYY-MM-DD)")
    if args.first > args.last:
        ap.error(f"--from {args.first} is after --to {args.last}")
    if args.passages < 1 or args.top_k < args.passages:
        ap.error(f"need 1 <= --passages ({args.passages}) <= --top-k ({args.top_k})")
    if args.max_questions < 0 or args.max_answer_tokens < 0 or args.threads < 0:
        ap.error("--max-questions, --max-answer-tokens and --threads must be >= 0")
    try:
        args.reader_specs = [] if args.baselines_only else parse_reader_specs(args.readers)
    except ValueError as exc:
        ap.error(str(exc))
    args.gold = [g.strip() for g in args.gold_for.split(",") if g.strip()] if not args.baselines_only else []
    unknown = set(args.gold) - {s.label for s in args.reader_specs}
    if unknown:
        ap.error(f"--gold-for names no reader: {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    bar = sys.stderr.isatty() or os.environ.get("SQA_PROGRESS") == "1"
    if args.threads:
        import faiss
        import torch

        torch.set_num_threads(args.threads)
        faiss.omp_set_num_threads(args.threads)

    from app.bootstrap import open_database
    from settings import Settings

    overrides = {} if args.database_url is None else {"database_url": args.database_url}
    settings = Settings(home=Path(args.home), encoder=args.encoder, device=args.device, **overrides)
    db = open_database(settings, migrate=False)
    try:
        in_window = load_questions(db.sessions, args.first, args.last)
        kept, left_out = generation_subset(in_window, args.max_answer_tokens)
        questions = kept
        if args.max_questions and args.max_questions < len(kept):
            questions = sorted(
                random.Random(args.seed).sample(kept, args.max_questions), key=lambda q: (q.asked, q.qid)
            )
        why = ", ".join(f"{n} {reason}" for reason, n in left_out.most_common()) or "none"
        print(
            f"{len(in_window)} questions {args.first}..{args.last} in {settings.home}; generation subset "
            f"{len(kept)} (left out: {why}); evaluated {len(questions)}"
            + (f" (a seed-{args.seed} sample)" if len(questions) < len(kept) else ""),
            flush=True,
        )
        if not questions:
            print("nothing to evaluate")
            return 0

        rows, notes, retrieval, gold_ids = [], [], None, {}
        if not args.baselines_only and args.reader_specs:
            items, retrieval = retrieve_all(settings, db, questions, args.top_k, args.passages, bar)
            if args.gold:
                gold = gold_items(db.sessions, questions)
                gold_ids = {qid: item.passage_ids[0] for qid, item in gold.items()}
            cache = PartialCache(Path(f"{args.out}.partial.jsonl") if args.out else None)
            try:
                for rs in args.reader_specs:
                    info = trained_info(rs.spec)
                    # trained_until is exclusive: the model saw what is dated before it
                    if info and info.get("trained_until") and info["trained_until"] > str(args.first):
                        notes.append(
                            f"{rs.label} was trained on data up to {info['trained_until']}, after the "
                            f"window starts ({args.first}): not a held-out figure"
                        )
                    get_reader = functools.cache(
                        functools.partial(load_bench_reader, rs.spec, device=args.device, passages=args.passages)
                    )
                    run = run_reader(rs.label, rs.spec, [items[q.qid] for q in questions], cache, get_reader, bar=bar)
                    rows.append({**reader_row(rs.label, "reader", rs.spec, questions, run), "reader_info": info})
                    if rs.label in args.gold:
                        with_gold = [q for q in questions if q.qid in gold]
                        label = f"{rs.label} (gold passage)"
                        run = run_reader(label, rs.spec, [gold[q.qid] for q in with_gold], cache, get_reader, bar=bar)
                        row = reader_row(label, "gold", rs.spec, with_gold, run, len(questions) - len(with_gold))
                        same = score(rows[-1]["predictions"], with_gold) if with_gold else None
                        row["retrieved_on_same_questions"] = same
                        rows.append(row)
            finally:
                cache.close()

        data = Path(args.data)
        systems = [s.strip() for s in args.baselines.split(",") if s.strip()]
        if systems and not (data / "baseline_results").is_dir() and data.name != "baseline_results":
            notes.append(
                f"no baseline results under {data} (expected {data / 'baseline_results'}): "
                "the baseline rows are left out"
            )
        elif systems:
            brows, bnotes = baseline_rows(data, systems, questions)
            rows += brows
            notes += bnotes
    finally:
        db.close()

    print_table(rows)
    for r in rows:
        if r["kind"] == "gold":
            same = r["retrieved_on_same_questions"]
            print(
                f"\n{r['system']}: {r['left_out']} of {r['n'] + r['left_out']} questions have no stored passage "
                "with a gold answer published by their date and are left out of this row"
                + (
                    f"; the same reader with retrieved passages on these {same['n']} questions: "
                    f"EM {100 * same['em']:.1f}, F1 {100 * same['f1']:.1f}"
                    if same
                    else ""
                )
            )
    if retrieval:
        k, top = args.passages, args.top_k
        lat = retrieval["latency"]
        print(
            f"\nretrieval ({retrieval['retriever']} over {retrieval['encoder']}, snapshot {retrieval['snapshot']}, "
            f"newest article {retrieval['newest_indexed_day']}): recall@{k} {100 * retrieval[f'recall@{k}']:.1f}, "
            f"recall@{top} {100 * retrieval[f'recall@{top}']:.1f} (share of questions whose top passages hold a "
            f"gold answer); retrieve p50 {lat['p50_ms']} ms, p95 {lat['p95_ms']} ms"
        )
        last_asked = str(max(q.asked for q in questions))
        if retrieval["newest_indexed_day"] < last_asked:
            print(
                f"note: the index ends on {retrieval['newest_indexed_day']}, before the last question ({last_asked}): "
                "is the window ingested?"
            )
    for note in notes:
        print(f"note: {note}")
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(
        f"machine: {os.cpu_count()} cores, load average {load and ' / '.join(f'{x:.1f}' for x in load)}, "
        f"threads {args.threads or 'default'}"
    )
    if args.out:
        result = {
            "config": {
                "home": str(settings.home),
                "from": str(args.first),
                "to": str(args.last),
                "readers": [vars(s) for s in args.reader_specs],
                "gold_for": args.gold,
                "passages": args.passages,
                "top_k": args.top_k,
                "max_questions": args.max_questions,
                "seed": args.seed,
                "max_answer_tokens": args.max_answer_tokens,
                "encoder": args.encoder,
                "device": args.device,
                "threads": args.threads,
                "baselines_only": args.baselines_only,
                "cpu_count": os.cpu_count(),
                "loadavg_end": list(load) if load else None,
            },
            "questions": {
                "in_window": len(in_window),
                "generation_subset": len(kept),
                "left_out": dict(left_out),
                "evaluated": len(questions),
            },
            "retrieval": retrieval,
            "rows": rows,
            "notes": notes,
            "per_question": [
                {
                    "qid": q.qid,
                    "asked": str(q.asked),
                    "question": q.text,
                    "answers": list(q.answers),
                    "gold_passage_id": gold_ids.get(q.qid),
                }
                for q in questions
            ],
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
