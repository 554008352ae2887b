"""Prompt lookup (n-gram) drafting: the lookup agrees with transformers' PromptLookupCandidateGenerator, the drafter
keeps each row's text, greedy output is the baseline's, and sampling with point-mass drafts keeps the target's
distribution."""
import random

import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

import decode.sampling
from decode import Generation, Sampling, generate_baseline, generate_speculative
from decode.drafters.prompt_lookup import NgramIndex, PromptLookupDrafter, lookup
from stats import V, chi_square, exact_joint_of_tokens_2_and_3, joint_counts
from tiny_models import ragged_batch, tiny_model

ARCHS = ["llama", "gpt2", "qwen2"]


def repetitive_batch(lengths, seed=0):
    """Left-padded prompts [B, max(lengths)] that repeat a 3-token pattern, so that n-grams match at once."""
    ids, mask = ragged_batch(lengths, seed=seed)
    for row, length in enumerate(lengths):
        pattern = ids[row, -length:][:3].tolist()
        ids[row, -length:] = torch.tensor((pattern * length)[:length])
    return ids, mask


# ---- the lookup -----------------------------------------------------------------------------------------

def test_lookup_by_hand():
    history = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3]
    # tail [1, 2, 3] occurs ending at 2 (then 9) and at 6 (then 8): the first wins, as in transformers and vLLM
    assert lookup(history, 3, 1, 2) == [9, 1]
    assert lookup(history, 3, 1, 10) == [9, 1, 2, 3, 8, 1, 2, 3]  # up to the end of the text, no further
    # a longer match beats an earlier shorter one: 6 first occurs at 0 (then 0), the bigram [4, 6] at 2-3 (then 7)
    assert lookup([6, 0, 4, 6, 7, 4, 6], 3, 1, 1) == [7]
    assert lookup([6, 0, 4, 6, 7, 4, 6], 1, 1, 1) == [0]  # unigrams only: the first 6
    assert lookup([4, 5, 6], 3, 1, 2) == []  # nothing repeats
    assert lookup([7, 1, 7], 3, 2, 3) == []  # only a unigram matches, and ngram_min is 2
    assert lookup([7, 7, 7], 3, 1, 4) == [7]  # a match may overlap the tail; its continuation ends at the text's end
    assert lookup([5], 3, 1, 2) == [] and lookup([], 3, 1, 2) == []
    assert lookup([1, 2, 1], 3, 1, 0) == []  # no budget


def test_lookup_equals_transformers_prompt_lookup():
    """On 400 random texts over a 4-token vocabulary (many matches of every length), our index and transformers'
    window scan propose the same tokens (transformers matches down to unigrams: ngram_min = 1)."""
    rng = random.Random(0)
    for _ in range(400):
        history = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        ngram_max, max_tokens = rng.randrange(1, 5), rng.randrange(1, 6)
        reference = PromptLookupCandidateGenerator(num_output_tokens=max_tokens, max_matching_ngram_size=ngram_max,
                                                   max_length=10_000)
        candidates, _ = reference.get_candidates(torch.tensor([history]))
        assert lookup(history, ngram_max, 1, max_tokens) == candidates[0, len(history):].tolist(), (history, ngram_max)


def test_index_grows_with_the_text():
    index = NgramIndex([3, 4, 5])
    assert index.propose(2, 1, 3) == []
    index.extend([3])
    assert index.propose(2, 1, 3) == [4, 5, 3]
    index.extend([4])  # tail [3, 4] now matches as a bigram
    assert index.propose(2, 2, 2) == [5, 3]


# ---- the drafter ----------------------------------------------------------------------------------------

