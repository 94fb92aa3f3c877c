"""What a Gemma reader reads: how often a gold answer lies in its prompt, and how long the prompt is,
for several ways of cutting the ranked passages, before any reader is trained on one.

    PYTHONPATH=. .venv/bin/python -m bench.bench_context --home "$SQA_HOME" \
        [--windows 2023-01-01:2023-03-31] [--recipes first:5x100,first:5x60,select:5:200] [--max-questions 0]

A reader cannot answer from what it does not read. Where a recipe puts an answer in fewer prompts than
the served one, a reader trained on it loses at least about that share of the questions times the
reader's accuracy on the ones it reads (about 60%); where it holds as many in fewer tokens, it reads
faster. This measures that bound in seconds, where a rolling test of a reader trained on the recipe
takes hours, so only a recipe that passes it is worth training.

Each question of the window (RealTimeQA's generation subset, as bench_quality asks them) retrieves
through the served pipeline over `--home` (SQA_* settings from the environment: the active re-ranker
re-ranks), every passage dated on or before the question. A recipe is

- `first:NxW`: the first W words of each of the first N passages (W=100, N=5: the trained default);
- `select:N:B`: the sentences of the first N passages that bear on the question, B words in all
  (models.reader_context.select_context, SQA_READER_CONTEXT_WORDS=B).

Headlines are printed as the trained default prints them (`--no-titles`: without). For each recipe it
prints the share of questions whose gold answer string the prompt holds (dates left out), the prompt's
Gemma tokens (median and mean), and the questions it gains and loses against the first recipe.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.served_questions import NotReady, open_served, parse_windows, window_questions  # noqa: E402
from evaluation.metrics import answer_in_text  # noqa: E402
from models.gemma_prompt import build_prompt, reader_context  # noqa: E402
from models.gemma_weights import gemma_folder  # noqa: E402
from settings import Settings  # noqa: E402

DEFAULT_RECIPES = "first:5x100,first:5x80,first:5x60,first:4x100,first:3x100,select:5:200,select:5:450,select:10:550"


@dataclass(frozen=True)
class Recipe:
    name: str
    passages: int
    words: int = 100  # per passage (first:)
    context_words: int = 0  # in all (select:); 0: the first `words` of each

    def read(self, question: str, ranked, *, titles: bool):
        """What a reader of this recipe reads of the `ranked` passages (as `build_prompt(..., None)` prints)."""
        return reader_context(
            question,
            ranked,
            n_passages=self.passages,
            max_passage_words=self.words,
            context_words=self.context_words,
            titles=titles,
        )


def parse_recipe(text: str) -> Recipe:
    """ "first:5x100" or "select:10:550"; ValueError naming the accepted forms otherwise."""
    kind, _, rest = text.strip().partition(":")
    try:
        if kind == "first":
            n, w = (int(x) for x in rest.split("x"))
            if n >= 1 and w >= 1:
                return Recipe(text.strip(), n, words=w)
        elif kind == "select":
            n, b = (int(x) for x in rest.split(":"))
            if n >= 1 and b >= 1:
                return Recipe(text.strip(), n, context_words=b)
    except ValueError:
        pass
    raise ValueError(f"recipe {text!r}: use first:NxW (N passages, W words each) or select:N:B (B words in all)")


def recipes_argument(text: str) -> list[Recipe]:
    try:
        return [parse_recipe(r) for r in text.split(",") if r.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def measure(questions, ranked_of, recipes: list[Recipe], count_tokens, *, titles: bool) -> list[dict]:
    """Per recipe: {"recipe", "held" (qids whose answer the prompt holds), "tokens" (per question)};
    `ranked_of(q)` gives a question's ranked passages, `count_tokens(prompt)` a prompt's length."""
    rows = [{"recipe": r.name, "held": set(), "tokens": []} for r in recipes]
    for q in questions:
        ranked = ranked_of(q)
        for recipe, row in zip(recipes, rows):
            read = recipe.read(q.text, ranked, titles=titles)
            if any(answer_in_text(list(q.answers), p.text) for p in read):
                row["held"].add(q.qid)
            row["tokens"].append(count_tokens(build_prompt(q.text, q.asked, read, None)))
    return rows


def print_rows(rows: list[dict], n: int) -> None:
    first = rows[0]
    base_tokens = statistics.mean(first["tokens"]) if first["tokens"] else 0.0
    print(f"{'recipe':16s} {'answer read':>11s} {'tokens p50':>10s} {'mean':>6s} {'vs first':>8s}  gained / lost")
    for row in rows:
        mean = statistics.mean(row["tokens"]) if row["tokens"] else 0.0
        gained, lost = len(row["held"] - first["held"]), len(first["held"] - row["held"])
        print(
            f"{row['recipe']:16s} {100 * len(row['held']) / n:10.1f}% {statistics.median(row['tokens']):10.0f} "
            f"{mean:6.0f} {mean / base_tokens if base_tokens else 0:7.2f}x  {gained} / {lost}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", required=True, help="an ingested SQA_HOME")
    ap.add_argument("--windows", type=parse_windows, default=parse_windows("2023-01-01:2023-03-31"))
    ap.add_argument("--recipes", type=recipes_argument, default=recipes_argument(DEFAULT_RECIPES))
    ap.add_argument("--max-questions", type=int, default=0, help="a seeded sample per window (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-titles", action="store_true", help="passages without their headlines")
    args = ap.parse_args(argv)
    try:
        db, service, snap = open_served(Path(args.home), reader="first-entity")
    except NotReady as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer  # noqa: PLC0415 (lazy: slow to import; reads the offline flags open_served set)

    depth = max(r.passages for r in args.recipes)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gemma_folder(Settings(home=Path(args.home)).models_dir / "base"))
        with db.sessions() as session:
            for first, last in args.windows:
                questions, _ = window_questions(db, first, last, args.max_questions, args.seed)
                if not questions:
                    print(f"{first}..{last}: no questions (imported?)")
                    continue

                def ranked_of(q, session=session):
                    found = service.retriever.retrieve(session, snap, q.text, q.asked, depth)
                    assert all(p.published <= q.asked for p in found), "a passage published after the question date"
                    return found

                rows = measure(
                    questions,
                    ranked_of,
                    args.recipes,
                    lambda prompt: len(tokenizer(prompt)["input_ids"]),
                    titles=not args.no_titles,
                )
                print(f"\n{first}..{last}: {len(questions)} questions, retriever {service.retriever.name}")
                print_rows(rows, len(questions))
    finally:
        db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
