"""The Gemma reader's generation on PyTorch against CTranslate2, on the same served prompts.

    pip install --no-deps --target /tmp/ct2pkgs ctranslate2==4.8.5     # not a project dependency
    PYTHONPATH=/tmp/ct2pkgs .venv/bin/python bench/bench_reader_runtime.py --data ../shared/data/realtimeqa \
        [--passages 5 --words 100] [--questions 12] [--quantization int8,float32]

For each of the first `--questions` questions of March 2023, a prompt is built the way the served
reader builds it (`models.gemma_prompt.reader_context` with headlines, then `build_prompt`) over five
(`--passages`) passages of that month's articles, cut to `--words` words each. It prints the prompt
length in tokens, then, for PyTorch float32 and for each CTranslate2 quantisation of the same
converted Gemma folder: the p50 and the slowest time of a greedy generation of 16 tokens (two threads),
and on how many prompts the generated text equals PyTorch's. The PyTorch text is the reference.
Questions, passages and the time-filter do not matter here, only the runtime: the passages are not
retrieved, and answers are not scored.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from indexer.chunking import chunk_texts  # noqa: E402
from indexer.importers import read_realtimeqa  # noqa: E402
from models.gemma_prompt import build_prompt, reader_context  # noqa: E402
from models.gemma_weights import gemma_folder  # noqa: E402
from models.reader_base import RetrievedPassage  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "realtimeqa"
NEW_TOKENS = 16


def prompts_of(data: Path, n: int, passages: int, words: int) -> list[str]:
    articles, questions, _ = read_realtimeqa(data, since=dt.date(2023, 3, 1), until=dt.date(2023, 3, 31))
    articles = sorted(articles, key=lambda a: a.url)[: 12 * n]
    pool = [
        RetrievedPassage(title=a.title, text=body, published=a.published)
        for a, bodies in zip(articles, chunk_texts([a.text for a in articles]))
        for body in bodies[:2]
    ]
    out = []
    for i, q in enumerate([q for q in questions if q.text][:n]):
        read = reader_context(
            q.text, pool[i * passages : (i + 1) * passages], n_passages=passages, max_passage_words=words, titles=True
        )
        out.append(build_prompt(q.text, q.asked, read, None))
    return out


def timed(name: str, generate, prompts: list[str]) -> list[str]:
    generate(prompts[0])  # warm-up
    times, texts = [], []
    for prompt in prompts:
        t0 = time.perf_counter()
        texts.append(generate(prompt))
        times.append(time.perf_counter() - t0)
    print(f"{name:16s} p50 {statistics.median(times) * 1000:6.0f} ms   slowest {max(times) * 1000:6.0f} ms", flush=True)
    return texts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--questions", type=int, default=12)
    ap.add_argument("--passages", type=int, default=5)
    ap.add_argument("--words", type=int, default=100, help="words kept of each passage (the served default: 100)")
    ap.add_argument("--quantization", default="int8,float32", help="CTranslate2 quantisations, comma-separated")
    args = ap.parse_args()
    data = Path(args.data)
    if not data.is_dir():
        print(f"no RealTimeQA data at {data}: pass --data PATH", file=sys.stderr)
        return 2
    try:
        import ctranslate2  # noqa: PLC0415 (lazy: an optional package, checked here)
        from ctranslate2.converters import TransformersConverter  # noqa: PLC0415 (lazy: as above)
    except ImportError:
        print(
            "ctranslate2 is not installed: see this script's docstring (it is not a project dependency)",
            file=sys.stderr,
        )
        return 2
    import torch  # noqa: PLC0415 (lazy: torch)
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 (lazy: transformers)

    folder = gemma_folder(None)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    prompts = prompts_of(data, args.questions, args.passages, args.words)
    lengths = [len(tokenizer(p)["input_ids"]) for p in prompts]
    print(f"{len(prompts)} prompts: {statistics.median(lengths):.0f} tokens (median), {min(lengths)}-{max(lengths)}")
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager").eval()

    def on_torch(prompt: str) -> str:
        ids = tokenizer(prompt, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)

    reference = timed("torch float32", on_torch, prompts)
    with tempfile.TemporaryDirectory(prefix="ct2-") as tmp:
        for quantization in args.quantization.split(","):
            target = Path(tmp) / quantization
            t0 = time.perf_counter()
            TransformersConverter(str(folder), load_as_float16=False).convert(str(target), quantization=quantization)
            print(f"converted to CTranslate2 {quantization} in {time.perf_counter() - t0:.0f} s")
            generator = ctranslate2.Generator(str(target), device="cpu", inter_threads=1, intra_threads=2)

            def on_ct2(prompt: str, generator=generator) -> str:
                tokens = tokenizer.convert_ids_to_tokens(tokenizer(prompt)["input_ids"])
                result = generator.generate_batch(
                    [tokens], max_length=NEW_TOKENS, sampling_topk=1, include_prompt_in_result=False
                )
                return tokenizer.decode(result[0].sequences_ids[0], skip_special_tokens=True)

            texts = timed(f"ct2 {quantization}", on_ct2, prompts)
            same = sum(a.strip() == b.strip() for a, b in zip(reference, texts))
            print(f"   the same text as torch on {same} of {len(prompts)} prompts", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
