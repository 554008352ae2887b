"""The cost model behind `speculative.tree: auto`: which tree shape gives the most tokens per unit of cost.

Sequoia's idea (Chen et al. 2024, "Sequoia: Scalable, Robust, and Hardware-aware Speculative Decoding", section 3.1):
under the positional acceptance assumption a node is accepted, given its parent was, with a probability p(depth,
rank) that depends only on its depth and its rank among its siblings (0: the parent's first child, the one the
verification tries first). A node is on the accepted path when every node from the root down to it is, so a tree's
expected accepted length is the sum over its nodes of the product of p along the path (`expected_accepted`); a round
emits that plus one token (the target's own at the end of the path). Dividing by the round's cost, in units of one
1-token target forward, gives tokens per target-forward time, which `best_tree` maximises over the candidate sizes.
Here p also depends on the depth (a drafter is surer near the root), which Sequoia does not model.

Pure Python: no torch. `TreeStats` estimates p from the round records the engine writes.
"""
from __future__ import annotations

import heapq
from typing import Callable, Iterable

from decode.tree_layout import depths_and_ranks

Acceptance = Callable[[int, int], float]  # (depth >= 1, rank >= 0) -> probability the node is accepted given its parent


class TreeStats:
    """Acceptance by depth and sibling rank, from round records.

    A tree round is {"drafted", "accepted": a, "emitted", "ranks": [the sibling rank of each accepted node, a of
    them], "tried": [the children the verification had at each depth it reached]} (decode/tree_layout.py
    TreeLayout.round_facts). A chain round has no "ranks" / "tried": its a accepted nodes are first children, and it
    reached depth a + 1 with one child unless all `drafted` were accepted: ranks [0] * a, tried [1] * min(a + 1,
    drafted).

    Per depth d and rank r: hits = rounds whose accepted node at depth d has rank r; trials = rounds that reached
    depth d with more than r children. p(d, r) = (hits + a) / (trials + a + b), the posterior mean under a Beta(a, b)
    prior; the default a = 0, b = 1 is conservative: a rank never tried counts 0, and one seen in a round or two
    counts less than its raw share (1 hit in 1 trial: 1/2), so `auto` does not bet on what it has barely seen.
    Then, per depth:
    - non-increasing in r (pool adjacent violators, on the pooled counts): under the positional assumption a later
      sibling is no likelier than an earlier one, and a rank that beat an earlier one by chance in few rounds is
      pooled with it, not credited above it;
    - the probabilities of a depth's ranks sum to at most 1 (each is capped at 1 minus the earlier ones): at most one
      child of a node is accepted; data where the rounds with more children differ from those with fewer could
      say otherwise.
    Depths beyond the deepest reached take the deepest reached depth's values. With no rounds p(d, 0) = a / (a + b)
    (0 by default: `best_tree` then speculates nothing; seed the stats with rounds of a fixed shape first).
    """

    def __init__(self, rounds: Iterable[dict] = (), prior: tuple[float, float] = (0.0, 1.0)):
        if prior[0] < 0 or prior[1] <= 0:
            raise ValueError(f"prior {prior}: a Beta(a, b) prior needs a >= 0 and b > 0")
        self.prior = prior
        self.hits: list[list[int]] = []  # [depth - 1][rank]
        self.trials: list[list[int]] = []  # [depth - 1][rank]
        self._table: list[list[float]] | None = None
        self.update(rounds)

    def update(self, rounds: Iterable[dict]) -> None:
        for record in rounds:
            ranks, tried = round_ranks_and_tried(record)
            for depth, children in enumerate(tried):
                _add(self.trials, depth, range(children))
            for depth, rank in enumerate(ranks):
                _add(self.hits, depth, [rank])
        self._table = None

    def __call__(self, depth: int, rank: int) -> float:
        """p(depth, rank): the probability that the node of that rank is accepted, given its parent was."""
        if depth < 1 or rank < 0:
            raise ValueError(f"depth {depth}, rank {rank}: depths start at 1, ranks at 0")
        if self._table is None:
            self._table = [self._pooled(d) for d in range(max(1, len(self.trials)))]
        row = self._table[min(depth, len(self._table)) - 1]
        while len(row) <= rank:  # a rank beyond those tried: the last pooled estimate, within what is left of 1
            row.append(min(row[-1], max(0.0, 1.0 - sum(row))))
        return row[rank]

    def _pooled(self, index: int) -> list[float]:
        """One depth's p for each rank with trials and one more; later ranks are added on demand."""
        trials = self.trials[index] if index < len(self.trials) else []
        hits = self.hits[index] if index < len(self.hits) else []
        counts = [(hits[r] if r < len(hits) else 0, trials[r]) for r in range(len(trials))] + [(0, 0)]
        blocks: list[tuple[int, int, int]] = []  # (hits, trials, ranks): pool adjacent violators
        for h, t in counts:
            blocks.append((h, t, 1))
            while len(blocks) > 1 and _estimate(blocks[-2], *self.prior) < _estimate(blocks[-1], *self.prior):
                last, before = blocks.pop(), blocks.pop()
                blocks.append((before[0] + last[0], before[1] + last[1], before[2] + last[2]))
        row: list[float] = []
        for block in blocks:
            for _ in range(block[2]):
                row.append(min(_estimate(block, *self.prior), max(0.0, 1.0 - sum(row))))
        return row


def _estimate(block: tuple, a: float, b: float) -> float:
    return (block[0] + a) / (block[1] + a + b)


def _add(table: list[list[int]], depth: int, ranks) -> None:
    while len(table) <= depth:
        table.append([])
    row = table[depth]
    for rank in ranks:
        while len(row) <= rank:
            row.append(0)
        row[rank] += 1


