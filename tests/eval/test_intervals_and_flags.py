"""What a figure can be trusted for: the paired bootstrap over prompts on enumerable cases, too few prompts, ratios
over the same batches only, partial points, flags raised on constructed unstable runs and none on a stable one,
the best points."""
import math

import pytest

from eval.flags import ci_verdict
from eval.stats import bootstrap_ci, expanded_tail
from eval.summary import summarize
from sample_records import SPEC_LABEL, codes, costs, paired_run, record, run

STABLE_COSTS = costs()


# ---- the paired bootstrap over prompts -------------------------------------------------------------------------

def test_bootstrap_of_identical_prompts_has_zero_width():
    clusters = [(10, 1.0, 10, 2.0)] * 8  # every prompt: point 10 tok/s, baseline 5 tok/s
    assert bootstrap_ci(clusters) == [pytest.approx(2.0), pytest.approx(2.0)]


def test_expanded_tail_by_hand():
    # n = 8: sqrt(8/7) * t(0.975, 7) = 1.06904 * 2.36462 (t table) = 2.52791; Phi(-2.52791) = 0.00574 (z table)
    assert expanded_tail(8) == pytest.approx(0.00574, abs=2e-5)
    # n = 30: sqrt(30/29) * 2.04523 = 2.08022; Phi(-2.08022) = 0.01875
    assert expanded_tail(30) == pytest.approx(0.01875, abs=2e-5)


def test_bootstrap_of_eight_prompts_by_hand():
    # 7 prompts at ratio 1 (10 tokens in 1 s both), one (B) where the point makes 30: a resample with k draws of B has
    # ratio (80 + 20k) / 80 = 1 + k/4, k ~ Binomial(8, 1/8). P(k = 0) = 0.344: the low end is 1.0. P(k >= 4) = 1.13%
    # and P(k >= 5) = 0.13% straddle the expanded tail 0.574% (n = 8): the high end is k = 4, 2.0. A plain 97.5th
    # percentile would stop at k = 3 (P(k >= 3) = 6.7%, P(k >= 4) = 1.1%): 1.75, too narrow for 8 prompts
    clusters = [(10, 1.0, 10, 1.0)] * 7 + [(30, 1.0, 10, 1.0)]
    assert bootstrap_ci(clusters) == [pytest.approx(1.0), pytest.approx(2.0)]
    assert bootstrap_ci(clusters) == bootstrap_ci(clusters)  # seeded: a rebuild gives the same numbers


def test_repeats_of_the_same_prompts_do_not_narrow_the_interval():
    # 8 prompts, alternately 1.5x and 2.5x faster; their repeats byte-identical. The interval is about the prompts:
    # one repeat or eight give the same interval (the old per-(repeat, batch) bootstrap shrank it by sqrt(8))
    def sweep(repeats):
        samples = []
        for repeat in range(repeats):
            for i in range(8):
                samples.append(record("baseline", i, i, repeat, tokens=4, latency=2.0))
                samples.append(record("speculative", i, i, repeat, tokens=4, latency=[2 / 1.5, 2 / 2.5][i % 2],
                                      rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}]))
        return run(summarize(samples, {}), "speculative")

    once, eight = sweep(1), sweep(8)
    assert once["metrics"]["speedup_ci95"] == eight["metrics"]["speedup_ci95"]
    assert once["metrics"]["speedup_ci95"][1] - once["metrics"]["speedup_ci95"][0] > 0.3
    assert eight["batches"]["prompts"] == 8 and eight["batches"]["paired"] == 64


def test_too_few_prompts_give_no_interval_and_a_flag():
    # two prompts at 1.50x and 1.52x: a bootstrap over 2 units is not a 95% interval ([1.50, 1.52] claimed before)
    samples = [record("baseline", i, i, tokens=3, latency=1.0) for i in range(2)]
    samples += [record("speculative", i, i, tokens=3, latency=1 / r, rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}])
                for i, r in enumerate((1.50, 1.52))]
    summary = summarize(samples, {})
    spec = run(summary, "speculative")
    assert spec["metrics"]["speedup"] == pytest.approx(6 / (1 / 1.5 + 1 / 1.52) / 3)
    assert spec["metrics"]["speedup_ci95"] is None and spec["metrics"]["decode_speedup_ci95"] is None
    assert codes(summary) == ["few_samples"] and codes(summary, "baseline") == []
    assert any(n.startswith(SPEC_LABEL + ": flagged few_samples") and "2 prompt batch" in n for n in summary["notes"])
    # seven prompts are still too few; eight give an interval
    assert codes(summarize(paired_run(units=7), {})) == ["few_samples"]
    assert codes(summarize(paired_run(units=8), {})) == []


