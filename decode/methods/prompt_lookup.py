"""Prompt lookup decoding (Saxena 2023): n-gram matches in the prompt and the text so far draft, no model."""
from decode.methods.base import MethodSpec


def run(ctx, point, prompt_ids, prompt_mask, generation, generator):
    from decode.generate import generate_speculative  # torch loads when a method runs, not with the registry
    from decode.drafters.prompt_lookup import PromptLookupDrafter  # imported when run: the registry loads without every drafter's dependencies

    drafter = PromptLookupDrafter(ngram_max=ctx.options.get("ngram_max", 3), ngram_min=ctx.options.get("ngram_min", 1))
    return generate_speculative(ctx.target, drafter, prompt_ids, prompt_mask, generation, point.gamma, generator,
                                ctx.clock)


SPEC = MethodSpec("prompt_lookup", "n-gram lookup in the prompt and the output so far proposes up to gamma tokens; "
                  "no draft model (our engine)", axes=("gamma", "tree"), run=run, has_rounds=True)
