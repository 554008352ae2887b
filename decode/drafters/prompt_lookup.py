"""Prompt lookup decoding (Saxena 2023; transformers' PromptLookupCandidateGenerator; vLLM's ngram proposer):
the tokens that followed an earlier occurrence of the row's last n tokens are the draft. No model.

Which occurrence: the longest n-gram (n from ngram_max down to ngram_min), and of its occurrences the first
(earliest). Saxena's reference code, transformers and vLLM (its KMP search keeps the earliest position on a
tie) all take the first, so our drafts are the ones the hf_prompt_lookup peer proposes for the same n, and
the comparison measures the engine, not a different lookup. The first occurrence also has the longest
continuation: in text that repeats with a short period (a loop the model fell into, a table) a later
occurrence sits right before the tail and leaves fewer than max_tokens tokens after it.
"""
from __future__ import annotations

import numpy as np
import torch

from decode.drafters.base import DeviceTree, HostTextDrafter, Proposal, unpadded
from decode.kv import host_to_device


class NgramIndex:
    """One row's text (prompt without padding, then every committed token) and, per token id, the positions
    where it occurs, so that a lookup only visits the occurrences of the last token: O(occurrences x
    ngram_max) per round instead of a scan of the whole text."""

    def __init__(self, tokens: list[int] | None = None):
        self.tokens: list[int] = []
        self.positions: dict[int, list[int]] = {}
        self.extend(tokens or [])

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.positions.setdefault(token, []).append(len(self.tokens))
            self.tokens.append(token)

    def _match_length(self, end: int, ngram_max: int) -> int:
        """How many tokens ending at `end` equal the text's last ones (the tail), at most ngram_max."""
        tokens, last = self.tokens, len(self.tokens) - 1
        length = 0
        while length < ngram_max and length <= end and tokens[end - length] == tokens[last - length]:
            length += 1
        return length

    def propose(self, ngram_max: int, ngram_min: int, max_tokens: int) -> list[int]:
        """The continuation (at most max_tokens) of the first occurrence of the longest tail n-gram,
        ngram_min <= n <= ngram_max, that has a continuation; [] when none matches."""
        return self.propose_match(ngram_max, ngram_min, max_tokens)[0]

    def propose_match(self, ngram_max: int, ngram_min: int, max_tokens: int) -> tuple[list[int], int]:
        """`propose`'s continuation and the length n of the n-gram it matched (0: none)."""
        if not self.tokens or max_tokens <= 0:
            return [], 0
        occurrences = self.positions[self.tokens[-1]]
        best_length, best_end = 0, -1
        # 1. every earlier occurrence of the last token ends a candidate match; the text's last position is
        #    the tail itself (no continuation), so it is left out
        for index in range(len(occurrences) - 1):
            end = occurrences[index]
            length = self._match_length(end, ngram_max)
            # 2. strictly longer only: among equally long matches the first is kept
            if length > best_length:
                best_length, best_end = length, end
                if length == ngram_max:
                    break
        # 3. the tokens that followed the match (at least one: the match ends before the last position)
        if best_length < ngram_min:
            return [], 0
        return self.tokens[best_end + 1: best_end + 1 + max_tokens], best_length


    def propose_many(self, ngram_max: int, ngram_min: int, max_tokens: int, matches: int) -> list[list[int]]:
        """Up to `matches` different continuations (at most max_tokens each): occurrences of the tail n-gram
        ordered as `propose` ranks them (the longest match first, then the earliest), so the first is `propose`'s."""
        if not self.tokens or max_tokens <= 0 or matches <= 0:
            return []
        occurrences = self.positions[self.tokens[-1]]
        found = []
        for index in range(len(occurrences) - 1):
            end = occurrences[index]
            length = self._match_length(end, ngram_max)
            if length >= ngram_min:
                found.append((-length, end))
        continuations = []
        for _, end in sorted(found):
            continuation = self.tokens[end + 1: end + 1 + max_tokens]
            if continuation not in continuations:
                continuations.append(continuation)
                if len(continuations) == matches:
                    break
        return continuations


def trie_of(continuations: list[list[int]], budget: int) -> tuple[list[int], list[int]]:
    """Continuations -> one tree (tokens, parents; -1: the root) that shares their common prefixes, breadth first,
    with at most `budget` nodes: the earlier continuations' nodes first (the better matches), a later one cut where
    the budget ends. A node's children keep the order in which the continuations reached them (rank 0: the best)."""
    nodes: dict[tuple, int] = {}
    order: list[tuple] = []  # (depth, first continuation, token path) of each node, in the order they were added
    for which, continuation in enumerate(continuations):
        for depth in range(1, len(continuation) + 1):
            key = tuple(continuation[:depth])
            if key not in nodes:
                if len(nodes) == budget:
                    break
                nodes[key] = len(nodes)
                order.append(key)
    by_depth = sorted(order, key=lambda key: (len(key), nodes[key]))  # siblings keep their order of arrival
    index = {key: i for i, key in enumerate(by_depth)}
    tokens = [key[-1] for key in by_depth]
    parents = [index[key[:-1]] if len(key) > 1 else -1 for key in by_depth]
    return tokens, parents


