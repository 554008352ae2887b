"""Draft-length schedules: their arithmetic worked out by hand, the confidence stop at a constructed step, greedy
output equal to the baseline under every schedule, and sampling that keeps the target's distribution when the
confidence schedule cuts rows' drafts short."""

import pytest
import torch

import decode.sampling
from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.drafters.schedules import (AcceptanceCounts, ConfidenceSchedule, ConstantSchedule, CostModelSchedule, HeuristicSchedule,
                                       PointEvidence, make_schedule, monotone)
from stats import PROMPT, V, chi_square, exact_joint_of_tokens_2_and_3, joint_counts, sampling_pair
from tiny_models import VOCAB, noisy_copy, ragged_batch, tiny_model


# ---- constant and heuristic ------------------------------------------------------------------------------

def test_constant_schedule():
    schedule = ConstantSchedule(3)
    schedule.start(2)
    schedule.update([3, 1], [0, 1])
    assert schedule.lengths() == [3, 3] and not schedule.stops_mid_round


def test_heuristic_lengths_by_hand():
    schedule = HeuristicSchedule(gamma=5)
    schedule.start(1)
    seen = []
    for accepted_all in [False, False, True, True, False, False, False, False, False]:
        length = schedule.lengths()[0]
        seen.append(length)
        schedule.update([length], [length if accepted_all else 0])
    # 5 -> reject: 4 -> reject: 3 -> all: 5 -> all: 5 (capped at gamma) -> reject: 4 -> 3 -> 2 -> 1 -> 1 (floor)
    assert seen == [5, 4, 3, 5, 5, 4, 3, 2, 1] and schedule.lengths() == [1]


def test_heuristic_rows_are_independent():
    schedule = HeuristicSchedule(gamma=4)
    schedule.start(3)
    # row 0 accepts all of a draft its budget clipped to 2: +2 from 4, capped at 4; row 1 rejects: 3;
    # row 2 drafted nothing (its budget was spent): no evidence, unchanged
    schedule.update([2, 4, 0], [2, 1, 0])
    assert schedule.lengths() == [4, 3, 4]
    schedule.update([4, 3, 4], [0, 0, 4])
    assert schedule.lengths() == [3, 2, 4]
    schedule.select_rows([1, 2])  # row 0 finished
    assert schedule.lengths() == [2, 4]


# ---- cost model ------------------------------------------------------------------------------------------

def test_cost_model_picks_by_hand():
    # no evidence: b_i = 0.5 everywhere; c = 0.1, v = 1 at every width; tokens per cost E(k) / (k c + v(k)):
    # k=0: 1/1 = 1; k=1: 1.5/1.1 = 1.364; k=2: 1.75/1.2 = 1.458; k=3: 1.875/1.3 = 1.442; k=4: 1.9375/1.4 = 1.384
    schedule = CostModelSchedule(gamma=4, c=0.1, v={1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0})
    schedule.start(1)
    assert schedule.acceptance(0) == [0.5] * 4 and schedule.lengths() == [2]
    # c = 0.3, v measured at k = 1 and 4 only: v(2) = 1.1, v(3) = 1.15 (interpolated), v(5) = 1.25, v(6) = 1.3
    # (the last slope, 0.05, extended). Given b = [0.9, 0.8, 0.8, 0.5, 0.5, 0.5] (acceptance comes in runs):
    # E = 1, 1.9, 2.62, 3.196, 3.484, 3.628, 3.700 over costs 1, 1.35, 1.7, 2.05, 2.4, 2.75, 3.1:
    # 1, 1.4074, 1.5412, 1.5590, 1.4517, 1.3193, 1.1935 -> k = 3
    schedule = CostModelSchedule(gamma=6, c=0.3, v={1: 1.05, 4: 1.2})
    assert [schedule.verify_cost(k) for k in range(7)] == pytest.approx([1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3])
    rates = [0.9, 0.8, 0.8, 0.5, 0.5, 0.5]
    assert [schedule.tokens_per_cost(k, rates) for k in range(7)] == pytest.approx(
        [1, 1.9 / 1.35, 2.62 / 1.7, 3.196 / 2.05, 3.484 / 2.4, 3.628 / 2.75, 3.7 / 3.1])
    assert schedule.best_length(rates) == 3
    # independence (b = 0.9 everywhere) is Leviathan's E(k) = (1 - 0.9^(k+1)) / 0.1: k=3: 3.439 / 2.05 = 1.678;
    # k=4: 4.0951 / 2.4 = 1.7063; k=5: 4.6856 / 2.75 = 1.7039 -> k = 4
    assert schedule.tokens_per_cost(4, [0.9] * 6) == pytest.approx(4.0951 / 2.4)
    assert schedule.best_length([0.9] * 6) == 4


