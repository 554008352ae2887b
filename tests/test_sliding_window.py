"""Sliding-window attention counts cache slots: the engine keeps such caches hole-free so that greedy
speculative decoding returns the target's own tokens, row by row, inside and past the window."""
import pytest
import torch
from transformers import (DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM)

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.kv import CacheLayoutError, KVState, sliding_window_of
from tiny_models import VOCAB, ragged_batch

LENGTHS = [3, 9, 1, 6]


def tiny_windowed(arch: str, window: int, seed: int, layers: int = 2, hidden: int = 64):
    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, sliding_window=window)
    if arch == "mistral":
        model = MistralForCausalLM(MistralConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=True, max_window_layers=0, **common))
    elif arch == "gemma3":  # a local layer and a global one (the one-layer draft: local only)
        config = Gemma3TextConfig(head_dim=16, tie_word_embeddings=False,  # tied: it repeats its input
                                  layer_types=["sliding_attention", "full_attention"][:layers], **common)
        model = Gemma3ForCausalLM(config)
    else:
        raise ValueError(arch)
    return model.float().eval()


def test_window_detected_from_config():
    assert sliding_window_of(tiny_windowed("mistral", 8, 0).config) == 8
    assert sliding_window_of(tiny_windowed("qwen2", 8, 0).config) == 8
    assert sliding_window_of(tiny_windowed("gemma3", 8, 0).config) == 8
    assert sliding_window_of(Qwen2Config(num_hidden_layers=2, sliding_window=8, use_sliding_window=False)) is None
    assert sliding_window_of(MistralConfig(num_hidden_layers=2, sliding_window=None)) is None


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "gemma3"])
@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("window,max_new_tokens", [(20, 10), (8, 40)], ids=["inside-window", "past-window"])
def test_greedy_speculative_equals_baseline_with_sliding_window(arch, gamma, window, max_new_tokens):
    target = tiny_windowed(arch, window, seed=1)
    draft = tiny_windowed(arch, window, seed=1, layers=1)  # the target minus a layer: agrees in part, so rollbacks leave holes
    ids, mask = ragged_batch(LENGTHS, seed=4)
    generation = Generation(max_new_tokens=max_new_tokens)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, gamma)
        for row, length in enumerate(LENGTHS):
            prompt = ids[row:row + 1, -length:]
            alone = generate_baseline(target, prompt, torch.ones_like(prompt), generation)[0]
            assert spec[row].output_ids == base[row].output_ids, f"row {row} differs from the batched baseline"
            assert spec[row].output_ids == alone.output_ids, f"row {row} differs from the row decoded alone"
    rounds = [r for s in spec for r in s.rounds]
    assert any(r["accepted"] < r["drafted"] for r in rounds), "the draft never disagreed: no rollback tested"


def test_windowed_cache_has_no_holes_after_rollback():
    model = tiny_windowed("mistral", 8, seed=1)
    ids, mask = ragged_batch([2, 5], seed=1)
    state = KVState()
    with torch.inference_mode():
        state.forward(model, ids, mask)
        state.forward(model, torch.full((2, 4), 5))
        state.keep_prefix_of_last(4, torch.tensor([1, 3]), 3)
    assert state.hole_free and state.hole_counts()[0] == 0
    assert state.mask.sum(dim=1).tolist() == [3, 8]


def test_trimming_sliding_cache_is_refused():
    model = tiny_windowed("mistral", 4, seed=1)
    ids, mask = ragged_batch([6, 3], seed=1)
    state = KVState(cache=DynamicCache(config=model.config))  # its layers keep only the last W-1 slots
    with torch.inference_mode(), pytest.raises(CacheLayoutError, match="slots but the mask has"):
        state.forward(model, ids, mask)
