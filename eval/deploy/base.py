"""What a serving target declares (#55): its settings (what the recommended choice becomes in that engine, or no
equivalent with why) and its acceptance form (per-position acceptance written in its form and read back). Either may
be absent: a benchmark tool with an acceptance file and no server has no settings."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
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

    def model_for(self, loads: str, engine: str) -> tuple[str | None, list[str]]:
        """The draft as an engine that loads `loads` ("gguf": a GGUF file; "hf": a transformers folder or hub id) is
        given it, and notes saying what the user must do where the config's model is not that (engine: its title)."""
        return loadable(self.drafts[self.draft], loads, engine, self.draft) if self.draft else (None, [])


GGUF, HF = "gguf", "hf"


def loadable(draft: SimpleNamespace, loads: str, engine: str, label: str) -> tuple[str, list[str]]:
    """(what the engine loads for a draft entry of config.yaml (model, and gguf_file where given), notes). The config
    names what our engine loads, which is not always what a server loads: a synthetic model exists only in the
    process that built it; an offline short name is a GGUF shipped in packages that our engine converts to a
    transformers folder; a GGUF is one engine's form, a folder or hub id another's (each target says which it loads).
    Where the engine cannot load the model as given, a placeholder path stands in its place and a note says how to
    make the file."""
    from utils.offline_models import OFFLINE_MODELS, cache_root

    model, gguf_file = str(draft.model), getattr(draft, "gguf_file", None)
    if model.startswith("synthetic:"):
        return model, [f"{engine}: the draft {model} is built in the process that runs it (random weights of a "
                       "shape): no server loads it; save it (save_pretrained) and give that folder"
                       + (", converted to GGUF," if loads == GGUF else "") + " in its place"]
    if model in OFFLINE_MODELS:
        hub_id = OFFLINE_MODELS[model].hub_id.split()[0]
        if loads == GGUF:
            path = str(cache_root() / f"{model}.gguf")
            return path, [f"{engine}: the draft {model} is an offline model; its GGUF is {path} once joined (python -c "
                          f"\"from utils.offline_models import offline_gguf; offline_gguf('{model}')\")"]
        path = str(cache_root() / model)
        return path, [f"{engine}: the draft {model} is an offline model; {path} is its transformers copy (converted "
                      f"from its quantized GGUF, the weights the run measured; {hub_id} on the hub is the original)"]
    is_gguf = model.endswith(".gguf") or bool(gguf_file)
    gguf_path = model if model.endswith(".gguf") else f"{model.rstrip('/')}/{gguf_file}" if gguf_file else None
    if loads == GGUF and is_gguf:
        return gguf_path, ([] if Path(model).expanduser().exists() else
                           [f"{engine}: {gguf_path} is a file of the hub repository {model}; download it and give "
                            "its local path"] if gguf_file else [])
    if loads == HF and not is_gguf:
        return model, []
    if loads == GGUF:
        path = f"{label}.gguf"
        return path, [f"{engine}: the draft {model} is no GGUF file and llama-server loads GGUF only: convert it "
                      f"(llama.cpp's convert_hf_to_gguf.py {model} --outfile {path}) and give that file in place of "
                      f"{path}"]
    path = f"{label}-hf"
    return path, [f"{engine}: the draft {gguf_path} is a GGUF file and {engine} loads a transformers folder or hub id: "
                  f"convert it (transformers' from_pretrained(..., gguf_file=...) then save_pretrained('{path}')), "
                  f"or give the model's original folder or hub id, in place of {path}"]


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
    # an engine that takes K by batch size: (its settings at the largest K, [[lo, hi, K], ...] inclusive ranges of rows
    # from 1, the last K held above the last range) -> (its settings with that table, notes); None: one K a server
    per_batch_size: Callable[[Any, list[list[int]]], tuple[Any, list[str]]] | None = None


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