def test_the_interval_rule_is_one_for_the_flag_and_for_repeats_auto():
    # half-width 0.10 of 1.0 but the low end 15% below: the old auto stop (half-width) said settled, the flag wide
    assert ci_verdict(1.0, [0.85, 1.05], prompts=8, ci_target=0.10) == "ci_wide"
    assert ci_verdict(1.0, [0.91, 1.09], prompts=8, ci_target=0.10) is None
    assert ci_verdict(1.0, [0.85, 1.05], prompts=8, ci_target=0.20) is None
    assert ci_verdict(1.0, None, prompts=3) == "few_samples"
    # summarize reads the run's ci_target from progress.json
    wide = paired_run(units=8, jitter=0.2)
    assert codes(summarize(wide, {})) == ["ci_wide"] and codes(summarize(wide, {"ci_target": 0.5})) == []


def test_the_summary_is_deterministic():
    samples = paired_run(units=8, jitter=0.3)
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
    assert spec["status"] == "partial" and spec["batches"] == {"done": 4, "paired": 4, "planned": 6, "prompts": 4,
                                                             "cross_process": 0}
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
    assert spec["batches"] == {"done": 3, "paired": 2, "planned": None, "prompts": 2, "cross_process": 0}
    assert spec["status"] == "ok"
    assert any("the baseline finished 2 of this point's 3 batches" in n for n in summary["notes"])


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
    summary = summarize(paired_run(units=8, repeats=2), {"drift": {"1": {"p1": [0.100, 0.101]}}, "costs": STABLE_COSTS})
    assert codes(summary) == [] and codes(summary, "baseline") == []
    assert not any("flagged" in n for n in summary["notes"])


def test_a_wide_interval_is_flagged():
    # latencies 1.5 and 0.5 in turn: the ratio of totals is 2.0, a resample's anywhere from 1.33 to 4
    summary = summarize(paired_run(units=8, jitter=0.5), {"costs": STABLE_COSTS})
    assert codes(summary) == ["ci_wide"]
    assert any(n.startswith(SPEC_LABEL + ": flagged ci_wide") for n in summary["notes"])


@pytest.mark.parametrize("drift", [{"p1": [0.100, 0.115]},  # one process's readings, off by 15%
                                   {"p1": [0.100, 0.100], "w1": [0.100, 0.130, 0.100]},  # one worker's, mid-run
                                   {"start_s": 0.100, "end_s": 0.115}])  # a folder written before processes were kept
def test_a_probe_that_moved_flags_drift(drift):
    summary = summarize(paired_run(units=8), {"drift": {"1": drift}, "costs": STABLE_COSTS})
    assert codes(summary) == ["drift"] and codes(summary, "baseline") == ["drift"]
    assert summarize(paired_run(units=8), {"drift": {"3": drift}, "costs": STABLE_COSTS})["runs"][1]["flags"] == []


def test_each_engine_reads_the_drift_of_the_probe_processes_its_entry_names():
    """Another engine's probe process carries its engine in its processes entry (read as data, whatever the key); a
    folder written before it did names the engine in the key ("<process>/<engine> <group>"), read still."""
    from eval.flags import probe_drift

    progress = {"drift": {"1": {"p1": [0.100, 0.110], "p1/x 0": [0.100, 0.140], "p1/vllm 0": [0.100, 0.120]}},
                "processes": {"p1": {"name": "process 1"}, "p1/x 0": {"probe": True, "engine": "llama_cpp"},
                              "p1/vllm 0": {"probe": True}}}
    assert probe_drift(progress, 1) == pytest.approx(0.10)  # ours: p1 alone
    assert probe_drift(progress, 1, "llama_cpp") == pytest.approx(0.40)
    assert probe_drift(progress, 1, "vllm") == pytest.approx(0.20)


def test_a_baseline_that_moved_between_repeats_flags_drift():
    samples = paired_run(units=8, repeats=2)
    for s in samples:
        if s["method"] == "baseline" and s["repeat"] == 1:
            s["latency_s"] = 2.5  # the same batches, 25% slower the second time
    summary = summarize(samples, {})
    assert "drift" in codes(summary) and "drift" in codes(summary, "baseline")
    assert any("between repeats" in f["message"] for f in run(summary, "speculative")["flags"])
    # the probe moved too: two drift flags on the run, said once in best
    both = summarize(samples, {"drift": {"1": {"p1": [0.100, 0.120]}}})
    assert codes(both).count("drift") == 2
    assert [best["flags"] for best in both["best"]["batch=1 greedy"].values()] == [["drift"]]
    # a repeat that measured one batch more (a slow one) is compared on the batches both repeats have
    steady = paired_run(units=8, repeats=2) + [record("baseline", 9, 9, 1, tokens=4, latency=30.0)]
    assert "drift" not in codes(summarize(steady, {}), "baseline")


