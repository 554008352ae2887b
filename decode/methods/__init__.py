"""The method registry: one entry per method, one file per method. Adding a method of our engine is one new file
plus two lines here (its module in the import, its SPEC in REGISTRY); a method of another engine (MethodSpec.engine,
runner/engines) is one file that declares its SPEC and its RANK (its place among that engine's methods), found by
listing this folder."""
from __future__ import annotations

import importlib
import pkgutil

from decode.methods.base import EngineCaps, MethodSpec, RunContext
from decode.methods import baseline, eagle3, early_exit, hf, hybrid, medusa, prompt_lookup, speculative, suffix


# a *_settings module declares an engine's config section (pydantic): imported only when the config asks for it, so the
# registry loads without pydantic (the GPU machine's check runs without it)
_MODULES = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)
            if not m.name.endswith("_settings")]


def _other_engines() -> list[MethodSpec]:
    """The SPEC of every module here that is not our engine's (the baseline's), in the order of their RANK."""
    specs = [m for m in _MODULES if isinstance(getattr(m, "SPEC", None), MethodSpec)
             and m.SPEC.engine != baseline.SPEC.engine]
    return [m.SPEC for m in sorted(specs, key=lambda m: (m.SPEC.engine, m.RANK))]


REGISTRY: dict[str, MethodSpec] = {spec.name: spec for spec in (
    baseline.SPEC,
    speculative.SPEC,
    prompt_lookup.SPEC,
    early_exit.SPEC,
    suffix.SPEC,
    hybrid.SPEC,
    eagle3.SPEC,
    medusa.SPEC,
    hf.GENERATE,
    hf.ASSISTED,
    hf.ASSISTED_DEFAULT,
    hf.PROMPT_LOOKUP,
    *_other_engines(),
)}
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


def __getattr__(name: str):
    """ENGINE_SECTIONS, on first use: engine -> the module that declares its config section (SECTION, a pydantic model;
    CHECK(config); EXAMPLE; DOC), the config key being the engine's name: utils/config.py adds each to the config."""
    if name == "ENGINE_SECTIONS":
        modules = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)
                   if m.name.endswith("_settings")]
        globals()[name] = {m.ENGINE: m for m in modules}
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def spec(name: str) -> MethodSpec:
    return REGISTRY[name]


def reference_method(engine: str = "ours") -> str:
    """The method every ratio of an engine's points is computed against."""
    return next(name for name, s in REGISTRY.items() if s.is_reference and s.engine == engine)


__all__ = ["ENGINE_CAPS", "ENGINE_SECTIONS", "ENGINE_TEXTS", "ENGINES", "HOME_ENGINE", "REGISTRY", "EngineCaps", "MethodSpec",
           "RunContext", "caps_of", "reference_method", "spec"]
