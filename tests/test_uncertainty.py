"""What a figure can be trusted for: the paired bootstrap on enumerable cases, ratios over the same batches only,
partial points, flags raised on constructed unstable runs and none on a stable one, and the best points."""
import pytest

from eval.metrics import bootstrap_ci, summarize
from test_metrics import SPEC_LABEL, paired_run, record, run

STABLE_COSTS = {"1": {"c": 0.3, "v": {"2": 1.2},
                      "reps_s": {"draft_1": [0.30, 0.31, 0.30], "target_1": [1.0, 1.02, 1.01], "target_3": [1.2, 1.21, 1.2]}}}


def codes(summary, method="speculative", group=None):
    return sorted(f["code"] for f in run(summary, method, group)["flags"])


# ---- the paired bootstrap -------------------------------------------------------------------------------

def test_bootstrap_of_identical_batches_has_zero_width():
    pairs = [(10, 1.0, 10, 2.0)] * 5  # every batch: point 10 tok/s, baseline 5 tok/s
    assert bootstrap_ci(pairs) == [pytest.approx(2.0), pytest.approx(2.0)]


def test_bootstrap_of_one_batch_is_null_and_said():
    assert bootstrap_ci([(10, 1.0, 10, 2.0)]) is None
    summary = summarize(paired_run(units=1), {})
    assert run(summary, "speculative")["metrics"]["speedup_ci95"] is None
    assert run(summary, "speculative")["metrics"]["decode_speedup_ci95"] is None
    assert any(n.startswith(SPEC_LABEL) and "no confidence interval" in n for n in summary["notes"])


def test_bootstrap_of_two_batches_by_hand():
    # batch A: ratio 2 (10/1 over 10/2), batch B: ratio 1 (10/1 over 10/1). A resample of two is AA, AB, BA or BB
    # with probability 1/4, 1/2, 1/4; ratio of totals: AA 2, AB/BA 20/2 over 20/3 = 1.5, BB 1.
    # AA and BB each hold far more than 2.5% of the resamples: the 2.5th percentile is 1, the 97.5th is 2
    pairs = [(10, 1.0, 10, 2.0), (10, 1.0, 10, 1.0)]
    assert bootstrap_ci(pairs) == [pytest.approx(1.0), pytest.approx(2.0)]


def test_bootstrap_of_three_batches_by_hand():
    # the baseline makes 10 tokens in 1 s in every batch; the point 10, 20 or 30 tokens in 1 s. A resample's ratio of
    # totals is the mean of its three draws over 10: from 1.0 (AAA) to 3.0 (CCC), each with probability 1/27 = 3.7%,
    # above 2.5%, so the interval is [1.0, 3.0] and the ratio itself (60/3 over 30/3) is 2.0
    pairs = [(10, 1.0, 10, 1.0), (20, 1.0, 10, 1.0), (30, 1.0, 10, 1.0)]
    assert bootstrap_ci(pairs) == [pytest.approx(1.0), pytest.approx(3.0)]
    assert bootstrap_ci(pairs) == bootstrap_ci(pairs)  # seeded: a rebuild gives the same numbers


def test_the_summary_is_deterministic():
    samples = paired_run(units=5, jitter=0.3)
    assert summarize(samples, {}) == summarize(list(reversed(samples)), {})


# ---- ratios over the same batches, partial points ------------------------------------------------------------

def test_ratios_pair_only_the_batches_both_finished():
    samples = paired_run(units=4)
    # the baseline also ran two more batches, slow ones, that the speculative point never finished
    samples += [record("baseline", 10 + i, 10 + i, tokens=4, latency=40.0) for i in range(2)]
    progress = {"planned": {SPEC_LABEL: 6, "baseline batch=1 greedy": 6},
                "failures": [{"method": "speculative", "batch_size": 1, "draft": "d", "gamma": 2, "schedule": "constant",
                              "exit_layer": None, "temperature": None, "status": "failed", "error": "CUDA out of memory"}]}
    summary = summarize(samples, progress)
    spec = run(summary, "speculative")
    assert spec["metrics"]["speedup"] == pytest.approx(2.0)  # over the 4 shared batches, not 16/4 over 24/88
    assert spec["status"] == "partial" and spec["batches"] == {"done": 4, "paired": 4, "planned": 6}
    assert spec["error"] == "CUDA out of memory"
    assert run(summary, "baseline")["status"] == "ok"
    assert summary["best"] == {}  # a partial point is never best
    assert any(n.startswith(SPEC_LABEL + ": partial, 4 of 6 batches (CUDA out of memory)") for n in summary["notes"])


