"""The serving targets a recommendation is emitted for (#55): each is a TARGET (base.py's Target) that declares its
settings and its acceptance form, in a module here (an engine this benchmark does not run: SGLang, SpecDec Bench) or
in the file an engine's declaration names (its TARGET, beside it in runner/engines/<name>/, loaded by its path as the
declaration is): adding a target is one file. eval/deploy.py, eval/acceptance_io.py and eval/recommend.py iterate
TARGETS and name none."""
from __future__ import annotations

import importlib
import pkgutil

from decode.methods import DECLARATIONS, engine_file
from eval.targets.base import AcceptanceError, AcceptanceForm, Choice, Settings, Target


def _targets() -> dict[str, Target]:
    found = [importlib.import_module(f"{__name__}.{module.name}").TARGET
             for module in pkgutil.iter_modules(__path__) if not module.ispkg and module.name != "base"]
    found += [engine_file(engine, d.TARGET).TARGET for engine, d in DECLARATIONS.items() if getattr(d, "TARGET", None)]
    return {target.name: target for target in sorted(found, key=lambda t: (t.rank, t.name))}


def __getattr__(name: str):
    """TARGETS, on first use: an engine's target imports eval/targets/base.py, which runs this package first."""
    if name == "TARGETS":
        globals()[name] = _targets()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _all() -> dict[str, Target]:
    return globals().get("TARGETS") or __getattr__("TARGETS")


def with_settings() -> list[Target]:
    return [t for t in _all().values() if t.settings is not None]


def with_acceptance() -> list[Target]:
    return [t for t in _all().values() if t.acceptance is not None]


__all__ = ["TARGETS", "AcceptanceError", "AcceptanceForm", "Choice", "Settings", "Target", "with_acceptance",
           "with_settings"]
