"""The method registry: one entry per method, one file per method. Adding a method is one new file
plus one line here."""
from __future__ import annotations

from decode.methods.base import OPTIONAL_AXES, MethodSpec, RunContext
from decode.methods import baseline, early_exit, hf, prompt_lookup, speculative

REGISTRY: dict[str, MethodSpec] = {spec.name: spec for spec in (
    baseline.SPEC,
    speculative.SPEC,
    prompt_lookup.SPEC,
    early_exit.SPEC,
    hf.GENERATE,
    hf.ASSISTED,
    hf.ASSISTED_DEFAULT,
    hf.PROMPT_LOOKUP,
)}


def spec(name: str) -> MethodSpec:
    return REGISTRY[name]


def reference_method() -> str:
    return next(name for name, s in REGISTRY.items() if s.is_reference)


__all__ = ["OPTIONAL_AXES", "REGISTRY", "MethodSpec", "RunContext", "reference_method", "spec"]
