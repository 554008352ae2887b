"""What a serving target declares (#55): its settings (what the recommended choice becomes in that engine, or no
equivalent with why) and its acceptance form (per-position acceptance written in its form and read back). Either may
be absent: a benchmark tool with an acceptance file and no server has no settings."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable

from utils import UserError


class AcceptanceError(UserError, ValueError):
    """A file that is not an acceptance this reads: one line saying what is wrong (exit 2)."""


@dataclass(frozen=True)
class Choice:
    """The recommended speculation as every target reads it: our method, its K (gamma), the draft's label, the drafts
    by label (SimpleNamespace(kind, model): config.yaml's, the label standing for one not there) and the config's
    speculative options (a dict; a method's typed_options reads its own)."""
    method: str
    gamma: int
    draft: str | None
    drafts: dict[str, SimpleNamespace]
    options: dict

    @property
    def model(self) -> str | None:
        """The draft's model (a head's folder for a head), None without a draft."""
        return self.drafts[self.draft].model if self.draft else None

    @property
    def kind(self) -> str | None:
        return self.drafts[self.draft].kind if self.draft else None


@dataclass(frozen=True)
class Settings:
    """emit(choice) -> (the settings, notes); settings None: this engine has no form of that method here.
    no_equivalent: our method -> why the engine has none. off: the settings of speculation off. show(settings) and
    off_text: the printed line."""
    emit: Callable[[Choice], tuple[Any, list[str]]]
    show: Callable[[Any], str]
    off: Any
    off_text: str
    no_equivalent: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class AcceptanceForm:
    """Unconditional per-position rates r_1..r_K in a target's form. key: the JSON key that marks a file of this form,
    None for a text form (flags; a file not starting with `{`). export(rates) -> a dict (JSON) or a str (text);
    parse(data or text, where) -> rates, AcceptanceError where wrong. suffix: the exported file's name after the
    candidate's. describe: how the bad-input lines name it."""
    suffix: str
    key: str | None
    export: Callable[[list[float]], dict | str]
    parse: Callable[[Any, str], list[float]]
    describe: str


@dataclass(frozen=True)
class Target:
    name: str  # recommend.json's key
    title: str  # printed
    rank: int  # its place in recommend.json and the printed settings
    settings: Settings | None = None
    acceptance: AcceptanceForm | None = None


def rates_in(values, key: str, where: str) -> list[float]:
    """A list of rates in [0, 1], else AcceptanceError naming key."""
    if not (isinstance(values, list) and values and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                        and math.isfinite(x) and 0 <= x <= 1 for x in values)):
        raise AcceptanceError(f"{where}: {key} is {values!r}, not a list of rates in [0, 1]; write one rate per "
                              "draft position")
    return [float(x) for x in values]


def rises(rates: list[float]) -> bool:
    """Unconditional rates never rise: the first i + 1 drafts accepted is no likelier than the first i."""
    return any(b > a for a, b in zip(rates, rates[1:]))
