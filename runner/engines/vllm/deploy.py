"""vLLM: the recommendation as its `--speculative-config` dict, and acceptance in its synthetic acceptance mode.

The dict comes from the registry: the vLLM method of this benchmark whose counterpart is our method
(runner/engines/vllm/declaration.py engine_config), so the settings the benchmark runs vLLM with and those
recommended are one function. A method with no vLLM counterpart keeps its own name with num_speculative_tokens, and says so.

The synthetic acceptance mode (vLLM 0.28.0's config/speculative.py): a speculative_config fragment
{"rejection_sample_method": "synthetic", "num_speculative_tokens": K, "synthetic_acceptance_rates": [r_1..r_K]},
entry i the marginal probability that the first i + 1 drafts are accepted: unconditional, non-increasing, K entries.
"""
from __future__ import annotations

import json
import shlex
from types import SimpleNamespace

from decode.methods import REGISTRY
from eval.deploy.base import HF, AcceptanceError, AcceptanceForm, Choice, Settings, Target, rates_in, rises

NO_EQUIVALENT = {"hybrid": "hybrid switches per row and round between lookup, suffix, the draft model and trees; vLLM "
                           "has no such switch",
                 "early_exit": "vLLM drafts with no layers of the target itself"}
KEY = "synthetic_acceptance_rates"
TITLE = "vLLM"


def speculative_config(choice: Choice) -> tuple[dict, list[str]]:
    counterpart = next((spec for spec in REGISTRY.values() if spec.engine == "vllm" and spec.counterpart == choice.method
                        and spec.engine_config), None)
    model, notes = choice.model_for(HF, TITLE)
    drafts = {label: SimpleNamespace(kind=d.kind, vllm_model=model if label == choice.draft else d.model)
              for label, d in choice.drafts.items()}
    if counterpart is not None:
        point = SimpleNamespace(gamma=choice.gamma, draft=choice.draft)
        return counterpart.engine_config(point, drafts, counterpart.typed_options(choice.options)), notes
    config = {"method": choice.method, "num_speculative_tokens": choice.gamma}
    if choice.draft:
        config["model"] = model
    return config, notes + [f"vLLM runs no counterpart of {choice.method} in this benchmark: its method name here is "
                            "assumed"]


def export(rates: list[float]) -> dict:
    return {"rejection_sample_method": "synthetic", "num_speculative_tokens": len(rates),
            KEY: [round(r, 6) for r in rates]}


def parse(data: dict, where: str) -> list[float]:
    method = data.get("rejection_sample_method")
    if method is not None and method != "synthetic":  # vLLM reads the rates only in its synthetic mode
        raise AcceptanceError(f"{where}: rejection_sample_method is {json.dumps(method)} beside {KEY}; vLLM takes the "
                              "rates only with \"synthetic\": write that or leave it out")
    rates = rates_in(data[KEY], KEY, where)
    if rises(rates):
        raise AcceptanceError(f"{where}: {KEY} rise ({rates}); vLLM's are unconditional, each at most the one before")
    return rates


def per_batch_size(settings: dict, ranges: list[list[int]]) -> tuple[dict, list[str]]:
    """speculative_config at the largest K with num_speculative_tokens_per_batch_size [[lo, hi, K], ...] (each K
    capped by num_speculative_tokens: vLLM's validate_and_normalize_dynamic_sd_schedule)."""
    top = max(k for _, _, k in ranges)
    return (dict(settings, num_speculative_tokens=top, num_speculative_tokens_per_batch_size=ranges),
            [f"above {ranges[-1][1]} rows (the largest load priced) {TITLE} holds K {ranges[-1][2]}"])


TARGET = Target(
    name="vllm", title=TITLE, rank=0,
    settings=Settings(emit=speculative_config, show=lambda c: f"--speculative-config {shlex.quote(json.dumps(c))}",
                      off=None, off_text="no speculative_config (speculation off)", no_equivalent=NO_EQUIVALENT,
                      per_batch_size=per_batch_size),
    acceptance=AcceptanceForm(suffix="vllm.json", key=KEY, export=export, parse=parse,
                              describe="vLLM's synthetic form"))
