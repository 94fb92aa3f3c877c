"""The served Gemma reader on PyTorch against llama.cpp, on the same questions and passages.

    .venv/bin/python -m bench.bench_reader_llama [--data ../shared/data/realtimeqa] [--questions 24]
        [--version-folder $SQA_HOME/models/VERSION --types q8_0,f16]

For each of the first `--questions` questions of March 2023 it reads five (`--passages`) passages of
that month's articles published on or before the question's date, as the served reader reads them
(`reader.generate`: the prompt with headlines, 100 words a passage, greedy decoding, the first line,
its confidence). Readers, each on the same inputs, two threads:

- the packaged base (zero-shot): PyTorch float32, PyTorch bfloat16 where the CPU computes it natively
  (what SQA_READER_PRECISION=auto picks there), llama.cpp on the shipped Q4_K_M GGUF;
- with `--version-folder`, a trained version: PyTorch as above, and llama.cpp on its export in each
  of `--types` (written into the folder on first use, as serving does).

It prints each reader's p50 and p95 per answer, and on how many questions its answer is PyTorch
float32's. Answers are not scored here: `bench.bench_quality` with SQA_READER_RUNTIME=torch and
=llama.cpp, paired by `bench.compare_quality`, says whether EM moves. To see a CPU without AVX512 on
one that has it: `ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2` for PyTorch, and llama-cpp-python
built with `CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from indexer.chunking import chunk_texts
from indexer.importers import read_realtimeqa
from models.gemma_weights import native_bfloat16
from models.reader_base import ReaderAnswer, RetrievedPassage

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "realtimeqa"
Item = tuple[str, dt.date, list[RetrievedPassage]]


def items_of(data: Path, n: int, passages: int) -> list[Item]:
    """(question, date, passages) for the first `n` questions of March 2023 with a text: a fixed
    draw of that month's (and February's) article passages published on or before each date."""
    articles, questions, _ = read_realtimeqa(data, since=dt.date(2023, 2, 1), until=dt.date(2023, 3, 31))
    articles = sorted(articles, key=lambda a: a.url)
    pool = [
        RetrievedPassage(title=a.title, text=bodies[0], published=a.published)
        for a, bodies in zip(articles, chunk_texts([a.text for a in articles]))
        if bodies
    ]
    asked = [q for q in questions if q.text and q.asked >= dt.date(2023, 3, 1)][:n]
    out = []
    for i, q in enumerate(asked):
        before = [p for p in pool if p.published <= q.asked]
        start = (i * passages) % max(1, len(before) - passages)
        out.append((q.text, q.asked, before[start : start + passages]))
    return out


def timed(name: str, read: Callable[[str, dt.date, list[RetrievedPassage]], ReaderAnswer], items: list[Item]):
    read(*items[0])  # warm-up
    times, answers = [], []
    for item in items:
        t0 = time.perf_counter()
        answers.append(read(*item))
        times.append(time.perf_counter() - t0)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    print(f"{name:34s} p50 {statistics.median(times) * 1000:6.0f} ms   p95 {p95 * 1000:6.0f} ms", flush=True)
    return answers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--questions", type=int, default=24)
    ap.add_argument("--passages", type=int, default=5)
    ap.add_argument("--version-folder", default="", help="a trained Gemma version's folder (SQA_HOME/models/NAME)")
    ap.add_argument(
        "--types",
        default="auto",
        help="its export's weight types, comma-separated (auto, f32, q8_0, f16, bf16; auto: what serving picks here)",
    )
    args = ap.parse_args()
    data = Path(args.data)
    if not data.is_dir():
        print(f"no RealTimeQA data at {data}: pass --data PATH", file=sys.stderr)
        return 2
    import torch  # noqa: PLC0415 (lazy: torch, after the argument checks)

    from models.gemma_gguf import resolve_weight_type  # noqa: PLC0415 (lazy: as above)
    from models.gemma_train import GemmaModel, llama_reader  # noqa: PLC0415 (lazy: imports torch)
    from models.readers import load_reader  # noqa: PLC0415 (lazy: as above)

    try:  # the same refusals as serving (q8_0 on an AMX CPU crashes llama.cpp 0.3.36)
        types = [resolve_weight_type(t.strip()) for t in args.types.split(",") if t.strip()]
    except ValueError as exc:
        print(f"error: --types: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(2)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    items = items_of(data, args.questions, args.passages)
    print(f"{len(items)} questions, {args.passages} passages each; CPU bfloat16 native: {native_bfloat16()}")
    precisions = ["float32", "bfloat16"] if native_bfloat16() else ["float32"]
    readers: list[tuple[str, Callable[[], object]]] = [
        (f"base, torch {p}", lambda p=p: load_reader("gemma", max_passages=args.passages, precision=p, runtime="torch"))
        for p in precisions
    ]
    readers.append(
        ("base, llama.cpp Q4_K_M", lambda: load_reader("gemma", max_passages=args.passages, runtime="llama.cpp"))
    )
    if args.version_folder:
        folder = Path(args.version_folder)
        readers += [
            (
                f"{folder.name}, torch {p}",
                lambda p=p: GemmaModel.load(folder).into_reader(
                    name=folder.name, n_passages=args.passages, precision=p
                ),
            )
            for p in precisions
        ]
        readers += [
            (
                f"{folder.name}, llama.cpp {t}",
                lambda t=t: llama_reader(folder, name=folder.name, n_passages=args.passages, weight_type=t),
            )
            for t in types
        ]
    reference: dict[str, list[str]] = {}
    for name, load in readers:
        t0 = time.perf_counter()
        reader = load()
        print(f"{name}: loaded in {time.perf_counter() - t0:.1f} s", flush=True)
        answers = [a.text for a in timed(name, reader.generate, items)]  # type: ignore[attr-defined]
        group = name.split(",")[0]
        if group not in reference:
            reference[group] = answers  # torch float32 comes first in each group
        else:
            same = sum(a == b for a, b in zip(answers, reference[group]))
            print(f"{'':34s} the answer of torch float32 on {same} of {len(items)}", flush=True)
        del reader
    return 0


if __name__ == "__main__":
    sys.exit(main())
