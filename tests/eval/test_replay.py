"""The replay in the report (eval/figures.py, eval/summary.py): a static point's batches replayed with the run's probes
as a cost profile, worked out by hand, beside Leviathan's closed form; prediction_off where the measurement falls
outside it."""
import pytest

from eval.summary import summarize
from sample_records import record, run


def rounds(*accepted, drafted=2):
    return [{"drafted": drafted, "accepted": a, "emitted": a + 1} for a in accepted]


def probe_at_two_rows() -> dict:
    """progress.json's costs at batch size 2: the target's 1-token step 1.0 s, its 3-token verification 1.5 s, the
    draft's step 0.3 s; prefills 0.02 s a token for the target, 0.01 for the draft (2 rows x 5 and 1 x 5 tokens)."""
    return {"2": {"p1": {
        "c_by_draft": {"d": 0.3}, "v": {"2": 1.5}, "target_forward_s": 1.0,
        "target_reps_s": {"1": [1.0, 1.0, 1.0], "3": [1.5, 1.5, 1.5]}, "draft_reps_s": {"d": [0.3, 0.3, 0.3]},
        "context_tokens": 10,
        "prefills": [{"model": "target", "rows": 2, "tokens": 5, "s": 0.2}, {"model": "target", "rows": 1, "tokens": 5, "s": 0.1},
                     {"model": "draft:d", "rows": 2, "tokens": 5, "s": 0.1}, {"model": "draft:d", "rows": 1, "tokens": 5, "s": 0.05}]}}}


def batches(spec_latency: float, base_latency: float) -> list[dict]:
    # two batches of 2 rows: A accepts 2 then 0 (5 tokens), B accepts 1 (3 tokens); prompts 5 tokens
    samples = []
    for unit in range(2):
        for row, rs in enumerate((rounds(2, 0), rounds(1))):
            sample_id, tokens = 2 * unit + row, 1 + sum(r["emitted"] for r in rs)
            samples.append(record("speculative", sample_id, unit, batch_size=2, tokens=tokens, rounds=rs,
                                  latency=spec_latency if row == 0 else 2.0))
            samples.append(record("baseline", sample_id, unit, batch_size=2, tokens=tokens,
                                  latency=base_latency if row == 0 else 2.0))
    return samples


def test_a_static_point_is_predicted_by_replaying_its_batches():
    summary = summarize(batches(4.6, 4.2), {"costs": probe_at_two_rows()})
    m = run(summary, "speculative", batch_size=2)["metrics"]
    # a batch: prefill of 2 rows 0.2, the draft's 0.1; round 1 over both 2 x 0.3 + 1.5 = 2.1 (B done at 2.4); round 2
    # over A alone, priced at the probed 2 rows (no 1-row probe): 2.1 -> 4.5. The baseline: prefill 0.2, 2 steps of
    # 1.0 (B done), 2 more for A at 2 rows' price: 4.2. 8 tokens each: 4.2 / 4.5
    assert m["predicted_speedup_replay"] == pytest.approx(4.2 / 4.5)
    assert m["replay"]["rows_priced_above"] == [1]
    # after the prefills: 6 tokens in 4.5 - 0.3 against 6 in 4.2 - 0.2
    assert m["predicted_decode_speedup_replay"] == pytest.approx(4.0 / 4.2)
    assert m["replay_efficiency"] == pytest.approx((4.2 / 4.6) / (4.2 / 4.5))
    # Leviathan's average row beside it (METRICS.md's predicted speedup): alpha from the pooled rounds, c 0.3, v 1.5;
    # 3 rounds accepting 2, 0, 1 of 2: alpha solves alpha (1 - alpha^2) / (1 - alpha) x 3 = 3, alpha = 0.618
    alpha = (5 ** 0.5 - 1) / 2
    assert m["predicted_speedup"] == pytest.approx((1 - alpha ** 3) / ((1 - alpha) * (2 * 0.3 + 1.5)))
    assert m["efficiency"] == pytest.approx(m["speedup"] / m["predicted_speedup"])
    assert m["predicted_speedup_replay_ci95"] is None  # 2 prompt batches: no interval
    assert m["prediction_off"] is None  # measured 0.913 within 5% of 0.933
    assert "prediction_off" not in {f["code"] for f in run(summary, "speculative", batch_size=2)["flags"]}


def test_a_measurement_far_from_the_replay_is_flagged_with_the_part_that_is_off():
    summary = summarize(batches(6.0, 4.2), {"costs": probe_at_two_rows()})
    r = run(summary, "speculative", batch_size=2)
    assert r["metrics"]["speedup"] == pytest.approx(0.7)
    flag = next(f for f in r["flags"] if f["code"] == "prediction_off")
    assert flag["message"].startswith("measured 0.700 against the replay's 0.933 (measured / predicted 0.750)")
    # the records' prefills (0.1 s a row) against the replay's (0.2 + 0.1 a row): the part that is off, named
    assert "the prefills took 0.33x the replay's" in flag["message"]


