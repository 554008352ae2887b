"""Every figure against values worked out by hand on constructed records (never recomputed with the
function under test): Leviathan's alpha and prediction, throughput, acceptance over variable draft lengths,
exact match, GSM8K cut answers, points without rounds, groups."""
import math

import pytest

from decode.methods import REGISTRY
from eval.figures import constant_draft_length
from eval.leviathan import expected_accepted, predicted_speedup, solve_alpha
from eval.figure_table import legend
from eval.summary import summarize
from eval.totals import throughput
from sample_records import SPEC_LABEL, costs, paired_run, record, run


# ---- Leviathan's model -----------------------------------------------------------------------------------

def test_alpha_from_the_rounds_by_hand():
    # every draft accepted: 1; none: 0, whatever tau says
    assert solve_alpha([{"drafted": 3, "accepted": 3}] * 2 + [{"drafted": 2, "accepted": 2}]) == 1.0
    assert solve_alpha([{"drafted": 3, "accepted": 0}] * 4) == 0.0
    # gamma 2, rounds accepting 2 and 0: 2 (alpha + alpha^2) = 2 -> alpha^2 + alpha - 1 = 0 -> (sqrt(5) - 1) / 2
    assert solve_alpha([{"drafted": 2, "accepted": 2}, {"drafted": 2, "accepted": 0}]) == \
        pytest.approx((math.sqrt(5) - 1) / 2, abs=1e-9)


def test_solve_alpha_for_variable_lengths_by_hand():
    assert expected_accepted(0.5, 3) == pytest.approx(0.875)  # .5 + .25 + .125 = .5 (1 - .5^3) / (1 - .5)
    # rounds drafting 1 and 2 tokens, 1 accepted in all: alpha + (alpha + alpha^2) = 1 -> alpha^2 + 2 alpha - 1 = 0
    rounds = [{"drafted": 1, "accepted": 0}, {"drafted": 2, "accepted": 1}, {"drafted": 0, "accepted": 0}]
    assert solve_alpha(rounds) == pytest.approx(math.sqrt(2) - 1, abs=1e-9)
    assert solve_alpha([{"drafted": 0, "accepted": 0}]) is None  # drafted nothing: no alpha


def test_alpha_of_a_short_output_is_not_biased_by_the_prefill_token():
    # gamma 3, max_new_tokens 12, every draft accepted: the prefill's token, rounds emitting 4, 4 and 3 (the budget
    # leaves 12 - 9 - 1 = 2 to draft in the last). tau = 12 / 4 forwards = 3 would solve 1 + a + a^2 + a^3 = 3 at
    # a = 0.811; the rounds say 1.0
    rounds = [{"drafted": 3, "accepted": 3, "emitted": 4}] * 2 + [{"drafted": 2, "accepted": 2, "emitted": 3}]
    samples = [record("baseline", i, i, tokens=12, latency=2.0) for i in range(8)]
    samples += [record("speculative", i, i, tokens=12, latency=1.0, gamma=3, rounds=rounds) for i in range(8)]
    m = run(summarize(samples, {"costs": costs(0.1, {"3": 1.2})}), "speculative")["metrics"]
    assert m["alpha"] == 1.0 and m["constant_draft_length"] is True
    assert m["mean_accepted_tokens"] == pytest.approx(11 / 3) and m["block_efficiency"] == 3.0
    # alpha 1: gamma + 1 = 4 tokens a round at 3 * 0.1 + 1.2 = 1.5 -> 2.667; measured 2.0 -> efficiency 0.75
    assert m["predicted_speedup"] == pytest.approx(4 / 1.5) and m["efficiency"] == pytest.approx(0.75)


def test_gamma_above_the_budget_is_not_a_constant_gamma():
    # gamma 8, max_new_tokens 6: the one round may draft 6 - 1 - 1 = 4 and accepts them: no round drafted 8
    rounds = [{"drafted": 4, "accepted": 4, "emitted": 5}]
    spec = [record("speculative", i, i, tokens=6, gamma=8, rounds=rounds) for i in range(8)]
    assert constant_draft_length(spec, 8) is False
    assert constant_draft_length([record("speculative", tokens=6, gamma=4, rounds=rounds)], 4) is True
    samples = [record("baseline", i, i, tokens=6, latency=2.0) for i in range(8)] + spec
    summary = summarize(samples, {"costs": costs(0.1, {"8": 2.0})})
    m = run(summary, "speculative")["metrics"]
    assert m["constant_draft_length"] is False and m["max_drafted"] == 4
    assert m["predicted_speedup"] is None and m["alpha"] == 1.0
    assert any("predicted speedup and efficiency are null" in n and "no round drafted gamma (at most 4" in n
               for n in summary["notes"])


