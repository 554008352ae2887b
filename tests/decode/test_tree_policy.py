"""The cost model behind tree: auto (decode/tree_policy.py): acceptance by depth and rank from round records, a tree's
expected accepted length, the greedy optimal tree, and the best tree for a cost. Every figure is worked out by hand."""
import itertools
import random

import pytest

from decode.tree_policy import TreeStats, best_tree, expected_accepted, greedy_trees, tree_value

# depth 1: first child 0.6, second 0.2; depth 2 and deeper: 0.5, 0.1; later ranks 0
TABLE = {1: [0.6, 0.2], 2: [0.5, 0.1]}


def p_hand(depth, rank):
    row = TABLE[min(depth, 2)]
    return row[rank] if rank < len(row) else 0.0


def chain_round(drafted, accepted):
    return {"drafted": drafted, "accepted": accepted, "emitted": accepted + 1}


def test_acceptance_by_depth_and_rank():
    rounds = [
        {"drafted": 5, "accepted": 2, "emitted": 3, "ranks": [0, 1], "tried": [3, 2]},
        {"drafted": 5, "accepted": 1, "emitted": 2, "ranks": [1], "tried": [3, 2]},
        {"drafted": 5, "accepted": 0, "emitted": 1, "ranks": [], "tried": [3]},
        chain_round(3, 1),  # ranks [0], tried [1, 1]
    ]
    stats = TreeStats(rounds[:2])
    stats.update(rounds[2:])
    # depth 1: rank 0 hit in 2 of 4 rounds -> 2 / 5; rank 1 in 1 of 3 -> 1 / 4; rank 2 in 0 of 3 -> 0
    assert [stats(1, r) for r in range(4)] == [pytest.approx(0.4), pytest.approx(0.25), 0.0, 0.0]
    # depth 2: rank 0 in 0 of 3 (0 / 4) is below rank 1 in 1 of 2 (1 / 3): pooled, 1 hit in 5 -> 1 / 6 each
    assert [stats(2, r) for r in range(3)] == [pytest.approx(1 / 6), pytest.approx(1 / 6), 0.0]
    assert [stats(5, r) for r in range(3)] == [stats(2, r) for r in range(3)]  # deeper: the deepest seen


def test_a_depths_ranks_sum_to_at_most_one():
    # 9 one-child rounds accept their child, 3 two-child rounds accept the second: 9 / 13 then 3 / 4, pooled to
    # 12 / 16 = 0.75 each, and the second capped at 1 - 0.75
    rounds = [{"drafted": 1, "accepted": 1, "emitted": 2, "ranks": [0], "tried": [1]}] * 9
    rounds += [{"drafted": 2, "accepted": 1, "emitted": 2, "ranks": [1], "tried": [2]}] * 3
    stats = TreeStats(rounds)
    assert [stats(1, r) for r in range(3)] == [pytest.approx(0.75), pytest.approx(0.25), 0.0]


def test_no_rounds_no_speculation_and_a_prior():
    assert TreeStats()(1, 0) == 0.0
    assert best_tree(TreeStats(), [1, 4], lambda n, d: 1.0) == []
    flat = TreeStats(prior=(1, 1))  # Beta(1, 1): 1/2, then what is left of 1
    assert [flat(3, r) for r in range(3)] == [0.5, 0.5, 0.0]


def test_a_round_that_contradicts_itself_is_refused():
    with pytest.raises(ValueError, match="one rank per accepted node"):
        TreeStats([{"drafted": 4, "accepted": 1, "emitted": 2, "ranks": [2], "tried": [2]}])


def test_expected_accepted_of_a_small_tree():
    # a (rank 0) and b (rank 1) under the root, c, d under a, e under b:
    # 0.6 + 0.2 + 0.6 * 0.5 + 0.6 * 0.1 + 0.2 * 0.5 = 1.26
    assert expected_accepted([-1, -1, 0, 0, 1], p_hand) == pytest.approx(1.26)
    assert expected_accepted([], p_hand) == 0.0


def test_greedy_trees_by_hand():
    trees = greedy_trees(p_hand, 5)
    # 1: a (0.6); 2: a's child c (0.3); 3: b (0.2) beats c's child (0.15): a tree, 1.1, over the chain's 1.05;
    # 4: c's child f (0.15); 5: b's child e (0.1) over f's child (0.075) and a's second child (0.06)
    assert trees == [[], [-1], [-1, 0], [-1, -1, 0], [-1, -1, 0, 2], [-1, -1, 0, 1, 2]]
    assert [expected_accepted(t, p_hand) for t in trees] == pytest.approx([0, 0.6, 0.9, 1.1, 1.25, 1.35])
    assert expected_accepted([-1, 0, 1], p_hand) == pytest.approx(1.05)
    assert greedy_trees(p_hand, 4, max_depth=2)[4] == [-1, -1, 0, 1]  # e (0.1) instead of f
    assert greedy_trees(p_hand, 3, max_children=1)[3] == [-1, 0, 1]  # a chain


def test_greedy_is_optimal_against_every_small_tree():
    # every tree of n nodes, written breadth first, is a non-decreasing parent list with parent i < node i
    rng = random.Random(7)
    for _ in range(5):
        table = {d: sorted((rng.random() for _ in range(3)), reverse=True) for d in (1, 2, 3, 4, 5)}

        def p(depth, rank):
            return table[depth][rank] if rank < 3 else 0.0

        trees = greedy_trees(p, 5)
        for n in range(1, 6):
            every = [parents for rest in itertools.product(range(-1, n - 1), repeat=n - 1) for parents in [[-1, *rest]]
                     if parents == sorted(parents) and all(q < i for i, q in enumerate(parents))]
            assert len(every) == [1, 2, 5, 14, 42][n - 1]  # the Catalan numbers: every tree once
            assert expected_accepted(trees[n], p) == pytest.approx(max(expected_accepted(t, p) for t in every))


