"""A speculative round's layouts: a chain of drafts or a token tree, each with its own verify / accept / read / roll
back and the record facts a round of it adds.

The round (decode/generate.py `_speculative_round`) picks one with `round_layout(proposal)` and then runs the same
steps whatever the layout:

- verify: one target forward over [last token, drafts] (a tree: over its root and nodes, with its tree mask);
- accept: each row's accepted drafts (a tree: a path) and the target's next token, on the device;
- readout / read: what the round's one host read copies (a tensor [B, K]; the round calls .tolist() on it), and the
  host rows (RoundRow) made of its values;
- roll back: the target's cache keeps each row's last token and accepted drafts;
- commit_facts / record_facts: what the drafter's commit and each row's round record add for this layout.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from decode.drafters.base import Proposal
from decode.kv import host_to_device
from decode.sampling import (accept_greedy, accept_sampled, accept_synthetic, accept_tree_greedy, accept_tree_sampled,
                             logits_to_probs)
from decode.settings import Sampling

SYNTHETIC_TREE = "synthetic acceptance applies to a chain of drafts, not to a token tree"


@dataclass
class RoundRow:
    """One row's verification result, as read to the host."""
    accepted: int  # drafts accepted (a tree: the path's length)
    token: int  # the target's next token
    drafted: int  # drafts it could accept (a tree: its valid nodes)
    drafts: list[int]  # the proposal's tokens (G of them; a tree: its N nodes)
    path: list[int]  # the accepted drafts' indices in `drafts`
    # a tree round's record facts: "ranks", "tried", "parents", and "batch_nodes": the nodes the round's target forward
    # verified besides the root (the batch's widest tree, whatever the row's own: what its verification cost)
    tree_facts: dict = field(default_factory=dict)


def _target_probs(target_logits: torch.Tensor, sampling: Sampling) -> torch.Tensor | None:
    """Sampling: the target's warped fp32 distribution [B, G+1, V]; greedy: None."""
    if not sampling.do_sample:
        return None
    return logits_to_probs(target_logits, sampling.temperature, sampling.top_k, sampling.top_p)


class ChainRound:
    """A chain of up to G drafts per row (proposal.tokens [B, G], row b's first draft_limit[b] of them count).
    synthetic_acceptance alpha: each row accepts by a Bernoulli(alpha) chain instead (decode/sampling.py
    accept_synthetic)."""

    def __init__(self, proposal: Proposal, synthetic_acceptance: float | None = None):
        self.proposal, self.synthetic_acceptance = proposal, synthetic_acceptance

    def verify(self, state, target, token: torch.Tensor) -> torch.Tensor:
        """fp32 target logits [B, G+1, V] over [last token, d_1 .. d_G]."""
        return state.forward(target, torch.cat([token[:, None], self.proposal.tokens], dim=1))

    def accept(self, target_logits: torch.Tensor, draft_limit: torch.Tensor, sampling: Sampling,
               generator) -> tuple[torch.Tensor, torch.Tensor, None]:
        """(accepted_len [B], next token [B], None): greedy or speculative sampling (decode/sampling.py accept_greedy /
        accept_sampled), or the synthetic chain at alpha."""
        proposal = self.proposal
        if self.synthetic_acceptance is not None:
            return (*accept_synthetic(draft_limit, proposal.tokens.shape[1], self.synthetic_acceptance, target_logits,
                                      _target_probs(target_logits, sampling), generator), None)
        if sampling.do_sample:
            return (*accept_sampled(proposal.tokens, proposal.probs, _target_probs(target_logits, sampling),
                                    draft_limit, generator), None)
        return (*accept_greedy(proposal.tokens, target_logits, draft_limit), None)

    def readout(self, accepted_len: torch.Tensor, token: torch.Tensor, draft_limit: torch.Tensor,
                path: None = None) -> torch.Tensor:
        """What the round's host read copies, [B, 3 + G]: accepted_len, next token, draft_limit, the drafts."""
        return torch.cat([accepted_len[:, None], token[:, None], draft_limit[:, None], self.proposal.tokens], dim=1)

    def read(self, values: list[list[int]]) -> list[RoundRow]:
        """The host rows of the readout's values: a row's path is its first `accepted` drafts."""
        return [RoundRow(v[0], v[1], v[2], v[3:], list(range(v[0]))) for v in values]

    def roll_back(self, state, accepted_len: torch.Tensor, host: list[RoundRow]) -> None:
        """Keep each row's last token and accepted drafts: a prefix of the round's G + 1 slots."""
        state.keep_prefix_of_last(self.proposal.tokens.shape[1] + 1, accepted_len + 1,
                                  max(r.accepted for r in host) + 1, [r.accepted + 1 for r in host])

    def commit_facts(self, host: list[RoundRow]) -> dict:
        """What Drafter.commit gets besides the accepted lengths: nothing."""
        return {}

    def record_facts(self, row: RoundRow, draft_forwards: int) -> dict:
        """A row's round record beyond "drafted", "accepted", "emitted": nothing."""
        return {}


