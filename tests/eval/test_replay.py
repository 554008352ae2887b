"""The replay of a static batch's schedule (eval/replay.py) against schedules worked out by hand, and Leviathan's
closed form as its batch-1 special case."""
import pytest

from eval.leviathan import predicted_speedup, solve_alpha
from eval.replay import replay_speedup, speculative_steps
from eval.summary import summarize
from sample_records import costs, record, run

V = {0: 1.0, 1: 1.1, 2: 1.2}.get  # v of a chain of G drafts


def rounds(*accepted, drafted=2):
    return [{"drafted": drafted, "accepted": a, "emitted": a + 1} for a in accepted]


def test_two_rows_in_lockstep_by_hand():
    # row 0: 2 rounds (gamma 2), row 1: 3 rounds; c = 0.3: each round 2 * 0.3 + 1.2 = 1.8 steps, the third over row 1
    # alone: 3 rounds = 5.4 steps
    assert speculative_steps([rounds(2, 1), rounds(0, 2, 2)], 0.3, V) == pytest.approx(5.4)
    # a round where only a row that drafts 1 is left: 0.3 + 1.1; where no row drafts: one plain step
    assert speculative_steps([rounds(2) + rounds(0, drafted=1), rounds(1)], 0.3, V) == pytest.approx(1.8 + 1.4)
    assert speculative_steps([rounds(0, drafted=0)], 0.3, V) == pytest.approx(1.0)
    assert speculative_steps([rounds(2, drafted=3)], 0.3, V) is None  # v unknown at 3 drafts: no price


def test_a_static_batch_waits_for_its_slow_row():
    # batch of 2, 10 new tokens each: the fast row takes 3 rounds (3 + 3 + 3 tokens after its first), the slow one 9
    # (1 token a round). Baseline: 9 steps for 18 decode tokens. Method: 9 rounds of 1.8 steps = 16.2 for 18 tokens.
    # Replay: (18 / 16.2) / (18 / 9) = 0.556; Leviathan's average row (alpha from the pooled rounds) says more
    fast, slow = rounds(2, 2, 2), rounds(*[0] * 9)
    samples = [record("speculative", 0, 0, batch_size=2, tokens=10, rounds=fast),
               record("speculative", 1, 0, batch_size=2, tokens=10, rounds=slow)]
    baseline = [record("baseline", 0, 0, batch_size=2, tokens=10), record("baseline", 1, 0, batch_size=2, tokens=10)]
    assert replay_speedup(samples, baseline, 0.3, V) == pytest.approx((18 / 16.2) / 2.0)
    alpha = solve_alpha(fast + slow)
    assert predicted_speedup(alpha, 2, 0.3, 1.2) > 0.7  # the average row: 18 tokens in 12 rounds, 1.5 / 1.8 = 0.83


def test_at_batch_one_and_constant_gamma_the_replay_is_leviathans():
    # per prompt one row: accepted 2, 0, 1 and 2, 2 (gamma 2): Leviathan's E(alpha) / (2c + v) with alpha solved
    # from the same rounds equals the replay's tokens per step ratio
    rows = [rounds(2, 0, 1), rounds(2, 2)]
    samples = [record("speculative", i, i, tokens=1 + sum(r["emitted"] for r in rs), rounds=rs)
               for i, rs in enumerate(rows)]
    baseline = [record("baseline", i, i, tokens=s["new_tokens"]) for i, s in enumerate(samples)]
    alpha = solve_alpha([r for rs in rows for r in rs])
    assert replay_speedup(samples, baseline, 0.3, V) == pytest.approx(predicted_speedup(alpha, 2, 0.3, 1.2))


def test_summary_carries_the_replay_beside_leviathans():
    # batch 2, two batches; costs c 0.3, v(2) 1.2 at batch size 2
    samples = []
    for unit in range(2):
        for row, rs in enumerate((rounds(2, 2, 2), rounds(0, 0, 0, 0, 0, 0))):
            sample_id = 2 * unit + row
            tokens = 1 + sum(r["emitted"] for r in rs)
            samples.append(record("speculative", sample_id, unit, batch_size=2, tokens=tokens, rounds=rs))
            samples.append(record("baseline", sample_id, unit, batch_size=2, tokens=tokens))
    probe = costs(c=0.3, v={"2": 1.2})
    summary = summarize(samples, {"costs": {"2": probe["1"]}})
    m = run(summary, "speculative", batch_size=2)["metrics"]
    # per batch: rows of 10 and 7 tokens; baseline 9 steps for 15 decode tokens; method 6 rounds of 1.8 steps
    assert m["predicted_speedup_replay"] == pytest.approx((15 / 10.8) / (15 / 9))
    assert m["replay_efficiency"] == pytest.approx(m["decode_speedup"] / m["predicted_speedup_replay"])