def test_a_point_ahead_of_its_baseline_pairs_only_the_shared_batches():
    samples = paired_run(units=2)
    samples += [record("speculative", 5, 5, tokens=4, latency=0.01, rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}])]
    summary = summarize(samples, {})
    spec = run(summary, "speculative")
    assert spec["metrics"]["speedup"] == pytest.approx(2.0)  # the fast unpaired batch does not count
    assert spec["batches"] == {"done": 3, "paired": 2, "planned": None} and spec["status"] == "ok"
    assert any("the baseline finished 2 of its 3 batches" in n for n in summary["notes"])


def test_partial_without_a_failure_and_failed_without_samples():
    samples = paired_run(units=2)
    progress = {"planned": {SPEC_LABEL: 3, "baseline batch=1 greedy": 2, "speculative draft=d gamma=9 constant batch=1 "
                            "greedy": 2},
                "failures": [{"method": "speculative", "batch_size": 1, "draft": "d", "gamma": 4, "schedule": "constant",
                              "exit_layer": None, "temperature": None, "status": "skipped", "error": "gamma too long"}]}
    summary = summarize(samples, progress)
    assert run(summary, "speculative", gamma=2)["status"] == "partial"  # 2 of 3 planned: an interrupted run
    assert any(n.startswith(SPEC_LABEL + ": partial, 2 of 3 batches (the run stopped first)") for n in summary["notes"])
    skipped = run(summary, "speculative", gamma=4)
    assert skipped["status"] == "skipped" and skipped["error"] == "gamma too long" and skipped["metrics"] == {}
    assert any("planned but not measured" in n and "gamma=9" in n for n in summary["notes"])


def test_group_runs_of_a_partial_point_are_partial():
    samples = [record("baseline", i, i, group=g, latency=2.0) for i, g in enumerate("ab")]
    samples += [record("speculative", i, i, group=g, latency=1.0) for i, g in enumerate("ab")]
    summary = summarize(samples, {"group_by": "category", "planned": {SPEC_LABEL: 4}})
    assert {r["status"] for r in summary["runs"] if r["method"] == "speculative"} == {"partial"}


# ---- flags ---------------------------------------------------------------------------------------------

def test_no_flag_on_a_stable_run():
    summary = summarize(paired_run(units=6, repeats=2), {"drift": {"1": {"start_s": 0.100, "end_s": 0.101}},
                                                         "costs": STABLE_COSTS})
    assert codes(summary) == [] and codes(summary, "baseline") == []
    assert not any("flagged" in n for n in summary["notes"])


def test_a_wide_interval_is_flagged():
    # latencies 1.5 and 0.5 in turn: the ratio of totals is 2.0, a resample's anywhere from 1.33 to 4
    summary = summarize(paired_run(units=6, jitter=0.5), {"costs": STABLE_COSTS})
    assert codes(summary) == ["ci_wide"]
    assert any(n.startswith(SPEC_LABEL + ": flagged ci_wide") for n in summary["notes"])


@pytest.mark.parametrize("drift", [{"start_s": 0.100, "end_s": 0.115},  # the contract: start and end, off by 15%
                                   {"start_s": 0.100, "end_s": 0.100, "probes_s": [0.100, 0.130, 0.100]}])  # mid-run
def test_a_probe_that_moved_flags_drift(drift):
    summary = summarize(paired_run(units=6), {"drift": {"1": drift}, "costs": STABLE_COSTS})
    assert codes(summary) == ["drift"] and codes(summary, "baseline") == ["drift"]
    assert summarize(paired_run(units=6), {"drift": {"3": drift}, "costs": STABLE_COSTS})["runs"][1]["flags"] == []