def round_ranks_and_tried(record: dict) -> tuple[list[int], list[int]]:
    """A round record's accepted ranks and children tried per depth (a chain round's from drafted and accepted)."""
    accepted = int(record["accepted"])
    if "ranks" not in record and "tried" not in record:
        return [0] * accepted, [1] * min(accepted + 1, int(record["drafted"]))
    ranks, tried = list(record["ranks"]), list(record["tried"])
    if len(ranks) != accepted or len(ranks) > len(tried) or any(r >= k for r, k in zip(ranks, tried)):
        raise ValueError(f"round {record}: expected one rank per accepted node, each below the children tried at "
                         "its depth")
    return ranks, tried


def expected_accepted(parents: list[int], p: Acceptance) -> float:
    """Sequoia's expected accepted length of a tree: the sum over its nodes of the product of p(depth, rank) along
    the path from the root's child down to the node (the probability that the node is on the accepted path)."""
    depths, ranks = depths_and_ranks(parents)
    reach: list[float] = []
    for node, parent in enumerate(parents):
        reach.append((1.0 if parent < 0 else reach[parent]) * p(depths[node], ranks[node]))
    return sum(reach)


def greedy_trees(p: Acceptance, nodes: int, max_depth: int | None = None,
                 max_children: int | None = None) -> list[list[int]]:
    """The trees of 0, 1, .., `nodes` nodes maximising `expected_accepted`, each as parents in breadth-first order.

    Greedy: start from the root alone and add, one at a time, the node not yet in the tree whose path product is the
    largest among those that can be added (the root's next child, or a node's first or next child), down to at most
    max_depth and with at most max_children children per node.

    Why this is optimal when every p <= 1 and p(d, r) is non-increasing in r (TreeStats guarantees both): call u
    "before" v when u is an ancestor of v or an elder sibling of one of v's ancestors-or-self. A set of nodes is a
    tree exactly when it holds, with each node, every node before it (its parent and its elder siblings). A node's
    path product is at most that of any node before it: going to a child multiplies by p <= 1, and going from an
    elder sibling to a younger one swaps a factor for one no larger. So the n nodes with the largest path products
    (ties broken towards the nodes before) form a tree, and since expected_accepted is the sum of the path products,
    no n-node tree has more. The greedy picks exactly those n: any node not yet picked has a node before it on the
    frontier, whose product is at least its own. Caps on depth and children keep the allowed nodes closed under
    "before", so the argument holds within them. The optimal trees are nested: tree n + 1 adds one node to tree n.
    """
    if max_depth is not None and max_depth < 1:
        return [[]] * (nodes + 1)
    # a candidate: (-its path product, order of discovery, parent index in the greedy order or -1, its rank, depth)
    counter = 0
    frontier = [(-p(1, 0), counter, -1, 0, 1)]
    reach: list[float] = []
    added: list[tuple[int, int, int]] = []  # (parent, rank, depth) in the order added
    trees = [[]]
    while len(added) < nodes and frontier:
        value, _, parent, rank, depth = heapq.heappop(frontier)
        node = len(added)
        added.append((parent, rank, depth))
        reach.append(-value)
        base = 1.0 if parent < 0 else reach[parent]
        if max_children is None or rank + 1 < max_children:
            counter += 1
            heapq.heappush(frontier, (-base * p(depth, rank + 1), counter, parent, rank + 1, depth))
        if max_depth is None or depth < max_depth:
            counter += 1
            heapq.heappush(frontier, (-reach[node] * p(depth + 1, 0), counter, node, 0, depth + 1))
        trees.append(_breadth_first(added))
    return trees


def _breadth_first(added: list[tuple[int, int, int]]) -> list[int]:
    """(parent, rank, depth) per node in the order added -> the same tree's parents in breadth-first order (depth by
    depth, children of earlier parents first, siblings by rank), the order decode/tree_layout.py static_parents uses."""
    new_index = {-1: -1}
    parents: list[int] = []
    for depth in sorted({d for _, _, d in added}):
        level = sorted((i for i, (_, _, d) in enumerate(added) if d == depth),
                       key=lambda i: (new_index[added[i][0]], added[i][1]))
        for i in level:
            new_index[i] = len(parents)
            parents.append(new_index[added[i][0]])
    return parents


def tree_value(parents: list[int], p: Acceptance, cost: Callable[[int, int], float]) -> float:
    """Expected tokens per round over the round's cost: (1 + expected_accepted) / cost(nodes, depth). The empty tree
    is a plain target step: 1 / cost(0, 0)."""
    depth = max(depths_and_ranks(parents)[0], default=0)
    return (1.0 + expected_accepted(parents, p)) / cost(len(parents), depth)


def best_tree(p: Acceptance, node_counts: Iterable[int], cost: Callable[[int, int], float],
              max_depth: int | None = None, max_children: int | None = None) -> list[int]:
    """The tree worth the most tokens per unit of cost: among the no-speculation step ([]) and, for each n in
    node_counts, the n-node tree of greatest expected accepted length (`greedy_trees`), the one of highest
    `tree_value`. cost(n, depth) is a round's cost in 1-token target forwards (verifying n nodes plus drafting to
    that depth); ties go to the smaller tree. p: a TreeStats or any (depth, rank) -> probability, <= 1 and
    non-increasing in rank."""
    counts = sorted({int(n) for n in node_counts if n > 0})
    trees = greedy_trees(p, counts[-1] if counts else 0, max_depth, max_children)
    best, best_value = [], tree_value([], p, cost)
    for n in counts:
        if n < len(trees):
            value = tree_value(trees[n], p, cost)
            if value > best_value:
                best, best_value = trees[n], value
    return best