class TreeRound:
    """A token tree per row (proposal.tokens [B, N], its host structure proposal.layout, decode/tree_layout.py
    TreeLayout; probs [B, N, V]: the q each node was drawn from)."""

    def __init__(self, proposal: Proposal):
        self.proposal, self.layout = proposal, proposal.layout

    def verify(self, state, target, token: torch.Tensor) -> torch.Tensor:
        """fp32 target logits [B, N+1, V] by verification column (0: the root, i + 1: node i), with the tree mask:
        each node sees the prefix and its ancestors."""
        ids = torch.cat([token[:, None], self.proposal.tokens], dim=1)
        return state.forward_tree(target, ids, self.layout.verify_parents(), self.layout.verify_valid(),
                                  new_round=True)

    def accept(self, target_logits: torch.Tensor, draft_limit: torch.Tensor, sampling: Sampling,
               generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(path length [B], next token [B], path [B, depth] of node indices, -1 past its end): greedy or SpecInfer's
        multi-step speculative sampling (decode/sampling.py accept_tree_greedy / accept_tree_sampled)."""
        proposal = self.proposal
        target_probs = _target_probs(target_logits, sampling)
        depth = max(self.layout.max_depth, 1)
        children = host_to_device(self.layout.children, proposal.tokens.device)
        if sampling.do_sample:
            return accept_tree_sampled(proposal.tokens, proposal.probs, target_probs, children, depth, generator)
        return accept_tree_greedy(proposal.tokens, target_logits, children, depth)

    def readout(self, accepted_len: torch.Tensor, token: torch.Tensor, draft_limit: torch.Tensor,
                path: torch.Tensor) -> torch.Tensor:
        """What the round's host read copies, [B, 3 + depth + N]: path length, next token, draft_limit, the path, the
        nodes' tokens."""
        self.depth = path.shape[1]
        return torch.cat([accepted_len[:, None], token[:, None], draft_limit[:, None], path, self.proposal.tokens],
                         dim=1)

    def read(self, values: list[list[int]]) -> list[RoundRow]:
        """The host rows of the readout's values; each row's record facts come from the host layout."""
        layout, depth = self.layout, self.depth
        rows = []
        for row, v in enumerate(values):
            nodes = [node for node in v[3: 3 + depth] if node >= 0]
            ranks, tried = layout.round_facts(row, nodes)
            rows.append(RoundRow(v[0], v[1], int(layout.valid[row].sum()), v[3 + depth:], nodes,
                                 {"ranks": ranks, "tried": tried, "parents": layout.row_parents(row),
                                  "batch_nodes": layout.nodes}))
        return rows

    def roll_back(self, state, accepted_len: torch.Tensor, host: list[RoundRow]) -> None:
        """Keep each row's root (its last committed token) and its path's columns, mask the rest."""
        keep = np.zeros((len(host), self.proposal.tokens.shape[1] + 1), dtype=bool)
        keep[:, 0] = True
        for row, r in enumerate(host):
            keep[row, [node + 1 for node in r.path]] = True
        state.keep_region(keep)

    def commit_facts(self, host: list[RoundRow]) -> dict:
        """Drafter.commit's path_host: each row's accepted node indices."""
        return {"path_host": [row.path for row in host]}

    def record_facts(self, row: RoundRow, draft_forwards: int) -> dict:
        """A tree round's record adds the round's draft forwards and the row's tree facts (RoundRow.tree_facts)."""
        return {"draft_forwards": draft_forwards, **row.tree_facts}


def round_layout(proposal: Proposal, synthetic_acceptance: float | None = None) -> ChainRound | TreeRound:
    """The proposal's layout: a chain (proposal.layout None) or a token tree. ValueError for a tree with
    synthetic_acceptance."""
    if proposal.layout is None:
        return ChainRound(proposal, synthetic_acceptance)
    if synthetic_acceptance is not None:
        raise ValueError(SYNTHETIC_TREE)
    return TreeRound(proposal)