def test_predicted_speedup_by_hand():
    # alpha 0.5, gamma 2: (1 - 0.125) / 0.5 = 1.75 tokens a round; cost 2 * 0.25 + 1.5 = 2.0 -> 0.875
    assert predicted_speedup(0.5, 2, 0.25, 1.5) == pytest.approx(0.875)
    # v = 1 (Leviathan Thm 3.8): 1.75 / (0.5 + 1) = 1.1667
    assert predicted_speedup(0.5, 2, 0.25, 1.0) == pytest.approx(1.75 / 1.5)
    # alpha 1: every round emits gamma + 1 = 4 tokens, at 3 * 0.1 + 1 = 1.3
    assert predicted_speedup(1.0, 3, 0.1, 1.0) == pytest.approx(4 / 1.3)


# ---- throughput, speedup, acceptance ------------------------------------------------------------------------

def test_throughput_over_two_batches_by_hand():
    samples = [record(sample_id=0, batch_index=0, batch_size=2, tokens=10, latency=2.0),
               record(sample_id=1, batch_index=0, batch_size=2, tokens=6, latency=1.0),
               record(sample_id=2, batch_index=1, batch_size=2, tokens=4, latency=3.0)]
    # (10 + 6 + 4) tokens / (2.0 (batch 0's slowest row) + 3.0) seconds = 4.0
    assert throughput(samples) == pytest.approx(4.0)


def test_speedup_acceptance_and_exact_match_by_hand():
    summary = summarize(paired_run(units=8), {"planned": {}})
    spec = run(summary, "speculative")["metrics"]
    assert spec["speedup"] == pytest.approx(2.0)  # 4 tokens / 1 s over 4 tokens / 2 s, every batch
    # decode: (4 - 1) tokens / (1 - 0.1 prefill) s over 3 / (2 - 0.1) = 1.9 / 0.9
    assert spec["decode_speedup"] == pytest.approx(1.9 / 0.9)
    assert spec["speedup_ci95"] == [pytest.approx(2.0), pytest.approx(2.0)]  # identical batches: zero width
    assert spec["acceptance_rate"] == 1.0 and spec["mean_accepted_tokens"] == 3.0
    assert spec["per_position_acceptance"] == [1.0, 1.0] and spec["accepted_histogram"] == [0, 0, 8]
    assert spec["block_efficiency"] == 2.0  # 4 tokens / (prefill + 1 round)
    assert spec["exact_match"] == 1.0 and spec["mismatches"] == [] and run(summary, "speculative")["flags"] == []
    assert spec["drafted_per_round"] == 2.0 and spec["zero_draft_rounds"] == 0.0


def test_per_position_acceptance_with_variable_lengths_by_hand():
    rounds = [{"drafted": 3, "accepted": 1, "emitted": 2}, {"drafted": 1, "accepted": 1, "emitted": 2},
              {"drafted": 0, "accepted": 0, "emitted": 1}, {"drafted": 2, "accepted": 2, "emitted": 3}]
    samples = [record("baseline", 0, 0, tokens=9),
               record("speculative", 0, 0, tokens=9, rounds=rounds, gamma=3, schedule="heuristic")]
    summary = summarize(samples, {"costs": costs(0.3, {"3": 1.2})})
    m = run(summary, "speculative")["metrics"]
    assert m["acceptance_rate"] == pytest.approx(4 / 6)  # (1 + 1 + 0 + 2) / (3 + 1 + 0 + 2): the empty round adds 0
    # position 1: drafted by 3 rounds, accepted in all 3; position 2: drafted by 2, accepted in 1; position 3: 1, 0
    assert m["per_position_acceptance"] == [pytest.approx(1.0), pytest.approx(0.5), pytest.approx(0.0)]
    assert m["accepted_histogram"] == [0, 2, 1, 0]  # a_r of the 3 rounds that drafted: 1, 1, 2
    assert m["zero_draft_rounds"] == 0.25 and m["drafted_per_round"] == 1.5
    assert m["mean_accepted_tokens"] == 2.0  # (2 + 2 + 1 + 3) / 4 rounds
    # variable lengths: alpha solves E[a | 3] + E[a | 1] + E[a | 2] = 4, i.e. 3 alpha + 2 alpha^2 + alpha^3 = 4
    a = m["alpha"]
    assert 3 * a + 2 * a ** 2 + a ** 3 == pytest.approx(4.0, abs=1e-9)
    assert m["constant_draft_length"] is False
    assert m["predicted_speedup"] is None and m["efficiency"] is None  # Leviathan's model is for a constant gamma
    assert any("predicted speedup and efficiency are null" in n and "varied" in n for n in summary["notes"])


