"""The drafters beyond the draft model (prompt lookup, early exit) and the draft-length schedules: each is
greedy-exact against the baseline at batch 1 and in ragged batches, and sampling-lossless."""

import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.drafters import EarlyExitDrafter, PromptLookupDrafter
from decode.drafters.early_exit import early_exit_view
from decode.drafters.prompt_lookup import lookup
from decode.drafters.schedules import CostModelSchedule, HeuristicSchedule, ConfidenceSchedule, make_schedule
from decode.sampling import logits_to_probs
from stats import chi_square
from tiny_models import VOCAB, noisy_copy, ragged_batch, tiny_model



def repetitive_batch(lengths, seed=0):
    """Left-padded prompts that repeat a short pattern, so n-gram lookup finds matches."""
    ids, mask = ragged_batch(lengths, seed=seed)
    for row, length in enumerate(lengths):
        pattern = ids[row, -length:][:3].tolist() or [5]
        ids[row, -length:] = torch.tensor((pattern * length)[:length])
    return ids, mask


def drafter_for(kind, target, arch, sampling=Sampling(), generator=None):
    if kind == "prompt_lookup":
        return PromptLookupDrafter(ngram_max=3, ngram_min=1)
    if kind == "early_exit":
        return EarlyExitDrafter(target, 2, VOCAB, sampling, generator)
    draft = noisy_copy(target, 0.05, seed=5)  # accepts about a third to a half of its drafts
    schedule = {"heuristic": HeuristicSchedule(4), "confidence": ConfidenceSchedule(4, 0.5),
                "cost_model": CostModelSchedule(4, c=0.05, v={1: 1.0, 2: 1.05, 4: 1.1}),
                "cost_model_off": CostModelSchedule(4, c=0.9, v={1: 2.0, 4: 5.0})}[kind]
    return DraftModelDrafter(draft, VOCAB, sampling, generator, schedule=schedule)


KINDS = ["prompt_lookup", "early_exit", "heuristic", "confidence", "cost_model", "cost_model_off"]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("lengths", [[9], [6, 13, 2, 9]], ids=["batch1", "ragged4"])
def test_greedy_output_equals_the_baseline(arch, kind, lengths):
    target = tiny_model(arch, seed=1, layers=3)
    ids, mask = repetitive_batch(lengths) if kind == "prompt_lookup" else ragged_batch(lengths)
    generation = Generation(max_new_tokens=40 if kind == "prompt_lookup" else 20)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, drafter_for(kind, target, arch), ids, mask, generation, 4)
    for row, (b, s) in enumerate(zip(base, spec)):
        assert s.output_ids == b.output_ids, f"{kind}: row {row} diverged"
        assert sum(r["emitted"] for r in s.rounds) + 1 == s.new_tokens
        assert all(0 <= r["accepted"] <= r["drafted"] <= 4 for r in s.rounds)
    rounds = [r for s in spec for r in s.rounds]
    if kind == "cost_model_off":  # drafting cannot pay at c 0.9, v 2: plain target steps, and a probe every 8
        assert sum(r["drafted"] == 0 for r in rounds) > len(rounds) / 2
    elif kind != "prompt_lookup" or len(lengths) > 1:  # drafts were accepted sometimes: rollback was exercised
        assert sum(r["accepted"] for r in rounds) > 0, kind
    if kind in ("heuristic", "confidence", "prompt_lookup") and len(lengths) > 1:  # lengths vary from round to round
        assert len({r["drafted"] for r in rounds}) > 1, kind


V = 12


def exact_joint(model, prompt, sampling):
    """P(t2, t3) under the warped target, [V * V] (t1 summed out)."""
    with torch.inference_mode():
        p1 = logits_to_probs(model(prompt).logits[0, -1], sampling.temperature)
        seq1 = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], 1)
        p2 = logits_to_probs(model(seq1).logits[:, -1], sampling.temperature)
        seq2 = torch.cat([seq1.repeat_interleave(V, 0), torch.arange(V).repeat(V)[:, None]], 1)
        p3 = logits_to_probs(model(seq2).logits[:, -1], sampling.temperature).view(V, V, V)
    return (p1[:, None, None].double() * p2[:, :, None].double() * p3.double()).sum(0).flatten()