def test_drafter_keeps_each_rows_text_and_limits():
    ids = torch.tensor([[0, 0, 5, 6, 7, 5], [8, 9, 8, 9, 4, 8]])  # row 0 left-padded by 2
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    drafter = PromptLookupDrafter(ngram_max=2, ngram_min=1)
    drafter.start(ids, mask)
    # row 0: text 5 6 7 5 + 6 -> bigram [5, 6] follows with 7 5 6; row 1: 8 9 8 9 4 8 + 3 -> no match
    proposal = drafter.propose(torch.tensor([6, 3]), max_tokens=3, row_limits=[3, 3])
    assert proposal.probs is None and drafter.forwards == 0
    assert proposal.tokens.shape == (2, 3) and proposal.lengths.tolist() == [3, 0]
    assert proposal.tokens[0].tolist() == [7, 5, 6]
    drafter.commit(torch.tensor([1, 0]), [1, 0], [3, 0])  # row 0 kept one draft (7)
    assert drafter.rows[0].tokens == [5, 6, 7, 5, 6, 7] and drafter.rows[1].tokens == [8, 9, 8, 9, 4, 8, 3]
    # next round: row 0's budget allows one token; no row matches more than that
    proposal = drafter.propose(torch.tensor([5, 9]), max_tokens=3, row_limits=[1, 3])
    assert proposal.lengths.tolist() == [1, 3] and proposal.tokens[0, :1].tolist() == [6]
    assert proposal.tokens[1].tolist() == [8, 9, 4]  # bigram [3, 9] unseen; unigram 9 first at 1, then 8 9 4
    drafter.commit(torch.tensor([1, 2]), [1, 2], [1, 3])
    drafter.select_rows(torch.tensor([1]))  # row 0 finished
    assert [r.tokens for r in drafter.rows] == [[8, 9, 8, 9, 4, 8, 3, 9, 8, 9]]
    # no match in any row: an empty proposal, G = 0 (the engine takes a plain target step)
    assert drafter.propose(torch.tensor([11]), max_tokens=3).tokens.shape == (1, 0)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prompts", ["repetitive", "random"])
@pytest.mark.parametrize("lengths", [[9], [6, 13, 2, 9]], ids=["batch1", "ragged4"])
def test_greedy_output_equals_the_baseline(arch, prompts, lengths):
    target = tiny_model(arch, seed=1, layers=3)
    ids, mask = repetitive_batch(lengths) if prompts == "repetitive" else ragged_batch(lengths, seed=3)
    generation = Generation(max_new_tokens=32)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, PromptLookupDrafter(3, 1), ids, mask, generation, 4)
    for row, (b, s) in enumerate(zip(base, spec)):
        assert s.output_ids == b.output_ids, f"row {row} diverged"
        assert sum(r["emitted"] for r in s.rounds) + 1 == s.new_tokens  # + the prefill's token
        assert all(0 <= r["accepted"] <= r["drafted"] <= 4 for r in s.rounds)
        assert s.target_forwards == 1 + len(s.rounds) and s.draft_forwards == 0  # no model drafts
    rounds = [r for s in spec for r in s.rounds]
    assert any(r["drafted"] > 0 for r in rounds), "lookup never matched: the test would not exercise drafting"
    if len(lengths) > 1:  # some drafts are accepted (the random target copies rarely), and lengths vary
        assert sum(r["accepted"] for r in rounds) > 0
        assert len({r["drafted"] for r in rounds}) > 1


def bigram_target(arch):
    """A tiny model whose attention and MLP outputs are zeroed: the next token is a function of the current one
    (and of the position, for GPT-2), so its greedy text soon cycles and lookup drafts are accepted, often in
    full. It exercises the drafter's and the engine's bookkeeping over long accepts; the random targets above
    exercise the cache."""
    model = tiny_model(arch, seed=1, layers=3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "attn.c_proj.weight", "mlp.c_proj.weight")):
                parameter.zero_()
    return model


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_long_accepts_equal_the_baseline(arch):
    target = bigram_target(arch)
    ids, mask = repetitive_batch([9, 6, 13, 2])
    generation = Generation(max_new_tokens=32)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, PromptLookupDrafter(3, 1), ids, mask, generation, 4)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    rounds = [r for s in spec for r in s.rounds]
    assert sum(r["accepted"] for r in rounds) > sum(r["drafted"] for r in rounds) / 2
    assert any(r["accepted"] == r["drafted"] == 4 for r in rounds)  # full accepts: the bonus token path
    assert all(len(s.rounds) < 31 for s in spec)  # fewer target forwards than tokens


# ---- sampling: q is a point mass -------------------------------------------------------------------------

