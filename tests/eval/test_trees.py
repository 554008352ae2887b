"""Token trees' figures (eval/trees.py, eval/figures.py) against values worked out by hand from hand-made rounds:
acceptance by depth and rank, Sequoia's expected accepted length, the tree prediction and its gaps, v(n), strict JSON
and the report's tree table, depth/rank block and v(n) line."""
import json

import pytest

from eval.figures import prediction_gap
from eval.figure_table import legend, run_metrics
from eval.records import CostProbe, Point
from eval.report import markdown
from eval.trees import acceptance_by_depth_rank, expected_emitted
from sample_records import costs, record

# Three rounds of the static tree [2, 1] (decode/tree_layout.py static_parents: parents [-1, -1, 0, 1]; nodes 0 and 1 are the
# root's children, ranks 0 and 1; node 2 is node 0's child, node 3 node 1's, both rank 0 at depth 2; n = 4 nodes):
# A: accepts node 0 then node 2, a leaf: a 2, ranks [0, 0], tried [2, 1] (the root's 2 children, node 0's 1), e 3
# B: accepts node 1 (rank 1), rejects node 3: a 1, ranks [1], tried [2, 1], e 2
# C: rejects both children of the root: a 0, ranks [], tried [2], e 1
TREE = [-1, -1, 0, 1]
ROUNDS = [{"drafted": 4, "accepted": 2, "emitted": 3, "ranks": [0, 0], "tried": [2, 1], "parents": TREE},
          {"drafted": 4, "accepted": 1, "emitted": 2, "ranks": [1], "tried": [2, 1], "parents": TREE},
          {"drafted": 4, "accepted": 0, "emitted": 1, "ranks": [], "tried": [2], "parents": TREE}]
# p(1, 0) = 1 hit (A) / 3 trials (every round tried 2 children at depth 1) = 1/3; p(1, 1) = 1 (B) / 3 = 1/3;
# p(2, 0) = 1 (A) / 2 (A and B reached depth 2, with 1 child each) = 1/2.
# E[e] of the tree = 1 + p(1,0) + p(1,1) + p(1,0) p(2,0) + p(1,1) p(2,0) = 1 + 1/3 + 1/3 + 1/6 + 1/6 = 2
# v measured at n = 2 (1.2) and 6 (2.0): v(4) = 1.2 + (4 - 2) / (6 - 2) (2.0 - 1.2) = 1.6
# c = 0.25, D = 2 draft forwards (the tree's depth): a round costs 2 * 0.25 + 1.6 = 2.1; predicted = 3 * 2 / (3 * 2.1)
# = 0.952; with v = 1: 6 / (3 * 1.5) = 1.333; without a draft model (c = 0): 6 / (3 * 1.6) = 1.25
V = {"2": 1.2, "6": 2.0}


def tree_point(**axes):
    return Point(**axes)


def tree_samples(method="speculative", draft="d"):
    """8 prompts at batch size 1: the baseline 7 tokens in 2 s, the tree point 7 (the prefill's + 3 + 2 + 1) in 1 s."""
    baseline = [record("baseline", i, i, tokens=7, latency=2.0) for i in range(8)]
    spec = [record(method, i, i, tokens=7, latency=1.0, rounds=ROUNDS, draft=draft, tree="2-1") for i in range(8)]
    return spec, baseline


def test_acceptance_by_depth_and_rank_by_hand():
    assert acceptance_by_depth_rank(ROUNDS) == [
        {"depth": 1, "p": [pytest.approx(1 / 3), pytest.approx(1 / 3)], "hits": [1, 1], "trials": [3, 3]},
        {"depth": 2, "p": [0.5], "hits": [1], "trials": [2]}]
    # chain rounds (no ranks or tried recorded): rank 0 only, one child tried per depth reached, min(a + 1, drafted)
    # depth 1 tried by all 3 rounds, accepted by 2; depth 2 tried by the first two, accepted by the second; depth 3
    # tried and accepted by the second only (the first stopped at depth 2, the third at depth 1)
    chain = [{"drafted": 3, "accepted": 1, "emitted": 2}, {"drafted": 3, "accepted": 3, "emitted": 4},
             {"drafted": 2, "accepted": 0, "emitted": 1}]
    assert [(row["depth"], row["hits"], row["trials"]) for row in acceptance_by_depth_rank(chain)] == [
        (1, [2], [3]), (2, [1], [2]), (3, [1], [1])]