@pytest.mark.parametrize("kind", ["prompt_lookup", "confidence"])
def test_sampling_keeps_the_target_distribution(kind):
    sampling = Sampling(True, 1.0)
    target = tiny_model("llama", seed=1, vocab_size=V, layers=2, hidden=32, init_range=0.3)
    prompt = torch.tensor([[3, 7, 5, 3, 7, 5, 3]])
    rows = 20_000
    ids = prompt.expand(rows, -1).contiguous()
    mask = torch.ones_like(ids)
    generator = torch.Generator().manual_seed(0)
    if kind == "prompt_lookup":
        drafter = PromptLookupDrafter(3, 1)
    else:
        draft = tiny_model("llama", seed=7, vocab_size=V, layers=1, hidden=32, init_range=0.3)
        drafter = DraftModelDrafter(draft, V, sampling, generator, schedule=ConfidenceSchedule(2, 0.3))
    generation = Generation(max_new_tokens=4, sampling=sampling)
    with torch.inference_mode():
        spec = generate_speculative(target, drafter, ids, mask, generation, gamma=2, generator=generator)
    first = [r.rounds[0] for r in spec]
    assert sum(r["drafted"] for r in first) > rows / 4, "the drafter proposed too rarely for the test to bite"
    assert 0 < sum(r["accepted"] for r in first) < sum(r["drafted"] for r in first)
    counts = torch.bincount(torch.tensor([r.output_ids[1] * V + r.output_ids[2] for r in spec]), minlength=V * V)
    expected = exact_joint(target, prompt, sampling)
    statistic, critical = chi_square(counts, expected)
    assert statistic < critical, f"{kind}: off the target's distribution: chi2 {statistic:.1f} > {critical:.1f}"
    if kind == "prompt_lookup":  # power: accepting the point-mass drafts always would be caught
        always = torch.zeros(V * V, dtype=torch.long)
        always[3 * V + 7] = rows  # the lookup's continuation of '... 5 3' is '7 5'
        assert chi_square(always, expected)[0] > 3 * critical


# ---- pieces worked out by hand -------------------------------------------------------------------------

def test_lookup_takes_the_first_longest_match():
    history = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3]
    # tail [1, 2, 3] occurs at 0 (then 9) and at 4 (then 8): the first wins, as in transformers' prompt lookup
    assert lookup(history, 3, 1, 2) == [9, 1]
    assert lookup([4, 5, 6], 3, 1, 2) == []  # nothing repeats
    assert lookup([7, 1, 7], 2, 1, 3) == [1, 7]  # only the unigram '7' matches


def test_heuristic_schedule_lengths_by_hand():
    schedule = HeuristicSchedule(gamma=5)
    schedule.start(1)
    seen = []
    for accepted_all in [False, False, True, True, False]:
        n = schedule.lengths()[0]
        seen.append(n)
        schedule.update([n], [n if accepted_all else 0])
    # 5 -> reject: 4 -> reject: 3 -> all: 5 -> all: 5 (cap) -> reject: 4
    assert seen == [5, 4, 3, 5, 5] and schedule.lengths() == [4]


def test_cost_model_picks_by_hand():
    # a = 0.5 (the prior (0 + 1) / (0 + 2)), c = 0.1, v = 1 for every width: tokens per cost
    # k=0: 1/1 = 1; k=1: 1.5/1.1 = 1.364; k=2: 1.75/1.2 = 1.458; k=3: 1.875/1.3 = 1.442 -> k = 2
    schedule = CostModelSchedule(gamma=4, c=0.1, v={1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0})
    schedule.start(1)
    assert schedule.lengths() == [2]
    # one rejected first draft (gamma 4: only position 1 was tested): the pool's b1 = (0 + 2 * 0.5) / 3 = 1/3, the
    # row's (0 + 2/3) / 3 = 2/9; c = 0.5, v = 2: k=1 gives (1 + 2/9) / 2.5 = 0.49 < 1 -> k = 0
    schedule = CostModelSchedule(gamma=4, c=0.5, v={1: 2.0})
    schedule.start(1)
    schedule.update([4], [0])
    for _ in range(CostModelSchedule.PROBE_EVERY - 1):  # no evidence while idle: a 1-token probe every 8 rounds
        assert schedule.lengths() == [0]
        schedule.update([0], [0])
    assert schedule.lengths() == [1]
    # v between measured lengths is interpolated: v(2) halfway between v(1) = 2 and v(3) = 4
    assert CostModelSchedule(4, 0.5, {1: 2.0, 3: 4.0}).verify_cost(2) == pytest.approx(3.0)


def test_confidence_schedule_stops_rows_under_the_threshold():
    schedule = ConfidenceSchedule(gamma=4, threshold=0.4)
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.35, 0.33, 0.32]])
    keep = schedule.keep_drafting(probs, torch.tensor([0, 0]))
    assert keep.tolist() == [True, False]  # q(drafted) 0.5 >= 0.4 goes on; 0.35 stops after this token
    with pytest.raises(ValueError, match="cost_model"):
        make_schedule("cost_model", 4)


def test_early_exit_view_shares_the_targets_weights():
    target = tiny_model("llama", seed=1, layers=3)
    view = early_exit_view(target, 2)
    assert len(view.model.layers) == 2 and len(target.model.layers) == 3  # the target is untouched
    assert view.model.layers[0].self_attn.q_proj.weight.data_ptr() == target.model.layers[0].self_attn.q_proj.weight.data_ptr()
    assert view.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()
    gpt2 = tiny_model("gpt2", seed=1, layers=3)
    assert len(early_exit_view(gpt2, 1).transformer.h) == 1 and len(gpt2.transformer.h) == 3
    for bad in (0, 3):
        with pytest.raises(ValueError, match="exit_layer"):
            early_exit_view(target, bad)