def test_acceptance_counts_by_hand():
    counts = AcceptanceCounts(4)
    counts.add(4, 1)  # draft 1 accepted, draft 2 rejected: positions 1 and 2 tested, 3 and 4 never
    counts.add(4, 4)  # all four accepted
    counts.add(2, 2)  # both accepted (positions 3 and 4 not drafted)
    assert counts.tested[1:] == [3, 3, 1, 1] and counts.accepted[1:] == [3, 2, 1, 1]
    # weight 2, no prior: b1 = (3 + 2 * 0.5) / (3 + 2) = 0.8; b2 = (2 + 2 * 0.8) / 5 = 0.72;
    # b3 = (1 + 2 * 0.72) / 3 = 0.81333; b4 = (1 + 2 * 0.81333) / 3 = 0.87556
    assert counts.rates([None] * 4, 2.0) == pytest.approx([0.8, 0.72, 2.44 / 3, (1 + 2 * 2.44 / 3) / 3])
    # a given prior replaces the chain where given: b3 = (1 + 2 * 0.1) / 3 = 0.4, b4 = (1 + 2 * 0.4) / 3 = 0.6
    assert counts.rates([None, None, 0.1, None], 2.0) == pytest.approx([0.8, 0.72, 0.4, 0.6])
    counts.add(1, 0, decay=0.5)  # halves the evidence, then adds a rejection at position 1
    assert counts.tested[1:] == [2.5, 1.5, 0.5, 0.5] and counts.accepted[1:] == [1.5, 1.0, 0.5, 0.5]


def test_cost_model_rows_learn_from_the_pool():
    evidence = PointEvidence(4)
    pool = evidence.counts
    for _ in range(8):
        pool.add(2, 2)  # earlier batches of the point: 8 rounds, both drafts accepted each time
    schedule = CostModelSchedule(gamma=4, c=0.1, v={1: 1.0}, evidence=evidence)
    schedule.start(2)
    # pool: b1 = (8 + 1) / 10 = 0.9, b2 = (8 + 1.8) / 10 = 0.98; positions 3 and 4 untested by the pool nor the
    # row: as likely as the position before. A row with no evidence of its own starts from the pool's
    assert schedule.acceptance(0) == pytest.approx([0.9, 0.98, 0.98, 0.98])
    # row 0 rejects its first draft, row 1 accepts all four: decayed row counts (0.8), shrunk toward the pool
    # with weight 2; the pool counts both rounds undecayed
    schedule.update([4, 4], [0, 4])
    assert pool.tested[1:] == [10, 9, 1, 1] and pool.accepted[1:] == [9, 9, 1, 1]
    pooled = [10 / 12, (9 + 2 * 10 / 12) / 11]  # the pool, updated: b1 = (9 + 2 * 0.5) / (10 + 2), b2 as shown
    assert schedule.acceptance(0)[0] == pytest.approx((0 + 2 * pooled[0]) / 3)  # 0.556: one rejection does
    assert schedule.lengths()[0] >= 1  # not switch off a row that the pool knows to accept 9 drafts in 10
    assert schedule.acceptance(1)[:2] == pytest.approx([(1 + 2 * pooled[0]) / 3, (1 + 2 * pooled[1]) / 3])
    schedule.select_rows([1])
    assert schedule.acceptance(0)[0] == pytest.approx((1 + 2 * pooled[0]) / 3)


