"""Draft-model token trees (decode/tree_layout.py): a static shape, EAGLE-2's dynamic tree, and the shape `auto` picks.

Each round the drafter's catch-up forward gives the root's draft distribution; the tree grows depth by depth, the
nodes of a depth that have children fed to the draft in ONE forward with the tree mask (each sees the prefix and
its ancestors). Nodes at the deepest level (and leaves) are never fed: their tokens only need the target's check.

Children of a node:
- greedy: the draft's top-k tokens (distinct), rank 0 its argmax; a rank past the draft's vocabulary is padding;
- sampling, static tree: k draws i.i.d. from the node's warped q (siblings may repeat a token), each node's q kept
  for SpecInfer's acceptance rule;
- sampling, dynamic tree: the top-k of q by cumulative probability, deterministic: point masses (probs None).
Both are exact under decode/sampling.py accept_tree_sampled.
"""
from __future__ import annotations

import numpy as np
import torch

from decode.drafters.base import DeviceTree, Proposal
from decode.kv import host_to_device
from decode.sampling import logits_to_probs, sample
from decode.tree_layout import depths_and_ranks


def breadth_first(parents: list[int]) -> list[int]:
    """The same tree with its nodes ordered depth by depth (siblings keep their order), parents renumbered."""
    depths, _ = depths_and_ranks(parents)
    order = sorted(range(len(parents)), key=lambda node: (depths[node], node))
    new_index = {old: new for new, old in enumerate(order)}
    return [new_index[parents[old]] if parents[old] >= 0 else -1 for old in order]


def trim_depth(parents: list[int], max_depth: int) -> list[int]:
    """The nodes at depth <= max_depth of a breadth-first tree (a prefix of it)."""
    depths, _ = depths_and_ranks(parents)
    return [p for p, d in zip(parents, depths) if d <= max_depth]


class StaticTree:
    """One shape every round (a branching list, or auto's choice), trimmed to the round's depth cap."""

    def __init__(self, parents: list[int], sampling):
        self.parents = breadth_first(list(parents))
        self.sampling = sampling

    def shape_for_round(self, max_depth: int) -> list[int] | None:
        shape = trim_depth(self.parents, max_depth)
        return shape or None

    @torch.no_grad()
    def draft(self, drafter, root_logits: torch.Tensor, lengths: list[int], parents: list[int]):
        """root_logits [B, V_t] -> a Proposal with its DeviceTree (its columns: each node's draft cache column, the same
        in every row)."""
        batch = root_logits.shape[0]
        count = len(parents)
        depths, ranks = depths_and_ranks(parents)
        sampling = self.sampling
        useful = min(drafter.input_vocab_size, drafter.target_vocab_size)  # greedy ranks past it are padding
        logits_of = {-1: root_logits}
        tokens: list[torch.Tensor | None] = [None] * count
        probs: list[torch.Tensor | None] = [None] * count
        fed: dict[int, int] = {}
        has_children = set(p for p in parents if p >= 0)
        for depth in range(1, max(depths) + 1):
            level = [node for node in range(count) if depths[node] == depth]
            for parent in dict.fromkeys(parents[node] for node in level):
                kids = [node for node in level if parents[node] == parent]
                logits = logits_of[parent]
                if sampling.do_sample:
                    q = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)  # [B, V]
                    draws = sample(q[:, None, :].expand(-1, len(kids), -1), drafter.generator)  # [B, k] i.i.d.
                    for j, node in enumerate(kids):
                        tokens[node], probs[node] = draws[:, j], q
                else:
                    top = logits.topk(min(len(kids), logits.shape[-1]), dim=-1).indices  # [B, k']
                    for j, node in enumerate(kids):
                        tokens[node] = top[:, min(j, top.shape[1] - 1)]
            feed = [node for node in level if node in has_children]
            if feed:
                ids = torch.stack([tokens[node] for node in feed], dim=1)  # [B, F]
                region = np.array([[fed[parents[node]] if parents[node] >= 0 else -1 for node in feed]] * batch)
                logits = drafter.tree_forward(ids, region, new_round=not fed)
                for j, node in enumerate(feed):
                    fed[node] = len(fed)
                    logits_of[node] = logits[:, j]
        within = np.asarray(depths)[None, :] <= np.asarray(lengths)[:, None]  # [B, N] each row's tree by its length
        valid = within.copy()
        if not sampling.do_sample:
            valid &= np.asarray(ranks)[None, :] < useful
        for node, parent in enumerate(parents):  # a padding node's subtree is padding
            if parent >= 0:
                valid[:, node] &= valid[:, parent]
        columns = np.array([[fed.get(node, -1) for node in range(count)]] * batch)
        # a row alone verifies its tree trimmed to its length (shape_for_round), its rank padding included
        layout = DeviceTree.of(np.array([parents] * batch), valid, root_logits.device, columns,
                               within.sum(axis=1).tolist())
        stacked = torch.stack(tokens, dim=1)
        q = torch.stack(probs, dim=1) if sampling.do_sample else None
        return Proposal(stacked, q, layout=layout)