def test_point_mass_path_equals_an_explicit_one_hot_q():
    """draft_probs None gives the draws an explicit one-hot q gives (same random numbers), padded positions and
    rows that drafted nothing included."""
    generator = torch.Generator().manual_seed(0)
    rows, drafts, vocab = 512, 3, 6
    target_probs = torch.softmax(torch.randn(rows, drafts + 1, vocab, generator=generator) * 2, dim=-1)
    tokens = torch.randint(vocab, (rows, drafts), generator=generator)  # [B, G]
    limits = torch.randint(0, drafts + 1, (rows,), generator=generator)  # [B] some rows drafted nothing
    tokens = torch.where(torch.arange(drafts) < limits[:, None], tokens, 0)  # padding past each row's length
    one_hot = torch.nn.functional.one_hot(tokens, vocab).float()  # [B, G, V]
    implicit = decode.sampling.accept_sampled(tokens, None, target_probs, limits, torch.Generator().manual_seed(1))
    explicit = decode.sampling.accept_sampled(tokens, one_hot, target_probs, limits, torch.Generator().manual_seed(1))
    assert torch.equal(implicit[0], explicit[0]) and torch.equal(implicit[1], explicit[1])
    assert bool((implicit[0] <= limits).all()) and bool((implicit[0][limits == 0] == 0).all())


def test_point_mass_step_outputs_p():
    """One deterministic draft x: accepted with probability p(x), else a draw from p without x; the token that
    comes out is distributed as p (and a row with draft_limit 0 draws from p directly)."""
    p = torch.tensor([0.1, 0.4, 0.05, 0.3, 0.15])
    rows = 200_000
    generator = torch.Generator().manual_seed(2)
    for limit in (1, 0):
        tokens = torch.full((rows, 1), 3)  # x = 3 drafted in every row
        accepted, next_token = decode.sampling.accept_sampled(tokens, None, p.expand(rows, 2, 5),
                                                              torch.full((rows,), limit), generator)
        first = torch.where(accepted == 1, tokens[:, 0], next_token)
        assert (torch.bincount(first, minlength=5).double() / rows - p.double()).abs().max() < 0.005
        if limit:
            assert abs(accepted.double().mean().item() - 0.3) < 0.005  # P(accept) = p(x)

PERMUTATION = torch.tensor([[3, 7, 5, 0, 9, 1, 11, 4, 8, 2, 10, 6]])  # every id once: any first token matches


def sample_joint(target, rows, sampling):
    ids = PERMUTATION.expand(rows, -1).contiguous()
    generator = torch.Generator().manual_seed(0)
    generation = Generation(max_new_tokens=4, sampling=sampling)  # tokens 2 and 3 come from the first round
    with torch.inference_mode():
        spec = generate_speculative(target, PromptLookupDrafter(3, 1), ids, torch.ones_like(ids), generation,
                                    gamma=2, generator=generator)
    return joint_counts(spec), spec


def test_sampling_keeps_the_target_distribution(monkeypatch):
    """The joint of the 2nd and 3rd new tokens (both drafted in the first round) against the exact joint."""
    sampling = Sampling(True, 1.0)
    target = tiny_model("llama", seed=1, vocab_size=V, layers=2, hidden=32, init_range=0.3)
    rows = 12_000
    expected = exact_joint_of_tokens_2_and_3(target, sampling, PERMUTATION)
    counts, spec = sample_joint(target, rows, sampling)
    first = [s.rounds[0] for s in spec]
    drafted = sum(r["drafted"] for r in first)
    assert drafted > 1.5 * rows, "the lookup should propose two tokens in nearly every row"
    # a random target rarely agrees with the prompt's continuation (about 1 draft in 12 is accepted): enough
    # accepts to test that path, and the rejections test the residual
    assert 0.02 * drafted < sum(r["accepted"] for r in first) < 0.98 * drafted, "accepts and rejects both occur"
    statistic, critical = chi_square(counts, expected)
    assert statistic < critical, f"off the target's distribution: chi2 {statistic:.1f} > {critical:.1f}"
    # power: the usual bug, resampling from p instead of p without the rejected draft, is caught at this size
    monkeypatch.setattr(decode.sampling, "residual_distribution", lambda p, q: p)
    buggy, _ = sample_joint(target, rows, sampling)
    assert chi_square(buggy, expected)[0] > 2 * critical