def test_cost_model_is_off_where_drafting_does_not_pay():
    # c = 0.9, v(1) = 2: even at the prior b = 0.5, k=1 gives 1.5 / 2.9 = 0.52 tokens per cost < 1 (k=0)
    schedule = CostModelSchedule(gamma=4, c=0.9, v={1: 2.0, 4: 5.0})
    schedule.start(2)
    assert schedule.lengths() == [0, 0]


def test_cost_model_switches_off_and_recovers():
    # c = 0.2, v(1) = 1.5, v(2) = 2 (v(3) = 2.5, v(4) = 3 by the last slope): k = 1 pays only when
    # (1 + b1) / 1.7 > 1, i.e. b1 > 0.7
    schedule = CostModelSchedule(gamma=4, c=0.2, v={1: 1.5, 2: 2.0}, probe_every=8)
    schedule.start(1)
    schedule.update([4], [0])  # pool b1 = 1/3; row b1 = (0 + 2/3) / (1 + 2) = 2/9: off
    seen = []
    for _ in range(33):
        length = schedule.lengths()[0]
        seen.append(length)
        schedule.update([length], [length])  # every draft is accepted from now on
    # idle rounds draft nothing, every 8th probes one token. After probe 1: pool b1 = 2/4, row (t 1.8, a 1)
    # b1 = (1 + 1) / 3.8 = 0.526; probe 2: pool 3/5, row (2.44, 1.8) (1.8 + 1.2) / 4.44 = 0.676; probe 3:
    # pool 4/6, row (2.952, 2.44) (2.44 + 1.333) / 4.952 = 0.762 > 0.7: on again (k = 2 would need
    # b1 (1 + b2) > 1.4: 0.762 * 1.762 = 1.34, not yet)
    assert seen[:25] == ([0] * 7 + [1]) * 3 + [1]
    assert all(length >= 1 for length in seen[24:])


def test_v_is_made_non_decreasing_by_hand():
    # the probe's v(3) under v(2) is noise: pool-adjacent-violators averages the violating run. The v measured in
    # a methods run on this CPU: 1.061, 1.109, 1.019, 1.052 -> 1.109 and 1.019 pool to 1.064; 1.052 under it
    # pools the three to 1.06; 1.061 over that pools all four: 4.241 / 4 = 1.06025
    assert monotone({1: 1.061, 2: 1.109, 3: 1.019, 4: 1.052}) == pytest.approx({k: 1.06025 for k in (1, 2, 3, 4)})
    assert monotone({1: 1.0, 2: 1.2, 3: 1.1, 4: 1.5}) == pytest.approx({1: 1.0, 2: 1.15, 3: 1.15, 4: 1.5})
    assert monotone({1: 1.1, 4: 1.3}) == {1: 1.1, 4: 1.3}  # already monotone: unchanged
    assert monotone({1: 0.95, 2: 1.1}) == {1: 1.0, 2: 1.1}  # never under a plain step, within the noise
    # a dip deeper than the noise (10%) is the machine's: the AMD EPYC's v from an MT-Bench run. 0.85 is 33% under
    # 1.26: kept apart; 0.78 is 9% under 0.85: pooled to 0.815, then 0.80 to 0.81, then 0.78 to 3.21 / 4 = 0.8025;
    # 1.005 is over it. 0.8025 is more than 10% under a plain step: kept under 1
    assert monotone({1: 1.26, 2: 0.85, 3: 0.78, 4: 0.80, 5: 0.78, 6: 1.005}) == pytest.approx(
        {1: 1.26, 2: 0.8025, 3: 0.8025, 4: 0.8025, 5: 0.8025, 6: 1.005})
    # a dip is judged against the value measured just before it, not against a pooled mean: 1.3, 1.2, 1.1 fall by
    # 8% and 9% a step, noise, and pool to 1.2; 1.05 to 0.95 falls 10.5%, kept as measured (no floor lifts it)
    assert monotone({1: 1.0, 2: 1.3, 3: 1.2, 4: 1.1}) == pytest.approx({1: 1.0, 2: 1.2, 3: 1.2, 4: 1.2})
    assert monotone({1: 1.05, 2: 0.95}) == {1: 1.05, 2: 0.95}
    # past the widest measured, a falling last slope is not extrapolated: v(4) = v(2), not 1.0 - 2 x 0.3
    assert CostModelSchedule(gamma=4, c=0.1, v={1: 1.3, 2: 1.0}).verify_cost(4) == pytest.approx(1.0)
    schedule = CostModelSchedule(gamma=4, c=0.1, v={1: 1.0, 2: 1.2, 3: 1.1, 4: 1.5})
    assert [schedule.verify_cost(k) for k in range(5)] == pytest.approx([1.0, 1.0, 1.15, 1.15, 1.5])