def test_a_constant_schedule_cut_by_max_new_tokens_keeps_the_prediction():
    # gamma 2, max_new_tokens 6: round 1 drafts 2 after the prefill's token, accepts both, emits 3 (6 - 4 = 2 left);
    # round 2 may draft only min(2, 6 - 4 - 1) = 1, accepts it, emits 2: 6 tokens, stop "length"
    rounds = [{"drafted": 2, "accepted": 2, "emitted": 3}, {"drafted": 1, "accepted": 1, "emitted": 2}]
    spec_row = record("speculative", 0, 0, tokens=6, rounds=rounds, latency=1.0)
    assert constant_draft_length([spec_row], 2)
    # a round drafting 1 in the middle of a row is a schedule's choice, not the budget's
    assert not constant_draft_length([record("speculative", tokens=9, rounds=rounds[::-1] + rounds)], 2)
    samples = [record("baseline", 0, 0, tokens=6, latency=2.0), spec_row]
    m = run(summarize(samples, {"costs": costs(0.25, {"2": 1.5})}), "speculative")["metrics"]
    assert m["alpha"] == 1.0  # every draft accepted (tau = 6 / 3 = 2 would say 0.618)
    # (gamma + 1) / (2 * 0.25 + 1.5) = 3 / 2 = 1.5; measured 6/1 over 6/2 = 2.0 -> efficiency 4/3
    assert m["predicted_speedup"] == pytest.approx(1.5) and m["efficiency"] == pytest.approx(4 / 3)
    assert m["predicted_speedup_v1"] == pytest.approx(3 / 1.5)


def test_the_records_price_the_steps_the_probes_stand_for():
    """c_run and v_run from the records by hand. Baseline: 13 tokens, prefill 1.0, 12 steps of 1.5 (its forward 1.0 and
    the top-2 gap 0.5). Speculative: prefill 1.0, draft prefill 0.5 (1 draft forward), 4 rounds of 2 draft forwards of
    0.3 and a verification of 1.2: c_run = 0.3 / 1.5 = 0.2, v_run = 1.2 / 1.5 = 0.8. Decode speedup (12 / 7.2) / (12 /
    18) = 2.5 = 3 / (2 x 0.2 + 0.8): probed costs like the run's give decode efficiency 1; costs of forwards alone
    (c 0.3, v 1.2) give 1.5, and c_run, v_run say the costs are what is off."""
    rounds = [{"drafted": 2, "accepted": 2, "emitted": 3}] * 4
    samples = []
    for i in range(8):
        samples.append(record("baseline", i, i, tokens=13, prefill=1.0, latency=19.0))
        samples.append(record("speculative", i, i, tokens=13, prefill=1.0, latency=8.7, rounds=rounds, draft_prefill_s=0.5,
                              draft_forwards=9, draft_s=2.9, target_s=5.8))
    for probed, efficiency in ((costs(0.2, {"2": 0.8}), 1.0), (costs(0.3, {"2": 1.2}), 1.5)):
        m = run(summarize(samples, {"costs": probed}), "speculative")["metrics"]
        assert m["draft_cost_ratio_c_run"] == pytest.approx(0.2) and m["verify_cost_ratio_v_run"] == pytest.approx(0.8)
        assert m["decode_speedup"] == pytest.approx(2.5) and m["decode_efficiency"] == pytest.approx(efficiency)
    base = run(summarize(samples, {"costs": costs()}), "baseline")["metrics"]
    assert base["draft_cost_ratio_c_run"] is None and base["verify_cost_ratio_v_run"] is None