def test_a_baseline_that_moved_between_repeats_flags_drift():
    samples = paired_run(units=3, repeats=2)
    for s in samples:
        if s["method"] == "baseline" and s["repeat"] == 1:
            s["latency_s"] = 2.5  # the same batches, 25% slower the second time
    summary = summarize(samples, {})
    assert "drift" in codes(summary) and "drift" in codes(summary, "baseline")
    assert any("between repeats" in f["message"] for f in run(summary, "speculative")["flags"])
    # the probe moved too: two drift flags on the run, said once in best
    both = summarize(samples, {"drift": {"1": {"start_s": 0.100, "end_s": 0.120}}})
    assert codes(both).count("drift") == 2
    assert [best["flags"] for best in both["best"]["batch=1 greedy"].values()] == [["drift"]]
    # a repeat that measured one batch more (a slow one) is compared on the batches both repeats have
    steady = paired_run(units=3, repeats=2) + [record("baseline", 7, 7, 1, tokens=4, latency=30.0)]
    assert "drift" not in codes(summarize(steady, {}), "baseline")


def test_cost_probes_that_disagree_are_flagged():
    costs = {"1": dict(STABLE_COSTS["1"], reps_s=dict(STABLE_COSTS["1"]["reps_s"], target_3=[1.2, 2.4, 1.3]))}
    summary = summarize(paired_run(units=6), {"costs": costs})
    assert codes(summary) == ["cost_unstable"]
    assert "target_3" in run(summary, "speculative")["flags"][0]["message"]
    # a probe this point does not use (the 9-token forward of gamma 8) flags nothing here
    costs = {"1": dict(STABLE_COSTS["1"], reps_s=dict(STABLE_COSTS["1"]["reps_s"], target_9=[1.0, 3.0]))}
    assert codes(summarize(paired_run(units=6), {"costs": costs})) == []


@pytest.mark.parametrize("c, v", [(0.3, 0.8), (1.2, 1.2)])
def test_implausible_costs_are_flagged(c, v):
    summary = summarize(paired_run(units=6), {"costs": {"1": dict(STABLE_COSTS["1"], c=c, v={"2": v})}})
    assert codes(summary) == ["cost_implausible"]
    assert "M = 1" in run(summary, "speculative")["flags"][0]["message"]


def test_greedy_mismatch_explained_or_flagged_by_the_numerics_probe():
    samples = [record("baseline", 0, 0, output=[1, 2, 3], tokens=3),
               record("speculative", 0, 0, output=[1, 2, 4], tokens=3)]
    drifting = summarize(samples, {"numerics": {"target": {"verify_vs_stepwise_max_logit_diff": 0.03,
                                                           "batched_vs_single_max_logit_diff": 0.01,
                                                           "dtype": "bfloat16"}, "drafts": {}}})
    assert codes(drifting) == []
    assert any("exact match 0.000" in n and "explained by the numerics probe" in n and "0.03" in n and "0.01" in n
               and "bfloat16" in n and "[2]" in n for n in drifting["notes"])
    exact = summarize(samples, {"numerics": {"target": {"verify_vs_stepwise_max_logit_diff": 2e-6}, "drafts": {}}})
    assert codes(exact) == ["possible_bug"]
    # the draft's numerics cannot change greedy output (the target decides every token): no excuse
    draft_only = summarize(samples, {"numerics": {"target": {"verify_vs_stepwise_max_logit_diff": 2e-6},
                                                  "drafts": {"d": {"verify_vs_stepwise_max_logit_diff": 0.5}}}})
    assert codes(draft_only) == ["possible_bug"]
    assert codes(summarize(samples, {})) == ["possible_bug"]  # no probe at all
    assert "no numerics probe ran" in run(summarize(samples, {}), "speculative")["flags"][0]["message"]


def test_group_flags_are_noted_once():
    # group a: 2 batches, one twice as fast as the other; group b: 20 steady batches. Overall the 2 jittery
    # batches barely move the interval, group a alone spans [1.33, 4]
    samples = [record("baseline", i, i, group="a" if i < 2 else "b", latency=2.0, tokens=4) for i in range(22)]
    samples += [record("speculative", i, i, group="a" if i < 2 else "b", tokens=4, latency=[0.5, 1.5, 1.0][min(i, 2)],
                       rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}]) for i in range(22)]
    summary = summarize(samples, {"group_by": "category", "drift": {"1": {"start_s": 0.1, "end_s": 0.2}}})
    assert codes(summary) == ["drift"]
    assert codes(summary, group="a") == ["ci_wide", "drift"] and codes(summary, group="b") == ["drift"]
    drift_notes = [n for n in summary["notes"] if "flagged drift" in n]
    # said once, for every overall run it concerns, not again per group
    assert len(drift_notes) == 1 and drift_notes[0].startswith(f"baseline batch=1 greedy; {SPEC_LABEL}: flagged drift")
    assert any(n.startswith(SPEC_LABEL + " [category=a]: flagged ci_wide") for n in summary["notes"])