def lookup(history: list[int], ngram_max: int, ngram_min: int, max_tokens: int) -> list[int]:
    """The prompt-lookup draft for one text: see NgramIndex.propose."""
    return NgramIndex(history).propose(ngram_max, ngram_min, max_tokens)


class PromptLookupDrafter(HostTextDrafter):
    """Deterministic drafts (q a point mass: probs None). Each row's text lives on the host: the prompt without
    padding, then each round's last token (the correction or bonus token, or the prefill's token) when it
    arrives with `propose`, then the drafts `commit` says were accepted. `forwards` stays 0: no model."""

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1, matches: int = 1, budget: int | None = None):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"prompt lookup needs 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        # matches > 1: a token tree of up to `matches` different continuations (their shared prefixes merged), at
        # most `budget` nodes; 1: today's chain
        self.matches, self.budget = matches, budget

    def reset(self):
        self.rows: list[NgramIndex] = []
        self._observed = self._observed_drafts = None
        self.last_tree = None

    def add_rows(self, prompt_ids, prompt_mask, host=None):
        """Each joining row's index of its prompt (padding dropped)."""
        self.rows += [NgramIndex(prompt) for prompt in unpadded(prompt_ids, prompt_mask, host)]
        self.device = prompt_ids.device

    def propose(self, last_tokens, max_tokens, row_limits=None):
        limits = row_limits if row_limits is not None else [max_tokens] * len(self.rows)
        if self.matches > 1:
            return self._propose_tree(last_tokens, max_tokens, limits)
        self.last_tree = None
        # the tokens were part of the engine's last host sync (observe)
        drafts = []
        for row, token in enumerate(self._last_tokens_host(last_tokens)):
            self.rows[row].extend([token])
            drafts.append(self.rows[row].propose(self.ngram_max, self.ngram_min, min(max_tokens, limits[row])))
        width = max((len(d) for d in drafts), default=0)  # G: a round with no match anywhere has G = 0
        tokens = torch.zeros(len(drafts), width, dtype=torch.long)  # [B, G], 0 past a row's length (never accepted)
        for row, draft in enumerate(drafts):
            tokens[row, :len(draft)] = torch.tensor(draft, dtype=torch.long)
        self.last_drafts = drafts
        lengths = torch.tensor([len(d) for d in drafts], dtype=torch.long)  # [B]
        return Proposal(host_to_device(tokens, self.device), None, host_to_device(lengths, self.device))

    def _propose_tree(self, last_tokens, max_tokens, limits):
        """Each row's continuations merged into a trie (point masses). No match in any row: G = 0, a plain step."""
        trees = []
        for row, token in enumerate(self._last_tokens_host(last_tokens)):
            self.rows[row].extend([token])
            continuations = self.rows[row].propose_many(self.ngram_max, self.ngram_min, min(max_tokens, limits[row]),
                                                        self.matches)
            trees.append(trie_of(continuations, self.budget or max_tokens * self.matches))
        self.last_tree = trees
        if not any(tokens for tokens, _ in trees):
            self.last_drafts = [[] for _ in trees]
        return tree_proposal(trees, self.device)


def tree_proposal(trees: list[tuple[list[int], list[int]]], device) -> Proposal:
    """Each row's (tokens, parents) trie -> one tree Proposal of point masses, the rows padded to the widest with
    invalid nodes; a round where no row has a node proposes nothing (an empty chain)."""
    width = max(len(tokens) for tokens, _ in trees)
    if width == 0:
        zeros = np.zeros(len(trees), dtype=np.int64)
        return Proposal(host_to_device(np.zeros((len(trees), 0), dtype=np.int64), device), None,
                        host_to_device(zeros, device))
    tokens = np.zeros((len(trees), width), dtype=np.int64)
    parents = np.full((len(trees), width), -1, dtype=np.int64)
    valid = np.zeros((len(trees), width), dtype=bool)
    for row, (row_tokens, row_parents) in enumerate(trees):
        tokens[row, :len(row_tokens)], parents[row, :len(row_tokens)] = row_tokens, row_parents
        valid[row, :len(row_tokens)] = True
    return Proposal(host_to_device(tokens, device), None, layout=DeviceTree.of(parents, valid, device))
