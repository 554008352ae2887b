"""A serving run's arrivals (runner/load.py): drawn as vLLM's `bench serve` draws them (a gap before every request,
the first included, then every time scaled so that the last lands at N / rate), and seeded so that a concurrency
sweep at one rate sees one trace per repeat."""
import numpy as np
import pytest

from runner.load import arrival_gaps, arrival_times, schedule_of
from runner.plan import Unit, comparisons
from utils.config import validate

VALID = {"target": {"model": "t"}, "draft": {"model": "d"}, "dataset": {"path": "x.jsonl", "preset": "gsm8k"}}


@pytest.mark.parametrize("arrival", ["poisson", "constant"])
@pytest.mark.parametrize("burstiness", [0.5, 1.0, 3.0])
def test_the_first_request_waits_a_gap_and_the_last_lands_at_n_over_rate(arrival, burstiness):
    for count, rate in [(1, 2.0), (7, 0.5), (40, 8.0)]:
        times = arrival_times(count, rate, arrival, burstiness, seed=11)
        assert len(times) == count and times[0] > 0
        assert times[-1] == pytest.approx(count / rate, rel=1e-12)
        assert all(b >= a for a, b in zip(times, times[1:]))
    assert arrival_times(4, 2.0, "constant") == pytest.approx([0.5, 1.0, 1.5, 2.0])
    assert arrival_times(3, None, arrival, burstiness) == [0.0] * 3  # all at once
    assert arrival_times(3, float("inf"), arrival, burstiness) == [0.0] * 3


def test_the_gaps_before_scaling_have_mean_one_over_rate_and_the_scaling_is_vllms():
    """The gaps as drawn: gamma(shape = burstiness, scale = 1 / (rate x burstiness)), mean 1/rate and variance
    1 / (rate^2 burstiness); the times are their running sum times (N / rate) / their sum."""
    rate, count = 4.0, 20000
    for burstiness in (0.5, 1.0, 4.0):
        gaps = arrival_gaps(count, rate, "poisson", burstiness, seed=3)
        assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
        assert gaps.var() == pytest.approx(1 / (rate ** 2 * burstiness), rel=0.1)
        times = arrival_times(count, rate, "poisson", burstiness, seed=3)
        assert times == pytest.approx(np.cumsum(gaps) * (count / rate) / gaps.sum(), rel=1e-12)
    few = arrival_gaps(8, rate, "poisson", 1.0, seed=3)  # a short trace's gaps miss N / rate: scaled to it
    assert few.sum() != pytest.approx(8 / rate, rel=1e-3)
    assert arrival_times(8, rate, "poisson", 1.0, seed=3)[-1] == pytest.approx(8 / rate, rel=1e-12)


def test_a_concurrency_sweep_sees_one_trace_per_rate_seed_and_repeat():
    config = validate({**VALID, "seed": 5, "load": {"concurrency": [1, 4, 16], "request_rate": [2.0], "requests": 9}})
    units = [Unit(c, 0, 0) for c in comparisons(config, 9)]
    assert [u.concurrency for u in units] == [1, 4, 16]
    traces = [schedule_of(config, unit, 6) for unit in units]
    assert len(traces[0]) == 9 and traces[0] == traces[1] == traces[2]
    assert schedule_of(config, Unit(units[0].comparison, 1, 0), 6) != traces[0]  # another repeat: another trace
    other = validate({**VALID, "seed": 6, "load": {"concurrency": [1], "request_rate": [2.0], "requests": 9}})
    assert schedule_of(other, Unit(comparisons(other, 9)[0], 0, 0), 6) != traces[0]  # another seed: another


def test_a_conversations_later_turns_follow_their_previous_turn_and_the_schedule_paces_first_turns():
    from types import SimpleNamespace as P

    from runner.load import follows_of, load_of, requests_of

    # two conversations (rows 0 and 1) of two turns, as utils/data.py orders them: first turns, then second turns;
    # 6 requests cycle through them, a lone prompt has no conversation
    prompts = [P(conversation=0, turn=1), P(conversation=1, turn=1), P(conversation=0, turn=2),
               P(conversation=1, turn=2)]
    requests = requests_of(prompts, 6)
    assert follows_of(requests) == [None, None, 0, 1, None, None]
    assert follows_of([P(conversation=None, turn=None)] * 2) == [None, None]
    config = validate({**VALID, "dataset": {**VALID["dataset"], "turns": 2},
                       "load": {"concurrency": [2], "request_rate": [2.0], "arrival": "constant", "think_s": 1.5}})
    load = load_of(config, Unit(comparisons(config, 6)[0], 0, 0), requests)
    assert load.follows == [None, None, 0, 1, None, None] and load.think_s == 1.5
    # the schedule is drawn for the 4 requests that follow none, at 2 per second, in order
    assert [a for a, j in zip(load.arrivals, load.follows) if j is None] == pytest.approx([0.5, 1.0, 1.5, 2.0])
    load.check(6)
    lone = validate({**VALID, "load": {"concurrency": [2], "request_rate": [2.0], "requests": 6}})
    plain = load_of(lone, Unit(comparisons(lone, 6)[0], 0, 0), [P(conversation=None, turn=None)] * 6)
    assert plain.follows is None and plain.arrivals == schedule_of(lone, Unit(comparisons(lone, 6)[0], 0, 0), 6)
    from utils import ConfigError

    with pytest.raises(ConfigError, match="think_s: 1.0 paces a conversation's turns"):
        validate({**VALID, "load": {"concurrency": [2], "think_s": 1.0}})
