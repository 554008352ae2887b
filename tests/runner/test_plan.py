"""The plan (runner/plan.py): the points a config's sweep axes and drafts make, and the order a unit runs them in."""
from collections import Counter

import pytest

from eval.records import Comparison
from runner.plan import Unit, order_of, points_of, williams_order
from utils.config import ConfigError, validate

VALID = {"target": {"model": "t"}, "draft": {"model": "d"}, "dataset": {"path": "x.jsonl", "preset": "gsm8k"}}


def test_sweep_axes_and_drafts():
    config = validate({**VALID, "draft": [{"model": "a/d1"}, {"model": "b/d2", "label": "small"}],
                       "methods": ["baseline", "speculative", "prompt_lookup"],
                       "generation": {"do_sample": True, "temperature": [0, 0.7]},
                       "speculative": {"gamma": [2, 4], "schedule": ["constant", "cost_model"]}})
    assert [d.name for d in config.draft] == ["d1", "small"]
    assert config.generation.temperatures() == [None, 0.7]
    points = points_of(config, Comparison(batch_size=1, temperature=0.7))
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
    assert order_of(points, Unit(Comparison(batch_size=1), 1, 2)) == [points[i] for i in williams_order(n, 3)]


CHAIN_SWEEP = {**VALID, "methods": ["baseline", "speculative", "prompt_lookup"],
               "speculative": {"gamma": [2, 4], "schedule": ["constant", "heuristic"]}}
CHAIN_LABELS = ["baseline batch=1 greedy",
                "speculative draft=d gamma=2 constant batch=1 greedy",
                "speculative draft=d gamma=2 heuristic batch=1 greedy",
                "speculative draft=d gamma=4 constant batch=1 greedy",
                "speculative draft=d gamma=4 heuristic batch=1 greedy",
                "prompt_lookup gamma=2 batch=1 greedy",
                "prompt_lookup gamma=4 batch=1 greedy"]


def test_chain_points_are_those_of_before_the_tree_axis():
    for speculative in ({}, {"tree": None}, {"tree": [None]}):
        config = validate({**CHAIN_SWEEP, "speculative": {**CHAIN_SWEEP["speculative"], **speculative}})
        points = points_of(config, Comparison(batch_size=1))
        assert [p.label for p in points] == CHAIN_LABELS
        assert all(p.tree is None for p in points)


def test_tree_points_follow_the_chains():
    # a static tree's gamma is its depth (one point whatever the gammas and schedules), a dynamic tree and auto
    # take each gamma as their depth cap; no tree point has a schedule
    config = validate({**CHAIN_SWEEP, "speculative": {**CHAIN_SWEEP["speculative"],
                                                      "tree": [[3, 2, 1], None, {"dynamic": 24}, "auto", [2, 2]]}})
    labels = [p.label for p in points_of(config, Comparison(batch_size=1))]
    assert labels == CHAIN_LABELS[:5] + [
        "speculative draft=d gamma=3 tree=3-2-1 batch=1 greedy",
        "speculative draft=d gamma=2 tree=dynamic-24 batch=1 greedy",
        "speculative draft=d gamma=4 tree=dynamic-24 batch=1 greedy",
        "speculative draft=d gamma=2 tree=auto batch=1 greedy",
        "speculative draft=d gamma=4 tree=auto batch=1 greedy",
        "speculative draft=d gamma=2 tree=2-2 batch=1 greedy",
    ] + CHAIN_LABELS[5:] + [
        "prompt_lookup gamma=3 tree=3-2-1 batch=1 greedy",
        "prompt_lookup gamma=2 tree=dynamic-24 batch=1 greedy",
        "prompt_lookup gamma=4 tree=dynamic-24 batch=1 greedy",
        "prompt_lookup gamma=2 tree=2-2 batch=1 greedy",  # no auto: it prices a drafter's forward
    ]
    points = points_of(config, Comparison(batch_size=1))
    assert all(p.schedule is None for p in points if p.tree is not None)
    assert len({p.key for p in points}) == len(points)
    # the static tree of depth 2 and the chain of gamma 2 are two points
    gamma_2 = {p.tree for p in points if p.method == "prompt_lookup" and p.gamma == 2}
    assert gamma_2 == {None, "dynamic-24", "2-2"}


def test_records_of_before_the_tree_axis_are_chain_points(tmp_path):
    # samples.jsonl lines written before the axis have no "tree": they read as chains, their batches count as done
    # for the same plan, and the folder's config.yaml (no tree keys) is this config on --resume
    from eval.records import Point, SampleRecord, batch_key
    SERVING_FIELDS = ("concurrency", "request_rate", "request", "arrival_s", "admitted_s", "first_token_s", "finish_s", "emits")
    from runner.storage import ReportFolder
    from sample_records import record

    old = record("speculative", sample_id=0, batch_index=3, repeat=1, gamma=4)
    assert "tree" not in old and SampleRecord.from_json(old).tree is None
    config = validate(VALID)
    point, = [p for p in points_of(config, Comparison(batch_size=1)) if p.method == "speculative"]
    assert Point.of(old) == point and batch_key(old) == point.key + (1, 3)
    assert SampleRecord.from_json(old).to_json() == {**old, "tree": None, "draft_context": None,
                                                   "synthetic_acceptance": None, "top2_gaps": None,
                                                   "extra": {}, "conversation": None, "turn": None, "follows": None,
                                                   "think_s": None, "energy_j": None,
                                                   **dict.fromkeys(SERVING_FIELDS)}

    raw = config.model_dump(mode="json")
    older = {**raw, "speculative": {k: v for k, v in raw["speculative"].items() if not k.startswith("tree")}}
    ReportFolder(tmp_path, older, "t", None, False).create()
    folder = ReportFolder(tmp_path, raw, "t", None, False)
    folder.reopen()  # does not refuse
    with pytest.raises(Exception, match="the config differs"):
        ReportFolder(tmp_path, {**raw, "speculative": {**raw["speculative"], "tree": ["auto"]}}, "t", None,
                     False).reopen()


def test_the_drafts_window_sweeps_the_draft_models_points_only():
    config = validate({**VALID, "methods": ["baseline", "speculative", "prompt_lookup", "hybrid"],
                       "speculative": {"draft_context": [None, 32]}})
    labels = [p.label for p in points_of(config, Comparison(batch_size=1))]
    assert labels == ["baseline batch=1 greedy", "speculative draft=d gamma=4 constant batch=1 greedy",
                      "speculative draft=d gamma=4 constant ctx=32 batch=1 greedy", "prompt_lookup gamma=4 batch=1 greedy",
                      "hybrid draft=d gamma=4 batch=1 greedy", "hybrid draft=d gamma=4 ctx=32 batch=1 greedy"]
    assert validate({**VALID, "speculative": {"draft_context": 64}}).speculative.draft_context == [64]
    with pytest.raises(ConfigError, match="draft_context applies to speculative or hybrid only"):
        validate({**VALID, "methods": ["baseline", "prompt_lookup"], "speculative": {"draft_context": 64}})
    for bad in (0, -3, 2.5, True, [32, 32], [], "long"):
        with pytest.raises(ConfigError, match="draft_context"):
            validate({**VALID, "speculative": {"draft_context": bad}})
