"""possible_bug on hand-made records: a greedy mismatch is a rounding flip only where the baseline's top-1 logit led
its top-2 by at most twice the target's drift (each logit moves by up to the numerics probe's max |logit diff|)."""
import pytest

from eval.summary import summarize
from sample_records import record, run

BF16 = {"verify_vs_stepwise_max_logit_diff": 0.1, "batched_vs_single_max_logit_diff": 0.05, "dtype": "bfloat16",
        "quantization": "none"}  # drift 0.1: a gap up to 0.2 can flip


def summary_of(pairs, target=BF16):
    """pairs: (baseline output, its top2_gaps, speculative output) per prompt."""
    samples = []
    for i, (base, gaps, spec) in enumerate(pairs):
        samples += [record("baseline", i, i, output=base, tokens=len(base), top2_gaps=gaps),
                    record("speculative", i, i, output=spec, tokens=len(spec))]
    return summarize(samples, {"numerics": {"target": target, "drafts": {}}} if target else {})


def bugs(summary):
    return [f["message"] for f in run(summary, "speculative")["flags"] if f["code"] == "possible_bug"]


def test_a_mismatch_where_the_gap_is_wide_is_flagged_and_a_near_tie_is_explained():
    summary = summary_of([([5, 6, 7, 8], [3.0, 0.02, 0.5, 1.0], [5, 9, 7, 8]),  # differs at 1, gap 0.02 <= 0.2
                          ([5, 6, 7, 8], [3.0, 2.0, 0.5, 1.0], [5, 6, 9, 8]),  # differs at 2, gap 0.5 > 0.2
                          ([5, 6, 7, 8], [3.0, 2.0, 0.5, 1.0], [5, 6, 7, 8])])
    metrics = run(summary, "speculative")["metrics"]
    assert metrics["exact_match"] == pytest.approx(1 / 3)
    assert [(m["sample_id"], m["first_mismatch"], m["baseline_gap"]) for m in metrics["mismatches"]] == \
        [(0, 1, 0.02), (1, 2, 0.5)]
    [message] = bugs(summary)
    assert "in 1 sample(s)" in message and "(of 2 that differ)" in message
    assert "sample 1 (repeat 0) first differs at token 2" in message and "by 0.5," in message and "is 0.1;" in message
    [note] = [n for n in summary["notes"] if "explained by the numerics probe" in n]
    assert "1 mismatch(es) (starting at tokens [1])" in note and "at most 0.02" in note and "bfloat16" in note


@pytest.mark.parametrize("gap, flagged", [(0.2, False), (0.21, True)])
def test_the_reach_is_twice_the_drift(gap, flagged):
    assert bool(bugs(summary_of([([5, 6], [1.0, gap], [5, 7])]))) == flagged


def test_outputs_differing_in_length_only_are_flagged():
    # the speculative row went on past the baseline's last token: no token differs, so no near-tie can explain it
    summary = summary_of([([5, 6], [1.0, 0.01], [5, 6, 7])])
    assert run(summary, "speculative")["metrics"]["mismatches"][0]["baseline_gap"] is None
    [message] = bugs(summary)
    assert "first differs at token 2" in message and "only in length" in message


def test_fp32_exact_tie_is_explained_and_a_gap_above_its_drift_is_not():
    fp32 = {"verify_vs_stepwise_max_logit_diff": 3e-5, "batched_vs_single_max_logit_diff": 1e-5, "dtype": "float32"}
    assert bugs(summary_of([([5, 6], [1.0, 0.0], [5, 7])], fp32)) == []  # an exact tie: either token is the argmax
    assert bugs(summary_of([([5, 6], [1.0, 6e-5], [5, 7])], fp32)) == []  # 6e-5 <= 2 x 3e-5
    assert len(bugs(summary_of([([5, 6], [1.0, 0.01], [5, 7])], fp32))) == 1


def test_without_a_probe_every_mismatch_is_flagged():
    [message] = bugs(summary_of([([5, 6], [1.0, 0.0], [5, 7])], target=None))
    assert "no numerics probe ran" in message


def test_an_8bit_target_at_batch_above_one_is_flagged_not_exact_unless_measured_exact():
    """LLM.int8 is not batch-invariant: at batch 2 a mismatch however wide is int8_batch, not possible_bug; at batch 1
    the same records are judged by the drift; a batch-2 point that matched every sample gets no flag."""
    int8 = {**BF16, "quantization": "8bit"}

    def flags(pairs, batch_size):
        samples = []
        for i, (base, gaps, spec) in enumerate(pairs):
            samples += [record("baseline", i, i // batch_size, output=base, tokens=len(base), top2_gaps=gaps,
                               batch_size=batch_size),
                        record("speculative", i, i // batch_size, output=spec, tokens=len(spec), batch_size=batch_size)]
        summary = summarize(samples, {"numerics": {"target": int8, "drafts": {}}})
        return {f["code"]: f["message"] for f in run(summary, "speculative")["flags"]}

    wide = [([5, 6, 7, 8], [3.0, 2.0, 0.5, 1.0], [5, 6, 9, 8]), ([5, 6, 7, 8], [3.0, 2.0, 0.5, 1.0], [5, 6, 7, 8])]
    at_two = flags(wide, 2)
    assert "possible_bug" not in at_two and "batch 2" in at_two["int8_batch"] and "1 sample(s) differ" in at_two["int8_batch"]
    at_one = flags(wide, 1)
    assert "int8_batch" not in at_one and "possible_bug" in at_one
    equal = [([5, 6, 7, 8], [3.0, 2.0, 0.5, 1.0], [5, 6, 7, 8])] * 2
    assert "int8_batch" not in flags(equal, 2)
