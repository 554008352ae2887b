"""The names a run's models go by where one file times or prices several of them (a cost profile's points, a run's
probes, recommend.json's draft prefill lines): the target's, and a draft model's by its label."""
from __future__ import annotations

TARGET = "target"
_DRAFT = "draft:"


def draft_model(label: str) -> str:
    """A draft model's name, by its label (config draft[i].label)."""
    return f"{_DRAFT}{label}"


def label_of(name: str) -> str | None:
    """The label of a draft model's name; None for another name (the target's)."""
    return name[len(_DRAFT):] if name.startswith(_DRAFT) else None