def test_expected_emitted_is_sequoias_sum_over_paths():
    p = {(1, 0): 1 / 3, (1, 1): 1 / 3, (2, 0): 0.5}
    assert expected_emitted(TREE, p) == pytest.approx(2.0)  # worked out above
    assert expected_emitted([], p) == 1.0  # nothing drafted: the target's own token
    # a chain of 3 with p 0.5 at every depth: 1 + .5 + .25 + .125; a rank never tried counts 0
    assert expected_emitted([-1, 0, 1], {(1, 0): .5, (2, 0): .5, (3, 0): .5}) == pytest.approx(1.875)
    assert expected_emitted([-1, -1], {(1, 0): .5}) == pytest.approx(1.5)


def test_v_at_nodes_interpolates_between_measured_node_counts():
    probe = CostProbe(v={2: 1.2, 6: 2.0})
    assert probe.v_at_nodes(4) == pytest.approx(1.6) and probe.v_at_nodes(6) == 2.0
    assert probe.v_at_nodes(1) == pytest.approx(1.1)  # between v(0) = 1 (the 1-token forward itself) and v(2)
    assert probe.v_at_nodes(0) == 1.0 and probe.v_at_nodes(7) is None  # above the largest measured: no v


def test_tree_point_figures_and_prediction_by_hand():
    spec, baseline = tree_samples()
    point = tree_point(method="speculative", batch_size=1, draft="d", gamma=2, schedule="constant", tree="2-1")
    m = run_metrics(point, spec, baseline, CostProbe.from_json(costs(0.25, V)["1"]["p1"]))
    assert m["drafted_per_round"] == 4.0 and m["mean_accepted_tokens"] == 2.0  # (3 + 2 + 1) / 3
    assert m["acceptance_rate"] == pytest.approx(0.25)  # accepted path 3 of 12 nodes verified
    assert m["per_position_acceptance"] == [pytest.approx(2 / 3), pytest.approx(1 / 3)]  # by depth, of 3 rounds
    assert m["accepted_histogram"] == [8, 8, 8]  # a = 0, 1, 2 once in each of 8 samples
    assert m["alpha"] is None and m["constant_draft_length"] is None  # a chain's figures
    assert m["acceptance_by_depth_rank"][1] == {"depth": 2, "p": [0.5], "hits": [8], "trials": [16]}
    assert m["draft_cost_ratio_c"] == 0.25 and m["verify_cost_ratio_v"] is None  # no v measured at 4 itself
    assert m["verify_cost_by_nodes"] == {"2": 1.2, "6": 2.0}
    assert m["predicted_speedup"] == pytest.approx(2 / 2.1) and m["predicted_speedup_v1"] == pytest.approx(2 / 1.5)
    assert m["speedup"] == pytest.approx(2.0) and m["efficiency"] == pytest.approx(2.0 * 2.1 / 2)
    json.dumps(m, allow_nan=False)  # strict JSON


def test_a_tree_without_a_draft_model_costs_only_its_verification():
    spec, baseline = tree_samples("prompt_lookup", draft=None)
    point = tree_point(method="prompt_lookup", batch_size=1, gamma=2, tree="2-1")
    m = run_metrics(point, spec, baseline, CostProbe(v={2: 1.2, 6: 2.0}))
    assert m["predicted_speedup"] == pytest.approx(2 / 1.6)  # c = 0: E[e] 2 over v(4) 1.6 a round


def test_a_tree_prediction_gap_says_why():
    spec, baseline = tree_samples()
    point = tree_point(method="speculative", batch_size=1, draft="d", gamma=2, schedule="constant", tree="2-1")
    short = CostProbe.from_json(costs(0.25, {"2": 1.2})["1"]["p1"])  # v up to 2 nodes, the tree has 4
    m = run_metrics(point, spec, baseline, short)
    assert m["predicted_speedup"] is None and m["efficiency"] is None
    assert prediction_gap(point, m, short) == ("no v was measured at 4 tree nodes (a 5-token target forward; measured "
                                               "up to 2 nodes), and the tree prediction prices every round")
    no_c = CostProbe(v={6: 2.0})
    assert prediction_gap(point, run_metrics(point, spec, baseline, no_c), no_c) == "no c was measured for this draft"
    assert prediction_gap(point, run_metrics(point, spec, baseline, None), None).startswith("no cost probe ran")
    exit_point = tree_point(method="early_exit", batch_size=1, gamma=2, exit_layer=1, tree="2-1")
    assert "early-exit" in prediction_gap(exit_point, run_metrics(exit_point, spec, baseline, no_c), no_c)


