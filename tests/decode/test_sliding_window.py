"""Sliding-window attention counts cache slots: the engine keeps such caches hole-free so that greedy
speculative decoding returns the target's own tokens, row by row, inside and past the window.

The drafts here agree with the target only in part (the target's weights plus a little noise: about
35-65% of drafts accepted), so rows of a ragged batch accept different lengths and each rollback
leaves holes in the rows that accepted less. Without `KVState.hole_free` those holes push real tokens
out of a window counted in slots, and these configurations diverge from the baseline (checked by
forcing hole_free off: every case below then fails); the tests also check that such window-shrinking
holes really occurred, so that they cannot silently stop exercising the case.
"""

import pytest
import torch
from transformers import (DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.kv import CacheLayoutError, KVState, sliding_window_of
from tiny_models import VOCAB, noisy_copy, ragged_batch

# relative noise on the draft's weights: the gemma3 pair (one local layer) is less sensitive to it
DRAFT_NOISE = {"mistral": 0.03, "qwen2": 0.03, "gemma3": 0.08}

# window, prompt lengths, new tokens, gammas, prompt seeds
CASES = {
    # prompt + generation <= window for every row: only holes can push a token out of the window
    "inside-window": (32, [14, 18, 11, 16], 14, [4], range(6)),
    # the window-8 ragged batch of 4 and 40 new tokens of the issue
    "past-window": (8, [3, 9, 1, 6], 40, [2, 4], range(2)),
}


def tiny_windowed(arch: str, window: int, seed: int, layers: int = 2, hidden: int = 64):
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, sliding_window=window)
    if arch == "mistral":
        model = MistralForCausalLM(MistralConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=True, max_window_layers=0, **common))
    elif arch == "gemma3":  # a local layer and a global one
        config = Gemma3TextConfig(head_dim=16, tie_word_embeddings=False,  # tied: it repeats its input
                                  layer_types=["sliding_attention", "full_attention"][:layers], **common)
        model = Gemma3ForCausalLM(config)
    else:
        raise ValueError(arch)
    return model.float().eval()



def record_window_shrinking_holes(monkeypatch, target, window: int) -> list[int]:
    """Watch the target's cache (not the draft's) at each rollback, before it is compacted, and return a list
    that gets, per rollback, the number of rows whose window the holes would shrink if they were kept: rows
    whose last `window` slots hold fewer than min(tokens, window) real tokens, or whose tokens plus every hole
    rolled back so far (had none been compacted) would exceed the window."""
    shrinking = []
    real_forward, real_select_rows, real_maybe_compact = KVState.forward, KVState.select_rows, KVState.maybe_compact

    def forward(self, model, *args, **kwargs):
        if model is target and self.mask is None:
            self.holes_so_far = None  # [B] holes this row has had, summed over rollbacks
        return real_forward(self, model, *args, **kwargs)

    def select_rows(self, rows):
        if getattr(self, "holes_so_far", None) is not None:
            self.holes_so_far = self.holes_so_far[rows]
        real_select_rows(self, rows)

    def maybe_compact(self):
        if hasattr(self, "holes_so_far") and self.mask is not None and self.mask.numel():
            tokens = self.mask.sum(dim=1)
            first_real = (self.mask != 0).int().argmax(dim=1)
            holes = self.length - first_real - tokens  # new since the last call: a hole-free cache is compacted
            self.holes_so_far = holes if self.holes_so_far is None else self.holes_so_far + holes
            in_window = self.mask[:, -window:].sum(dim=1)
            shrunk = (in_window < tokens.clamp(max=window)) | ((self.holes_so_far > 0) & (tokens + self.holes_so_far > window))
            shrinking.append(int(shrunk.sum()))
        real_maybe_compact(self)

    monkeypatch.setattr(KVState, "forward", forward)
    monkeypatch.setattr(KVState, "select_rows", select_rows)
    monkeypatch.setattr(KVState, "maybe_compact", maybe_compact)
    return shrinking


def test_window_detected_from_config():
    assert sliding_window_of(tiny_windowed("mistral", 8, 0).config) == 8
    assert sliding_window_of(tiny_windowed("qwen2", 8, 0).config) == 8
    assert sliding_window_of(tiny_windowed("gemma3", 8, 0).config) == 8
    assert sliding_window_of(Qwen2Config(num_hidden_layers=2, sliding_window=8, use_sliding_window=False)) is None
    assert sliding_window_of(MistralConfig(num_hidden_layers=2, sliding_window=None)) is None


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "gemma3"])
@pytest.mark.parametrize("case", list(CASES))
def test_greedy_speculative_equals_baseline_with_sliding_window(monkeypatch, arch, case):
    window, lengths, max_new_tokens, gammas, prompt_seeds = CASES[case]
    if case == "inside-window":
        assert max(lengths) + max_new_tokens <= window
    target = tiny_windowed(arch, window, seed=1)
    drafter = DraftModelDrafter(noisy_copy(target, DRAFT_NOISE[arch]), VOCAB, Sampling())
    shrinking = record_window_shrinking_holes(monkeypatch, target, window)
    generation = Generation(max_new_tokens=max_new_tokens)
    mismatches, drafted, accepted = [], 0, 0
    with torch.inference_mode():
        for prompt_seed in prompt_seeds:
            ids, mask = ragged_batch(lengths, seed=prompt_seed)
            base = generate_baseline(target, ids, mask, generation)
            if prompt_seed == prompt_seeds[0]:  # the batched baseline is each row's own greedy output
                for row, length in enumerate(lengths):
                    prompt = ids[row:row + 1, -length:]
                    alone = generate_baseline(target, prompt, torch.ones_like(prompt), generation)[0]
                    assert base[row].output_ids == alone.output_ids, f"row {row}: the batched baseline differs"
            for gamma in gammas:
                spec = generate_speculative(target, drafter, ids, mask, generation, gamma)
                for row in range(len(lengths)):
                    if spec[row].output_ids != base[row].output_ids:
                        mismatches.append((prompt_seed, gamma, row))
                    drafted += sum(r["drafted"] for r in spec[row].rounds)
                    accepted += sum(r["accepted"] for r in spec[row].rounds)
    assert not mismatches, f"{len(mismatches)} (prompt seed, gamma, row) differ from the baseline: {mismatches}"
    assert 0.25 < accepted / drafted < 0.9, f"acceptance {accepted / drafted:.2f}: the draft should agree in part"
    # the case was exercised: rollbacks left holes that would have shrunk a row's window
    assert sum(shrinking) > 0, "no rollback left window-shrinking holes in the target's cache"


def test_windowed_cache_has_no_holes_after_rollback():
    model = tiny_windowed("mistral", 8, seed=1)
    ids, mask = ragged_batch([2, 5], seed=1)
    state = KVState()
    with torch.inference_mode():
        state.forward(model, ids, mask)
        state.forward(model, torch.full((2, 4), 5))
        state.keep_prefix_of_last(4, torch.tensor([1, 3]), 3)
    assert state.hole_free and state.hole_counts()[0] == 0 and state.compactions == 1
    assert state.mask.sum(dim=1).tolist() == [3, 8]


def test_trimming_sliding_cache_is_refused():
    model = tiny_windowed("mistral", 4, seed=1)
    ids, mask = ragged_batch([6, 3], seed=1)
    state = KVState(cache=DynamicCache(config=model.config))  # its layers keep only the last W-1 slots
    with torch.inference_mode(), pytest.raises(CacheLayoutError, match="slots but the mask has"):
        state.forward(model, ids, mask)
