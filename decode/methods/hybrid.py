"""Hybrid drafting: per row and round, prompt lookup, suffix decoding, the draft model, or a tree of a free source and
the draft model, whichever promises the most accepted tokens per unit of measured cost (decode/drafters/hybrid.py)."""
from decode.methods.base import MethodSpec


def run(ctx, point, prompt_ids, prompt_mask, generation, generator):
    from decode.drafters import DraftModelDrafter
    from decode.drafters.hybrid import SOURCES, HybridDrafter
    from decode.drafters.schedules import PointEvidence
    from decode.drafters.suffix import remember_outputs
    from decode.generate import generate_speculative
    from decode.methods.suffix import MAX_DEPTH, MIN_PROB, cache_for

    costs = ctx.costs
    c = costs.c_for(point.draft) if costs else None
    if c is None or not costs.v:
        raise ValueError("hybrid needs the measured costs c and v, and the cost probes did not run")
    max_depth = ctx.options.get("suffix_max_depth") or MAX_DEPTH
    min_prob = ctx.options.get("suffix_min_prob")
    cache = cache_for(ctx, point, max_depth + point.gamma)
    pools = ctx.memory.setdefault(("hybrid", point.key), {s: PointEvidence(point.gamma) for s in SOURCES})
    draft = DraftModelDrafter(ctx.drafts[point.draft], ctx.target_vocab_size, generation.sampling, generator)
    drafter = HybridDrafter(draft, ctx.target_vocab_size, point.gamma, c, dict(costs.v), pools=pools, cache=cache,
                            ngram_max=ctx.options.get("ngram_max", 3), ngram_min=ctx.options.get("ngram_min", 1),
                            suffix_max_depth=max_depth, suffix_min_prob=MIN_PROB if min_prob is None else min_prob)
    records = generate_speculative(ctx.target, drafter, prompt_ids, prompt_mask, generation, point.gamma, generator,
                                   ctx.clock)
    if not ctx.warming_up:  # the warmup runs the first batch's prompts: its outputs would be the answers
        remember_outputs(cache, prompt_ids, prompt_mask, records)
    return records


SPEC = MethodSpec("hybrid", "per row and round, prompt lookup, suffix decoding, the draft model, or a tree of a free "
                  "source and the draft, whichever promises the most accepted tokens per unit of measured cost "
                  "(our engine)", axes=("draft", "gamma"), run=run, has_rounds=True)