def test_cost_model_probes_one_position_deeper():
    # the pool saw 8 rounds that accepted draft 1 and rejected draft 2: b1 = (8 + 2 * 0.5) / 10 = 0.9,
    # b2 = (0 + 2 * 0.9) / 10 = 0.18. c = 0.1, v(1) = 1, v(2) = 1.1: k = 2 beats k = 1 only when
    # (1 + b1 + b1 b2) / 1.3 > (1 + b1) / 1.1, i.e. b2 > 0.1818 (1 + b1) / b1, 0.37 at b1 = 0.95. The pool's
    # b2 stays under 0.2 (2 b1 / 10) while rows accept first drafts, and a row that has not drafted a second
    # token itself takes it: k = 1 for good, unless it explores
    evidence = PointEvidence(2)
    for _ in range(8):
        evidence.counts.add(2, 1)
    schedule = CostModelSchedule(gamma=2, c=0.1, v={1: 1.0, 2: 1.1}, evidence=evidence, probe_every=8)
    schedule.start(1)
    seen = []
    for _ in range(12):
        length = schedule.lengths()[0]
        seen.append(length)
        schedule.update([length], [length])  # every draft accepted
    # the 8th round probes k = 2, accepted: the pool now b1 = (16 + 1) / 18 = 0.944, b2 = (1 + 2 * 0.944) / 11
    # = 0.263; the row's own b1 = (4.161 + 2 * 0.944) / 6.161 = 0.982 (8 rounds decayed by 0.8: 4.161) and
    # b2 = (1 + 2 * 0.263) / 3 = 0.51 > 0.1818 * 1.982 / 0.982 = 0.367: k = 2 from then on
    assert seen == [1] * 7 + [2] * 5
    # at gamma there is nothing deeper to probe, and rounds there do not count toward the next probe (a row that
    # falls back below gamma does not probe gamma again at once, right after being rejected there)
    for _ in range(20):
        assert schedule.lengths() == [2]
        schedule.update([2], [2])
    assert schedule.since_probe == [0]


