"""Token trees: several draft continuations per row, verified by the target in one forward.

A tree proposal of a row is N nodes after its root (the row's last committed token, which the verification feeds
first). Node i has a parent (-1: the root) that comes before it, a depth (1 for the root's children) and a sibling
rank (its index among its parent's children, in the order the verification tries them: 0 is the drafter's first
choice). A chain of gamma drafts is the tree whose parents are i - 1.

The target scores the root and every node in one forward (`KVState.forward_tree`): each node sees the committed
prefix and its own ancestors, at position prefix length + depth. Acceptance walks from the root:

- greedy: the child equal to the target's argmax at its parent, if any (the first such sibling); the output equals
  the target's own, token for token;
- sampling: SpecInfer's multi-step speculative sampling (Miao et al. 2024, "SpecInfer", Alg. 2 / Thm. 4.2): at a
  node with target distribution p, children are tried in rank order, child x drawn from q is accepted with
  probability min(1, p(x) / q(x)), and after each rejection p <- norm(max(0, p - q)); when every child is rejected
  the next token is drawn from the last p. With children drawn i.i.d. from q (siblings may repeat a token) or
  chosen deterministically (q a point mass on each, e.g. the draft's top-k or n-gram matches) the output is
  distributed exactly as the target's.

Tree shapes as the config names them (`speculative.tree`, a sweep axis; labels in the records):
- None: a chain of gamma (the method's usual path);
- a branching list [k1, k2, ..., kD], label "3-2-1-1": every node at depth d - 1 has k_d children (N = k1 + k1 k2
  + ...); a static tree;
- "dynamic-N": EAGLE-2's dynamic tree: expand by cumulative draft probability, keep the best N nodes (depth gamma);
- "auto": the shape that maximises expected tokens per unit of cost (decode/tree_policy.py).
"""
from __future__ import annotations

import numpy as np

AUTO = "auto"
DYNAMIC_PREFIX = "dynamic-"


def tree_label(value) -> str | None:
    """A config value -> its label: None (chain), [3, 2, 1, 1] -> "3-2-1-1", {"dynamic": 24} -> "dynamic-24", "auto".
    Raises ValueError naming what is wrong."""
    if value is None or value == "chain":
        return None
    if isinstance(value, str):
        if value == AUTO:
            return AUTO
        if value.startswith(DYNAMIC_PREFIX) or all(part.isdigit() for part in value.split("-")):
            shape = branching_or_budget(value)  # validates
            if isinstance(shape, list):
                _check_node_count(shape, value)
            return value
        raise ValueError(f"tree {value!r}: expected null (a chain), a branching list such as [3, 2, 1, 1], "
                         "{dynamic: 24} or auto")
    if isinstance(value, dict):
        if set(value) != {"dynamic"}:
            raise ValueError(f"tree {value!r}: a dynamic tree is written {{dynamic: N}} with N its node budget")
        budget = value["dynamic"]
        if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_NODES:
            raise ValueError(f"tree {value!r}: the dynamic tree's node budget must be an integer in 1..256")
        return f"{DYNAMIC_PREFIX}{budget}"
    if isinstance(value, (list, tuple)):
        if not value or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in value):
            raise ValueError(f"tree {value!r}: a branching list has one integer >= 1 per depth, e.g. [3, 2, 1, 1]")
        _check_node_count(list(value), value)
        return "-".join(str(k) for k in value)
    raise ValueError(f"tree {value!r}: expected null, a branching list, {{dynamic: N}} or auto")


MAX_NODES = 256


def static_node_count(branching: list[int], cap: int = MAX_NODES) -> int:
    """Nodes of the static tree [k1, .., kD] (k1 + k1 k2 + ...), counted by prefix products without building it;
    stops at the first depth past `cap` and returns that running count (so [1000, 1000, 1000] costs three steps)."""
    total, width = 0, 1
    for k in branching:
        width *= k
        total += width
        if total > cap:
            break
    return total


def _check_node_count(branching: list[int], value) -> None:
    if static_node_count(branching) > MAX_NODES:
        shown = value if isinstance(value, str) else list(value)
        raise ValueError(f"tree {shown!r} has more than {MAX_NODES} nodes; at most {MAX_NODES}: use fewer children "
                         "per depth, e.g. [3, 2, 1, 1]")


def branching_or_budget(label: str) -> list[int] | int:
    """A static label's branching list, or a dynamic label's node budget."""
    if label.startswith(DYNAMIC_PREFIX):
        budget = label[len(DYNAMIC_PREFIX):]
        if not budget.isdigit() or not 1 <= int(budget) <= MAX_NODES:
            raise ValueError(f"tree {label!r}: the dynamic tree's node budget must be an integer in 1..256")
        return int(budget)
    parts = label.split("-")
    if not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"tree {label!r}: a branching list has one integer >= 1 per depth")
    return [int(p) for p in parts]


def static_parents(branching: list[int]) -> list[int]:
    """[k1, .., kD] -> each node's parent (-1: the root), breadth first: depth by depth, children of a node in rank
    order, so a parent always comes before its children. [2, 2] -> [-1, -1, 0, 0, 1, 1]."""
    parents, frontier = [], [-1]
    for k in branching:
        nxt = []
        for parent in frontier:
            for _ in range(k):
                nxt.append(len(parents))
                parents.append(parent)
        frontier = nxt
    return parents