def test_without_prefills_in_the_probes_there_is_no_replay_and_it_says_why():
    probe = probe_at_two_rows()
    del probe["2"]["p1"]["prefills"]
    m = run(summarize(batches(4.6, 4.2), {"costs": probe}), "speculative", batch_size=2)["metrics"]
    assert m["predicted_speedup_replay"] is None and m["predicted_speedup"] is not None
    assert "prefill" in m["replay_missing"]


def test_a_synthetic_acceptance_point_is_replayed_as_a_real_one():
    """Its rounds are recorded as the engine ran them (only who decided the acceptance differs): the same replay,
    4.2 / 4.5, on a GPU's random-weight shapes the only prediction there is."""
    samples = [dict(s, synthetic_acceptance=0.8) if s["method"] == "speculative" else s
               for s in batches(4.6, 4.2)]
    m = run(summarize(samples, {"costs": probe_at_two_rows()}), "speculative", batch_size=2)["metrics"]
    assert m["predicted_speedup_replay"] == pytest.approx(4.2 / 4.5)
    assert m["exact_match"] is None


def eight_alike_batches() -> list[dict]:
    """8 prompt batches as batches() makes them, every one alike: the acceptance varies nothing over prompts."""
    samples = []
    for unit in range(8):
        for s in batches(4.6, 4.2)[:4]:
            samples.append(dict(s, batch_index=unit, sample_id=2 * unit + s["sample_id"]))
    return samples


def test_the_replay_interval_holds_the_probes_timing_spread():
    """Batches alike: the prediction's interval is the probes' timing spread alone. With every repetition equal it
    is the point 4.2 / 4.5. The probe times its steps interleaved, repetition by repetition, and they are drawn
    together: where a repetition was slow for every step (the target's step 0.9, 1.0, 1.1 s, its verification 1.35,
    1.5, 1.65, the draft's 0.27, 0.3, 0.33) the speedup barely moves, only the prefills not scaling: 0.3 + 2 x (0.54 +
    1.35) = 4.08 s a batch against 0.2 + 4 x 0.9 = 3.8 at the fast end, 0.931; 4.92 against 4.6, 0.935, at the slow.
    Where the method's steps were slow when the baseline's were fast (verification 1.6, 1.5, 1.4, draft 0.35, 0.3,
    0.25) it widens, inside the extremes by hand: 4.9 s against 3.8, 0.776, and 4.1 against 4.6, 1.122."""
    def interval(target, verify, draft):
        probe = probe_at_two_rows()
        probe["2"]["p1"].update(target_reps_s={"1": target, "3": verify}, draft_reps_s={"d": draft})
        return run(summarize(eight_alike_batches(), {"costs": probe}), "speculative",
                   batch_size=2)["metrics"]["predicted_speedup_replay_ci95"]

    assert interval([1.0] * 3, [1.5] * 3, [0.3] * 3) == pytest.approx([4.2 / 4.5, 4.2 / 4.5])
    low, high = interval([0.9, 1.0, 1.1], [1.35, 1.5, 1.65], [0.27, 0.3, 0.33])
    assert 3.8 / 4.08 - 1e-9 <= low <= high <= 4.6 / 4.92 + 1e-9
    low, high = interval([0.9, 1.0, 1.1], [1.6, 1.5, 1.4], [0.35, 0.3, 0.25])
    assert 3.8 / 4.9 <= low < 4.2 / 4.5 - 0.02 and 4.2 / 4.5 + 0.02 < high <= 4.6 / 4.1


def test_steps_priced_beyond_the_probed_caches_are_said_in_the_notes():
    costs = probe_at_two_rows()
    costs["2"]["p2"] = dict(costs["2"]["p1"], context_tokens=30)  # another process's probe: a cache of 30, as dear
    summary = summarize(batches(4.6, 4.2), {"costs": costs})
    m = run(summary, "speculative", batch_size=2)["metrics"]
    assert m["predicted_speedup_replay"] == pytest.approx(4.2 / 4.5)  # a flat line: as with the one cache
    # the rows' caches, their 5-token prompts and the tokens since, 6 to 9: below the probed 10 and 30
    assert m["replay"]["caches_priced_beyond"] == [6, 9]
    assert "speculative draft=d gamma=2 constant batch=2 greedy: the replay's steps at caches of 6 to 9 tokens priced " \
           "beyond the profiled caches (10, 30 tokens)" in " ".join(summary["notes"])


def test_a_machine_uniformly_slower_than_its_probes_names_the_same_prefills():
    """Every time of every record 3x (a machine 3x slower than its probes): the prefills are named as on the machine of
    the probes, in units of the baseline's steps (which ran 3x the replay's there), not hidden at 1.00x the replay's."""
    slow = [{**s, **{k: s[k] * 3 for k in ("latency_s", "prefill_s", "target_s", "draft_s", "draft_prefill_s")}}
            for s in batches(6.0, 4.2)]
    messages = [next(f for f in run(summarize(samples, {"costs": probe_at_two_rows()}), "speculative",
                                    batch_size=2)["flags"] if f["code"] == "prediction_off")["message"]
                for samples in (batches(6.0, 4.2), slow)]
    for message in messages:
        assert "the prefills took 0.33x the replay's in units of the baseline's steps" in message, message