def test_the_report_shows_a_tree_point():
    spec, baseline = tree_samples()
    point = tree_point(method="speculative", batch_size=1, draft="d", gamma=2, schedule="constant", tree="2-1")
    m = run_metrics(point, spec, baseline, CostProbe.from_json(costs(0.25, V)["1"]["p1"]))
    tree_run = {**point.values(), "tree": "2-1", "group": None,
                "label": point.label, "status": "ok", "flags": [], "metrics": m,
                "batches": {"done": 8, "paired": 8, "planned": 8, "prompts": 8, "cross_process": 0}}
    chain_run = {**tree_run, "tree": None, "label": "chain", "metrics": {"drafted_per_round": 2.0}}
    summary = {"runs": [tree_run, chain_run], "legend": legend(), "notes": []}
    text = markdown(json.loads(json.dumps(summary, allow_nan=False)))
    header = next(line for line in text.splitlines() if line.startswith("| point"))
    assert header.startswith("| point | status | tree | tok/s |") and "| nodes/rd | accept |" in header
    row = next(line for line in text.splitlines() if line.startswith(f"| {point.label}"))
    assert "| ok | 2-1 |" in row and "| 4.00 | 0.250 |" in row  # nodes per round, acceptance rate
    assert "| pred |" in header and "| 0.952 | 2.100 |" in row  # predicted, efficiency
    chain_row = next(line for line in text.splitlines() if line.startswith("| chain"))
    assert "| ok | - |" in chain_row
    assert f"- {point.label}: d1: r0 0.333 (24), r1 0.333 (24); d2: r0 0.500 (16)" in text
    assert "- v(n) at batch=1: n=2 1.200, n=6 2.000" in text
    chains_only = markdown({"runs": [chain_run], "legend": {}, "notes": []})  # the tree columns only with a tree
    assert chains_only.splitlines()[1].startswith("| point | status | tok/s |") and "nodes/rd" not in chains_only
    assert "v(n)" not in chains_only and "Trees" not in chains_only


def test_summary_of_a_tree_point_is_strict_and_notes_a_missing_v():
    from eval.summary import summarize
    from sample_records import run

    spec, baseline = tree_samples()
    summary = summarize(spec + baseline, {"costs": costs(0.25, {"2": 1.2})})
    tree_run = run(summary, "speculative")
    assert tree_run["tree"] == "2-1" and tree_run["metrics"]["predicted_speedup"] is None
    assert any("predicted speedup and efficiency are null" in n and "no v was measured at 4 tree nodes" in n
               for n in summary["notes"])
    json.dumps(summary, allow_nan=False)
    assert "d1: r0 0.333 (24)" in markdown(summary)


def test_the_tree_prediction_prices_each_round_at_the_batchs_widest_tree():
    """One batch round of 2 rows: row A verifies the [2, 1] tree (4 nodes), row B had no budget or no match (0 nodes)
    but waits for the same 5-token target forward. Neither accepts: p(1, 0) = p(1, 1) = 0 / 1, E[e] = 1 per row.
    c = 0.25, 2 draft forwards, v(4) = 2.0: each row's round costs 2 * 0.25 + 2.0 = 2.5, predicted 2 / 5 = 0.4 (pricing
    B at v(0) = 1 would claim 2 / 4 = 0.5)."""
    from eval.trees import tree_prediction

    a = {"drafted": 4, "accepted": 0, "emitted": 1, "ranks": [], "tried": [2], "parents": TREE, "draft_forwards": 2,
         "batch_nodes": 4}
    b = {"drafted": 0, "accepted": 0, "emitted": 1, "ranks": [], "tried": [], "parents": [], "draft_forwards": 2,
         "batch_nodes": 4}
    v = CostProbe(v={4: 2.0})
    assert tree_prediction([a, b], 0.25, v.v_at_nodes) == (pytest.approx(0.4), pytest.approx(2 / 3))
    older = [{k: x for k, x in r.items() if k != "batch_nodes"} for r in (a, b)]  # records before batch_nodes
    assert tree_prediction(older, 0.25, v.v_at_nodes)[0] == pytest.approx(0.5)


def test_the_replay_prices_a_padded_tree_at_what_a_round_of_it_alone_verifies():
    """A dynamic tree of budget 4 whose sampling filter allowed 2 candidates verifies 4 nodes (padded): its round is
    5 tokens wide, not 3; a row of a tree verified as its valid nodes (no `verified`) is priced by them."""
    from eval.replay import round_shape

    padded = {"drafted": 2, "accepted": 0, "emitted": 1, "parents": [-1, -1], "batch_nodes": 4, "verified": 4,
              "draft_forwards": 1}
    own = {k: x for k, x in padded.items() if k != "verified"}
    assert round_shape([padded]) == (5, 1) and round_shape([own]) == (3, 1)
    assert round_shape([own, {**own, "parents": [-1], "verified": 3}]) == (4, 1)
