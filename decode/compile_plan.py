"""Which step widths each model of a compiled run uses (engine.compile): the compiled mode (decode/static_kv.py) builds a
graph per width, so the widths are planned from the run's points before anything runs."""
from __future__ import annotations

import numpy as np


def compile_widths(points, tree_top_k: int, auto_nodes) -> dict:
    """The step widths each model of the run uses, so that each compiles only those.

    points: the run's points of our engine (runner/plan.py Point: method, draft, gamma, tree); auto_nodes: the node
    counts `tree: auto` picks among (the ones whose v the probes measure). Returns {"target": (chain widths, tree
    widths), "drafts": {label: (chain widths, tree widths)}, "round": the most columns one round's steps take beyond
    the committed tokens (for L_max)}:

    - the target: 1 (the baseline, a round in which no row drafts, the probes) and gamma + 1 (a chain's
      verification, whatever drafts it: a shorter draft runs padded to it); a tree's verification n + 1, through the
      tree step (n: a static tree's nodes, a dynamic tree's budget, each of auto's node counts and its warmup's
      exploring tree; hybrid's merged tree of two sources' chains, 2 gamma, where smaller ones run padded);
    - a draft model (and early exit's view, CompiledModel.view_widths): 1 (a draft step) and 2 (its catch-up after a round
      that accepted every draft: the last draft and the new token; a longer catch-up runs in steps of 2); a static
      tree's draft forwards feed the nodes of a depth that have children (k1, k1 k2, ...), a dynamic tree's the
      top_k frontier, auto's any count up to its largest tree, padded to a power of 2. A head (eagle3, medusa) runs
      eager beside the compiled target: it has no widths.
    """
    from decode.drafters.draft_tree import AutoTree, trim_depth
    from decode.methods import ENGINE_CAPS, REGISTRY
    from decode.tree_layout import AUTO, branching_or_budget, static_parents, tree_nodes

    target_chain, target_tree, drafts, rounds = {1}, set(), {}, [1]
    for point in points:
        spec = REGISTRY[point.method]
        if not ENGINE_CAPS[spec.engine].compiles or spec.peer or not spec.has_rounds:
            continue
        label = getattr(point, "tree", None)
        compiled_draft = spec.needs_draft and "model" in spec.draft_kinds  # a draft model (a head stays eager)
        draft = drafts.setdefault(point.draft, (set(), set())) if compiled_draft else None
        if draft is not None:
            draft[0].update((1, 2))
        if spec.draft_sources:  # hybrid: a free source's chain beside the draft's, merged into one tree
            target_tree.add(2 * point.gamma + 1)
            rounds.append(2 * point.gamma + 1)
        if label is None:
            target_chain.add(point.gamma + 1)
            rounds.append(point.gamma + 1)
            continue
        if label == AUTO:
            nodes = [*auto_nodes, len(trim_depth(static_parents(AutoTree.EXPLORE), point.gamma))]
        else:
            nodes = [tree_nodes(label, point.gamma)]
        target_tree.update(n + 1 for n in nodes)
        rounds.extend(n + 1 for n in nodes)
        if draft is None:
            continue
        shape = branching_or_budget(label) if label != AUTO else None
        if label == AUTO:  # a tree of n nodes feeds at most n, in forwards of at most n each
            largest = max(nodes)
            fed = {1 << i for i in range(largest.bit_length() + 1) if 1 << i < 2 * largest}
            region = largest + max(fed)
        elif isinstance(shape, int):  # dynamic: top_k nodes a depth, at depths 1 .. gamma - 1
            fed = {tree_top_k}
            region = tree_top_k * max(point.gamma - 1, 1)
        else:
            per_depth = [int(np.prod(shape[:d])) for d in range(1, len(shape))]  # nodes with children, per depth
            fed = set(per_depth)  # none for a tree of one depth: the draft feeds no node
            region = sum(per_depth) + max(fed, default=0)
        draft[1].update(fed)
        rounds.append(region)
    return {"target": (tuple(sorted(target_chain)), tuple(sorted(target_tree))),
            "drafts": {label: (tuple(sorted(chain)), tuple(sorted(tree))) for label, (chain, tree) in drafts.items()},
            "round": max(rounds)}
