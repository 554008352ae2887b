"""The engine registry: every package here (and in the folders of $SPECULATE_ENGINES: decode/methods engine_folders)
is an engine whose ENGINE implements runner/engines/base.py's contract, found by listing the folders: adding an engine
is one package, its methods and what the rest reads of it in its declaration.py (decode/methods/__init__.py). The home
engine (Engine.home: ours) runs its units first in each repeat and loads the prompts and
tokenizer; the others follow by name."""
from __future__ import annotations

import importlib
import pkgutil

from decode.methods import engine_folders
from runner.engines.base import Engine

__path__ = [str(folder) for folder in engine_folders()]  # this folder first


def _engines() -> dict[str, type[Engine]]:
    found = [importlib.import_module(f"{__name__}.{module.name}").ENGINE
             for module in pkgutil.iter_modules(__path__) if module.ispkg]
    return {engine.name: engine for engine in sorted(found, key=lambda e: (not e.home, e.name))}


ENGINES: dict[str, type[Engine]] = _engines()
HOME = next(name for name, engine in ENGINES.items() if engine.home)

__all__ = ["ENGINES", "HOME", "Engine"]
