"""Deploying the recommendation (#55): the serving targets it is emitted for and what it becomes in each, ready to
paste. Each target is a TARGET (base.py's Target) that declares its settings and its acceptance form, in a module here
(an engine this benchmark does not run: SGLang, SpecDec Bench) or in the file an engine's declaration names (its
DEPLOY, deploy.py beside it in runner/engines/<name>/, loaded by its path as the declaration is): adding a target is
one file. This module, eval/acceptance_io.py and eval/recommend.py iterate TARGETS and name none: settings() gives the
recommended choice as one entry per target that declares settings; "off" is the target alone, no speculation in any of
them."""
from __future__ import annotations

import importlib
import json
import pkgutil
from types import SimpleNamespace

from decode.methods import DECLARATIONS, FIXED, REGISTRY, engine_file
from eval.deploy.base import AcceptanceError, AcceptanceForm, Choice, Settings, Target


def drafts_of(config: dict) -> dict:
    """config.yaml's drafts by label (ModelConfig.name: label, else the model's last path component): their kind, the
    model our engine loaded and its gguf_file (each target gives its engine what it loads: Choice.model_for)."""
    entries = config.get("draft") or []
    out = {}
    for entry in entries if isinstance(entries, list) else [entries]:
        if isinstance(entry, dict) and entry.get("model"):
            model = str(entry["model"])
            label = entry.get("label") or model.rstrip("/").split("/")[-1].split(":")[-1].removesuffix(".gguf")
            out[label] = SimpleNamespace(kind=entry.get("kind", "model"), model=model, gguf_file=entry.get("gguf_file"))
    return out


def head_kind(method: str) -> str:
    """The kind of draft entry the method's draft axis takes: a head's kind (eagle3, medusa), else a draft model."""
    kinds = REGISTRY[method].draft_kinds if method in REGISTRY else ()
    return next((kind for kind in kinds if kind != "model"), "model")


def settings(choice: dict | None, drafts: dict, options: dict | None = None) -> dict:
    """One choice ({method, gamma, draft, and its other axes: tree, schedule, ...}; None: off) as each target's
    settings (its own form; its `off` for off, None where it has no equivalent), no_equivalent (target -> why) and
    notes."""
    targets = with_settings()
    if choice is None:
        return {**{t.name: t.settings.off for t in targets}, "no_equivalent": {}, "notes": []}
    method, notes, why = choice["method"], [], {}
    if choice.get("tree") is not None:
        reason = (f"a tree of drafts (tree={choice['tree']}): the settings here are one chain of K, and a tree's "
                  "settings were not checked against ours")
        return {**{t.name: None for t in targets}, "no_equivalent": {t.name: reason for t in targets}, "notes": []}
    if choice.get("schedule") not in (None, FIXED):
        notes.append(f"schedule {choice['schedule']} picks K per round up to {choice['gamma']}: the engines draft a "
                     "fixed K, here that most")
    if choice.get("draft_context") is not None:
        notes.append(f"draft_context={choice['draft_context']}: the engines' drafts read the whole context")
    draft = choice.get("draft")
    if draft and draft not in drafts and any(method not in t.settings.no_equivalent for t in targets):
        # a run's config.yaml without it, or an acceptance file: the label stands for it
        drafts = dict(drafts, **{draft: SimpleNamespace(kind=head_kind(method), model=draft)})
        notes.append(f"the draft's model is not known here: its label {draft!r} stands for it; put its path there")
    spec = Choice(method=method, gamma=choice["gamma"], draft=draft, drafts=drafts, options=options or {})
    out = {}
    for target in targets:
        value, said = (None, []) if method in target.settings.no_equivalent else target.settings.emit(spec)
        out[target.name] = value
        notes += said
        if value is None:
            why[target.name] = target.settings.no_equivalent.get(method) or f"no {target.name} form of {method} here"
    return {**out, "no_equivalent": why, "notes": notes}


def emitted(by_load: list[tuple[str, dict]]) -> dict:
    """The settings of each load's recommendation ((load's name, settings)): one set where every load agrees, else
    one per load (an engine takes one K per server: where K differs by batch size, each batch size's server is its
    own)."""
    distinct = {json.dumps(s, sort_keys=True) for _, s in by_load}
    if len(distinct) == 1:
        return {"all": by_load[0][1]}
    return {load: s for load, s in by_load}


def lines(emitted_settings: dict) -> list[str]:
    """The printed settings, ready to paste: a line per target."""
    out = []
    for load, s in emitted_settings.items():
        why = s.get("no_equivalent") or {}
        out.append(f"{'every load' if load == 'all' else load}:")
        for target in with_settings():
            value = s.get(target.name)
            out.append(f"  {target.title + ':':<10} " + (
                f"no equivalent: {why[target.name]}" if target.name in why else
                target.settings.off_text if value == target.settings.off else target.settings.show(value)))
        out += [f"  note: {n}" for n in s["notes"]]
    return out


def load_label(result: dict) -> str:
    """A load's name in the emitted settings: the load, and its context where asked."""
    return result["load"] + (f" ctx={result['context']}" if result["context"] else "")


