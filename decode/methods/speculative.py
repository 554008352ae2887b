"""Speculative decoding with a draft model (Leviathan et al. 2023), our engine, with a draft-length
schedule: constant, heuristic, confidence, cost_model or recommended (decode/drafters/schedules.py)."""
import json
import math
from dataclasses import dataclass
from pathlib import Path

from decode.k_model import KModel
from decode.methods.base import MethodSpec, option

from decode.drafters.schedules import SCHEDULES as _BUILT

SCHEDULES = tuple(_BUILT)  # the draft-length schedules, as decode/drafters/schedules.py names them
MEASURED = tuple(name for name, schedule in _BUILT.items() if schedule.measured)  # those that read the measured c
#   and v and the draft's prefill cost


@dataclass(frozen=True)
class Trees:
    tree_top_k: int = option(4, "dynamic trees: children per expanded node; prompt lookup's matches for a dynamic "
                                "tree", ge=1, le=16)


@dataclass(frozen=True)
class Confidence:
    confidence: float = option(0.4, "confidence schedule, and hybrid's draft branch: a row stops drafting after the "
                                    "step whose top probability falls under this", gt=0, lt=1)


@dataclass(frozen=True)
class Recommendation:
    recommendation: str | None = option(None, "recommended schedule: the recommend.json (python -m eval.recommend) "
                                              "whose step table and acceptance it decides K by")

    def check_config(self, config) -> None:
        """At the config's load: a recommended schedule needs a recommendation that reads, of the run's target, with a
        candidate of each draft model (ValueError: the config's one line). The run reads it again at each point."""
        if "recommended" not in config.speculative.schedule or "speculative" not in config.methods:
            return
        if self.recommendation is None:
            raise ValueError("speculative.schedule recommended follows a recommendation: set speculative."
                             "recommendation to a recommend.json (python -m eval.recommend RUN_DIR)")
        data = read_recommendation(self.recommendation)
        theirs = (data.get("profile_meta") or {}).get("target_model")
        if theirs and not same_model(theirs, config.target.model):
            raise ValueError(f"speculative.recommendation: {self.recommendation} recommends for the target {theirs}, "
                             f"the run's is {config.target.model}; give a recommendation of this target")
        for draft in config.draft:
            if draft.kind == "model":
                model_of(data, draft.name, self.recommendation)


@dataclass(frozen=True)
class Options(Confidence, Trees, Recommendation):
    pass


def read_recommendation(path: str) -> dict:
    """recommend.json's content; ValueError naming the file where it is missing, unreadable or not one."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise ValueError(f"speculative.recommendation: cannot read {path} ({error.strerror or error}); give the "
                         "recommend.json that python -m eval.recommend RUN_DIR wrote") from None
    except ValueError as error:
        raise ValueError(f"speculative.recommendation: {path} is not JSON ({error}); give the recommend.json that "
                         "python -m eval.recommend RUN_DIR wrote") from None
    if not isinstance(data, dict) or not isinstance(data.get("loads"), list):
        raise ValueError(f"speculative.recommendation: {path} has no loads; give the recommend.json that "
                         "python -m eval.recommend RUN_DIR wrote")
    problem = recommendation_problem(data)
    if problem:
        raise ValueError(f"speculative.recommendation: {path}: {problem}; give the recommend.json that "
                         "python -m eval.recommend RUN_DIR wrote, or mend that key")
    return data


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def recommendation_problem(data: dict) -> str | None:
    """The first key of recommend.json that is not as eval.recommend writes it, named by its place (loads[0].
    candidates[1].speedup) with what it holds and what it should; None where each key read is of its kind: a load a
    {load, context, candidates} whose batch=B or conc=C names a count, a candidate a name, a speedup above 0, a K (or
    null), an interval of two numbers (or null), its axes a mapping; best, where given, one of its candidates."""
    def say(where: str, value, should: str) -> str:
        return f"{where} is {json.dumps(value)[:40]}, not {should}"
    for key in ("profile_meta", "draft_prefill"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            return say(key, data[key], "a mapping")
    for i, load in enumerate(data["loads"]):
        at = f"loads[{i}]"
        if not isinstance(load, dict):
            return say(at, load, "a load ({load, context, candidates})")
        name = load.get("load")
        if not isinstance(name, str):
            return say(f"{at}.load", name, "a load's name such as batch=1 or conc=4")
        kind, _, value = name.partition("=")
        if kind in ("batch", "conc") and not (value.isdigit() and int(value) >= 1):
            return say(f"{at}.load", name, f"{kind}= a count of at least 1")
        if load.get("context") is not None and not _count(load["context"]):
            return say(f"{at}.context", load["context"], "a context length in tokens (or null)")
        candidates = load.get("candidates")
        if not isinstance(candidates, list):
            return say(f"{at}.candidates", candidates, "a list of candidates")
        for j, c in enumerate(candidates):
            where = f"{at}.candidates[{j}]"
            if not isinstance(c, dict):
                return say(where, c, "a candidate ({candidate, speedup, gamma, ...})")
            if not isinstance(c.get("candidate"), str):
                return say(f"{where}.candidate", c.get("candidate"), "a candidate's name")
            if not (_number(c.get("speedup")) and c["speedup"] > 0):
                return say(f"{where}.speedup", c.get("speedup"), "a predicted speedup above 0")
            if c.get("gamma") is not None and not _count(c["gamma"]):
                return say(f"{where}.gamma", c["gamma"], "a K (a whole number above 0, or null for off)")
            interval = c.get("speedup_ci95")
            if interval is not None and not (isinstance(interval, list) and len(interval) == 2
                                             and all(_number(x) for x in interval)):
                return say(f"{where}.speedup_ci95", interval, "an interval [low, high] (or null)")
            if c.get("axes") is not None and not isinstance(c["axes"], dict):
                return say(f"{where}.axes", c["axes"], "a mapping of the candidate's axes")
        if "best" in load and load["best"] not in [c["candidate"] for c in candidates]:
            return say(f"{at}.best", load["best"], "one of its candidates")
    return None


def same_model(a: str, b: str) -> bool:
    """Two targets named alike as eval.recommend compares a profile's (eval/recommend.py model_name): last path
    component, lower case, without synthetic: and its options; one beginning the other is the same."""
    def name(x):
        return str(x).removeprefix("synthetic:").split("?")[0].rstrip("/").split("/")[-1].lower()
    return name(a).startswith(name(b)) or name(b).startswith(name(a))


def model_of(data: dict, draft: str, path: str = "recommend.json"):
    """recommend.json's one model of a round (decode/k_model.py KModel), with the draft's acceptance; ValueError
    naming the file where it has none (written before eval.recommend wrote its model) or none of the draft's."""
    if not isinstance(data.get("k_model"), dict):
        raise ValueError(f"speculative.recommendation: {path} has no k_model (its step table and acceptance); run "
                         "python -m eval.recommend RUN_DIR again")
    model = KModel(data["k_model"], f"speculative.recommendation: {path}")
    if draft not in model.acceptance:
        raise ValueError(f"speculative.recommendation: {path} has no acceptance of the draft {draft} (its chain at a "
                         "constant K); give a recommendation of a run that measured it")
    return model