def test_cost_model_weighs_the_draft_prefill_by_hand():
    # the pool: 20 rounds drafting 2, 12 accepted both, 8 rejected the first: tested [20, 12], accepted [12, 12]:
    # b1 = (12 + 2 * 0.5) / 22 = 0.590909, b2 = (12 + 2 * 0.590909) / 14 = 0.941558. Optimistic, + 1.64
    # standard errors sqrt(b (1 - b) / (tested + 2)): b1 = 0.590909 + 1.64 * 0.104823 = 0.762819,
    # b2 = 0.941558 + 1.64 * 0.062694 > 1 -> 1. c = 0.2, v(1) = 1.2, v(2) = 1.4: k=1: 1.762819 / 1.4 = 1.259156;
    # k=2: (1.762819 + 0.762819) / 1.8 = 1.403132 = R; 1 - 1/R = 0.287313. No row finished yet: a row is
    # expected to run to the budget, 33: drafting saves 32 * 0.287313 = 9.194 target steps; the prefill
    # costs 1 + 0.05 P
    def schedule_with(evidence, **kw):
        return CostModelSchedule(2, c=0.2, v={1: 1.2, 2: 1.4}, evidence=evidence,
                                 prefill_cost={"fixed": 1.0, "per_token": 0.05}, **kw)

    evidence = PointEvidence(2)
    for accepted in [2] * 12 + [0] * 8:
        evidence.counts.add(2, accepted)
    assert schedule_with(evidence, budget=33).worth_drafting(160)  # 9 < 9.194
    assert not schedule_with(evidence, budget=33).worth_drafting(170)  # 9.5 > 9.194
    # (at the plain posterior mean, R = (1.590909 + 0.590909 * 0.941558) / 1.8 = 1.192936 would save only
    # 5.18 steps and skip P = 160 too: the optimism is what keeps a point that drew a few hard prompts first
    # from skipping the draft for good)
    assert evidence.skipped == 1
    # batches that ended at EOS after 9 and 17 tokens: T = (9 + 17 + 33) / 3 = 19.6667, saving 18.6667 * 0.287313
    # = 5.363: P = 80 (5) drafts, P = 90 (5.5) does not
    evidence.finish([9], [True])
    evidence.finish([4, 17], [True, True])  # a batch runs until its longest row ends
    assert evidence.expected_tokens(33) == pytest.approx(59 / 3)
    assert schedule_with(evidence, budget=33).worth_drafting(80) and evidence.skipped == 0
    assert not schedule_with(evidence, budget=33).worth_drafting(90)
    # a skipped batch teaches nothing: after 7 skipped in a row, the 8th drafts (a probe), and the count restarts
    decisions = [schedule_with(evidence, budget=33).worth_drafting(10_000) for _ in range(16)]
    assert decisions == ([False] * 6 + [True] + [False] * 7 + [True] + [False])  # 1 skipped before + 6, then 7
    # no budget, or too little evidence: it drafts, to learn
    assert schedule_with(evidence, budget=None).worth_drafting(10_000)
    few = PointEvidence(2)
    for _ in range(CostModelSchedule.MIN_POOLED_ROUNDS - 1):
        few.counts.add(2, 2)
    assert schedule_with(few, budget=33).worth_drafting(10_000)


def test_a_batch_not_worth_drafting_never_runs_the_draft():
    target = tiny_model("llama", seed=1, layers=3)
    draft = noisy_copy(target, 0.05, seed=5)
    ids, mask = ragged_batch([6, 13, 2, 9])
    generation = Generation(max_new_tokens=24)
    evidence = PointEvidence(4)
    for _ in range(20):
        evidence.counts.add(4, 4)
    schedule = CostModelSchedule(4, c=0.2, v={1: 1.1, 4: 1.4}, evidence=evidence, budget=24,
                                 prefill_cost={"fixed": 1000.0, "per_token": 0.0})
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling(), schedule=schedule), ids, mask,
                                    generation, 4)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    for s in spec:
        assert s.draft_forwards == 0  # not even its prefill
        assert s.rounds and all(r["drafted"] == 0 for r in s.rounds)  # plain steps, no probes either


def test_cost_model_needs_costs():
    with pytest.raises(ValueError, match="cost_model"):
        make_schedule("cost_model", 4)
    with pytest.raises(ValueError, match="unknown schedule"):
        make_schedule("adaptive", 4)
    with pytest.raises(ValueError, match="gamma"):
        HeuristicSchedule(0)
    assert isinstance(make_schedule("cost_model", 4, c=0.1, v={"2": 1.2}), CostModelSchedule)  # JSON keys


# ---- confidence ------------------------------------------------------------------------------------------

def test_confidence_keep_drafting_by_hand():
    schedule = ConfidenceSchedule(gamma=4, threshold=0.4)
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.35, 0.33, 0.32], [0.1, 0.45, 0.45], [0.4, 0.35, 0.25]])
    # the top probability decides, not the drawn token's: row 2 drew token 0 (q 0.1) but its top is 0.45;
    # row 3's top is exactly the threshold: it goes on
    keep = schedule.keep_drafting(probs, torch.tensor([0, 0, 0, 1]))
    assert keep.tolist() == [True, False, True, True]
    assert schedule.stops_mid_round


