"""The settings spell out evaluation/drift.py's feature kinds and measures (so that app/core imports
nothing from evaluation/): they must stay the same names, with the same messages."""
from __future__ import annotations

import typing

import pytest

from app.core.config import DRIFT_FEATURE_KINDS, Settings, parse_drift_features
from evaluation.drift import DRIFT_MEASURES, FEATURE_KINDS, parse_features


def test_config_drift_feature_kinds_equal_evaluation_drift():
    assert DRIFT_FEATURE_KINDS == FEATURE_KINDS


def test_config_drift_measure_choices_equal_evaluation_drift():
    choices = typing.get_args(Settings.model_fields["drift_measure"].annotation)
    assert sorted(choices) == sorted(DRIFT_MEASURES) and len(choices) == len(DRIFT_MEASURES)


@pytest.mark.parametrize("value", ["words", "entities", "entities, words", " WORDS ,", "words,,entities"])
def test_config_parse_drift_features_agrees_with_evaluation_drift(value):
    assert parse_drift_features(value) == parse_features(value)


@pytest.mark.parametrize("value", ["topics", "words,topics", "zeta,alpha", "", " , "])
def test_config_parse_drift_features_refuses_with_evaluation_drift_message(value):
    with pytest.raises(ValueError) as expected:
        parse_features(value)
    with pytest.raises(ValueError) as got:
        parse_drift_features(value)
    assert str(got.value) == str(expected.value)

