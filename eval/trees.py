"""Token trees' figures from their rounds (docs/metrics.md): acceptance by depth and sibling rank, and Sequoia's
expected accepted length and predicted speedup of a tree with the point's own measured acceptance (Chen et al. 2024,
"Sequoia"; chains keep Leviathan's model, eval/leviathan.py).

A tree round records (decode/tree_layout.py): drafted n (nodes verified besides the root), accepted a (the accepted path's
length), emitted e, ranks (each accepted node's sibling rank, a ints, 0 = its parent's first child), tried (per depth
the verification reached, the children it had there: a + 1 entries, or a when the path ended at a leaf) and parents
(each node's parent, -1 = the root). A chain round is the tree whose parents are i - 1: ranks all 0, one child tried
per depth reached.
"""
from __future__ import annotations

from decode.tree_layout import depths_and_ranks
from eval.stats import ratio


def tree_of(point) -> str | None:
    """The point's tree label (decode/tree_layout.py), None for a chain."""
    return getattr(point, "tree", None)


def round_parents(r: dict) -> list[int]:
    return r["parents"] if "parents" in r else list(range(-1, r["drafted"] - 1))


def round_ranks(r: dict) -> list[int]:
    return r["ranks"] if "ranks" in r else [0] * r["accepted"]


def round_tried(r: dict) -> list[int]:
    return r["tried"] if "tried" in r else [1] * min(r["accepted"] + 1, r["drafted"])


def round_depth(r: dict) -> int:
    """The deepest node of the round's tree (a chain: its drafted tokens)."""
    if "parents" not in r:
        return r["drafted"]
    depths, _ = depths_and_ranks(r["parents"])
    return max(depths, default=0)


def verified_nodes(r: dict) -> int:
    """Nodes the round's target forward verified besides the root: the batch's widest tree as recorded (a row's own
    tree may be smaller, or empty), else the row's own."""
    return r["batch_nodes"] if "batch_nodes" in r else r["drafted"]


def draft_forwards(r: dict) -> int:
    """Draft forwards the round ran: as recorded, else its tree's depth (one forward per level)."""
    return r["draft_forwards"] if "draft_forwards" in r else round_depth(r)


def acceptance_by_depth_rank(rounds: list[dict]) -> list[dict]:
    """p(d, r) = hits / trials: hits = rounds whose accepted node at depth d has sibling rank r; trials = rounds that
    reached depth d with more than r children there. Unconditional on the siblings before r (Sequoia's positional
    acceptance): the chance that the rank-r child is the one accepted once its parent is. One entry per depth
    reached: {"depth", "p", "hits", "trials"}, the lists indexed by rank."""
    hits: dict[tuple[int, int], int] = {}
    trials: dict[tuple[int, int], int] = {}
    for r in rounds:
        for depth, children in enumerate(round_tried(r), start=1):
            for rank in range(children):
                trials[depth, rank] = trials.get((depth, rank), 0) + 1
        for depth, rank in enumerate(round_ranks(r), start=1):
            hits[depth, rank] = hits.get((depth, rank), 0) + 1
    table = []
    for depth in sorted({d for d, _ in trials}):
        ranks = range(max(rank for d, rank in trials if d == depth) + 1)
        row_hits = [hits.get((depth, rank), 0) for rank in ranks]
        row_trials = [trials.get((depth, rank), 0) for rank in ranks]
        table.append({"depth": depth, "p": [ratio(h, t) for h, t in zip(row_hits, row_trials)], "hits": row_hits,
                      "trials": row_trials})
    return table


def expected_emitted(parents: list[int], acceptance: dict[tuple[int, int], float]) -> float:
    """E[e] of one tree = 1 + sum over its nodes of P(node on the accepted path), the product of p(depth, rank) along
    the node's path from the root (Sequoia's expected accepted length, the bonus or correction token included). A
    (depth, rank) never tried in the rounds has no evidence of acceptance: 0."""
    depths, ranks = depths_and_ranks(parents)
    reach: list[float] = []
    for node, parent in enumerate(parents):
        p = acceptance.get((depths[node], ranks[node]), 0.0)
        reach.append(p * (1.0 if parent < 0 else reach[parent]))
    return 1.0 + sum(reach)


def tree_prediction(rounds: list[dict], c: float, v_of) -> tuple[float | None, float | None]:
    """Predicted speedup over the point's own rounds: sum_r E[e_r] / sum_r (D_r c + v(n_r)), D_r the round's draft
    forwards, n_r the nodes its target forward verified (the batch's widest tree: a row with a smaller tree, or none,
    waits for that forward all the same), v_of(n) the verification cost ratio at n nodes; and the same with v = 1.
    (None, None) where a round's v is not known."""
    table = acceptance_by_depth_rank(rounds)
    acceptance = {(row["depth"], rank): p for row in table for rank, p in enumerate(row["p"]) if p is not None}
    tokens = cost = cost_v1 = 0.0
    for r in rounds:
        v = v_of(verified_nodes(r))
        if v is None:
            return None, None
        tokens += expected_emitted(round_parents(r), acceptance)
        cost += draft_forwards(r) * c + v
        cost_v1 += draft_forwards(r) * c + 1.0
    return ratio(tokens, cost), ratio(tokens, cost_v1)
