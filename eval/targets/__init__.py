"""The serving targets a recommendation is emitted for (#55): every module here but base is one target whose TARGET
(base.py's Target) declares its settings and its acceptance form, found by listing this folder as
runner/engines/__init__.py finds engines: adding a target is one file. eval/deploy.py, eval/acceptance_io.py and
eval/recommend.py iterate TARGETS and name none."""
from __future__ import annotations

import importlib
import pkgutil

from eval.targets.base import AcceptanceError, AcceptanceForm, Choice, Settings, Target


def _targets() -> dict[str, Target]:
    found = [importlib.import_module(f"{__name__}.{module.name}").TARGET
             for module in pkgutil.iter_modules(__path__) if not module.ispkg and module.name != "base"]
    return {target.name: target for target in sorted(found, key=lambda t: (t.rank, t.name))}


TARGETS: dict[str, Target] = _targets()


def with_settings() -> list[Target]:
    return [t for t in TARGETS.values() if t.settings is not None]


def with_acceptance() -> list[Target]:
    return [t for t in TARGETS.values() if t.acceptance is not None]


__all__ = ["TARGETS", "AcceptanceError", "AcceptanceForm", "Choice", "Settings", "Target", "with_acceptance",
           "with_settings"]