def depths_and_ranks(parents) -> tuple[list[int], list[int]]:
    """Each node's depth (1 for the root's children) and sibling rank (0 for its parent's first child)."""
    depths, ranks, children = [], [], {}
    for node, parent in enumerate(parents):
        if parent >= node:
            raise ValueError(f"node {node}'s parent {parent} does not come before it")
        depths.append(1 if parent < 0 else depths[parent] + 1)
        ranks.append(children.get(parent, 0))
        children[parent] = children.get(parent, 0) + 1
    return depths, ranks


def tree_depth(label: str | None, gamma: int | None) -> int | None:
    """The deepest a point's tree goes: a static tree's length, else gamma (a chain, a dynamic tree, auto)."""
    if label is None or label == AUTO or label.startswith(DYNAMIC_PREFIX):
        return gamma
    return len(branching_or_budget(label))


def tree_nodes(label: str | None, gamma: int | None) -> int | None:
    """Nodes a full tree of the point verifies besides the root: a static tree's size, a dynamic tree's budget, a
    chain's gamma; None for auto (it varies)."""
    if label is None:
        return gamma
    if label == AUTO:
        return None
    shape = branching_or_budget(label)
    return shape if isinstance(shape, int) else len(static_parents(shape))


class TreeLayout:
    """The host structure of one round's tree proposal for a batch (decode/drafters/base.py DeviceTree's, read with the
    round): parents [B, N] (-1: the root), valid [B, N] (False: padding, never accepted; a row's tree may be smaller
    than the batch's), and what is derived from them:
    depths, ranks, and the children table [B, N + 1, K] in verification columns (column 0 is the root, node i is
    column i + 1; -1 pads), with K the most children any column has. columns [B, N]: the draft cache column each
    node was fed at (-1: never fed; all -1 where not given)."""

    def __init__(self, parents: np.ndarray, valid: np.ndarray, columns: np.ndarray | None = None):
        self.parents = np.asarray(parents, dtype=np.int64)  # [B, N]
        self.valid = np.asarray(valid, dtype=bool)  # [B, N]
        self.columns = np.full(self.parents.shape, -1, dtype=np.int64) if columns is None else np.asarray(columns)
        batch, nodes = self.parents.shape
        self.depths = np.zeros((batch, nodes), dtype=np.int64)
        self.ranks = np.zeros((batch, nodes), dtype=np.int64)
        counts = np.zeros((batch, nodes + 1), dtype=np.int64)
        for row in range(batch):
            for node in range(nodes):
                parent = self.parents[row, node]
                if parent >= node:
                    raise ValueError(f"row {row}: node {node}'s parent {parent} does not come before it")
                if not self.valid[row, node]:
                    continue
                if parent >= 0 and not self.valid[row, parent]:
                    raise ValueError(f"row {row}: valid node {node} has a padding parent {parent}")
                self.depths[row, node] = 1 if parent < 0 else self.depths[row, parent] + 1
                self.ranks[row, node] = counts[row, parent + 1]
                counts[row, parent + 1] += 1
        width = max(1, int(counts.max()) if counts.size else 1)
        self.children = np.full((batch, nodes + 1, width), -1, dtype=np.int64)
        for row in range(batch):
            for node in range(nodes):
                if self.valid[row, node]:
                    self.children[row, self.parents[row, node] + 1, self.ranks[row, node]] = node + 1
        self.max_depth = int(self.depths.max()) if self.depths.size else 0

    @property
    def batch(self) -> int:
        return self.parents.shape[0]

    @property
    def nodes(self) -> int:
        return self.parents.shape[1]

    def verify_parents(self) -> np.ndarray:
        """[B, N + 1] parents in verification columns (the root first, its parent -1: the committed prefix)."""
        shifted = np.where(self.parents >= 0, self.parents + 1, 0)
        return np.concatenate([np.full((self.batch, 1), -1, dtype=np.int64), shifted], axis=1)

    def verify_valid(self) -> np.ndarray:
        return np.concatenate([np.ones((self.batch, 1), dtype=bool), self.valid], axis=1)

    def row_parents(self, row: int) -> list[int]:
        """Row `row`'s tree as its valid nodes' parents, renumbered over the valid nodes (-1: the root)."""
        index = np.cumsum(self.valid[row]) - 1
        return [int(index[p]) if p >= 0 else -1 for p, ok in zip(self.parents[row], self.valid[row]) if ok]

    def round_facts(self, row: int, path: list[int]) -> tuple[list[int], list[int]]:
        """Row `row`'s accepted path (node indices from depth 1 down) -> (the sibling rank of each accepted node,
        the number of children the verification tried at each depth it reached: at depth d the children of the path's
        node at depth d - 1; after a rejection nothing deeper is tried, and a leaf tries nothing)."""
        ranks = [int(self.ranks[row, node]) for node in path]
        tried = []
        column = 0
        for depth in range(len(path) + 1):
            kids = int((self.children[row, column] >= 0).sum())
            if kids == 0:
                break
            tried.append(kids)
            if depth < len(path):
                column = path[depth] + 1
        return ranks, tried
