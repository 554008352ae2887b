"""Synthetic acceptance (decode/sampling.py accept_synthetic, generate_speculative's synthetic_acceptance): the
Bernoulli chain's accepted length against a truncated geometric worked out by hand, seeded reproducibility, the
target's own token after the accepted prefix, and one host read per round through the engine."""
import math

import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_speculative
from decode.drafters.prompt_lookup import PromptLookupDrafter
from decode.sampling import accept_synthetic
from tiny_models import VOCAB, ragged_batch, tiny_model

ROWS = 20_000


def chain(alpha, limits, seed=0, vocab=5):
    limit = torch.tensor(limits)
    num_drafted = max(limits)
    logits = torch.zeros(len(limits), num_drafted + 1, vocab)
    return accept_synthetic(limit, num_drafted, alpha, logits, None, torch.Generator().manual_seed(seed))


def test_accepted_length_is_a_truncated_geometric():
    # alpha 0.7, 4 drafts: P(a = k) = 0.7^k 0.3 for k < 4, P(a = 4) = 0.7^4, by hand:
    # 0.3, 0.21, 0.147, 0.1029, 0.2401; E[a] = 0.7 + 0.49 + 0.343 + 0.2401 = 1.7731 (= alpha (1 - alpha^4) / (1 - alpha));
    # E[a^2] = sum_k P(a >= k) (2k - 1) = 0.7 + 3 * 0.49 + 5 * 0.343 + 7 * 0.2401 = 5.5657, var 5.5657 - 1.7731^2 = 2.4218
    accepted, _ = chain(0.7, [4] * ROWS)
    mean = accepted.double().mean().item()
    standard_error = math.sqrt(2.4218 / ROWS)  # 0.0110
    assert abs(mean - 1.7731) < 4 * standard_error  # a 4-sigma band: a correct chain fails it once in ~16000 seeds
    for k, p in enumerate([0.3, 0.21, 0.147, 0.1029, 0.2401]):
        share = (accepted == k).double().mean().item()
        assert abs(share - p) < 4 * math.sqrt(p * (1 - p) / ROWS), (k, share, p)


def test_each_row_stops_at_its_draft_limit():
    accepted, _ = chain(0.9, [0, 1, 2, 4] * 500)
    by_limit = accepted.view(-1, 4)
    assert by_limit[:, 0].eq(0).all() and by_limit[:, 1].le(1).all() and by_limit[:, 2].le(2).all()
    # at alpha 0.9 a limit of 4 is reached in 0.9^4 = 66% of the rows; a limit of 2 caps 0.9^2 = 81% of them
    assert by_limit[:, 3].eq(4).any() and by_limit[:, 2].eq(2).float().mean() > 0.7


def test_seeded_draws_repeat_and_another_seed_differs():
    first, _ = chain(0.5, [4] * 64, seed=3)
    again, _ = chain(0.5, [4] * 64, seed=3)
    other, _ = chain(0.5, [4] * 64, seed=4)
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_the_next_token_is_the_targets_at_the_accepted_length():
    # position i of row b scores token 10 * b + i: greedy takes argmax at a, sampling draws from a point mass there
    batch, drafted, vocab = 6, 3, 64
    logits = torch.full((batch, drafted + 1, vocab), -1e4)
    for b in range(batch):
        for i in range(drafted + 1):
            logits[b, i, 10 * b + i] = 0.0
    limit = torch.full((batch,), drafted)
    accepted, greedy = accept_synthetic(limit, drafted, 0.5, logits, None, torch.Generator().manual_seed(1))
    assert greedy.tolist() == [10 * b + a for b, a in enumerate(accepted.tolist())]
    accepted, sampled = accept_synthetic(limit, drafted, 0.5, logits, logits.softmax(-1),
                                         torch.Generator().manual_seed(1))
    assert sampled.tolist() == [10 * b + a for b, a in enumerate(accepted.tolist())]


def run(drafter_kind, sampling, alpha, seed=0, lengths=(7, 4, 9)):
    target = tiny_model("llama", seed=1, layers=3)
    ids, mask = ragged_batch(list(lengths), seed=0)
    generator = torch.Generator().manual_seed(seed)
    drafter = (DraftModelDrafter(tiny_model("llama", seed=2, layers=1), VOCAB, sampling, generator)
               if drafter_kind == "draft_model" else PromptLookupDrafter())
    with torch.inference_mode():
        return generate_speculative(target, drafter, ids, mask, Generation(max_new_tokens=16, sampling=sampling), 3,
                                    generator, synthetic_acceptance=alpha)


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(True, 1.0)], ids=["greedy", "sampling"])
def test_the_engine_accepts_by_the_chain_and_repeats_itself(sampling):
    records = run("draft_model", sampling, 0.6)
    again = run("draft_model", sampling, 0.6)
    assert [r.output_ids for r in records] == [r.output_ids for r in again]
    assert [r.rounds for r in records] == [r.rounds for r in again]
    rounds = [r for record in records for r in record.rounds]
    assert all(0 <= r["accepted"] <= r["drafted"] <= 3 and r["emitted"] <= r["accepted"] + 1 for r in rounds)
    # the random tiny pair rarely agrees; at 0.6 some rounds accept drafts and some accept all three
    assert any(r["accepted"] == 3 for r in rounds) and any(r["accepted"] == 0 for r in rounds)
    assert all(record.new_tokens == 16 or record.stop_reason == "eos" for record in records)


def test_greedy_output_is_draft_tokens_then_the_targets_own():
    """With greedy decoding every emitted token after the accepted drafts is the target's argmax: replaying the
    output through the target, the token at each round's end is its argmax given everything before it."""
    target = tiny_model("llama", seed=1, layers=3)
    ids, mask = ragged_batch([6], seed=0)
    records = run("draft_model", Sampling(), 0.5, lengths=(6,))
    record = records[0]
    sequence = torch.cat([ids[0], torch.tensor(record.output_ids)])
    with torch.inference_mode():
        argmax = target(sequence[None]).logits[0].argmax(-1)
    prompt = ids.shape[1]
    position = 1  # the prefill's token is output 0
    assert record.output_ids[0] == argmax[prompt - 1]
    for r in record.rounds:
        end = position + r["accepted"]  # the round's own token follows its accepted drafts
        if end < record.new_tokens:
            assert record.output_ids[end] == argmax[prompt + end - 1]
        position += r["emitted"]


def test_prompt_lookup_takes_it_too():
    records = run("prompt_lookup", Sampling(), 0.9)
    assert any(r["accepted"] > 0 for record in records for r in record.rounds)


def test_a_tree_proposal_is_refused_before_its_verification():
    import numpy as np

    from decode.drafters.base import Proposal
    from decode.generate import round_layout
    from decode.tree_layout import TreeLayout

    tree = Proposal(torch.zeros(1, 2, dtype=torch.long), None,
                    layout=TreeLayout(np.array([[-1, 0]]), np.ones((1, 2), dtype=bool)))
    with pytest.raises(ValueError, match="not to a token tree"):
        round_layout(tree, synthetic_acceptance=0.5)
    assert round_layout(Proposal(torch.zeros(1, 2, dtype=torch.long), None), 0.5).__class__.__name__ == "ChainRound"
