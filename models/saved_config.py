"""The JSON round trip of a model's frozen config dataclass (FiDConfig, SpanConfig, RankerConfig).

Its own module so that the reader modules and `models/trained.py` (which loads them) do not import
each other: the readers import this, and only `trained.py` imports the readers.
"""

from __future__ import annotations

import dataclasses


class SavedConfig:
    """For a model's frozen config dataclass: JSON out, and back in ignoring unknown keys (a config
    written by a newer version still loads)."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict):
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
