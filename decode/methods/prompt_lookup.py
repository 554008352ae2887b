"""Prompt lookup decoding (Saxena 2023): n-gram matches in the prompt and the text so far draft, no model."""
from dataclasses import dataclass

from decode.methods.base import MethodSpec, option
from decode.methods.speculative import Trees


@dataclass(frozen=True)
class Ngrams:
    ngram_max: int = option(3, "prompt_lookup: longest n-gram matched", ge=1)
    ngram_min: int = option(1, "prompt_lookup: shortest n-gram matched; hf_prompt_lookup needs 1 (transformers has "
                               "no minimum)", ge=1)

    def __post_init__(self):
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) is above ngram_max ({self.ngram_max})")


@dataclass(frozen=True)
class Options(Ngrams, Trees):
    pass


def run(ctx, point, prompt_ids, prompt_mask, generation, generator):
    from decode.generate import generate_speculative  # torch loads when a method runs, not with the registry
    from decode.drafters.prompt_lookup import PromptLookupDrafter  # imported when run: the registry loads without every drafter's dependencies

    from decode.tree_layout import branching_or_budget, tree_nodes

    label = getattr(point, "tree", None)
    options = ctx.options[point.method]
    matches, budget = 1, None
    if label is not None:  # a trie of several matches: a static label's first branching, or top_k for a dynamic one
        shape = branching_or_budget(label)
        matches = shape[0] if isinstance(shape, list) else options.tree_top_k
        budget = tree_nodes(label, point.gamma)
    drafter = PromptLookupDrafter(ngram_max=options.ngram_max, ngram_min=options.ngram_min,
                                  matches=matches, budget=budget)
    return generate_speculative(ctx.target, drafter, prompt_ids, prompt_mask, generation, point.gamma, generator,
                                ctx.clock, synthetic_acceptance=point.synthetic_acceptance, load=ctx.load)


SPEC = MethodSpec("prompt_lookup", "n-gram lookup in the prompt and the output so far proposes up to gamma tokens; "
                  "no draft model (our engine)", axes=("gamma", "tree", "synthetic_acceptance"), run=run, has_rounds=True,
                  options=Options)
