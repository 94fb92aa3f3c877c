"""Would readers that work together answer better? (issue 18, item 4): the served generator's answer
reconciled with other answers the same pipeline can propose, the combination learned on one window
of questions and scored on another.

    .venv/bin/python -m bench.bench_reconcile --home "$SQA_HOME" --out /tmp/reconcile.json

For each question of the two windows (default: 2023-03, the month the training after ingest holds
back, and 2023-04..06, the reporting quarter; RealTimeQA's generation subset), over the served
pipeline (app.bootstrap.builders.build_answer_service with the environment's SQA_* settings):

- the served answer: the reader on the top `n` passages (n = the reader's own number, 3 for Gemma);
- the same reader on passages n+1..2n and 2n+1..3n (windows 2 and 3): other answers it would give;
- the ranker's candidates: the spaCy entities of the top 3n passages (models.candidates, with the
  entity ranker's features), at most --max-candidates, in passage order;
- the generator's log-probability of every proposed answer (" <answer>\\n" after the prompt) under
  each window's prompt (Gemma readers only: the model scores what it did not write).

It then prints EM/F1 of the served answer, the oracles (the best window's answer; the best of the
window answers and the candidates), and a logistic regression that picks one answer per question
from features of the answers (window, log-probabilities, agreement between windows, the entity
ranker's features), fitted on one window and scored on the other, both ways.

Every question's record is appended to `<out>.partial.jsonl`; a rerun with the same --out resumes.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from bench.served_questions import parse_windows
from evaluation.bakeoff import generation_subset, score
from evaluation.metrics import exact_match, normalize_answer
from models.candidates import annotate_passages, candidates, features, question_type
from models.gemma_prompt import build_prompt
from models.ranker import passage_bodies, ranker_item
from models.selflabel.generate import load_nlp
from settings import Settings
from workers.bakeoff_gold import load_questions

DEFAULT_WINDOWS = "2023-03-01:2023-03-31,2023-04-01:2023-06-30"
N_WINDOWS = 3


def score_continuations(model, tokenizer, prompt: str, answers: list[str]) -> list[float]:
    """The mean log-probability per token of " <answer>\\n" after `prompt`, for each answer: one
    forward pass over the prompt, then all answers at once from its cache."""
    import torch  # noqa: PLC0415 (lazy: torch)

    if not answers:
        return []
    with torch.inference_mode():
        enc = tokenizer(prompt, return_tensors="pt")
        out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], use_cache=True)
        first = torch.log_softmax(out.logits[:, -1].float(), -1)[0]
        ids = [tokenizer(f" {a.strip()}\n", add_special_tokens=False)["input_ids"] for a in answers]
        width = max(len(x) for x in ids)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        batch = torch.tensor([x + [pad] * (width - len(x)) for x in ids])
        mask = torch.cat(
            [
                torch.ones(len(ids), enc["input_ids"].shape[1], dtype=torch.long),
                torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids]),
            ],
            1,
        )
        past = copy.deepcopy(out.past_key_values)
        past.batch_repeat_interleave(len(ids))
        logp = torch.log_softmax(model(input_ids=batch, attention_mask=mask, past_key_values=past).logits.float(), -1)
    return [
        (float(first[x[0]]) + sum(float(logp[i, j, x[j + 1]]) for j in range(len(x) - 1))) / len(x)
        for i, x in enumerate(ids)
    ]


def measure(service, session, snap, q, nlp, *, max_candidates: int) -> dict:
    """One question's record: the window answers, the candidates and the log-probability matrix."""
    reader = service.reader
    n = service.passages_for(reader)
    found = service.retriever.retrieve(session, snap, q.text, q.asked, N_WINDOWS * n)
    passages = list(found)
    windows = [passages[w * n : (w + 1) * n] for w in range(N_WINDOWS)]
    gens = [reader.generate(q.text, q.asked, part).text if part else "" for part in windows]
    item = ranker_item(
        q.text,
        q.asked,
        annotate_passages(nlp, passage_bodies(passages)),
        [p.published for p in passages],
        qid=q.qid,
        answers=q.answers,
    )
    wh, head = question_type(q.text)
    cands = sorted(candidates(item), key=lambda c: (c.first_rank, -c.count))[:max_candidates]
    proposed = [a for a in dict.fromkeys([*gens, *(c.text for c in cands)]) if normalize_answer(a)]
    lp = {}
    if hasattr(reader, "tokenizer"):  # a Gemma reader: it scores every proposal under each window
        for w, part in enumerate(windows):
            if part:
                prompt = build_prompt(q.text, q.asked, reader.context(q.text, part), None)
                lp[w] = dict(zip(proposed, score_continuations(reader.model, reader.tokenizer, prompt, proposed)))
    return {
        "qid": q.qid,
        "answers": list(q.answers),
        "gens": gens,
        "cands": [{"text": c.text, "feat": features(item, c, wh, head, use_score=False)} for c in cands],
        "lp": {str(w): v for w, v in lp.items()},
    }


