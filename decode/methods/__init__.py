"""The method registry: one entry per method, one file per method. Adding a method is one new file
plus one line here."""
from __future__ import annotations

from decode.methods.base import OPTIONAL_AXES, MethodSpec, RunContext
from decode.methods import (baseline, early_exit, hf, hybrid, prompt_lookup, speculative, suffix, vllm_draft,
                            vllm_eagle, vllm_generate, vllm_mtp, vllm_ngram, vllm_suffix)

REGISTRY: dict[str, MethodSpec] = {spec.name: spec for spec in (
    baseline.SPEC,
    speculative.SPEC,
    prompt_lookup.SPEC,
    early_exit.SPEC,
    suffix.SPEC,
    hybrid.SPEC,
    hf.GENERATE,
    hf.ASSISTED,
    hf.ASSISTED_DEFAULT,
    hf.PROMPT_LOOKUP,
    vllm_generate.SPEC,
    vllm_draft.SPEC,
    vllm_ngram.SPEC,
    vllm_eagle.SPEC,
    vllm_mtp.SPEC,
    vllm_suffix.SPEC,
)}
ENGINES = ("ours", "vllm")


def spec(name: str) -> MethodSpec:
    return REGISTRY[name]


def reference_method(engine: str = "ours") -> str:
    """The method every ratio of an engine's points is computed against."""
    return next(name for name, s in REGISTRY.items() if s.is_reference and s.engine == engine)


__all__ = ["ENGINES", "OPTIONAL_AXES", "REGISTRY", "MethodSpec", "RunContext", "reference_method", "spec"]
