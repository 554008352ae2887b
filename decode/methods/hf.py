"""transformers' own generate(), run as peers on the same prompts with the same settings.

Each peer gives one wall time per batch: no per-row latency, TTFT or forward counts.
"""
from __future__ import annotations

from dataclasses import dataclass

from decode.methods.base import MethodSpec
from decode.methods.prompt_lookup import Ngrams


@dataclass(frozen=True)
class LookupOptions(Ngrams):
    """prompt_lookup's n-gram sizes, where transformers (5.23) tries n-grams from max_matching_ngram_size down to 1
    and takes no minimum: a minimum above 1 would answer another question than prompt_lookup's."""

    def __post_init__(self):
        super().__post_init__()
        if self.ngram_min != 1:
            raise ValueError(f"speculative.ngram_min: {self.ngram_min} cannot apply to hf_prompt_lookup (transformers "
                             "matches n-grams down to 1 and takes no minimum); set ngram_min: 1, or run "
                             "hf_prompt_lookup in a run of its own")


def generation_config(generation, pad_id: int, **assisted):
    """A GenerationConfig with exactly our settings: none of the model's own defaults (a repetition penalty,
    sampling switched on) may leak into a comparison."""
    from transformers import GenerationConfig

    s = generation.sampling
    kwargs = dict(max_new_tokens=generation.max_new_tokens, do_sample=s.do_sample,
                  eos_token_id=list(generation.eos_token_ids), pad_token_id=pad_id, repetition_penalty=1.0)
    if s.do_sample:
        kwargs.update(temperature=s.temperature, top_k=s.top_k or 0, top_p=s.top_p or 1.0)
    else:
        kwargs.update(temperature=None, top_k=None, top_p=None)
    return GenerationConfig(**kwargs, **assisted)


def _generate(ctx, prompt_ids, prompt_mask, generation, config, assistant=None) -> list:
    from decode.generate import RowRecord  # torch loads when a method runs, not with the registry

    start = ctx.clock.now()
    output = ctx.target.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config,
                                 assistant_model=assistant)
    elapsed = ctx.clock.now() - start
    records = []
    for row in output[:, prompt_ids.shape[1]:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in generation.eos_token_ids), None)
        tokens = row[:cut] if cut else row[: generation.max_new_tokens]
        records.append(RowRecord(output_ids=tokens, stop_reason="eos" if cut else "length", prefill_s=None,
                                 latency_s=elapsed, target_forwards=None, draft_forwards=None, target_s=elapsed))
    return records


def run_generate(ctx, point, prompt_ids, prompt_mask, generation, generator):
    return _generate(ctx, prompt_ids, prompt_mask, generation, generation_config(generation, ctx.pad_id))


def _with_assistant(ctx, point, prompt_ids, prompt_mask, generation, schedule: dict):
    """Assisted generation reads its schedule from the assistant's generation_config: set it on a copy of
    that config for this call only, and put the model's own back after."""
    import copy

    draft = ctx.drafts[point.draft]
    saved = draft.generation_config
    draft.generation_config = copy.deepcopy(saved)
    for key, value in schedule.items():
        setattr(draft.generation_config, key, value)
    try:
        config = generation_config(generation, ctx.pad_id, **schedule)
        return _generate(ctx, prompt_ids, prompt_mask, generation, config, assistant=draft)
    finally:
        draft.generation_config = saved


def run_assisted(ctx, point, prompt_ids, prompt_mask, generation, generator):
    return _with_assistant(ctx, point, prompt_ids, prompt_mask, generation,
                           {"num_assistant_tokens": point.gamma, "num_assistant_tokens_schedule": "constant",
                            "assistant_confidence_threshold": 0.0})


def run_assisted_default(ctx, point, prompt_ids, prompt_mask, generation, generator):
    """What transformers' users actually run: its own default schedule. transformers 5 leaves these keys None
    in a GenerationConfig and fills them from its global defaults (20 tokens, schedule "constant",
    confidence threshold 0.4 in 5.23); they are read from there, so a newer default follows the library."""
    from transformers import GenerationConfig

    keys = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    defaults = GenerationConfig._get_default_generation_params() if hasattr(
        GenerationConfig, "_get_default_generation_params") else {}
    fresh = GenerationConfig()
    schedule = {key: getattr(fresh, key) if getattr(fresh, key, None) is not None else defaults.get(key) for key in keys}
    return _with_assistant(ctx, point, prompt_ids, prompt_mask, generation, schedule)


def run_prompt_lookup(ctx, point, prompt_ids, prompt_mask, generation, generator):
    # n-grams of ngram_max down to 1: transformers takes no minimum, so LookupOptions refuses ngram_min > 1
    config = generation_config(generation, ctx.pad_id, prompt_lookup_num_tokens=point.gamma,
                               max_matching_ngram_size=ctx.options[point.method].ngram_max)
    return _generate(ctx, prompt_ids, prompt_mask, generation, config)


GENERATE = MethodSpec("hf_generate", "transformers' model.generate(), the target alone", axes=(), run=run_generate,
                      per_row_timing=False, peer=True, serves=False)
ASSISTED = MethodSpec("hf_assisted", "transformers' assisted generation with the draft, constant schedule at gamma",
                      axes=("draft", "gamma"), run=run_assisted, per_row_timing=False, max_batch_size=1, peer=True, serves=False)
ASSISTED_DEFAULT = MethodSpec("hf_assisted_default", "transformers' assisted generation with its own default schedule",
                              axes=("draft",), run=run_assisted_default, per_row_timing=False, max_batch_size=1,
                              peer=True, serves=False)
PROMPT_LOOKUP = MethodSpec("hf_prompt_lookup", "transformers' prompt lookup decoding (prompt_lookup_num_tokens = gamma)",
                           axes=("gamma",), run=run_prompt_lookup, per_row_timing=False, max_batch_size=1, peer=True, serves=False,
                           options=LookupOptions)
