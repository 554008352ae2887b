"""The plan (runner/plan.py): the points a config's sweep axes and drafts make, and the order a unit runs them in."""
from collections import Counter

import pytest

from runner.plan import Unit, order_of, points_of, williams_order
from utils.config import validate

VALID = {"target": {"model": "t"}, "draft": {"model": "d"}, "dataset": {"path": "x.jsonl", "preset": "gsm8k"}}


def test_sweep_axes_and_drafts():
    config = validate({**VALID, "draft": [{"model": "a/d1"}, {"model": "b/d2", "label": "small"}],
                       "methods": ["baseline", "speculative", "prompt_lookup"],
                       "generation": {"do_sample": True, "temperature": [0, 0.7]},
                       "speculative": {"gamma": [2, 4], "schedule": ["constant", "cost_model"]}})
    assert [d.name for d in config.draft] == ["d1", "small"]
    assert config.generation.temperatures() == [None, 0.7]
    points = points_of(config, 1, 0.7)
    # baseline 1 + speculative 2 drafts x 2 gammas x 2 schedules + prompt_lookup 2 gammas
    assert len(points) == 1 + 8 + 2
    assert {p.draft for p in points if p.method == "speculative"} == {"d1", "small"}
    assert all(p.draft is None and p.schedule is None for p in points if p.method == "prompt_lookup")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 12, 13])
def test_point_order_is_a_williams_design(n):
    # over a cycle (n units for even n, 2n for odd), every point runs in every position equally often, and every
    # ordered pair of points runs back to back equally often (a rotation by one always puts b right after a)
    cycle = n if n % 2 == 0 or n <= 2 else 2 * n
    rows = [williams_order(n, index) for index in range(cycle)]
    assert all(sorted(row) == list(range(n)) for row in rows)
    positions = Counter((position, point) for row in rows for position, point in enumerate(row))
    assert set(positions.values()) == {cycle // n} and len(positions) == n * n
    if n > 2:
        pairs = Counter((a, b) for row in rows for a, b in zip(row, row[1:]))
        assert len(pairs) == n * (n - 1) and len(set(pairs.values())) == 1
    assert williams_order(n, cycle + 3) == williams_order(n, 3)  # it cycles
    points = [f"p{i}" for i in range(n)]  # the unit's index is its batch index plus its repeat
    assert order_of(points, Unit(1, None, 1, 2)) == [points[i] for i in williams_order(n, 3)]