def per_batch_size(results: list[dict], emitted_settings: dict) -> dict:
    """Where the choice is off or one chain at a constant K at every batch or concurrency load of a context, and K
    differs between them: the engines' per-batch-size forms, by context ("as measured" where none was asked): each
    target that takes a table (Settings.per_batch_size: inclusive ranges of rows from 1, the last K held above the last
    range) from its settings at the largest K; TensorRT-LLM's draft_len_schedule {the largest batch size of each K:
    K} with max_draft_len the largest K (K 0 above the last key); the targets that take one K a server: a note.
    Static batches and concurrencies are tables of their own (a key each, where the results hold both)."""
    out = {}
    groups = dict.fromkeys((r["context"], r["load"].partition("=")[0]) for r in results
                           if r["load"].partition("=")[0] in ("batch", "conc"))
    both_kinds = len({kind for _, kind in groups}) > 1
    for context, kind in groups:
        ks, chains, widest = {}, set(), None
        for r in results:
            load_kind, _, value = r["load"].partition("=")
            if r["context"] != context or load_kind != kind or not r.get("candidates"):
                continue
            best = next(c for c in r["candidates"] if c["candidate"] == r["best"])
            axes = best.get("axes") or {}
            if best["candidate"] != "off" and (axes.get("tree") is not None or axes.get("schedule") not in
                                               (None, FIXED) or not best.get("gamma")):
                chains.add(None)  # a tree or a schedule of its own: no K table says it
                continue
            ks[int(value)] = int(best.get("gamma") or 0)
            if best["candidate"] != "off":
                chains.add((best["method"], best.get("draft")))
                if widest is None or ks[int(value)] > ks[widest]:
                    widest = int(value)
        if len(chains) != 1 or None in chains or len(set(ks.values())) < 2:
            continue
        rows, ranges = sorted(ks), []
        for i, b in enumerate(rows):
            hi = rows[i + 1] - 1 if i + 1 < len(rows) else b
            if ranges and ranges[-1][2] == ks[b]:
                ranges[-1][1] = hi
            else:
                ranges.append([1 if i == 0 else b, hi, ks[b]])
        at_widest = emitted_settings.get("all") or emitted_settings[load_label(next(
            r for r in results if r["context"] == context and r["load"] == f"{kind}={widest}"))]
        top = max(ks.values())
        last_on = max(i for i, (_, _, k) in enumerate(ranges) if k)
        forms, notes = {"batch_sizes": [[b, ks[b]] for b in rows]}, []
        tables = [t for t in with_settings() if t.settings.per_batch_size is not None]
        for target in tables:
            settings = at_widest.get(target.name)
            forms[target.name], target_notes = (None, []) if settings is None else \
                target.settings.per_batch_size(settings, ranges)
            notes += target_notes + ([f"context {context}: a table of its own ({target.title}'s table here has no "
                                      "context axis)"] if context is not None and forms[target.name] is not None
                                     else [])
        # TensorRT-LLM refuses a schedule whose smallest key is not max_draft_len (llm_args.py)
        forms["tensorrt_llm"] = {"max_draft_len": top, "draft_len_schedule": {
            str(hi): k for _, hi, k in ranges[:last_on + 1]}} if ranges[0][2] == top else None
        if forms["tensorrt_llm"] is None:
            notes.append(f"TensorRT-LLM: no draft_len_schedule (K {ranges[0][2]} at the fewest rows is not the "
                         f"largest, {top}, which its schedule must start with): one K a server")
        single = [t.title for t in with_settings() if t.settings.per_batch_size is None]
        notes += ([f"above {rows[-1]} rows TensorRT-LLM runs off",
                   "TensorRT-LLM's draft_len_schedule read as the largest batch size of each K, off above its last "
                   "key (its form in which {1: 4} means batch size 1 only); an earlier form reads each key as "
                   "the least batch size of its K and needs {1: max_draft_len}: check your version"]
                  if forms["tensorrt_llm"] is not None else []) + [
                  f"{' and '.join(single)} {'takes' if len(single) == 1 else 'take'} one K a server: each batch "
                  "size's server is in the settings by load"]
        key = "as measured" if context is None else str(context)
        out[f"{key}, {'static batch' if kind == 'batch' else 'concurrency'}" if both_kinds else key] = dict(
            forms, notes=notes)
    return out


def per_batch_lines(table: dict) -> list[str]:
    """per_batch_size's forms, printed: a line for each target that takes a table and a TensorRT-LLM line per
    context, then the notes."""
    out = []
    for context, forms in table.items():
        out += ["", f"per batch size ({context}): K by rows {', '.join(f'{b}: {k}' for b, k in forms['batch_sizes'])}"]
        for target in with_settings():
            if forms.get(target.name) is not None:
                out.append(f"  {target.title}: {target.settings.show(forms[target.name])}")
        if forms["tensorrt_llm"] is not None:
            out.append(f"  TensorRT-LLM: speculative_config {json.dumps(forms['tensorrt_llm'])}")
        out += [f"  note: {n}" for n in forms["notes"]]
    return out


def _targets() -> dict[str, Target]:
    found = [importlib.import_module(f"{__name__}.{module.name}").TARGET
             for module in pkgutil.iter_modules(__path__) if not module.ispkg and module.name != "base"]
    found += [engine_file(engine, d.DEPLOY).TARGET for engine, d in DECLARATIONS.items() if getattr(d, "DEPLOY", None)]
    return {target.name: target for target in sorted(found, key=lambda t: (t.rank, t.name))}


def __getattr__(name: str):
    """TARGETS, on first use: an engine's deploy.py imports eval/deploy/base.py, which runs this package first."""
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


__all__ = ["TARGETS", "AcceptanceError", "AcceptanceForm", "Choice", "Settings", "Target", "drafts_of", "emitted",
           "head_kind", "lines", "load_label", "per_batch_lines", "per_batch_size", "settings", "with_acceptance",
           "with_settings"]