def greedy_draft_with_top_probs(draft, prompt: list[int], first: int, steps: int):
    """The draft's greedy tokens after prompt + [first] and each step's top probability, without a cache."""
    sequence, tokens, tops = prompt + [first], [], []
    with torch.inference_mode():
        for _ in range(steps):
            probs = torch.softmax(draft(torch.tensor([sequence])).logits[0, -1].float(), dim=-1)
            tokens.append(int(probs.argmax()))
            tops.append(float(probs.max()))
            sequence.append(tokens[-1])
    return tokens, tops


def test_confidence_stops_each_row_at_the_constructed_step():
    draft = tiny_model("llama", seed=2, layers=1)
    gamma = 4
    ids, mask = ragged_batch([5, 8, 3, 6], seed=1)
    firsts = [11, 12, 13, 14]
    rows = [greedy_draft_with_top_probs(draft, ids[r][mask[r] == 1].tolist(), firsts[r], gamma) for r in range(4)]

    def stops(threshold):  # each row keeps the token whose top probability fell under the threshold, then stops
        return [next((i + 1 for i, top in enumerate(tops) if top < threshold), gamma) for _, tops in rows]

    # a threshold midway between two of the rows' top probabilities, at least 1e-3 from each (float noise cannot
    # move a stop), chosen so that the rows stop at as many different steps as possible
    values = sorted(top for _, tops in rows for top in tops)
    gaps = [(len(set(stops((a + b) / 2))), b - a, (a + b) / 2) for a, b in zip(values, values[1:]) if b - a > 2e-3]
    distinct, _, threshold = max(gaps)
    expected = stops(threshold)
    assert distinct >= 3, expected
    drafter = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=ConfidenceSchedule(gamma, threshold))
    with torch.inference_mode():
        drafter.start(ids, mask)
        proposal = drafter.propose(torch.tensor(firsts), gamma)
    assert proposal.lengths.tolist() == expected
    for row, (tokens, _) in enumerate(rows):
        assert proposal.tokens[row, :expected[row]].tolist() == tokens[:expected[row]]
    # the rows end on the device: the chain runs its gamma steps (no host read asks whether every row has ended)
    assert proposal.tokens.shape[1] == gamma and drafter.forwards == 1 + gamma


def test_confidence_extremes():
    draft = tiny_model("llama", seed=2, layers=1)
    ids, mask = ragged_batch([5, 3])
    for threshold, length in [(0.0, 4), (1.0, 1)]:  # never stops; stops after the first token
        drafter = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=ConfidenceSchedule(4, threshold))
        with torch.inference_mode():
            drafter.start(ids, mask)
            proposal = drafter.propose(torch.tensor([7, 8]), 4)
        assert proposal.lengths.tolist() == [length, length] and proposal.tokens.shape[1] == 4


# ---- every schedule in the engine: greedy ----------------------------------------------------------------


