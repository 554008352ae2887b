"""Suffix decoding (Oliaro et al. 2024): the most frequent continuation of the text's tail in a suffix trie of the
prompt, the output so far and earlier requests' outputs drafts, no model (decode/drafters/suffix.py)."""
from dataclasses import dataclass

from decode.methods.base import MethodSpec, option


@dataclass(frozen=True)
class Options:
    suffix_max_depth: int = option(8, "suffix and hybrid: the longest tail of the text matched in the suffix trie",
                                   ge=1, le=64, strict=True)
    suffix_min_prob: float = option(0.1, "suffix and hybrid: a drafted token's least probability along its path (the "
                                         "trie's counts)", ge=0, le=1, strict=True, allow_inf_nan=False)
    suffix_cache_tokens: int = option(16384, "suffix: the tokens of earlier outputs its cache keeps (the oldest leave "
                                             "first)", ge=1, strict=True)


def cache_for(ctx, point, trie_depth: int):
    """The point's cache of earlier outputs (per process, RunContext.memory), shared by its later batches of the same
    repeat. A repeat starts an empty one, so that repeats are alike: a conversation's turn 1 would draft, in repeat 1,
    from the answers to its own turns 2 and 3 that repeat 0 left (they re-emit its answer), and a prompt from every
    other prompt's answer where repeat 0 had only those before it."""
    from decode.drafters.suffix import SuffixCache

    repeat = getattr(ctx, "repeat", 0)
    held = ctx.memory.get(("suffix_cache", point.key))
    if held is None or held[0] != repeat:
        held = ctx.memory[("suffix_cache", point.key)] = (
            repeat, SuffixCache(trie_depth, ctx.options[point.method].suffix_cache_tokens))
    return held[1]


def generate_remembering(ctx, drafter, cache, point, prompt_ids, prompt_mask, generation, generator, gamma=None):
    """The batch through the engine; its outputs join the point's cache of earlier outputs (not the warmup's: it runs
    the first batch's prompts, and its outputs would be their answers): a static batch's when it ends (its rows never
    draft from each other), a served request's as it finishes, inside the timed loop, as a server's global tree
    grows (SuffixDecoding): every request admitted after draws on it, a conversation's later turns and the other
    conversations alike."""
    from collections import Counter

    from decode.drafters.suffix import prompt_key, remember_outputs, unpadded
    from decode.generate import generate_speculative

    on_finish = None
    if ctx.load is not None and not ctx.warming_up and cache is not None:
        keys = [prompt_key(p) for p in unpadded(prompt_ids, prompt_mask)]  # host reads before the loop's clock
        unfinished = Counter(keys)  # requests of each prompt still to finish (requests cycle through the prompts)

        def on_finish(request, record):
            # a prompt's output joins once no request of the same prompt is left: none drafts from its own answer
            unfinished[keys[request]] -= 1
            if not unfinished[keys[request]]:
                cache.remember(keys[request], list(record.output_ids))
    records = generate_speculative(ctx.target, drafter, prompt_ids, prompt_mask, generation, gamma or point.gamma,
                                   generator, ctx.clock, load=ctx.load, on_finish=on_finish)
    if ctx.load is None and not ctx.warming_up:
        remember_outputs(cache, prompt_ids, prompt_mask, records)
    return records


MEMORY = ("its cache of earlier outputs (a suffix trie of at most speculative.suffix_cache_tokens tokens, the oldest "
          "dropped first) belongs to the point and the repeat (each repeat starts an empty one, so repeats are alike), "
          "in each process (a Ray worker, a resumed run: its own), and is shared by all its requests: a static "
          "batch's outputs join it when the batch ends, a served request's when it finishes (the last request of its "
          "prompt, where requests cycle through the prompts), so every request admitted after it, of the same "
          "conversation or another, drafts from it; a request never drafts from its own earlier output (a prompt that "
          "runs again in a cycle of requests takes its own out first), and the untimed warmup adds nothing. A "
          "conversation's earlier turns and answers are also in its prompt: the row's own trie reads them")


def run(ctx, point, prompt_ids, prompt_mask, generation, generator):
    from decode.drafters.suffix import SuffixDrafter
    from decode.tree_layout import tree_nodes

    label = getattr(point, "tree", None)
    options = ctx.options[point.method]
    max_depth, min_prob = options.suffix_max_depth, options.suffix_min_prob
    depth = max_depth + point.gamma
    cache = cache_for(ctx, point, depth)
    drafter = SuffixDrafter(cache, max_depth=max_depth, min_prob=min_prob,
                            budget=None if label is None else tree_nodes(label, point.gamma), depth=depth)
    return generate_remembering(ctx, drafter, cache, point, prompt_ids, prompt_mask, generation, generator)

SPEC = MethodSpec("suffix", "suffix decoding: the most frequent continuation of the text's tail in a suffix trie of the "
                  "prompt, the output so far and earlier requests' outputs proposes up to gamma tokens (a tree: its "
                  "most probable continuations); no draft model (our engine)", axes=("gamma", "tree"), run=run,
                  has_rounds=True, memory=MEMORY, options=Options)
