"""The target alone, one forward per token: the reference every ratio is computed against."""
from decode.methods.base import EngineCaps, MethodSpec


def run(ctx, point, prompt_ids, prompt_mask, generation, generator):
    from decode.generate import generate_baseline  # torch loads when a method runs, not with the registry
    return generate_baseline(ctx.target, prompt_ids, prompt_mask, generation, generator, ctx.clock,
                             load=ctx.load)


SPEC = MethodSpec("baseline", "the target alone, autoregressive (our engine)", axes=(), run=run, is_reference=True,
                  engine_caps=EngineCaps(home=True, times_forwards=True, probes_numerics=True, compiles=True))