def answer_rows(r: dict, *, with_candidates: bool) -> list[tuple[str, dict]]:
    """(answer, features) for each distinct proposed answer of a record."""
    norm = [normalize_answer(g) for g in r["gens"]]
    ents = {normalize_answer(c["text"]): c for c in r["cands"]}
    texts = [*r["gens"], *(c["text"] for c in r["cands"] if with_candidates)]
    rows, seen = [], set()
    for text in texts:
        key = normalize_answer(text)
        if not key or key in seen:
            continue
        seen.add(key)
        lps = [r["lp"][w][text] for w in sorted(r["lp"]) if text in r["lp"][w]] or [-10.0]
        window = norm.index(key) if key in norm else None  # the first window that wrote it
        own = r["lp"].get(str(window), {}).get(text, lps[0]) if window is not None else lps[0]
        f = {
            f"window={window + 1 if window is not None else 0}": 1.0,
            "agree": float(norm.count(key)),
            "lp_w1": lps[0],
            "lp_own": own,
            "lp_max": max(lps),
            "lp_mean": float(np.mean(lps)),
            "lp_w1_gap": lps[0] - max((r["lp"]["0"][t] for t in r["lp"].get("0", {})), default=lps[0]),
            "entity": float(key in ents),
        }
        if key in ents:
            f.update({f"e:{k}": v for k, v in ents[key]["feat"].items()})
        rows.append((text, f))
    return rows


def pick_learned(train: list[dict], test: list[dict], *, with_candidates: bool, c: float = 0.3) -> list[str]:
    from sklearn.feature_extraction import DictVectorizer  # noqa: PLC0415 (lazy: sklearn)
    from sklearn.linear_model import LogisticRegression  # noqa: PLC0415 (lazy: sklearn)

    x, y = [], []
    for r in train:
        for text, f in answer_rows(r, with_candidates=with_candidates):
            x.append(f)
            y.append(exact_match(text, r["answers"]))
    if len(set(y)) < 2:
        return [r["gens"][0] for r in test]
    vec = DictVectorizer()
    model = LogisticRegression(C=c, max_iter=5000).fit(vec.fit_transform(x), y)
    out = []
    for r in test:
        rows = answer_rows(r, with_candidates=with_candidates)
        if not rows:
            out.append(r["gens"][0])
            continue
        p = model.predict_proba(vec.transform([f for _, f in rows]))[:, 1]
        out.append(rows[int(np.argmax(p))][0])
    return out


def em_f1(predictions: list[str], records: list[dict]) -> tuple[float, float]:
    """EM and F1 in percent, scored as bench_quality scores (evaluation.bakeoff.score)."""
    questions = [SimpleNamespace(qid=r["qid"], answers=r["answers"]) for r in records]
    s = score({r["qid"]: p for p, r in zip(predictions, records)}, questions)
    return round(100 * s["em"], 1), round(100 * s["f1"], 1)