class DynamicTree:
    """EAGLE-2's dynamic tree (Li et al. 2024): each depth expands the top_k frontier nodes with the highest
    cumulative draft probability by their top_k children each (one draft forward of top_k nodes per depth); at the
    end the `budget` nodes of highest cumulative probability (a tree: a node's probability is at most its
    parent's) are verified. Children are deterministic (point masses under sampling). Ranked on the device (a stable
    sort: ties go to the earlier candidate, so a parent before its children), so a round reads nothing before its
    verification; every row verifies min(budget, candidates) nodes, those a row cannot take (past its length, q = 0)
    padding."""

    def __init__(self, budget: int, top_k: int, sampling):
        self.budget, self.top_k, self.sampling = budget, top_k, sampling

    def shape_for_round(self, max_depth: int):
        return max_depth  # the depth; the shape comes out of the draft

    def _log_q(self, logits: torch.Tensor) -> torch.Tensor:
        if self.sampling.do_sample:
            s = self.sampling
            return logits_to_probs(logits, s.temperature, s.top_k, s.top_p).log()
        return torch.log_softmax(logits.float(), dim=-1)

    @torch.no_grad()
    def draft(self, drafter, root_logits: torch.Tensor, lengths: list[int], max_depth: int) -> Proposal:
        """root_logits [B, V_t] -> a Proposal with its DeviceTree. Candidates are numbered depth by depth: the root's k
        children, then at each depth the frontier's k x k children (frontier node f's j-th best: f k + j)."""
        batch, device = root_logits.shape[0], root_logits.device
        k = min(self.top_k, root_logits.shape[-1])
        top = self._log_q(root_logits).topk(k, dim=-1)
        # per depth, [B, k] then [B, k k]: token, cumulative log q, parent candidate (-1: the root)
        tokens, scores, parents = [top.indices], [top.values], [torch.full_like(top.indices, -1)]
        frontier = torch.arange(k, device=device).expand(batch, -1)  # [B, k] candidate ids, fed in this order
        region = torch.full_like(top.indices, -1)  # [B, k] the frontier's parents' draft cache columns (-1: the root)
        fed = []  # the frontier of each forward: depth d's is fed at columns (d - 1) k .. d k - 1
        for depth in range(1, max_depth):
            logits = drafter.tree_forward(torch.cat(tokens, 1).gather(1, frontier), region, new_round=depth == 1)
            fed.append(frontier)
            base = torch.cat(scores, 1).gather(1, frontier)  # [B, k]
            top = (base[:, :, None] + self._log_q(logits)).topk(k, dim=-1)  # [B, k, k]
            first = sum(t.shape[1] for t in tokens)  # this depth's first candidate id
            tokens.append(top.indices.flatten(1))
            scores.append(top.values.flatten(1))
            parents.append(frontier.repeat_interleave(k, dim=1))
            order = scores[-1].sort(dim=1, descending=True, stable=True).indices[:, :k]  # this depth's best k
            frontier, region = order + first, (depth - 1) * k + order // k
        tokens, scores, parents = torch.cat(tokens, 1), torch.cat(scores, 1), torch.cat(parents, 1)  # [B, C]
        ids = torch.arange(tokens.shape[1], device=device)
        depths = torch.where(ids < k, 1, 2 + (ids - k).div(k * k, rounding_mode="floor"))  # [C]
        allowed = (depths[None, :] <= host_to_device(lengths, device)[:, None]) & (scores > float("-inf"))
        # the host knows each row's candidates within its length (k at depth 1, k k at each depth below), not which
        # of them the sampling filter ruled out: a row verifies min(budget, those), padded where fewer are allowed
        widths = [min(self.budget, k + (min(n, max_depth) - 1) * k * k) if n > 0 else 0 for n in lengths]
        width = max(max(widths), 1)
        best = torch.where(allowed, scores, float("-inf")).sort(dim=1, descending=True, stable=True).indices
        chosen = best[:, :width].sort(dim=1).values  # [B, W] candidate ids in order: a parent before its children
        valid = allowed.gather(1, chosen)
        node_of = torch.full_like(tokens, -1).scatter(1, chosen, ids[:width].expand(batch, -1))
        parent = parents.gather(1, chosen)
        node_parents = torch.where(valid & (parent >= 0), node_of.gather(1, parent.clamp(min=0)), -1)
        fed = torch.cat(fed, 1) if fed else frontier[:, :0]  # [B, (D - 1) k] the fed candidates, by column
        columns = torch.full_like(tokens, -1).scatter(1, fed, ids[:fed.shape[1]].expand(batch, -1))
        tree = DeviceTree(node_parents, valid, columns.gather(1, chosen), max_depth, k, widths)
        return Proposal(tokens.gather(1, chosen), None, layout=tree)


