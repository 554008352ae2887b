"""Self-speculation (LayerSkip; Draft & Verify): the target's first exit_layer layers, its final norm and its
LM head draft; no second model."""
from decode.methods.base import MethodSpec


def run(ctx, point, prompt_ids, prompt_mask, generation, generator):
    from decode.generate import generate_speculative  # torch loads when a method runs, not with the registry
    from decode.drafters.early_exit import EarlyExitDrafter  # imported when run: the registry loads without every drafter's dependencies

    drafter = EarlyExitDrafter(ctx.target, point.exit_layer, ctx.target_vocab_size, generation.sampling, generator)
    return generate_speculative(ctx.target, drafter, prompt_ids, prompt_mask, generation, point.gamma, generator,
                                ctx.clock, synthetic_acceptance=point.synthetic_acceptance, load=ctx.load)


SPEC = MethodSpec("early_exit", "the target's first exit_layer layers draft up to gamma tokens (self-speculation, "
                  "our engine)", axes=("exit_layer", "gamma", "synthetic_acceptance"), run=run, has_rounds=True)