SCHEDULES = {
    "constant": lambda: ConstantSchedule(4),
    "heuristic": lambda: HeuristicSchedule(4),
    "confidence": lambda: ConfidenceSchedule(4, 0.5),
    "cost_model": lambda: CostModelSchedule(4, c=0.05, v={1: 1.0, 2: 1.05, 4: 1.1}),  # drafting pays: lengths 1..4
    "cost_model_off": lambda: CostModelSchedule(4, c=0.9, v={1: 2.0, 4: 5.0}),  # plain steps, a probe every 8
}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("kind", list(SCHEDULES))
@pytest.mark.parametrize("lengths", [[9], [6, 13, 2, 9]], ids=["batch1", "ragged4"])
def test_greedy_output_equals_the_baseline(arch, kind, lengths):
    target = tiny_model(arch, seed=1, layers=3)
    draft = noisy_copy(target, 0.05, seed=5)
    ids, mask = ragged_batch(lengths)
    generation = Generation(max_new_tokens=24)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        drafter = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=SCHEDULES[kind]())
        spec = generate_speculative(target, drafter, ids, mask, generation, 4)
    for row, (b, s) in enumerate(zip(base, spec)):
        assert s.output_ids == b.output_ids, f"{kind}: row {row} diverged"
        assert sum(r["emitted"] for r in s.rounds) + 1 == s.new_tokens
        assert all(0 <= r["accepted"] <= r["drafted"] <= 4 for r in s.rounds)
        assert s.target_forwards == 1 + len(s.rounds)
    rounds = [r for s in spec for r in s.rounds]
    if kind == "cost_model_off":  # drafting cannot pay: mostly plain target steps
        assert sum(r["drafted"] == 0 for r in rounds) > len(rounds) / 2
        assert any(r["drafted"] == 1 for r in rounds)  # the probes
    else:  # drafts were accepted and rejected: rollback exercised
        assert 0 < sum(r["accepted"] for r in rounds) < sum(r["drafted"] for r in rounds)
    if kind in ("heuristic", "confidence", "cost_model") and len(lengths) > 1:
        assert len({r["drafted"] for r in rounds}) > 1, "the schedule should vary the length"


def test_greedy_with_qwen2_and_heuristic():
    target = tiny_model("qwen2", seed=1, layers=3)
    ids, mask = ragged_batch([6, 13, 2, 9])
    generation = Generation(max_new_tokens=24)
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        drafter = DraftModelDrafter(noisy_copy(target, 0.05, seed=5), VOCAB, Sampling(), schedule=HeuristicSchedule(4))
        spec = generate_speculative(target, drafter, ids, mask, generation, 4)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]


# ---- sampling under the confidence schedule --------------------------------------------------------------

def confidence_threshold_splitting_rows(target, draft) -> float:
    """The median, over the target's first token, of the draft's top probability at the first draft: about half
    the rows then stop after one draft, the other half draft two."""
    with torch.inference_mode():
        p1 = torch.softmax(target(PROMPT).logits[0, -1].float(), dim=-1)  # [V]
        sequences = torch.cat([PROMPT.expand(V, -1), torch.arange(V)[:, None]], dim=1)  # [V, P+1]
        tops = torch.softmax(draft(sequences).logits[:, -1].float(), dim=-1).max(dim=-1).values  # [V]
    order = tops.argsort()
    median = int((p1[order].cumsum(0) < 0.5).sum())
    return float(tops[order[median]])


def sample_joint(target, draft, sampling, threshold, rows):
    ids = PROMPT.expand(rows, -1).contiguous()
    generator = torch.Generator().manual_seed(0)
    drafter = DraftModelDrafter(draft, V, sampling, generator, schedule=ConfidenceSchedule(2, threshold))
    generation = Generation(max_new_tokens=4, sampling=sampling)  # tokens 2 and 3 come from the first round
    with torch.inference_mode():
        spec = generate_speculative(target, drafter, ids, torch.ones_like(ids), generation, gamma=2,
                                    generator=generator)
    return joint_counts(spec), spec


def test_sampling_under_the_confidence_schedule_keeps_the_target_distribution(monkeypatch):
    sampling = Sampling(True, 1.0)
    target, draft = sampling_pair()
    threshold = confidence_threshold_splitting_rows(target, draft)
    rows = 12_000
    counts, spec = sample_joint(target, draft, sampling, threshold, rows)
    drafted = [s.rounds[0]["drafted"] for s in spec]
    assert 0.2 * rows < drafted.count(1) < 0.8 * rows and drafted.count(1) + drafted.count(2) == rows
    accepted = sum(s.rounds[0]["accepted"] for s in spec)
    assert 0.05 * sum(drafted) < accepted < 0.95 * sum(drafted), "accepts and rejects both occur"
    expected = exact_joint_of_tokens_2_and_3(target, sampling, PROMPT)
    statistic, critical = chi_square(counts, expected)
    assert statistic < critical, f"off the target's distribution: chi2 {statistic:.1f} > {critical:.1f}"
    # power: resampling from p instead of norm(max(0, p - q)) after a rejection is caught at this size
    monkeypatch.setattr(decode.sampling, "residual_distribution", lambda p, q: p)
    buggy, _ = sample_joint(target, draft, sampling, threshold, rows)
    assert chi_square(buggy, expected)[0] > 2 * critical


