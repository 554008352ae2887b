"""Suffix decoding (Oliaro et al. 2024): the most frequent continuation of the text's tail in a suffix trie of the
prompt, the output so far and earlier requests' outputs drafts, no model (decode/drafters/suffix.py)."""
from decode.methods.base import MethodSpec

MAX_DEPTH, MIN_PROB, CACHE_TOKENS = 8, 0.1, 16384  # speculative.suffix_* options where given


def cache_for(ctx, point, trie_depth: int):
    """The point's cache of earlier outputs (per process, RunContext.memory), shared by its later batches."""
    from decode.drafters.suffix import SuffixCache

    return ctx.memory.setdefault(("suffix_cache", point.key),
                                 SuffixCache(trie_depth, ctx.options.get("suffix_cache_tokens") or CACHE_TOKENS))


def options(ctx) -> tuple[int, float]:
    """(the longest tail matched, the least probability a drafted token may have): speculative.suffix_max_depth and
    suffix_min_prob where given, else MAX_DEPTH and MIN_PROB."""
    min_prob = ctx.options.get("suffix_min_prob")
    return ctx.options.get("suffix_max_depth") or MAX_DEPTH, MIN_PROB if min_prob is None else min_prob


def generate_remembering(ctx, drafter, cache, point, prompt_ids, prompt_mask, generation, generator):
    """The batch through the engine; its outputs then join the point's cache of earlier outputs (not the warmup's:
    it runs the first batch's prompts, and its outputs would be their answers). Served under a load, the requests'
    outputs join when the whole load point ends, as a batch's do: while it runs, requests draft from their own text
    and from what earlier batches of the point left."""
    from decode.drafters.suffix import remember_outputs
    from decode.generate import generate_speculative

    records = generate_speculative(ctx.target, drafter, prompt_ids, prompt_mask, generation, point.gamma, generator,
                                   ctx.clock, load=ctx.load)
    if not ctx.warming_up:
        remember_outputs(cache, prompt_ids, prompt_mask, records)
    return records


def run(ctx, point, prompt_ids, prompt_mask, generation, generator):
    from decode.drafters.suffix import SuffixDrafter
    from decode.tree_layout import tree_nodes

    label = getattr(point, "tree", None)
    max_depth, min_prob = options(ctx)
    depth = max_depth + point.gamma
    cache = cache_for(ctx, point, depth)
    drafter = SuffixDrafter(cache, max_depth=max_depth, min_prob=min_prob,
                            budget=None if label is None else tree_nodes(label, point.gamma), depth=depth)
    return generate_remembering(ctx, drafter, cache, point, prompt_ids, prompt_mask, generation, generator)

SPEC = MethodSpec("suffix", "suffix decoding: the most frequent continuation of the text's tail in a suffix trie of the "
                  "prompt, the output so far and earlier requests' outputs proposes up to gamma tokens (a tree: its "
                  "most probable continuations); no draft model (our engine)", axes=("gamma", "tree"), run=run,
                  has_rounds=True)
