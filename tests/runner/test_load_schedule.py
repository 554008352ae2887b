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


def test_the_bounds_count_the_arrivals_at_the_rate_and_the_warning_adds_the_think_times():
    """Conversations: only first turns arrive at request_rate. 2 conversations x 2 turns at 1/1000 per second: 2,000 s of
    arrivals and one think time of 30 s a load point, for baseline and prompt_lookup: 4,060 s, 1.1 h (over the hour:
    warned); at 1/600 per second, 2 x (1,200 + 30) = 2,460 s (not)."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from runner.experiment import Experiment
    from runner.storage import Progress

    bound = validate({**VALID, "methods": ["baseline", "prompt_lookup"], "dataset": {**VALID["dataset"], "turns": 2},
                      "load": {"concurrency": 1, "request_rate": 3.0e-5}}).load
    bound.check_scale(4, 2)  # 66,667 s: inside 24 h
    with pytest.raises(ValueError, match=r"spreads 4 requests \(load.requests\) over 133333.3333 s \(37 h\)"):
        bound.check_scale(4, 4)  # were every turn an arrival: 133,333 s
    with pytest.raises(ValueError, match=r"spreads the 3 conversations' first turns of 8 requests \(load.requests\) "
                                         r"over 100000 s \(27.8 h\)"):
        bound.check_scale(8, 3)

    prompts = [SimpleNamespace(conversation=c, turn=t) for t in (1, 2) for c in (0, 1)]
    for rate, warned in [(0.001, "waiting alone takes 1.1 h"), (1 / 600, None)]:
        config = validate({**VALID, "methods": ["baseline", "prompt_lookup"],
                           "dataset": {**VALID["dataset"], "turns": 2},
                           "load": {"concurrency": 1, "request_rate": rate, "think_s": 30.0}})
        run = Experiment.__new__(Experiment)
        run.config, run.console, run.folder = config, Console(file=io.StringIO()), SimpleNamespace(progress=Progress())
        run.check_load(prompts)
        notes = run.folder.progress.notes
        assert (notes and warned in notes[0]) if warned else not notes, notes
