"""The recommended choice as the serving engines' own settings (#55), ready to paste: one entry per target of
eval/targets/ that declares settings, each its own file. "off" is the target alone: no speculation in any of them."""
from __future__ import annotations

import json
from types import SimpleNamespace

from decode.methods import REGISTRY
from eval.targets import Choice, with_settings


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
    if choice.get("schedule") not in (None, "constant"):
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