# ---- best ----------------------------------------------------------------------------------------------

def test_best_points_and_the_predicted_gamma_by_hand():
    # gamma 2: 3 rounds emit 3, 2, 1 -> 7 tokens in 4 forwards, tau 1.75 -> alpha 0.5
    g2 = [{"drafted": 2, "accepted": a, "emitted": a + 1} for a in (2, 1, 0)]
    # gamma 4: 15 rounds emit 2 -> 31 tokens in 16 forwards, tau 31/16 = 1 + .5 + .25 + .125 + .0625 -> alpha 0.5
    g4 = [{"drafted": 4, "accepted": 1, "emitted": 2}] * 15
    # sampled (T = 0.7): outputs of different lengths are no mismatch
    samples = [record("baseline", 0, 0, tokens=7, latency=2.0),
               record("speculative", 0, 0, tokens=7, latency=1.0, rounds=g2, stop_reason="eos"),
               record("speculative", 0, 0, tokens=31, latency=4.0, rounds=g4, gamma=4, stop_reason="eos"),
               # the fastest, but partial: never best
               record("speculative", 0, 0, tokens=31, latency=0.1, rounds=g4, gamma=4, schedule="heuristic",
                      stop_reason="eos")]
    for s in samples:
        s["temperature"] = 0.7
    costs = {"1": {"c": 0.25, "v": {"2": 1.5, "4": 2.0}}}
    summary = summarize(samples, {"costs": costs, "planned": {"speculative draft=d gamma=4 heuristic batch=1 T=0.7": 2}})
    assert run(summary, "speculative", schedule="heuristic")["status"] == "partial"
    best = summary["best"]["batch=1 T=0.7"]["speculative"]
    # measured: gamma 4 makes 31 tokens / 4 s = 7.75 tok/s over 7 / 2 = 3.5 -> 2.214x; gamma 2 7/1 over 3.5 = 2x
    assert best["label"] == "speculative draft=d gamma=4 constant batch=1 T=0.7"
    assert best["speedup"] == pytest.approx(7.75 / 3.5) and best["flagged"] is False
    # predicted with alpha 0.5, c 0.25: gamma 2: 1.75 / (0.5 + 1.5) = 0.875; gamma 4: 1.9375 / (1.0 + 2.0) = 0.646
    assert best["alpha_used"] == pytest.approx(0.5)
    assert best["predicted_best_gamma"] == 2 and best["predicted_best_speedup"] == pytest.approx(0.875)
    assert run(summary, "speculative", gamma=4, schedule="constant")["metrics"]["predicted_speedup"] == \
        pytest.approx(1.9375 / 3)


def test_an_unstable_run_raises_every_flag_it_earns_and_the_notes_say_why():
    # one run, three faults at once: latencies 1.5 / 0.5 in turn (CI [1.33, 4] around 2.0), a drift probe that moved
    # 30%, and a 3-token target forward measured cheaper than a 1-token one (v = 0.8)
    costs = {"1": dict(STABLE_COSTS["1"], v={"2": 0.8})}
    summary = summarize(paired_run(units=6, jitter=0.5), {"costs": costs,
                                                          "drift": {"1": {"start_s": 0.10, "end_s": 0.13}}})
    assert codes(summary) == ["ci_wide", "cost_implausible", "drift"]
    for code in ("ci_wide", "cost_implausible", "drift"):
        assert any(code in n and "flagged" in n for n in summary["notes"]), code
    # the same sweep measured steadily raises none
    steady = summarize(paired_run(units=6), {"costs": STABLE_COSTS, "drift": {"1": {"start_s": 0.10, "end_s": 0.10}}})
    assert codes(steady) == []
