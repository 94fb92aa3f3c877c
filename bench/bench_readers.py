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
from pathlib import Path

from bench.bakeoff_runs import (
    PartialCache,
    baseline_rows,
    gold_items,
    load_bench_reader,
    parse_reader_specs,
    print_table,
    reader_row,
    retrieve_all,
    run_reader,
    trained_info,
)
from evaluation.bakeoff import MAX_ANSWER_TOKENS, generation_subset, score
from settings import Settings
from workers.bakeoff_gold import load_questions

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "realtimeqa"
DEFAULT_BASELINES = "open_rag_gcs_gen,open_gpt3_gcs_gen,closed_t5_gen"


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
        import faiss  # noqa: PLC0415 (lazy: faiss)
        import torch  # noqa: PLC0415 (lazy: torch)

        torch.set_num_threads(args.threads)
        faiss.omp_set_num_threads(args.threads)

    from app.bootstrap.builders import open_database  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)

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