def test_a_deferred_prefill_is_a_round_forward_not_one_left_out():
    """A row whose draft prefill waited for its first drafting round (its rounds' catch_up: the recommended schedule's
    idle rows) has no prefill forward to leave out: 8 draft forwards in its 4 rounds, the first the catch-up of its 7
    tokens (0.6 s), the rest 0.3 s: c_run = (0.6 + 7 x 0.3) / 8 / 1.5 = 0.225 (leaving one out read 0.257). The
    baseline as above: 12 steps of 1.5."""
    rounds = [{"drafted": 2, "accepted": 2, "emitted": 3, "catch_up": 7}] + \
        [{"drafted": 2, "accepted": 2, "emitted": 3, "catch_up": 1}] * 3
    samples = []
    for i in range(8):
        samples.append(record("baseline", i, i, tokens=13, prefill=1.0, latency=19.0))
        samples.append(record("speculative", i, i, tokens=13, prefill=1.0, latency=8.5, rounds=rounds,
                              draft_prefill_s=0.0, draft_forwards=8, draft_s=2.7, target_s=5.8))
    m = run(summarize(samples, {"costs": costs(0.2, {"2": 0.8})}), "speculative")["metrics"]
    assert m["draft_cost_ratio_c_run"] == pytest.approx(2.7 / 8 / 1.5)
    assert m["verify_cost_ratio_v_run"] == pytest.approx(0.8)


def test_prompt_lookup_rounds_that_found_no_match():
    rounds = [{"drafted": 0, "accepted": 0, "emitted": 1}, {"drafted": 2, "accepted": 1, "emitted": 2},
              {"drafted": 0, "accepted": 0, "emitted": 1}, {"drafted": 2, "accepted": 0, "emitted": 1}]
    samples = [record("baseline", 0, 0, tokens=6), record("prompt_lookup", 0, 0, tokens=6, rounds=rounds)]
    m = run(summarize(samples, {}), "prompt_lookup")["metrics"]
    assert m["acceptance_rate"] == pytest.approx(0.25)  # 1 accepted of 4 drafted
    assert m["per_position_acceptance"] == [pytest.approx(0.5), pytest.approx(0.0)]
    assert m["zero_draft_rounds"] == 0.5 and m["drafted_per_round"] == 1.0
    # E[a | 2] twice = 2 (alpha + alpha^2) = 1 -> alpha = (sqrt(3) - 1) / 2
    assert m["alpha"] == pytest.approx((math.sqrt(3) - 1) / 2, abs=1e-9)
    assert m["predicted_speedup"] is None


def test_exact_match_positions_by_hand():
    samples = [record("baseline", 0, 0, output=[5, 6, 7, 8], tokens=4), record("baseline", 1, 1, output=[1, 2], tokens=2),
               record("baseline", 2, 2, output=[3, 3], tokens=2),
               record("speculative", 0, 0, output=[5, 6, 9, 8], tokens=4),  # differs at index 2
               record("speculative", 1, 1, output=[1, 2, 3], tokens=3),  # the baseline's is a prefix: at its end, 2
               record("speculative", 2, 2, output=[3, 3], tokens=2)]
    m = run(summarize(samples, {}), "speculative")["metrics"]
    assert m["exact_match"] == pytest.approx(1 / 3)
    assert [(x["sample_id"], x["first_mismatch"]) for x in m["mismatches"]] == [(0, 2), (1, 2)]


# ---- points without rounds ---------------------------------------------------------------------------------

def test_no_rounds_gives_nulls_and_a_note():
    # max_new_tokens 1: the prefill's token is the whole output, no round runs
    samples = [record("baseline", 0, 0, tokens=1), record("speculative", 0, 0, tokens=1, rounds=[])]
    summary = summarize(samples, {"costs": costs(0.3, {"2": 1.2})})
    m = run(summary, "speculative")["metrics"]
    assert m["rounds"] == 0
    for key in ("alpha", "acceptance_rate", "per_position_acceptance", "mean_accepted_tokens", "predicted_speedup",
                "efficiency", "decode_efficiency"):
        assert m[key] is None, key
    assert m["speedup"] is not None
    assert any(n.startswith(SPEC_LABEL + ": no speculation rounds (every row ended at its first token)")
               for n in summary["notes"])


def test_a_round_that_drafted_nothing_predicts_nothing():
    rounds = [{"drafted": 0, "accepted": 0, "emitted": 1}]  # max_new_tokens 2: the only round had no budget to draft
    samples = [record("baseline", 0, 0, tokens=2), record("speculative", 0, 0, tokens=2, rounds=rounds)]
    summary = summarize(samples, {"costs": costs(0.3, {"2": 1.2})})
    m = run(summary, "speculative")["metrics"]
    assert m["alpha"] is None and m["acceptance_rate"] is None and m["per_position_acceptance"] is None
    assert m["predicted_speedup"] is None and m["efficiency"] is None
    assert m["mean_accepted_tokens"] == 1.0 and m["zero_draft_rounds"] == 1.0  # a plain target step: 1 token
    assert m["block_efficiency"] == 1.0  # 2 tokens / (prefill + 1 round)
    assert any(n.startswith(SPEC_LABEL + ": no round drafted a token") for n in summary["notes"])


