"""Every figure against values worked out by hand on constructed records (never recomputed with the
function under test), the paired bootstrap on enumerable cases, partial points, flags, strict JSON."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eval.metrics import (bootstrap_ci, predicted_speedup, solve_alpha, solve_alpha_rounds, summarize, throughput)
from utils.io import write_json

ROOT = Path(__file__).resolve().parents[1]


def record(method="baseline", sample_id=0, batch_index=0, repeat=0, batch_size=1, tokens=10, latency=1.0, prefill=0.1,
           rounds=None, gamma=None, output=None, group=None, draft=None, schedule=None, **extra):
    speculative = method != "baseline"
    return {"method": method, "batch_size": batch_size, "draft": draft if draft or not speculative else "d",
            "gamma": gamma if gamma or not speculative else 2, "schedule": schedule if schedule or not speculative else "constant",
            "exit_layer": None, "temperature": None, "sample_id": sample_id, "repeat": repeat,
            "batch_index": batch_index, "batch_rows": batch_size, "group": group, "prompt_tokens": 5, "preset": "none",
            "reference": None, "output_ids": output if output is not None else list(range(tokens)), "output_text": "",
            "new_tokens": tokens, "stop_reason": "length", "latency_s": latency, "prefill_s": prefill,
            "target_forwards": tokens if not speculative else 1 + len(rounds or []), "draft_forwards": 0,
            "target_s": latency, "draft_s": 0.0, "draft_prefill_s": 0.0, "rounds": rounds if speculative else None,
            "peak_memory_bytes": None, "worker": None, **extra}


def run(summary, method, group=None):
    return next(r for r in summary["runs"] if r["method"] == method and r["group"] == group)


# ---- formulas ------------------------------------------------------------------------------------------

def test_solve_alpha_by_hand():
    assert solve_alpha(1.75, 2) == pytest.approx(0.5, abs=1e-9)  # 1 + .5 + .25
    assert solve_alpha(1 + 0.8 + 0.64 + 0.512, 3) == pytest.approx(0.8, abs=1e-9)
    assert solve_alpha(1.0, 4) == 0.0 and solve_alpha(5.0, 4) == 1.0


def test_solve_alpha_for_variable_lengths_by_hand():
    # rounds drafting 1 and 2 tokens, 1 accepted in all: alpha + (alpha + alpha^2) = 1 -> alpha^2 + 2 alpha - 1 = 0
    rounds = [{"drafted": 1, "accepted": 0}, {"drafted": 2, "accepted": 1}, {"drafted": 0, "accepted": 0}]
    assert solve_alpha_rounds(rounds) == pytest.approx(math.sqrt(2) - 1, abs=1e-9)
    assert solve_alpha_rounds([{"drafted": 0, "accepted": 0}]) is None


def test_predicted_speedup_by_hand():
    # alpha 0.5, gamma 2: (1 - 0.125) / 0.5 = 1.75 tokens; cost 2 * 0.25 + 1.5 = 2.0 -> 0.875
    assert predicted_speedup(0.5, 2, 0.25, 1.5) == pytest.approx(0.875)
    # v = 1 (Leviathan Thm 3.8): 1.75 / 1.5
    assert predicted_speedup(0.5, 2, 0.25, 1.0) == pytest.approx(1.75 / 1.5)
    assert predicted_speedup(1.0, 3, 0.1, 1.0) == pytest.approx(4 / 1.3)


def test_throughput_over_two_batches_by_hand():
    samples = [record(sample_id=0, batch_index=0, batch_size=2, tokens=10, latency=2.0),
               record(sample_id=1, batch_index=0, batch_size=2, tokens=6, latency=1.0),
               record(sample_id=2, batch_index=1, batch_size=2, tokens=4, latency=3.0)]
    # (10 + 6 + 4) tokens / (2.0 (the batch's slowest row) + 3.0) seconds = 4.0
    assert throughput(samples) == pytest.approx(4.0)


# ---- the paired bootstrap -------------------------------------------------------------------------------

def test_bootstrap_of_identical_batches_has_zero_width():
    pairs = [(10, 1.0, 10, 2.0)] * 5  # every batch: method 10 tok/s, baseline 5 tok/s
    assert bootstrap_ci(pairs) == [pytest.approx(2.0), pytest.approx(2.0)]


def test_bootstrap_needs_two_batches():
    assert bootstrap_ci([(10, 1.0, 10, 2.0)]) is None


def test_bootstrap_of_two_batches_by_hand():
    # batch A: ratio 2 (10/1 over 10/2), batch B: ratio 1 (10/1 over 10/1). A resample of two is AA, AB, BA or BB
    # with probability 1/4, 1/2, 1/4; ratio of totals: AA 2, AB/BA 20/2 over 20/3 = 1.5, BB 1.
    # so the 2.5th percentile is 1 and the 97.5th is 2
    pairs = [(10, 1.0, 10, 2.0), (10, 1.0, 10, 1.0)]
    low, high = bootstrap_ci(pairs)
    assert low == pytest.approx(1.0) and high == pytest.approx(2.0)


# ---- summaries of constructed runs -----------------------------------------------------------------------

def paired_run(units=4, base_latency=2.0, spec_latency=1.0, jitter=0.0):
    samples = []
    for i in range(units):
        samples.append(record("baseline", i, i, latency=base_latency, output=[1, 2, 3, 4]))
        samples.append(record("speculative", i, i, latency=spec_latency * (1 + jitter * (-1) ** i), output=[1, 2, 3, 4],
                              tokens=4, rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}]))
    for s in samples:
        s["new_tokens"], s["output_ids"] = 4, [1, 2, 3, 4]
    return samples


def test_speedup_acceptance_and_exact_match_by_hand():
    samples = paired_run()
    summary = summarize(samples, {"planned": {}})
    spec = run(summary, "speculative")["metrics"]
    assert spec["speedup"] == pytest.approx(2.0)  # 4 tokens / 1 s over 4 tokens / 2 s, every batch
    assert spec["speedup_ci95"] == [pytest.approx(2.0), pytest.approx(2.0)]
    assert spec["acceptance_rate"] == 1.0 and spec["mean_accepted_tokens"] == 3.0
    assert spec["per_position_acceptance"] == [1.0, 1.0] and spec["accepted_histogram"] == [0, 0, 4]
    assert spec["exact_match"] == 1.0 and run(summary, "speculative")["flags"] == []


def test_per_position_acceptance_with_variable_lengths_by_hand():
    rounds = [{"drafted": 3, "accepted": 1, "emitted": 2}, {"drafted": 1, "accepted": 1, "emitted": 2},
              {"drafted": 0, "accepted": 0, "emitted": 1}, {"drafted": 2, "accepted": 2, "emitted": 3}]
    samples = [record("baseline", 0, 0, tokens=9), record("speculative", 0, 0, tokens=9, rounds=rounds, gamma=3,
                                                          schedule="heuristic")]
    m = run(summarize(samples, {}), "speculative")["metrics"]
    assert m["acceptance_rate"] == pytest.approx(4 / 6)  # (1 + 1 + 0 + 2) / (3 + 1 + 0 + 2)
    # position 1: drafted by 3 rounds, accepted in all 3; position 2: drafted by 2, accepted in 1; position 3: 1, 0
    assert m["per_position_acceptance"] == [pytest.approx(1.0), pytest.approx(0.5), pytest.approx(0.0)]
    assert m["zero_draft_rounds"] == 0.25 and m["drafted_per_round"] == 1.5
    assert m["predicted_speedup"] is None  # Leviathan's model is for a constant gamma


def test_exact_match_positions_by_hand():
    samples = [record("baseline", 0, 0, output=[5, 6, 7, 8], tokens=4), record("baseline", 1, 1, output=[1, 2], tokens=2),
               record("speculative", 0, 0, output=[5, 6, 9, 8], tokens=4, rounds=[]),
               record("speculative", 1, 1, output=[1, 2, 3], tokens=3, rounds=[])]
    m = run(summarize(samples, {}), "speculative")["metrics"]
    assert m["exact_match"] == 0.0
    assert [(x["sample_id"], x["first_mismatch"]) for x in m["mismatches"]] == [(0, 2), (1, 2)]


def test_ratios_pair_only_the_batches_both_finished():
    samples = paired_run(units=4)
    # the baseline also ran two more batches, slow ones, that the speculative point never finished
    samples += [record("baseline", 10 + i, 10 + i, latency=40.0, tokens=4) for i in range(2)]
    progress = {"planned": {"speculative draft=d gamma=2 constant batch=1 greedy": 6},
                "failures": [{"method": "speculative", "batch_size": 1, "draft": "d", "gamma": 2, "schedule": "constant",
                              "exit_layer": None, "temperature": None, "status": "failed", "error": "CUDA out of memory"}]}
    summary = summarize(samples, progress)
    spec = run(summary, "speculative")
    assert spec["metrics"]["speedup"] == pytest.approx(2.0)  # over the 4 shared batches, not 4 / (4 * 2 + 2 * 40)
    assert spec["status"] == "partial" and spec["batches"] == {"done": 4, "paired": 4, "planned": 6}
    assert summary["best"] == {}  # a partial point is never best
    assert any("partial (4 of 6 batches)" in n for n in summary["notes"])


def test_no_rounds_gives_nulls_and_a_note():
    samples = [record("baseline", 0, 0, tokens=1), record("speculative", 0, 0, tokens=1, rounds=[])]
    summary = summarize(samples, {"costs": {"1": {"c": 0.3, "v": {"2": 1.2}}}})
    m = run(summary, "speculative")["metrics"]
    assert m["alpha"] is None and m["acceptance_rate"] is None and m["predicted_speedup"] is None
    assert m["efficiency"] is None
    assert any("no speculation rounds" in n for n in summary["notes"])
    json.dumps(summary, allow_nan=False)


def test_a_round_that_drafted_nothing_predicts_nothing():
    rounds = [{"drafted": 0, "accepted": 0, "emitted": 1}]  # max_new_tokens 2: the only round had no budget
    samples = [record("baseline", 0, 0, tokens=2), record("speculative", 0, 0, tokens=2, rounds=rounds)]
    m = run(summarize(samples, {"costs": {"1": {"c": 0.3, "v": {"2": 1.2}}}}), "speculative")["metrics"]
    assert m["alpha"] is None and m["predicted_speedup"] is None and m["efficiency"] is None


def test_flags_on_an_unstable_run_and_none_on_a_stable_one():
    stable = summarize(paired_run(units=6), {"drift": {"1": {"probes_s": [0.100, 0.101, 0.099]}},
                                             "costs": {"1": {"c": 0.3, "v": {"2": 1.2}, "reps_s": {"target_1": [1.0, 1.02]}}}})
    assert run(stable, "speculative")["flags"] == []
    unstable = summarize(paired_run(units=6, jitter=0.5), {
        "drift": {"1": {"probes_s": [0.100, 0.150]}},
        "costs": {"1": {"c": 0.3, "v": {"2": 0.8}, "reps_s": {"target_1": [1.0, 2.0, 1.1]}}}})
    codes = {f["code"] for f in run(unstable, "speculative")["flags"]}
    assert codes == {"ci_wide", "drift", "cost_unstable", "cost_implausible"}
    assert any("flagged ci_wide" in n for n in unstable["notes"])


def test_greedy_mismatch_explained_or_flagged_by_the_numerics_probe():
    samples = [record("baseline", 0, 0, output=[1, 2, 3], tokens=3), record("speculative", 0, 0, output=[1, 2, 4],
                                                                             tokens=3, rounds=[])]
    drifting = summarize(samples, {"numerics": {"target": {"verify_vs_stepwise_max_logit_diff": 0.03}, "drafts": {}}})
    assert run(drifting, "speculative")["flags"] == []
    assert any("explained by the numerics probe" in n and "0.03" in n for n in drifting["notes"])
    exact = summarize(samples, {"numerics": {"target": {"verify_vs_stepwise_max_logit_diff": 2e-6}, "drafts": {}}})
    assert [f["code"] for f in run(exact, "speculative")["flags"]] == ["possible_bug"]


def test_groups_are_split_and_an_overall_run_kept():
    samples = [record("baseline", i, i, group=g, latency=2.0) for i, g in enumerate("aabb")]
    samples += [record("speculative", i, i, group=g, latency=1.0 if g == "a" else 4.0, rounds=[])
                for i, g in enumerate("aabb")]
    summary = summarize(samples, {"group_by": "category"})
    assert summary["groups"] == ["a", "b"]
    assert run(summary, "speculative", "a")["metrics"]["speedup"] == pytest.approx(2.0)
    assert run(summary, "speculative", "b")["metrics"]["speedup"] == pytest.approx(0.5)
    assert run(summary, "speculative")["metrics"]["speedup"] == pytest.approx((40 / 10) / (40 / 8))  # 10 s vs 8 s


def test_gsm8k_accuracy_counts_cut_answers():
    base = dict(preset="gsm8k", reference="so #### 18")
    samples = [record("baseline", 0, 0, output_text="... #### 18", **base),
               record("baseline", 1, 1, output_text="we first compute", **base),
               record("baseline", 2, 2, output_text="then half of", **base)]
    summary = summarize(samples, {})
    m = run(summary, "baseline")["metrics"]
    assert m["accuracy"] == pytest.approx(1 / 3) and m["accuracy_cut"] == 2
    assert any("cut at max_new_tokens" in n for n in summary["notes"])


def test_strict_json_is_enforced(tmp_path):
    with pytest.raises(ValueError):
        write_json(tmp_path / "x.json", {"speedup": float("nan")})


def test_eval_rebuilds_the_same_summary(tmp_path):
    samples = paired_run(units=3)
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    progress = {"planned": {}, "notes": ["a note"]}
    (tmp_path / "progress.json").write_text(json.dumps(progress))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"name": "constructed"}))
    result = subprocess.run([sys.executable, "-m", "eval", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["runs"] == json.loads(json.dumps(summarize(samples, progress)["runs"]))
    assert (tmp_path / "speedup.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "methods.png").exists()