def schedule_for(ctx, point, draft_label: str | None, max_new_tokens: int | None = None):
    """The point's schedule; cost_model reads the c and v measured in this run (runner/probes.py), recommended the
    recommendation's table (speculative.recommendation)."""
    from decode.drafters.schedules import make_schedule

    name = point.schedule or SCHEDULES[0]
    if name == "recommended":
        path = ctx.options[point.method].recommendation
        model = ctx.memory.get(("recommended", path, draft_label))
        if model is None:  # read at the point's first batch (the config's load checked it)
            model = model_of(read_recommendation(path), draft_label, path)
            ctx.memory[("recommended", path, draft_label)] = model
        # what its rounds measured against their prices holds for the point's every batch (the machine is the same)
        ratios = ctx.memory.setdefault(("recommended timed", point.key), {})
        return make_schedule(name, point.gamma, budget=max_new_tokens, model=model, draft=draft_label, ratios=ratios,
                             served=ctx.load is not None, window=point.draft_context)
    if name not in MEASURED:
        return make_schedule(name, point.gamma, confidence=ctx.options[point.method].confidence)
    costs = ctx.costs  # a CostProbe (eval/records.py), or None where the probes did not run
    c = costs.c_for(draft_label) if costs else None
    if c is None or not costs.v:
        raise ValueError("the cost_model schedule needs the measured costs c and v, and the cost probes did not run")
    # the warmup always runs the draft (its kernels are what it warms) and decides nothing
    return make_schedule(name, point.gamma, c=c, v=dict(costs.v), evidence=evidence_of(ctx, point),
                         prefill_cost=costs.draft_prefill.get(draft_label),
                         budget=None if ctx.warming_up else max_new_tokens)


def evidence_of(ctx, point):
    """What cost_model learnt on this point's earlier batches (warmup included): its rows' prior, how long rows
    run, how many batches it skipped (PointEvidence)."""
    from decode.drafters.schedules import PointEvidence

    return ctx.memory.setdefault(("cost_model", point.key), PointEvidence(point.gamma))


def tree_for(ctx, point, sampling):
    """The point's token tree drafter (decode/drafters/draft_tree.py), None for a chain."""
    from decode.drafters.draft_tree import DynamicTree, StaticTree
    from decode.tree_layout import AUTO, branching_or_budget, static_parents

    label = getattr(point, "tree", None)
    if label is None:
        return None
    if label == AUTO:
        from decode.drafters.draft_tree import AutoTree

        return AutoTree.for_point(ctx, point, sampling)
    shape = branching_or_budget(label)
    if isinstance(shape, int):
        return DynamicTree(shape, ctx.options[point.method].tree_top_k, sampling)
    return StaticTree(static_parents(shape), sampling)


def run(ctx, point, prompt_ids, prompt_mask, generation, generator):
    from decode.drafters import DraftModelDrafter  # torch loads when a method runs, not with the registry
    from decode.generate import generate_speculative

    tree = tree_for(ctx, point, generation.sampling)
    schedule = None if tree is not None else schedule_for(ctx, point, point.draft, generation.max_new_tokens)
    drafter = DraftModelDrafter(ctx.drafts[point.draft], ctx.target_vocab_size, generation.sampling, generator,
                                schedule=schedule, tree=tree, context=point.draft_context)
    records = generate_speculative(ctx.target, drafter, prompt_ids, prompt_mask, generation, point.gamma, generator,
                                   ctx.clock, synthetic_acceptance=point.synthetic_acceptance, load=ctx.load)
    evidence = getattr(schedule, "evidence", None)  # cost_model's; the warmup's budget is not the run's
    # (a served run is no batch that runs to its longest row: cost_model's prefill decision is not taken there)
    if evidence is not None and not ctx.warming_up and ctx.load is None:
        evidence.finish([r.new_tokens for r in records], [r.stop_reason == "eos" for r in records])
    return records


SPEC = MethodSpec("speculative", "a draft model proposes up to gamma tokens a round (its schedule decides how many), "
                  "the target verifies them in one forward (our engine)",
                  axes=("draft", "gamma", "schedule", "tree", "draft_context", "synthetic_acceptance"), run=run, has_rounds=True,
                  tree_auto=True, options=Options, schedules=SCHEDULES, measured_schedules=MEASURED)