# ---- GSM8K -------------------------------------------------------------------------------------------------

def test_gsm8k_accuracy_counts_cut_answers():
    base = dict(preset="gsm8k", reference="so #### 18")
    samples = [record("baseline", 0, 0, output_text="... #### 18", stop_reason="eos", **base),
               record("baseline", 1, 1, output_text="we first compute 18", **base),  # cut, graded on its last number
               record("baseline", 2, 2, output_text="then half of", **base)]  # cut, no number
    summary = summarize(samples, {})
    m = run(summary, "baseline")["metrics"]
    assert m["accuracy"] == pytest.approx(2 / 3) and m["accuracy_cut"] == 2 and m["accuracy_graded"] == 3
    assert any("2 of 3 GSM8K answers were cut" in n and "not meaningful" in n and "max_new_tokens" in n
               for n in summary["notes"])
    few_cut = [dict(s, stop_reason="eos", output_text="#### 18") for s in samples[:2]] + samples[2:]
    summary = summarize(few_cut, {})
    assert run(summary, "baseline")["metrics"]["accuracy_cut"] == 1
    assert not any("GSM8K" in n for n in summary["notes"])  # 1 of 3: the accuracy stands


# ---- groups ----------------------------------------------------------------------------------------------

def test_groups_at_batch_size_one_are_split_and_an_overall_run_kept():
    samples = [record("baseline", i, i, group=g, latency=2.0) for i, g in enumerate("aabb")]
    samples += [record("speculative", i, i, group=g, latency=1.0 if g == "a" else 4.0) for i, g in enumerate("aabb")]
    summary = summarize(samples, {"group_by": "category"})
    assert summary["groups"] == ["a", "b"] and summary["group_by"] == "category"
    assert run(summary, "speculative", "a")["metrics"]["speedup"] == pytest.approx(2.0)  # 20/2 s over 20/4 s
    assert run(summary, "speculative", "b")["metrics"]["speedup"] == pytest.approx(0.5)  # 20/8 s over 20/4 s
    assert run(summary, "speculative")["metrics"]["speedup"] == pytest.approx((40 / 10) / (40 / 8))  # 10 s vs 8 s
    assert run(summary, "speculative", "a")["batches"] == {"done": 2, "paired": 2, "planned": None, "prompts": 2,
                                                           "cross_process": 0}


def test_a_group_of_a_shared_batch_takes_its_slowest_row():
    # one batch of 2 rows, one per group: the group's wall is its own row's latency, the batch's the slower one
    samples = [record("baseline", 0, 0, batch_size=2, group="a", latency=2.0),
               record("baseline", 1, 0, batch_size=2, group="b", latency=2.0),
               record("speculative", 0, 0, batch_size=2, group="a", latency=1.0),
               record("speculative", 1, 0, batch_size=2, group="b", latency=3.0)]
    summary = summarize(samples, {"group_by": "category"})
    assert run(summary, "speculative", "a")["metrics"]["speedup"] == pytest.approx(2.0)  # 10/1 over 10/2
    assert run(summary, "speculative", "b")["metrics"]["speedup"] == pytest.approx(2 / 3)  # 10/3 over 10/2
    assert run(summary, "speculative")["metrics"]["speedup"] == pytest.approx(2 / 3)  # 20/3 over 20/2
    assert "slowest row of that group" in legend()["group"]
    assert not summarize(samples, {})["groups"]  # no group_by: overall runs only


# ---- eval asks the registry, never a method's name -----------------------------------------------------------

