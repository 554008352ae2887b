"""Greedy speculative decoding returns the target's own tokens, row by row."""
import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from tiny_models import VOCAB, ragged_batch, tiny_model

ARCHS = ["llama", "gpt2", "qwen2"]


def run_pair(arch, lengths, gamma, max_new_tokens=24, eos=(), draft=None, target=None, seed=0):
    target = target or tiny_model(arch, seed=1, layers=3)
    draft = draft or tiny_model(arch, seed=2, layers=1)
    ids, mask = ragged_batch(lengths, seed=seed)
    generation = Generation(max_new_tokens=max_new_tokens, eos_token_ids=tuple(eos))
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, gamma)
    return base, spec


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("gamma", [1, 3, 8])
@pytest.mark.parametrize("lengths", [[7], [5, 11, 1, 8, 3]], ids=["batch1", "ragged5"])
def test_greedy_speculative_equals_baseline(arch, gamma, lengths):
    base, spec = run_pair(arch, lengths, gamma)
    for row, (b, s) in enumerate(zip(base, spec)):
        assert s.output_ids == b.output_ids, f"row {row} diverged"
        assert s.new_tokens == 24
        assert sum(r["emitted"] for r in s.rounds) + 1 == s.new_tokens  # + the prefill's token
        assert s.target_forwards == len(s.rounds) + 1


def test_batched_rows_equal_single_prompt_runs():
    """Left padding, masked rollback and dropped rows do not change a row's tokens."""
    lengths = [4, 9, 2, 6]
    target, draft = tiny_model("llama", seed=1, layers=3), tiny_model("llama", seed=2, layers=1)
    ids, mask = ragged_batch(lengths)
    generation = Generation(max_new_tokens=20)
    with torch.inference_mode():
        batched = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, 3)
        for row, length in enumerate(lengths):
            prompt = ids[row:row + 1, -length:]
            single = generate_baseline(target, prompt, torch.ones_like(prompt), generation)
            assert batched[row].output_ids == single[0].output_ids, f"row {row}"


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_draft_equal_to_target_accepts_everything(arch):
    target = tiny_model(arch, seed=1, layers=2)
    gamma, max_new = 4, 23
    base, spec = run_pair(arch, [6, 3, 9], gamma, max_new_tokens=max_new, draft=target, target=target)
    for b, s in zip(base, spec):
        assert s.output_ids == b.output_ids
        for r in s.rounds[:-1]:
            assert r["accepted"] == r["drafted"] == gamma
            assert r["emitted"] == gamma + 1
        assert sum(r["accepted"] for r in s.rounds) == sum(r["drafted"] for r in s.rounds)


def test_gamma_larger_than_budget_is_clipped():
    base, spec = run_pair("llama", [5, 2], gamma=8, max_new_tokens=5)
    for b, s in zip(base, spec):
        assert s.output_ids == b.output_ids and s.new_tokens == 5
        assert all(r["drafted"] <= 3 for r in s.rounds)  # 5 tokens: 1 from prefill, then at most 4 a round


def test_one_token_prompt_and_max_new_tokens_one():
    base, spec = run_pair("qwen2", [1, 1], gamma=3, max_new_tokens=1)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    assert all(s.new_tokens == 1 and s.rounds == [] for s in spec)
    base, spec = run_pair("qwen2", [1], gamma=3, max_new_tokens=12)
    assert spec[0].output_ids == base[0].output_ids


def test_eos_accepted_from_draft_cuts_the_row():
    target = tiny_model("llama", seed=1, layers=2)
    lengths = [6, 3, 9, 4]
    # pick as EOS a token the target produces mid-sequence in some row, so that with draft == target
    # it is proposed by the draft and accepted inside a run
    base_full, _ = run_pair("llama", lengths, 4, max_new_tokens=20, draft=target, target=target)
    eos = base_full[0].output_ids[5]
    base, spec = run_pair("llama", lengths, 4, max_new_tokens=20, eos=[eos], draft=target, target=target)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    assert spec[0].output_ids[-1] == eos and spec[0].stop_reason == "eos"
    assert spec[0].new_tokens <= 6
    assert any(s.new_tokens < 20 for s in spec)
    for s in spec:
        assert s.output_ids.count(eos) <= 1


def test_padded_draft_vocab_is_restricted_to_common():
    target = tiny_model("llama", seed=1, layers=2, vocab_size=VOCAB)
    draft = tiny_model("llama", seed=2, layers=1, vocab_size=VOCAB - 16)  # fewer output rows
    ids, mask = ragged_batch([5, 8], vocab_size=VOCAB - 16)
    generation = Generation(max_new_tokens=16)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling()), ids, mask, generation, 3)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
