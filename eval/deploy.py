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


# our method -> the vLLM method of this benchmark that runs the same speculation, where its spec names no counterpart
VLLM_OF = {"eagle3": "vllm_eagle", "suffix": "vllm_suffix"}
# why an engine has no equivalent of our method (engine -> method -> reason)
NO_EQUIVALENT = {
    "vllm": {"hybrid": "hybrid switches per row and round between lookup, suffix, the draft model and trees; vLLM has "
                       "no such switch",
             "early_exit": "vLLM drafts with no layers of the target itself"},
    "sglang": {"hybrid": "SGLang has no per-round switch between drafters",
               "early_exit": "SGLang drafts with no layers of the target itself",
               "suffix": "SGLang has no suffix decoding", "medusa": "SGLang has no Medusa heads"},
    "llama_cpp": {"hybrid": "llama.cpp has no per-round switch between drafters",
                  "early_exit": "llama.cpp drafts with no layers of the target itself",
                  "suffix": "llama.cpp has no suffix trie (ngram-cache keeps n-gram counts, another drafter)",
                  "medusa": "llama.cpp has no Medusa heads",
                  "eagle3": "llama.cpp's EAGLE-3 (--spec-type draft-eagle3) loads its own GGUF conversion of the "
                            "head: not emitted"},
}


def head_kind(method: str) -> str:
    """The kind of draft entry the method's draft axis takes: a head's kind (eagle3, medusa), else a draft model."""
    kinds = REGISTRY[method].draft_kinds if method in REGISTRY else ()
    return next((kind for kind in kinds if kind != "model"), "model")


def vllm_config(method: str, gamma: int, draft: str | None, drafts: dict, options: dict | None = None) -> tuple[dict, str | None]:
    """(speculative_config, a note where the name is our method's own)."""
    point = SimpleNamespace(gamma=gamma, draft=draft)
    counterpart = next((spec for spec in REGISTRY.values() if spec.engine == "vllm" and spec.counterpart == method
                        and spec.engine_config), None) or REGISTRY.get(VLLM_OF.get(method, ""))
    note = None
    if draft and draft not in drafts:  # a run's config.yaml without it, or an acceptance file: the label stands for it
        drafts = dict(drafts, **{draft: SimpleNamespace(kind=head_kind(method),
                                                        vllm_model=draft, model=draft)})
        note = f"the draft's model is not known here: its label {draft!r} stands for it; put its path there"
    if counterpart is not None:
        return counterpart.engine_config(point, drafts, counterpart.typed_options(options or {})), note
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
    """llama-server's flags (build b11434: --draft-max and --draft-min were removed there, and refuse to start): a
    draft model drafting K every round as measured (--spec-draft-n-min K, --spec-draft-p-min 0 so that no draft is
    cut short by its confidence); prompt lookup as ngram-simple, its closest: a lookup n-gram of prompt_lookup_max
    tokens, a draft of K. None for the rest."""
    k = str(vllm["num_speculative_tokens"])
    if vllm.get("method") == "draft_model":
        return ["--spec-type", "draft-simple", "--model-draft", vllm["model"], "--spec-draft-n-max", k,
                "--spec-draft-n-min", k, "--spec-draft-p-min", "0"]
    if vllm.get("method") == "ngram":
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(vllm.get("prompt_lookup_max", 3)),
                "--spec-ngram-simple-size-m", k]
    return None


def settings(choice: dict | None, drafts: dict, options: dict | None = None) -> dict:
    """One choice ({method, gamma, draft, and its other axes: tree, schedule, ...}; None: off) as each engine's
    settings: vllm (the dict, or None), sglang and llama_cpp (argument lists, [] for off), no_equivalent (engine ->
    why it has none: its setting None) and notes."""
    if choice is None:
        return {"vllm": None, "sglang": [], "llama_cpp": [], "no_equivalent": {}, "notes": []}
    method, notes, why = choice["method"], [], {}
    if choice.get("tree") is not None:
        reason = (f"a tree of drafts (tree={choice['tree']}): the settings here are one chain of K, and a tree's "
                  "settings were not checked against ours")
        return {"vllm": None, "sglang": None, "llama_cpp": None,
                "no_equivalent": {e: reason for e in ("vllm", "sglang", "llama_cpp")}, "notes": []}
    if choice.get("schedule") not in (None, "constant"):
        notes.append(f"schedule {choice['schedule']} picks K per round up to {choice['gamma']}: the engines draft a "
                     "fixed K, here that most")
    if choice.get("draft_context") is not None:
        notes.append(f"draft_context={choice['draft_context']}: the engines' drafts read the whole context")
    vllm = None
    if method in NO_EQUIVALENT["vllm"]:
        why["vllm"] = NO_EQUIVALENT["vllm"][method]
    else:
        vllm, note = vllm_config(method, choice["gamma"], choice.get("draft"), drafts, options)
        notes += [note] if note else []
    out = {"vllm": vllm, "sglang": None, "llama_cpp": None}
    for engine, flags in (("sglang", sglang_flags), ("llama_cpp", llama_cpp_flags)):
        reason = NO_EQUIVALENT[engine].get(method)
        out[engine] = None if reason or vllm is None else flags(vllm)
        if out[engine] is None:
            why[engine] = reason or f"no {engine} form of {method} here"
    return {**out, "no_equivalent": why, "notes": notes}


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
        why = s.get("no_equivalent") or {}
        out.append(f"{'every load' if load == 'all' else load}:")
        out.append("  vLLM:      " + (f"no equivalent: {why['vllm']}" if "vllm" in why else
                                      "no speculative_config (speculation off)" if s["vllm"] is None else
                                      f"--speculative-config {shlex.quote(json.dumps(s['vllm']))}"))
        for name, key in (("SGLang", "sglang"), ("llama.cpp", "llama_cpp")):
            flags = s[key]
            out.append(f"  {name + ':':<10} " + (f"no equivalent: {why.get(key, '')}" if flags is None else
                                                 "no speculation flags (off)" if not flags else shlex.join(flags)))
        out += [f"  note: {n}" for n in s["notes"]]
    return out