def test_a_new_method_is_measured_by_what_its_spec_says(monkeypatch):
    from decode.methods import MethodSpec

    # a drafter with rounds and a gamma axis, and a peer timed per batch only, under names eval has never seen
    monkeypatch.setitem(REGISTRY, "zz_lookup", MethodSpec("zz_lookup", "test", axes=("gamma",), run=None,
                                                          has_rounds=True))
    monkeypatch.setitem(REGISTRY, "zz_peer", MethodSpec("zz_peer", "test", axes=(), run=None, per_row_timing=False))
    rounds = [{"drafted": 2, "accepted": 1, "emitted": 2}, {"drafted": 2, "accepted": 2, "emitted": 3}]
    samples = [record("baseline", 0, 0, tokens=6, latency=3.0),
               record("zz_lookup", 0, 0, tokens=6, latency=1.0, rounds=rounds),
               record("zz_peer", 0, 0, tokens=6, latency=2.0, prefill=None, target_forwards=None)]
    summary = summarize(samples, {})
    lookup, peer = run(summary, "zz_lookup")["metrics"], run(summary, "zz_peer")["metrics"]
    assert lookup["acceptance_rate"] == pytest.approx(0.75)  # 3 accepted of 4 drafted
    assert lookup["block_efficiency"] == pytest.approx(2.0)  # 6 tokens / (prefill + 2 rounds)
    assert lookup["speedup"] == pytest.approx(3.0)  # 6/1 over 6/3
    assert peer["speedup"] == pytest.approx(1.5) and peer["decode_speedup"] is None  # no prefill time
    assert peer["block_efficiency"] is None and "acceptance_rate" not in peer


def test_a_round_after_the_budget_cut_must_stay_cut():
    # gamma 4: round 2 drafts 2 after 6 tokens (a budget of 9), so round 3, after 7, could draft at most 1; it drafted
    # 4: a schedule chose these lengths, not the budget (a confidence schedule stopped round 2 early)
    rounds = [{"drafted": 4, "accepted": 4, "emitted": 5}, {"drafted": 2, "accepted": 0, "emitted": 1},
              {"drafted": 4, "accepted": 1, "emitted": 2}]
    assert not constant_draft_length([record("speculative", tokens=9, gamma=4, rounds=rounds, stop_reason="eos")], 4)
    # the engine's own cut: 6 tokens, then min(4, 9 - 6 - 1) = 2 drafted, 2 accepted, 3 emitted: 9
    cut = rounds[:1] + [{"drafted": 2, "accepted": 1, "emitted": 2}, {"drafted": 0, "accepted": 0, "emitted": 1}]
    assert constant_draft_length([record("speculative", tokens=9, gamma=4, rounds=cut)], 4)


def test_a_row_that_ended_at_its_first_token_has_no_decode_time():
    # batch 2, groups X and Y: Y's row ends at its first token (latency = prefill 0.1) in every batch, though the
    # batch's draft prefill (0.05) is on its record; X decodes 8 tokens. Y decodes nothing: its decode wall is 0, not
    # -0.05, and its prefill share is its whole latency, not 1.5 of it
    samples = []
    for i in range(8):
        samples += [record("baseline", 2 * i, i, batch_size=2, group="X", tokens=9, latency=0.9),
                    record("baseline", 2 * i + 1, i, batch_size=2, group="Y", tokens=1, latency=0.1),
                    record("speculative", 2 * i, i, batch_size=2, group="X", tokens=9, latency=0.55,
                           draft_prefill_s=0.05, rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}] * 2 + [
                               {"drafted": 2, "accepted": 1, "emitted": 2}]),
                    record("speculative", 2 * i + 1, i, batch_size=2, group="Y", tokens=1, latency=0.1,
                           draft_prefill_s=0.05, rounds=[])]
    summary = summarize(samples, {"group_by": "category"})
    # X: 8 tokens after the first in 0.55 - 0.1 - 0.05 = 0.4 s against 8 in 0.9 - 0.1 = 0.8 s: 2.0x
    assert run(summary, "speculative", "X")["metrics"]["decode_speedup"] == pytest.approx(2.0)
    assert run(summary, "speculative", "Y")["metrics"]["prefill_share"] == pytest.approx(1.0)
    # overall: the batch's decode wall is X's 0.4 s: (8 * 8 / 3.2) / (8 * 8 / 6.4) = 2.0
    assert run(summary, "speculative")["metrics"]["decode_speedup"] == pytest.approx(2.0)


def test_acceptance_counts_a_draft_only_where_it_was_emitted():
    """Two rounds drafting 4: one accepted all and emitted 5; one a record written before the rule, saying 4 accepted
    where an EOS cut the round at its 3rd draft (emitted 3). Accepted 4 + 3 of 8 drafted: 0.875, not 1.0."""
    rounds = [{"drafted": 4, "accepted": 4, "emitted": 5}, {"drafted": 4, "accepted": 4, "emitted": 3}]
    samples = [record("baseline", 0, 0, tokens=9), record("speculative", 0, 0, tokens=9, gamma=4, rounds=rounds)]
    assert run(summarize(samples), "speculative")["metrics"]["acceptance_rate"] == pytest.approx(7 / 8)