def test_cost_probes_that_disagree_are_flagged():
    unsteady = costs()
    unsteady["1"]["p1"]["target_reps_s"]["3"] = [1.2, 2.4, 1.3]
    summary = summarize(paired_run(units=8), {"costs": unsteady})
    assert codes(summary) == ["cost_unstable"]
    assert "target 3-token" in run(summary, "speculative")["flags"][0]["message"]
    # a probe this point does not use (the 9-token forward of gamma 8) flags nothing here
    unused = costs()
    unused["1"]["p1"]["target_reps_s"]["9"] = [1.0, 3.0]
    assert codes(summarize(paired_run(units=8), {"costs": unused})) == []


@pytest.mark.parametrize("c, v", [(0.3, 0.8), (1.2, 1.2)])
def test_implausible_costs_are_flagged(c, v):
    summary = summarize(paired_run(units=8), {"costs": costs(c, {"2": v})})
    assert codes(summary) == ["cost_implausible"]
    assert "M = 1" in run(summary, "speculative")["flags"][0]["message"]


def test_greedy_mismatch_explained_or_flagged_by_the_numerics_probe():
    samples = [record("baseline", 0, 0, output=[1, 2, 3], tokens=3),
               record("speculative", 0, 0, output=[1, 2, 4], tokens=3)]
    drifting = summarize(samples, {"numerics": {"target": {"verify_vs_stepwise_max_logit_diff": 0.03,
                                                           "batched_vs_single_max_logit_diff": 0.01,
                                                           "dtype": "bfloat16"}, "drafts": {}}})
    assert codes(drifting) == ["few_samples"]  # one prompt: no interval, and the mismatch is explained
    assert any("exact match 0.000" in n and "explained by the numerics probe" in n and "0.03" in n and "0.01" in n
               and "bfloat16" in n and "[2]" in n for n in drifting["notes"])
    exact = summarize(samples, {"numerics": {"target": {"verify_vs_stepwise_max_logit_diff": 2e-6}, "drafts": {}}})
    assert codes(exact) == ["few_samples", "possible_bug"]
    # the draft's numerics cannot change greedy output (the target decides every token): no excuse
    draft_only = summarize(samples, {"numerics": {"target": {"verify_vs_stepwise_max_logit_diff": 2e-6},
                                                  "drafts": {"d": {"verify_vs_stepwise_max_logit_diff": 0.5}}}})
    assert codes(draft_only) == ["few_samples", "possible_bug"]
    assert codes(summarize(samples, {})) == ["few_samples", "possible_bug"]  # no probe at all
    assert "no numerics probe ran" in run(summarize(samples, {}), "speculative")["flags"][-1]["message"]


def test_group_flags_are_noted_once():
    # group a: 8 batches, alternately 2.67x and 1.6x faster; group b: 20 steady batches. Overall the jittery batches
    # barely move the interval, group a alone is wide; group c has 2 prompts, too few for an interval
    groups = ["a"] * 8 + ["b"] * 20 + ["c"] * 2
    samples = [record("baseline", i, i, group=g, latency=2.0, tokens=4) for i, g in enumerate(groups)]
    samples += [record("speculative", i, i, group=g, tokens=4, latency=[0.75, 1.25][i % 2] if g == "a" else 1.0,
                       rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}]) for i, g in enumerate(groups)]
    summary = summarize(samples, {"group_by": "category", "drift": {"1": {"p1": [0.1, 0.2]}}})
    assert codes(summary) == ["drift"]
    assert codes(summary, group="a") == ["ci_wide", "drift"] and codes(summary, group="b") == ["drift"]
    assert codes(summary, group="c") == ["drift", "few_samples"]
    drift_notes = [n for n in summary["notes"] if "flagged drift" in n]
    # said once, for every overall run it concerns, not again per group
    assert len(drift_notes) == 1 and drift_notes[0].startswith(f"baseline batch=1 greedy; {SPEC_LABEL}: flagged drift")
    assert any(n.startswith(SPEC_LABEL + " [category=a]: flagged ci_wide") for n in summary["notes"])
    few = [n for n in summary["notes"] if "few_samples" in n]
    assert len(few) == 1 and "category=c (2 prompt batches)" in few[0] and SPEC_LABEL in few[0]


# ---- best ----------------------------------------------------------------------------------------------

