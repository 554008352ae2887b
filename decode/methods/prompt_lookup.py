"""Prompt lookup decoding (Saxena 2023): n-gram matches in the prompt and the text so far draft, no model."""
from decode.methods.base import MethodSpec


def run(ctx, point, prompt_ids, prompt_mask, generation, generator):
    from decode.generate import generate_speculative  # torch loads when a method runs, not with the registry
    from decode.drafters.prompt_lookup import PromptLookupDrafter  # imported when run: the registry loads without every drafter's dependencies

    from decode.tree_layout import branching_or_budget, tree_nodes

    label = getattr(point, "tree", None)
    matches, budget = 1, None
    if label is not None:  # a trie of several matches: a static label's first branching, or top_k for a dynamic one
        shape = branching_or_budget(label)
        matches = shape[0] if isinstance(shape, list) else ctx.options.get("tree_top_k", 4)
        budget = tree_nodes(label, point.gamma)
    drafter = PromptLookupDrafter(ngram_max=ctx.options.get("ngram_max", 3), ngram_min=ctx.options.get("ngram_min", 1),
                                  matches=matches, budget=budget)
    return generate_speculative(ctx.target, drafter, prompt_ids, prompt_mask, generation, point.gamma, generator,
                                ctx.clock, synthetic_acceptance=point.synthetic_acceptance, load=ctx.load)


SPEC = MethodSpec("prompt_lookup", "n-gram lookup in the prompt and the output so far proposes up to gamma tokens; "
                  "no draft model (our engine)", axes=("gamma", "tree", "synthetic_acceptance"), run=run, has_rounds=True)
