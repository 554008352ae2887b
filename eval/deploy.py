"""The recommended choice as the serving engines' own settings (#55), ready to paste: vLLM's speculative_config,
SGLang's server flags, llama.cpp's server flags. "off" is the target alone: no speculation in any of them.

vLLM's dict comes from the registry: the vLLM method whose counterpart is our method (decode/methods/vllm_*.py
engine_config), so the settings the benchmark runs vLLM with and the settings recommended are one function. A
method with no vLLM counterpart keeps its own name with num_speculative_tokens, and says so.
"""
from __future__ import annotations

import json
import shlex
from types import SimpleNamespace

from decode.methods import REGISTRY

# vLLM's speculative_config method -> SGLang's --speculative-algorithm (None: SGLang has none)
SGLANG_ALGORITHM = {"draft_model": "STANDALONE", "eagle": "EAGLE", "eagle3": "EAGLE3", "ngram": "NGRAM",
                    "mtp": "EAGLE", "medusa": None, "suffix": None}


def drafts_of(config: dict) -> dict:
    """config.yaml's drafts by label (ModelConfig.name: label, else the model's last path component): their kind and
    the model vLLM, SGLang and llama.cpp load."""
    entries = config.get("draft") or []
    out = {}
    for entry in entries if isinstance(entries, list) else [entries]:
        if isinstance(entry, dict) and entry.get("model"):
            model = str(entry["model"])
            label = entry.get("label") or model.rstrip("/").split("/")[-1].split(":")[-1].removesuffix(".gguf")
            out[label] = SimpleNamespace(kind=entry.get("kind", "model"), vllm_model=model, model=model)
    return out


def vllm_config(method: str, gamma: int, draft: str | None, drafts: dict, options: dict | None = None) -> tuple[dict, str | None]:
    """(speculative_config, a note where the name is our method's own)."""
    point = SimpleNamespace(gamma=gamma, draft=draft)
    counterpart = next((spec for spec in REGISTRY.values() if spec.engine == "vllm" and spec.counterpart == method
                        and spec.engine_config), None)
    note = None
    if draft and draft not in drafts:  # a run's config.yaml without it, or an acceptance file: the label stands for it
        drafts = dict(drafts, **{draft: SimpleNamespace(kind="model", vllm_model=draft, model=draft)})
        note = f"the draft's model is not known here: its label {draft!r} stands for it; put its path there"
    if counterpart is not None:
        return counterpart.engine_config(point, drafts, options or {}), note
    config = {"method": method, "num_speculative_tokens": gamma}
    if draft:
        config["model"] = drafts[draft].vllm_model
    return config, "; ".join(filter(None, [note, f"vLLM runs no counterpart of {method} in this benchmark: its "
                                                 "method name here is assumed"]))


def sglang_flags(vllm: dict) -> list[str] | None:
    """SGLang's flags for the same speculation: one chain of K drafts (top-k 1), K + 1 tokens verified. None where
    SGLang has no such algorithm."""
    algorithm = SGLANG_ALGORITHM.get(vllm.get("method"))
    if algorithm is None:
        return None
    k = vllm["num_speculative_tokens"]
    flags = ["--speculative-algorithm", algorithm]
    if vllm.get("model"):
        flags += ["--speculative-draft-model-path", vllm["model"]]
    return flags + ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                    "--speculative-num-draft-tokens", str(k + 1)]


def llama_cpp_flags(vllm: dict) -> list[str] | None:
    """llama.cpp server's flags for a draft model: K drafts every round as measured (--draft-min K, and
    --draft-p-min 0 so that no draft is cut short by its confidence). None for a method without a draft model."""
    if vllm.get("method") != "draft_model":
        return None
    k = str(vllm["num_speculative_tokens"])
    return ["--model-draft", vllm["model"], "--draft-max", k, "--draft-min", k, "--draft-p-min", "0"]


def settings(choice: dict | None, drafts: dict, options: dict | None = None) -> dict:
    """One choice ({method, gamma, draft}; None: off) as each engine's settings: vllm (the dict, or None: no
    speculative_config), sglang and llama_cpp (argument lists, [] for off, None where the engine has no equivalent)
    and notes."""
    if choice is None:
        return {"vllm": None, "sglang": [], "llama_cpp": [], "notes": []}
    vllm, note = vllm_config(choice["method"], choice["gamma"], choice.get("draft"), drafts, options)
    return {"vllm": vllm, "sglang": sglang_flags(vllm), "llama_cpp": llama_cpp_flags(vllm),
            "notes": [note] if note else []}


def emitted(by_load: list[tuple[str, dict]]) -> dict:
    """The settings of each load's recommendation ((load's name, settings)): one set where every load agrees, else
    one per load (vLLM takes one K per server: where K differs by batch size, each batch size's server is its
    own)."""
    distinct = {json.dumps(s, sort_keys=True) for _, s in by_load}
    if len(distinct) == 1:
        return {"all": by_load[0][1]}
    return {load: s for load, s in by_load}


def lines(emitted_settings: dict) -> list[str]:
    """The printed settings, ready to paste."""
    out = []
    for load, s in emitted_settings.items():
        out.append(f"{'every load' if load == 'all' else load}:")
        out.append("  vLLM:      " + ("no speculative_config (speculation off)" if s["vllm"] is None else
                                      f"--speculative-config {shlex.quote(json.dumps(s['vllm']))}"))
        for name, key in (("SGLang", "sglang"), ("llama.cpp", "llama_cpp")):
            flags = s[key]
            out.append(f"  {name + ':':<10} " + ("no equivalent" if flags is None else
                                                 "no speculation flags (off)" if not flags else shlex.join(flags)))
        out += [f"  note: {n}" for n in s["notes"]]
    return out