def test_idle_rows_with_a_smaller_draft_vocabulary():
    """Rows at k = 0 queue their tokens for the draft's next catch-up; a target id the draft cannot embed must
    not reach its embedding (it only costs acceptance)."""
    target = tiny_model("llama", seed=1, layers=2)
    draft = tiny_model("llama", seed=2, layers=1, vocab_size=VOCAB - 40)
    ids, mask = ragged_batch([5, 8], vocab_size=VOCAB - 40)
    generation = Generation(max_new_tokens=24)
    schedule = CostModelSchedule(4, c=0.9, v={1: 2.0}, probe_every=4)  # idle, with a catch-up every 4 rounds
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, Sampling(), schedule=schedule), ids, mask,
                                    generation, 4)
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    assert any(t >= VOCAB - 40 for b in base for t in b.output_ids)  # the target did emit such ids


def test_cost_model_points_remember_how_long_rows_ran():
    from decode import Clock
    from decode.methods import REGISTRY
    from decode.methods.base import RunContext
    from decode.methods.speculative import evidence_of, schedule_for
    from eval.records import CostProbe, Point

    target = tiny_model("llama", seed=1, layers=3)
    draft = noisy_copy(target, 0.05, seed=5)
    ids, mask = ragged_batch([6, 13, 2])
    context = RunContext(target=target, tokenizer=None, drafts={"d": draft}, target_vocab_size=VOCAB, pad_id=0,
                         clock=Clock("cpu"), costs=CostProbe(c_by_draft={"d": 0.2}, v={1: 1.1, 4: 1.4}))
    point = Point(method="speculative", draft="d", gamma=4, schedule="cost_model", batch_size=3)
    with torch.inference_mode():
        context.warming_up = True  # the warmup: its rounds count, its shorter budget does not
        assert schedule_for(context, point, "d", 10).budget is None  # it always drafts, deciding nothing
        REGISTRY["speculative"].run(context, point, ids, mask, Generation(max_new_tokens=10), None)
        evidence = evidence_of(context, point)
        warm_rounds = evidence.counts.tested[1]
        assert evidence.batches == 0 and warm_rounds > 0
        context.warming_up = False
        assert schedule_for(context, point, "d", 10).budget == 10
        first = REGISTRY["speculative"].run(context, point, ids, mask, Generation(max_new_tokens=10), None)
        second = REGISTRY["speculative"].run(context, point, ids[:2], mask[:2], Generation(max_new_tokens=10), None)
    assert [r.stop_reason for r in first + second] == ["length"] * 5  # no EOS configured
    assert evidence.batches == 2 and evidence.eos_batches == 0 and evidence.expected_tokens(10) == 10
    # every drafted round of every row, once
    assert evidence.counts.tested[1] == warm_rounds + sum(1 for r in first + second for x in r.rounds if x["drafted"])
    # a batch of rows that all ended at EOS runs its longest row; one stopped by the budget ran to it
    evidence.finish([3, 6], [True, True])
    evidence.finish([2, 10], [True, False])
    assert evidence.expected_tokens(10) == pytest.approx((6 + 3 * 10 + 10) / 5)


def test_the_schedules_the_config_takes_are_the_ones_built():
    """speculative.SCHEDULES (what the config's schedule axis takes) names each schedule decode/drafters builds, in
    its order; cost_model alone reads the measured costs."""
    from decode.drafters.schedules import SCHEDULES as BUILT
    from decode.methods.speculative import MEASURED, SCHEDULES
    from utils.config import SCHEDULES as TAKEN

    assert SCHEDULES == TAKEN == tuple(BUILT) == ("constant", "heuristic", "confidence", "cost_model", "recommended")
    assert all(BUILT[name].name == name for name in SCHEDULES) and MEASURED == ("cost_model",)