def summarise(label: str, records: list[dict], other: list[dict], other_label: str) -> dict:
    served = [r["gens"][0] for r in records]
    oracle_windows = [
        max((g for g in r["gens"] if g), key=lambda g: exact_match(g, r["answers"]), default="") for r in records
    ]
    oracle_all = [
        max(
            [*(g for g in r["gens"] if g), *(c["text"] for c in r["cands"])] or [""],
            key=lambda a: exact_match(a, r["answers"]),
        )
        for r in records
    ]
    rows = {
        "served answer (window 1)": em_f1(served, records),
        "oracle: best window": em_f1(oracle_windows, records),
        "oracle: best of windows and candidates": em_f1(oracle_all, records),
    }
    for cands in (False, True):
        name = f"learned on {other_label}: windows{' + candidates' if cands else ''}"
        predicted = pick_learned(other, records, with_candidates=cands)
        rows[name] = (*em_f1(predicted, records), sum(p != s for p, s in zip(predicted, served)))
    print(f"\n{label}: {len(records)} questions")
    for name, v in rows.items():
        changed = f"  ({v[2]} answers changed)" if len(v) > 2 else ""
        print(f"  {name:48s} EM {v[0]:5.1f}  F1 {v[1]:5.1f}{changed}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", default=os.environ.get("SQA_HOME", ".sqa"))
    ap.add_argument("--windows", default=DEFAULT_WINDOWS, help="two FIRST:LAST question windows")
    ap.add_argument("--max-questions", type=int, default=0, help="a --seed sample per window (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-candidates", type=int, default=12)
    ap.add_argument("--out", help="write the figures here (JSON); records cached in <out>.partial.jsonl")
    args = ap.parse_args(argv)
    try:
        windows = parse_windows(args.windows)
    except ValueError as exc:
        ap.error(str(exc))
    if len(windows) != 2:
        ap.error("--windows takes exactly two windows: each is scored with the combination learned on the other")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    home = Path(args.home)
    if not (home / "sqa.db").exists() and "SQA_DATABASE_URL" not in os.environ:
        print(
            f"error: {home} holds no database: import and ingest the RealTimeQA slice first "
            "(../shared/data/realtimeqa; see README)",
            file=sys.stderr,
        )
        return 2

    from app.bootstrap.builders import build_answer_service, build_encoder, open_database  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)

    settings = Settings(home=home)
    db = open_database(settings, migrate=False)
    partial = Path(args.out + ".partial.jsonl") if args.out else None
    cached = {}
    if partial is not None and partial.exists():
        cached = {(r["reader"], r["qid"]): r for r in map(json.loads, partial.read_text().splitlines())}
    try:
        service = build_answer_service(settings, db, build_encoder(settings))
        if not service.index_state.refresh() and service.index_state.current() is None:
            print(f"error: no index snapshot in {home}: run `sqa ingest` first", file=sys.stderr)
            return 2
        snap, reader, nlp = service.index_state.current(), service.reader, load_nlp()
        print(
            f"served pipeline: retriever {service.retriever.name}, reader {reader.name} "
            f"({service.passages_for(reader)} passages a window, {N_WINDOWS} windows)"
        )
        per_window = []
        for first, last in windows:
            kept, _ = generation_subset(load_questions(db.sessions, first, last))
            questions = sorted(kept, key=lambda q: (q.asked, q.qid))
            if args.max_questions and len(questions) > args.max_questions:
                questions = sorted(
                    random.Random(args.seed).sample(questions, args.max_questions), key=lambda q: (q.asked, q.qid)
                )
            records, t0 = [], time.perf_counter()
            for i, q in enumerate(questions, 1):
                r = cached.get((reader.name, q.qid))
                if r is None:
                    with db.sessions() as session:
                        r = {
                            "reader": reader.name,
                            **measure(service, session, snap, q, nlp, max_candidates=args.max_candidates),
                        }
                    if partial is not None:
                        with open(partial, "a") as fh:
                            fh.write(json.dumps(r) + "\n")
                records.append(r)
                if i % 25 == 0 or i == len(questions):
                    print(
                        f"  {first}..{last}: {i}/{len(questions)} questions, {time.perf_counter() - t0:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
            per_window.append((f"{first}..{last}", records))
    finally:
        db.close()
    (a_label, a), (b_label, b) = per_window
    results = {a_label: summarise(a_label, a, b, b_label), b_label: summarise(b_label, b, a, a_label)}
    if args.out:
        Path(args.out).write_text(json.dumps({"reader": reader.name, "windows": results}, indent=1) + "\n")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
