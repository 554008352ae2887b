"""The engine contract: what the experiment (runner/experiment.py) asks of every engine in runner/engines/ENGINES.

An engine runs the points of its methods (decode.methods MethodSpec.engine == its name). The experiment makes every
engine the config uses, has each check what it can before any model loads (check), starts the home engine (the one
that loads the prompts and tokenizer: Engine.home, runner/engines/__init__.py HOME) and then the others with its
loaded session, and in each repeat hands each engine the units that have points of its methods (run), releasing the others first
where an engine loads its own copies of the models (exclusive). An engine yields each unit finished (a producer) and
never calls back into the experiment: the experiment alone keeps what they bring.

What an engine can do is its caps (its reference method's EngineCaps), which the rest of the tool asks instead of its
name. The name is still a key outside these files: records and progress.json's engine_info are keyed by it, and
progress.json's processes entry of another engine's drift probe carries it (eval/records.py probe_engine), so that
eval/flags.py probe_drift reads each engine's readings for its own points."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from decode.methods import ENGINE_CAPS, REGISTRY, EngineCaps, reference_method

if TYPE_CHECKING:
    import torch

    from runner.plan import Unit
    from runner.records import UnitResult
    from utils.config import Config


class _Declared:
    """Engine.caps and Engine.home, read from the engine's reference method (decode.methods ENGINE_CAPS): declared
    there once, for eval (which reads no runner/) and the runner alike."""

    def __init__(self, field: str | None = None):
        self.field = field

    def __get__(self, engine, cls) -> EngineCaps | bool:
        caps = ENGINE_CAPS.get(cls.name, EngineCaps())
        return caps if self.field is None else getattr(caps, self.field)


class Engine(ABC):
    name: ClassVar[str]  # the MethodSpec.engine of its methods
    title: ClassVar[str]  # how notes and the status line name it
    caps = _Declared()  # what it can do (EngineCaps: times its forwards, probes numerics, compiles ...)
    home = _Declared("home")  # loads the prompts and tokenizer (start(None)); runs first in each repeat
    exclusive: ClassVar[bool] = False  # loads its own copies of the models: the other engines release theirs first

    def __init__(self, config: Config, device: torch.device, out_dir: Path, raw_config: dict, status=None):
        self.config, self.device, self.out_dir, self.raw_config, self.status = config, device, Path(out_dir), \
            raw_config, status
        self.session = None  # the loaded prompts and tokenizer (and, for the home engine, its models)
        self.environments: list[tuple[dict, str]] = []  # (env.json entry, process) of each process it ran in
        self.workers_info: dict = {}  # progress.json workers: what each of its workers ran on
        self.notes: list[str] = []  # notes for the report, found as it started

    @classmethod
    def used_by(cls, config: Config) -> bool:
        """Whether a method of this engine is in the config's methods."""
        return any(REGISTRY[m].engine == cls.name for m in config.methods)

    @property
    def reference(self) -> str:
        """The method every ratio of this engine's points is computed against."""
        return reference_method(self.name)

    @property
    def num_prompts(self) -> int:
        return len(self.session.prompt_set.prompts)

    def check(self) -> dict | None:
        """Before any model loads: refuse (UserError, one line) what this engine cannot run; what env.json records
        of its environment under its name (None: nothing)."""
        return None

    @abstractmethod
    def start(self, session) -> None:
        """Ready to run units. session: the home engine's loaded session (prompts, tokenizer); None for the home
        engine itself, which loads it (self.session)."""

    @abstractmethod
    def run(self, units: list[Unit], done: set) -> Iterator[tuple[Unit, UnitResult]]:
        """Each unit's points of this engine's methods not in `done` (Point.key + (repeat, batch_index)), yielded as
        each unit finishes."""

    def release(self, by: Engine) -> str | None:
        """Free this engine's models while the exclusive engine `by` runs (run() loads them again); a note for the
        report when something was released."""
        return None

    def info(self) -> dict:
        """What progress.json keeps of this engine under engine_info[name] (version, pairing, order ...); {}:
        nothing."""
        return {}

    def close(self) -> None:
        """Nothing of this engine left running (processes, workers); called once, after the sweep or on a failure."""
