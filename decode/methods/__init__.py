"""The method registry: one entry per method, each engine's from its declaration (runner/engines/<name>/
declaration.py: METHODS, and its capabilities, report text and config section), found by listing the engine folders.
A method of our engine is one file here (its run function and its MethodSpec) plus its line in our engine's
declaration's METHODS (runner/engines/ours/declaration.py).

A declaration is data: torch-free, importing only decode/methods (tests/test_import_graph.py checks it), loaded here
by its path, so that decode/, eval/ and utils/ know every engine without importing runner/. The engine folders:
runner/engines and each folder of $SPECULATE_ENGINES (os.pathsep between them), whose packages runner/engines/__init__.py
registers too (a test's engine, outside the tree)."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from decode.methods.base import EngineCaps, MethodSpec, RunContext
from decode.drafters.schedules import FIXED, PRICED  # the fixed K's schedule, the priced ones (eval/ reads them here)


def engine_folders() -> list[Path]:
    """The folders whose packages are engines: runner/engines, then those $SPECULATE_ENGINES names."""
    extra = [Path(p).resolve() for p in os.environ.get("SPECULATE_ENGINES", "").split(os.pathsep) if p]
    return [Path(__file__).resolve().parents[2] / "runner" / "engines", *extra]


def _load(name: str, path: Path) -> ModuleType:
    """A module by its path, under its package's name (runner.engines.<engine>.<file>): importing it by that name
    later finds this one."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def _declarations() -> dict[str, ModuleType]:
    """engine -> its declaration: the home engine's first (its reference's EngineCaps.home), then by name."""
    found = {path.parent.name: _load(f"runner.engines.{path.parent.name}.declaration", path)
             for path in sorted(p for folder in engine_folders() for p in folder.glob("*/declaration.py"))}
    home = {engine for engine, d in found.items() if any(s.engine_caps and s.engine_caps.home for s in d.METHODS)}
    return {engine: found[engine] for engine in sorted(found, key=lambda e: (e not in home, e))}


DECLARATIONS: dict[str, ModuleType] = _declarations()
assert all(spec.engine == engine for engine, d in DECLARATIONS.items() for spec in d.METHODS), \
    "a declaration's METHODS are of its engine (MethodSpec.engine: the package's name)"
REGISTRY: dict[str, MethodSpec] = {spec.name: spec for d in DECLARATIONS.values() for spec in d.METHODS}
ENGINES = tuple(dict.fromkeys(spec.engine for spec in REGISTRY.values()))  # the engines of the methods: names of
#   runner/engines packages, as progress.json's engine_info keys them
ENGINE_TEXTS = {spec.engine: spec.engine_text for spec in REGISTRY.values() if spec.engine_text}  # what the report
#   says of each engine other than ours
ENGINE_CAPS = {engine: next((s.engine_caps for s in REGISTRY.values() if s.engine == engine and s.engine_caps),
                            EngineCaps()) for engine in ENGINES}  # what each engine can do, as its reference declares
HOME_ENGINE = next(engine for engine, caps in ENGINE_CAPS.items() if caps.home)  # the engine of this process


def caps_of(method: str) -> EngineCaps:
    """What the engine that runs `method` can do."""
    return ENGINE_CAPS[REGISTRY[method].engine]


def is_home(engine: str) -> bool:
    """Whether `engine` is the home engine (EngineCaps.home); an engine no longer declared (an older report's) is
    not."""
    return ENGINE_CAPS.get(engine, EngineCaps()).home


def engine_file(engine: str, file: str) -> ModuleType:
    """A file its engine's declaration names (SETTINGS, DEPLOY), beside it, loaded by its path on first use."""
    declaration = DECLARATIONS[engine]
    return _load(f"runner.engines.{engine}.{Path(file).stem}", Path(declaration.__file__).with_name(file))


def __getattr__(name: str):
    """ENGINE_SECTIONS, on first use: engine -> the module that declares its config section (its declaration's
    SETTINGS, a file beside it: SECTION, a pydantic model; CHECK(config); EXAMPLE; DOC), the config key being the
    engine's name: utils/config.py adds each to the config. Loaded only when the config asks for it, so the registry
    loads without pydantic (the GPU machine's check runs without it)."""
    if name == "ENGINE_SECTIONS":
        globals()[name] = {engine: engine_file(engine, d.SETTINGS) for engine, d in DECLARATIONS.items()
                           if getattr(d, "SETTINGS", None)}
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def spec(name: str) -> MethodSpec:
    return REGISTRY[name]


def reference_method(engine: str = "ours") -> str:
    """The method every ratio of an engine's points is computed against."""
    return next(name for name, s in REGISTRY.items() if s.is_reference and s.engine == engine)


__all__ = ["DECLARATIONS", "engine_file", "ENGINE_CAPS", "ENGINE_SECTIONS", "ENGINE_TEXTS", "ENGINES", "HOME_ENGINE", "REGISTRY", "EngineCaps", "MethodSpec",
           "RunContext", "FIXED", "PRICED", "caps_of", "is_home", "reference_method", "spec"]