class AutoTree(StaticTree):
    """`tree: auto`: each round, the tree worth the most tokens per unit of cost (decode/tree_policy.py best_tree:
    Sequoia's construction with acceptance by depth and sibling rank), or no drafting at all when nothing beats a
    plain target step.

    - Acceptance: from this batch's own rounds (the last RECENT, updated after every round) on top of the last PRIOR
      rounds the point's earlier batches left (a prior worth PRIOR rounds), so a prompt on which the draft does badly
      shrinks the tree, or stops drafting, within a few rounds, and one on which it does well grows it, whatever the
      prompts before it did. The point's warmup drafts EXPLORE (ranks and depths to measure) to seed them.
    - Cost of a round: depth x c (one draft forward per depth, the catch-up included) + v(n) (the verification of n
      nodes and the root), both measured in this run (runner/probes.py); the trees considered have the measured n.
    - After PROBE_EVERY rounds without drafting, one round drafts the best tree of at least one node: without it an
      estimate that says "off" could never be revised.
    - Likewise for width: once the recent rounds hold no trial of a second child at depth 1 (a run of chains pushed the
      exploration out), a rank they never tried estimates 0 and no tree would widen again; so every PROBE_EVERY-th
      round then picks its tree with a Beta(1, 1) prior, which prices an untried rank at 1/2 (within what is left of
      1), at the measured node counts as always.
    """

    RECENT = 48
    PRIOR = 8
    PROBE_EVERY = 8
    EXPLORE = [4, 2, 2, 1, 1, 1, 1, 1]

    def __init__(self, memory: "AutoMemory", c: float, v: dict[int, float], sampling, explore: bool = False):
        super().__init__([], sampling)
        self.memory, self.c, self.explore = memory, c, explore
        self.v = {0: 1.0, **{int(n): float(value) for n, value in v.items()}}
        self.node_counts = sorted(n for n in self.v if n > 0)
        self.off_rounds = 0
        self.prior = list(memory.rounds)[-self.PRIOR:]  # what the point's earlier batches (its warmup) left
        from collections import deque

        self.batch_rounds = deque(maxlen=self.RECENT)  # this batch's rounds, every row's
        self.rounds = 0
        self.layout_parents: list[int] = []

    @classmethod
    def for_point(cls, ctx, point, sampling) -> "AutoTree":
        costs = ctx.costs
        c = costs.c_for(point.draft) if costs else None
        if c is None or not costs.v:
            raise ValueError("tree: auto needs the measured costs c and v, and the cost probes did not run")
        memory = ctx.memory.setdefault(("tree_auto", point.key), AutoMemory(cls.RECENT))
        return cls(memory, c, dict(costs.v), sampling, explore=ctx.warming_up)

    def cost(self, nodes: int, depth: int) -> float:
        """A round's cost in 1-token target forwards: depth draft forwards and the verification of nodes + 1 (v
        measured at every node count the policy considers, v(0) = 1 a plain step)."""
        return depth * self.c + self.v[nodes]

    def shape_for_round(self, max_depth: int):
        from decode.tree_layout import static_parents
        from decode.tree_policy import TreeStats, best_tree

        if self.explore:
            shape = trim_depth(static_parents(self.EXPLORE), max_depth)
        else:
            evidence = self.prior + list(self.batch_rounds)
            stats = TreeStats(evidence)
            self.rounds += 1
            if self.rounds % self.PROBE_EVERY == 0 and len(stats.trials[0] if stats.trials else []) < 2:
                stats = TreeStats(evidence, prior=(1.0, 1.0))  # a width probe: see the class
            shape = best_tree(stats, self.node_counts, self.cost, max_depth=max_depth)
            if not shape:
                self.off_rounds += 1
                if self.off_rounds % self.PROBE_EVERY == 0:
                    shape = best_tree(stats, self.node_counts, lambda n, d: self.cost(n, d) if n else float("inf"),
                                      max_depth=max_depth)
        self.layout_parents = shape
        return shape or None

    def observe(self, path_host: list[list[int]], layout) -> None:
        """After a round: its rows' facts (ranks and children tried on the accepted path) join the recent rounds."""
        for row, path in enumerate(path_host):
            ranks, tried = layout.round_facts(row, path)
            facts = {"accepted": len(path), "ranks": ranks, "tried": tried}
            self.memory.rounds.append(facts)
            self.batch_rounds.append(facts)


class AutoMemory:
    """What `tree: auto` keeps across a point's batches: its recent rounds."""

    def __init__(self, recent: int):
        from collections import deque

        self.rounds = deque(maxlen=recent)