def test_best_points_and_the_predicted_gamma_by_hand():
    # gamma 2: 4 rounds accept 2, 1, 0, 0 of 2: 4 (alpha + alpha^2) = 3 -> alpha 0.5; 1 + 3 + 2 + 1 + 1 = 8 tokens
    g2 = [{"drafted": 2, "accepted": a, "emitted": a + 1} for a in (2, 1, 0, 0)]
    # gamma 4: 16 rounds accept 1 but one 0: 16 (a + a^2 + a^3 + a^4) = 15 -> alpha 0.5; 1 + 15 * 2 + 1 = 32 tokens
    g4 = [{"drafted": 4, "accepted": 1, "emitted": 2}] * 15 + [{"drafted": 4, "accepted": 0, "emitted": 1}]
    # sampled (T = 0.7): outputs of different lengths are no mismatch
    samples = [record("baseline", 0, 0, tokens=8, latency=2.0),
               record("speculative", 0, 0, tokens=8, latency=1.0, rounds=g2, stop_reason="eos"),
               record("speculative", 0, 0, tokens=32, latency=3.2, rounds=g4, gamma=4, stop_reason="eos"),
               # the fastest, but partial: never best
               record("speculative", 0, 0, tokens=32, latency=0.1, rounds=g4, gamma=4, schedule="heuristic",
                      stop_reason="eos")]
    for s in samples:
        s["temperature"] = 0.7
    summary = summarize(samples, {"costs": costs(0.25, {"2": 1.5, "4": 2.0}), "planned": {"speculative draft=d gamma=4 heuristic batch=1 T=0.7": 2}})
    assert run(summary, "speculative", schedule="heuristic")["status"] == "partial"
    best = summary["best"]["batch=1 T=0.7"]["speculative"]
    # measured: gamma 4 makes 32 tokens / 3.2 s = 10 tok/s over 8 / 2 = 4 -> 2.5x; gamma 2 8/1 over 4 = 2x
    assert best["label"] == "speculative draft=d gamma=4 constant batch=1 T=0.7"
    assert best["speedup"] == pytest.approx(2.5) and best["flags"] == ["few_samples"]  # one prompt
    # predicted with alpha 0.5, c 0.25: gamma 2: 1.75 / (0.5 + 1.5) = 0.875; gamma 4: 1.9375 / (1.0 + 2.0) = 0.646
    assert best["alpha_used"] == pytest.approx(0.5)
    assert best["predicted_best_gamma"] == 2 and best["predicted_best_speedup"] == pytest.approx(0.875)
    assert run(summary, "speculative", gamma=4, schedule="constant")["metrics"]["predicted_speedup"] == \
        pytest.approx(1.9375 / 3)


def test_an_unstable_run_raises_every_flag_it_earns_and_the_notes_say_why():
    # one run, three faults at once: latencies 1.5 / 0.5 in turn (CI [1.33, 4] around 2.0), a drift probe that moved
    # 30%, and a 3-token target forward measured cheaper than a 1-token one (v = 0.8)
    summary = summarize(paired_run(units=8, jitter=0.5), {"costs": costs(0.3, {"2": 0.8}),
                                                          "drift": {"1": {"p1": [0.10, 0.13]}}})
    assert codes(summary) == ["ci_wide", "cost_implausible", "drift"]
    for code in ("ci_wide", "cost_implausible", "drift"):
        assert any(code in n and "flagged" in n for n in summary["notes"]), code
    # the same sweep measured steadily raises none
    steady = summarize(paired_run(units=8), {"costs": STABLE_COSTS, "drift": {"1": {"p1": [0.10, 0.10]}}})
    assert codes(steady) == []


def test_paired_batches_with_no_time_are_not_called_unpaired():
    samples = paired_run(units=8, base_latency=0.0)
    summary = summarize(samples, {})
    assert run(summary, "speculative")["metrics"]["speedup"] is None
    assert any(n.startswith(SPEC_LABEL + ": 8 batches paired with the baseline, but a side's total wall time or "
                            "tokens are 0") for n in summary["notes"])
    assert not any("to pair with" in n for n in summary["notes"])


def test_the_few_samples_note_names_only_the_points_it_concerns():
    # 16 prompts in groups A and B: at batch 1 each group has 8 prompt batches (an interval), at batch 4 four (none)
    samples = []
    for size in (1, 4):
        for i in range(16):
            group, index = "AB"[i % 2], i // size
            samples.append(record("baseline", i, index, batch_size=size, group=group, tokens=4, latency=2.0))
            samples.append(record("speculative", i, index, batch_size=size, group=group, tokens=4, latency=1.0,
                                  rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}]))
    summary = summarize(samples, {"group_by": "category"})
    few = [n for n in summary["notes"] if n.startswith("flagged few_samples")]  # the group runs' note
    assert len(few) == 1 and "every point" not in few[0]
    assert "category=A (4 prompt batches): speculative draft=d gamma=2 constant batch=4 greedy" in few[0]
    assert "batch=1" not in few[0]
