"""EAGLE-3 (Li et al. 2025) in our engine: a head trained for the target drafts up to gamma tokens a round from the
target's own hidden states at three layers, as a chain or a token tree (a draft of kind eagle3: the head's folder, in the speculators, EAGLE or
SpecForge layout; decode/head_models.py)."""
from decode.methods.base import MethodSpec
from decode.methods.speculative import Trees


def run(ctx, point, prompt_ids, prompt_mask, generation, generator):
    from decode.drafters.head_drafters import head_drafter  # torch loads when a method runs, not with the registry
    from decode.generate import generate_speculative
    from decode.methods.speculative import tree_for

    tree = tree_for(ctx, point, generation.sampling)  # None: a chain
    drafter = head_drafter(ctx.drafts[point.draft], ctx.target_vocab_size, generation.sampling, generator, tree)
    return generate_speculative(ctx.target, drafter, prompt_ids, prompt_mask, generation, point.gamma, generator,
                                ctx.clock, synthetic_acceptance=point.synthetic_acceptance, load=ctx.load)


SPEC = MethodSpec("eagle3", "an EAGLE-3 head reads the target's hidden states at three layers and drafts up to gamma "
                  "tokens, a chain or a token tree (a draft of kind eagle3; our engine)",
                  axes=("draft", "gamma", "tree", "synthetic_acceptance"),
                  run=run, has_rounds=True, draft_kinds=("eagle3",), tree_auto=True,
                  options=Trees, head_kinds=("eagle3",))
