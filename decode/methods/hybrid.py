"""Hybrid drafting: per row and round, prompt lookup, suffix decoding, the draft model, or a tree of a free source and
the draft model, whichever promises the most accepted tokens per unit of measured cost (decode/drafters/hybrid.py)."""
from dataclasses import dataclass

from decode.methods import suffix
from decode.methods.base import MethodSpec, option
from decode.methods.prompt_lookup import Ngrams
from decode.methods.speculative import Confidence
from decode.methods.suffix import MEMORY


@dataclass(frozen=True)
class Options(Confidence, Ngrams, suffix.Options):
    hybrid_max_draft: int | None = option(None, "hybrid: the longest draft a round may take from any source, each "
                                                "row's length chosen by expected tokens per cost (past gamma where "
                                                "acceptance stays high); null: gamma", ge=1, le=64)


def run(ctx, point, prompt_ids, prompt_mask, generation, generator):
    from decode.drafters import DraftModelDrafter
    from decode.drafters.hybrid import HybridDrafter, LengthRecord
    from decode.drafters.base import unpadded
    from decode.methods.suffix import cache_for, generate_remembering

    costs = ctx.costs
    c = costs.c_for(point.draft) if costs else None
    if c is None or not costs.v:
        raise ValueError("hybrid needs the measured costs c and v, and the cost probes did not run")
    options = ctx.options[point.method]
    max_depth, min_prob = options.suffix_max_depth, options.suffix_min_prob
    longest = cap(ctx, point)
    cache = cache_for(ctx, point, max_depth + longest)
    pools = ctx.memory.setdefault(("hybrid", point.key), {})  # evidence key -> PointEvidence, made by the drafter
    group_pools = ctx.memory.setdefault(("hybrid", point.key, "groups"), {})  # group -> such pools: a category's prior
    start_pools = ctx.memory.setdefault(("hybrid", point.key, "start"), {})  # None or a group -> StartRecord
    lengths = ctx.memory.setdefault(("hybrid", point.key, "lengths"), LengthRecord())  # finished requests' lengths
    draft = DraftModelDrafter(ctx.drafts[point.draft], ctx.target_vocab_size, generation.sampling, generator,
                              context=point.draft_context)
    drafter = HybridDrafter(draft, ctx.target_vocab_size, longest, c, dict(costs.v), pools=pools, cache=cache,
                            ngram_max=options.ngram_max, ngram_min=options.ngram_min,
                            suffix_max_depth=max_depth, suffix_min_prob=min_prob, group_pools=group_pools,
                            group_of=lambda prompt: ctx.groups.get(tuple(prompt)),
                            prefill_cost=costs.draft_prefill.get(point.draft), budget=generation.max_new_tokens,
                            start_pools=start_pools, confidence=options.confidence, lengths=lengths)
    records = generate_remembering(ctx, drafter, cache, point, prompt_ids, prompt_mask, generation, generator,
                                   gamma=longest)
    if not ctx.warming_up and ctx.load is None:  # a static batch's rows, in its prompts' order (the warmup's budget
        for prompt, record in zip(unpadded(prompt_ids, prompt_mask), records):  # is not the run's)
            lengths.add(ctx.groups.get(tuple(prompt)), record.new_tokens)
    return records


def cap(ctx, point) -> int:
    """The longest draft of a round: speculative.hybrid_max_draft where it is above the point's gamma, else gamma."""
    return max(point.gamma, ctx.options[point.method].hybrid_max_draft or 0)


SPEC = MethodSpec("hybrid", "per row and round, prompt lookup, suffix decoding, the draft model, or a tree of a free "
                  "source and the draft, whichever promises the most accepted tokens per unit of measured cost "
                  "(our engine)", axes=("draft", "gamma", "draft_context"), run=run, has_rounds=True,
                  draft_sources=("lookup", "suffix", "draft"), options=Options, draft_cap="hybrid_max_draft",
                  prices_rounds=True,
                  memory="each source's acceptance record, the prior of a new request's choice, belongs to the point, in "
                         "each process, pooled per dataset group where the prompts have one (dataset.group_by: a "
                         "category's record, shrunk toward the point's) and over the point otherwise; its suffix "
                         "source: " + MEMORY)  # decode/drafters/hybrid.py SOURCES (a test keeps them equal)
