"""Speculative decoding with a draft model (Leviathan et al. 2023), our engine, with a draft-length
schedule: constant, heuristic, confidence or cost_model (decode/drafters/schedules.py)."""
from dataclasses import dataclass

from decode.methods.base import MethodSpec, option

SCHEDULES = ("constant", "heuristic", "confidence", "cost_model")  # the draft-length schedules (decode/drafters/
#   schedules.py SCHEDULES: a test keeps them equal)
MEASURED = ("cost_model",)  # those that read the measured c and v and the draft's prefill cost


@dataclass(frozen=True)
class Trees:
    tree_top_k: int = option(4, "dynamic trees: children per expanded node; prompt lookup's matches for a dynamic "
                                "tree", ge=1, le=16)


@dataclass(frozen=True)
class Confidence:
    confidence: float = option(0.4, "confidence schedule, and hybrid's draft branch: a row stops drafting after the "
                                    "step whose top probability falls under this", gt=0, lt=1)


@dataclass(frozen=True)
class Options(Confidence, Trees):
    pass


def schedule_for(ctx, point, draft_label: str | None, max_new_tokens: int | None = None):
    """The point's schedule; cost_model reads the c and v measured in this run (runner/probes.py)."""
    from decode.drafters.schedules import make_schedule

    name = point.schedule or SCHEDULES[0]
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