def test_chain_rounds_give_leviathans_chain():
    # drafting 2 a round: 2 rounds accept 0, 1 accepts 1, 2 accept 2. Depth 1: 3 hits in 5 -> 3 / 6; depth 2:
    # 2 hits in 3 -> 2 / 4; deeper: depth 2's. alpha = 0.5 everywhere, and no second child was ever tried.
    stats = TreeStats([chain_round(2, 0)] * 2 + [chain_round(2, 1)] + [chain_round(2, 2)] * 2)
    assert greedy_trees(stats, 4)[4] == [-1, 0, 1, 2]
    assert expected_accepted([-1, 0, 1, 2], stats) == pytest.approx(0.5 + 0.25 + 0.125 + 0.0625)

    def cost(n, depth):  # Leviathan's: a target forward of any width is 1, each draft token c = 0.1
        return 1 + 0.1 * depth

    # (1 - alpha^(gamma + 1)) / ((1 - alpha)(gamma c + 1)): gamma 1: 1.364, 2: 1.458, 3: 1.442, 4: 1.384
    assert tree_value([-1, 0], stats, cost) == pytest.approx(0.875 / (0.5 * 1.2))
    assert best_tree(stats, [1, 2, 3, 4], cost) == [-1, 0]


def test_best_tree_for_a_cost():
    def cost(n, depth):
        return 1 + 0.05 * n + 0.1 * depth

    # n = 1: 1.6 / 1.15 = 1.391; 2: 1.9 / 1.3 = 1.462; 3: 2.1 / 1.35 = 1.556; 4: 2.25 / 1.5 = 1.5;
    # 5: 2.35 / 1.55 = 1.516
    assert best_tree(p_hand, range(1, 6), cost) == [-1, -1, 0]
    assert best_tree(p_hand, [1, 2, 4, 5], cost) == [-1, -1, 0, 1, 2]
    assert best_tree(p_hand, [5], cost, max_depth=1) == [-1, -1, -1, -1, -1]  # 1.8 / 1.35 = 1.333 > 1


def test_speculation_that_costs_too_much_is_not_done():
    # a draft token costs 2 target forwards: the best one-node tree gives 1.6 tokens for 3, under a plain step's 1
    assert best_tree(p_hand, [1, 2, 3], lambda n, depth: 1 + 2 * depth) == []


def test_auto_probes_width_after_chains_pushed_the_exploration_out():
    """tree: auto's evidence (the last 8 rounds its point's earlier batches left; this batch has none yet) is all
    one-node chains, right half the time at depth 1 and never at depth 2: a second child at depth 1 was never tried, so
    it estimates 0 and the best tree is the chain [-1] (p(1, 0) = 4 / 9: value 1.44 / (0.05 + v(1) 1.02) = 1.35 > 1).
    Every 8th round a Beta(1, 1) prior prices the untried rank at 1/2 (within 1 - p(1, 0) = 1/2; p(1, 0) = 5 / 10,
    p(2, 0) = 1 / 6): two children at the root, 2 / (0.05 + v(2) 1.04) = 1.83, beat the chain's 1.5 / 1.07 = 1.40 (a
    depth-2 node under each, (2 + 2 * 0.5 / 6) / (0.1 + v(4) 1.08) = 1.84, about ties with them)."""
    from decode.drafters.draft_tree import AutoMemory, AutoTree
    from decode.settings import Sampling

    memory = AutoMemory(AutoTree.RECENT)
    for i in range(AutoTree.RECENT):
        memory.rounds.append({"accepted": 1, "ranks": [0], "tried": [1, 1]} if i % 2 else
                             {"accepted": 0, "ranks": [], "tried": [1]})
    auto = AutoTree(memory, 0.05, {n: 1 + 0.02 * n for n in (1, 2, 4)}, Sampling(False))
    shapes = [auto.shape_for_round(4) for _ in range(2 * AutoTree.PROBE_EVERY)]
    probes = [AutoTree.PROBE_EVERY - 1, 2 * AutoTree.PROBE_EVERY - 1]
    assert all(shape == [-1] for i, shape in enumerate(shapes) if i not in probes)
    assert all(shapes[i][:2] == [-1, -1] for i in probes)  # the probe widens the root


def test_auto_follows_this_batchs_acceptance_not_the_points_history():
    """The point's earlier batches accepted every draft (48 rounds: the history says draft deep); this batch's first
    rounds reject the draft at depth 1 every time. After 6 such rounds the evidence is 8 full accepts of the last
    prior rounds and 6 rejections: p(1, 0) = 8 / 15, and with c = 0.4 and v(1) = 1.2 one node is worth
    (1 + 8/15) / 1.6 = 0.96 < 1: auto stops drafting (a plain target step), where the history alone (48 / 49) would
    have kept drafting."""
    import numpy as np

    from decode.drafters.draft_tree import AutoMemory, AutoTree
    from decode.settings import Sampling
    from decode.tree_layout import TreeLayout

    memory = AutoMemory(AutoTree.RECENT)
    for _ in range(AutoTree.RECENT):
        memory.rounds.append({"accepted": 1, "ranks": [0], "tried": [1]})
    auto = AutoTree(memory, 0.4, {1: 1.2, 2: 1.4, 4: 1.8}, Sampling(False))
    assert auto.shape_for_round(4) is not None  # 8/9 at depth 1: one node gives (1 + 8/9) / 1.6 = 1.18
    layout = TreeLayout(np.array([[-1]]), np.ones((1, 1), dtype=bool))
    for _ in range(6):
        auto.observe([[]], layout)  # the root's one child rejected
    assert auto.shape_for_round(4) is None
