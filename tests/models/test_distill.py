"""The distilled passage tower (`models/distill.py`): layers checked, batches cover an epoch once,
training moves the student toward MiniLM's vectors, and an interrupted run resumes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.distill import DistillConfig, cosine_figures, distill, epoch_batches, parse_layers, student_tower
from models.encoders import SentenceTransformerEncoder, packaged_minilm_path

TEXTS = [
    f"Monday, May {d}, 2024. {who} won the {sport} final in {town} on {day}, the {n}th title of the club."
    for d, (who, sport, town, day, n) in enumerate(
        [
            ("Ada Quist", "chess", "Leeds", "Sunday", 4),
            ("Bram Oyelaran", "rowing", "Lagos", "Saturday", 7),
            ("Cato Venn", "curling", "Perth", "Friday", 9),
            ("Dora Maelstrom", "fencing", "Oslo", "Thursday", 5),
            ("Egon Pratt", "darts", "Cork", "Monday", 11),
            ("Fay Lindqvist", "squash", "Turku", "Tuesday", 6),
            ("Gus Amadi", "judo", "Accra", "Wednesday", 8),
            ("Hana Ito", "karate", "Kobe", "Sunday", 12),
        ]
        * 3,
        start=1,
    )
]


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("0,5", None),
        ("5,0", "increasing"),
        ("0,6", "increasing numbers in 0..5"),
        ("a,b", "comma-separated"),
        ("", "comma"),
    ],
)
def test_layers_are_checked(text, fragment):
    if fragment is None:
        assert parse_layers(text) == (0, 5)
        return
    with pytest.raises(ValueError, match=fragment):
        parse_layers(text)


def test_an_epochs_batches_hold_every_passage_once_and_are_seeded():
    texts = [("x" * (i * 7 % 50)) for i in range(203)]
    batches = epoch_batches(texts, 8, seed=3)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(203)) and len(batches) == 26
    assert all(np.array_equal(a, b) for a, b in zip(batches, epoch_batches(texts, 8, seed=3)))
    assert not all(np.array_equal(a, b) for a, b in zip(batches, epoch_batches(texts, 8, seed=4)))
    # within a batch the lengths are close: sorted within runs of 50 batches
    spread = np.mean([np.ptp([len(texts[i]) for i in b]) for b in batches])
    assert spread < 20, spread


@pytest.mark.integration
def test_training_moves_the_student_toward_minilm_and_an_interrupted_run_resumes(tmp_path):
    torch.set_num_threads(1)
    teacher = SentenceTransformerEncoder.packaged()
    targets = teacher.encode_passages(TEXTS)
    train, held = TEXTS[:20], TEXTS[20:]
    cfg = DistillConfig(layers=(0,), batch_size=4, lr=5e-4, epochs=3, warmup_steps=1, checkpoint_every=2)

    class Stop(Exception):
        pass

    def stop_at_step_6(fraction, message):
        if message.startswith("step 6/"):
            raise Stop

    student = student_tower(packaged_minilm_path(), layers=cfg.layers)
    assert student[0].auto_model.config.num_hidden_layers == 1
    with pytest.raises(Stop):
        distill(student, train, targets[:20], held, targets[20:], tmp_path, cfg, report=stop_at_step_6)
    # a new process: a fresh student resumes from the checkpoint of step 6
    seen = []
    student = student_tower(packaged_minilm_path(), layers=cfg.layers)
    result = distill(
        student, train, targets[:20], held, targets[20:], tmp_path, cfg, report=lambda f, m: seen.append(m)
    )
    assert result.steps == 15 and not result.stopped
    assert seen and not any(m.startswith(("before", "step 2/", "step 4/")) for m in seen)  # resumed, not begun again
    assert result.after["cos_mean"] > result.before["cos_mean"] + 0.05, (result.before, result.after)
    assert result.after == cosine_figures(student, held, targets[20:])
    with pytest.raises(ValueError, match="need as many"):
        distill(student, train, targets[:19], held, targets[20:], tmp_path / "other", cfg)
