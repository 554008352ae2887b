"""Suffix decoding (Oliaro et al. 2024, "SuffixDecoding"; Snowflake's arctic-inference): the drafts are the most
frequent continuation of the text's tail in a suffix structure of the prompt, the output so far, and the outputs of
earlier requests. No model: every draft is a point mass (q one-hot), so greedy output equals the target's and
sampling stays exact.

The structure is a depth-bounded suffix trie with counts (`SuffixTrie`): every position of an indexed text starts a
path of at most `depth` tokens, and a node's count is the number of indexed positions whose text begins with the
node's tokens (its occurrences). Two of them answer a row:

- the row's own trie: its prompt (padding dropped) and every token it commits, extended token by token;
- the earlier outputs (`SuffixCache`): the output tokens of finished requests, at most `max_tokens` tokens of them,
  the oldest dropped first (their counts taken out again). Kept per process, per sweep point and per repeat
  (RunContext.memory; decode/methods/suffix.py cache_for: a repeat starts an empty one, so that repeats are alike and
  no conversation drafts from the answers to its own later turns): shared by every row of every later batch of the
  point, never by the rows of the static batch that is running (a row's output joins when its batch ends; served
  under a load, a request's joins as it finishes, and every request in flight or admitted later reads it:
  generate_remembering), never filled by the untimed warmup, and a prompt that runs again (requests that cycle
  through the prompts) first has its own earlier output taken out, so that no request drafts from its own answer.

Speculation (`SuffixTrie.speculate`): for each match length m = 1 .. max_depth, the node of the tail's last m tokens;
from it the draft grows greedily by the child with the largest count, each token's estimated probability the product
of count(child) / sum of the counts of its siblings along the way (the share of the occurrences that continue with
it), while that probability stays at or above `min_prob`. The draft's score is the sum of its tokens' probabilities
(its expected accepted length); of all match lengths and of the two tries the best score wins (a tie: the longer
match, then the row's own trie). A tree (`speculate_tree`) grows best first by probability within a node budget.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict

import numpy as np
import torch

from decode.drafters.base import HostTextDrafter, Proposal, unpadded  # noqa: F401  (unpadded: also imported from here)
from decode.drafters.prompt_lookup import tree_proposal
from decode.kv import host_to_device


class _Node:
    __slots__ = ("count", "children")

    def __init__(self):
        self.count = 0
        self.children: dict[int, _Node] = {}


class SuffixTrie:
    """A suffix trie of one or more texts, each path at most `depth` tokens, with occurrence counts (see the module)."""

    def __init__(self, depth: int):
        if depth < 2:
            raise ValueError(f"a suffix trie needs depth >= 2, got {depth}")
        self.depth = depth
        self.root = _Node()
        self._open: list[_Node] = []  # extend(): the nodes of the suffixes still shorter than depth

    def extend(self, tokens: list[int]) -> None:
        """Append tokens to the text being indexed (one text per trie that is extended; `add` indexes whole texts)."""
        for token in tokens:
            self.root.count += 1
            grown = []
            for node in [self.root, *self._open]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                child.count += 1
                grown.append(child)
            # shortest first; the suffix that reached `depth` tokens (the last) stops growing
            self._open = grown[:self.depth - 1]

    def add(self, tokens: list[int], sign: int = 1) -> None:
        """Index (sign 1) or take out again (sign -1) one whole text: each position's next `depth` tokens."""
        for start in range(len(tokens)):
            node = self.root
            node.count += sign
            for token in tokens[start: start + self.depth]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                child.count += sign
                if child.count <= 0:
                    del node.children[token]
                    break
                node = child

    def find(self, pattern: list[int]) -> _Node | None:
        node = self.root
        for token in pattern:
            node = node.children.get(token)
            if node is None:
                return None
        return node

    @staticmethod
    def _best_child(node: _Node) -> tuple[int, _Node, float] | None:
        """The child with the largest count (a tie: the smallest token id) and its share of the children's counts."""
        if not node.children:
            return None
        total = sum(child.count for child in node.children.values())
        token, child = min(node.children.items(), key=lambda item: (-item[1].count, item[0]))
        return token, child, child.count / total

    def chain(self, node: _Node, max_tokens: int, min_prob: float) -> tuple[list[int], list[float]]:
        """From a matched node: the greedy most frequent continuation and each token's estimated probability."""
        tokens, probs, prob = [], [], 1.0
        while len(tokens) < max_tokens:
            best = self._best_child(node)
            if best is None or prob * best[2] < min_prob:
                break
            token, node, share = best
            prob *= share
            tokens.append(token)
            probs.append(prob)
        return tokens, probs

    def speculate(self, context: list[int], max_depth: int, max_tokens: int, min_prob: float
                  ) -> tuple[list[int], list[float], int]:
        """The best-scoring draft over match lengths 1..max_depth of the context's tail: (tokens, their estimated
        probabilities, the match length); ([], [], 0) when nothing matches with a continuation."""
        best: tuple[list[int], list[float], int] = ([], [], 0)
        best_score = 0.0
        for m in range(1, min(max_depth, len(context), self.depth - 1) + 1):
            node = self.find(context[-m:])
            if node is None:
                break  # a longer tail occurs nowhere either
            tokens, probs = self.chain(node, min(max_tokens, self.depth - m), min_prob)
            score = sum(probs)
            if tokens and score >= best_score:  # a tie: the longer match
                best, best_score = (tokens, probs, m), score
        return best

    def speculate_tree(self, context: list[int], max_depth: int, budget: int, max_tokens: int, min_prob: float
                       ) -> tuple[list[int], list[int], list[float]]:
        """A tree of at most `budget` nodes (depth at most max_tokens) from the longest match with a continuation:
        nodes added best first by estimated probability (>= min_prob), so a parent comes before its children and
        siblings come in order of probability. Returns (tokens, parents (-1: the root), probabilities)."""
        node, m = None, 0
        for length in range(min(max_depth, len(context), self.depth - 1), 0, -1):
            found = self.find(context[-length:])
            if found is not None and found.children:
                node, m = found, length
                break
        if node is None:
            return [], [], []
        tokens, parents, probs = [], [], []
        heap = [(-1.0, 0, node, -1, 0)]  # (-probability, tie, trie node, its tree index, its depth)
        tie = 1
        while heap and len(tokens) <= budget:
            neg_prob, _, trie_node, index, depth = heapq.heappop(heap)
            if depth >= min(max_tokens, self.depth - m) or not trie_node.children:
                continue
            total = sum(child.count for child in trie_node.children.values())
            for token, child in sorted(trie_node.children.items(), key=lambda item: (-item[1].count, item[0])):
                prob = -neg_prob * child.count / total
                if prob < min_prob or len(tokens) >= budget:
                    break
                tokens.append(token)
                parents.append(index)
                probs.append(prob)
                heapq.heappush(heap, (-prob, tie, child, len(tokens) - 1, depth + 1))
                tie += 1
            if len(tokens) >= budget:
                break
        return tokens, parents, probs


class SuffixCache:
    """The earlier requests' outputs in one SuffixTrie, at most `max_tokens` tokens of them (the oldest dropped first),
    each under its prompt's key so that a prompt that runs again can take its own earlier output out (see the module)."""

    def __init__(self, depth: int, max_tokens: int = 16384):
        self.trie = SuffixTrie(depth)
        self.max_tokens = max_tokens
        self.outputs: OrderedDict[tuple, list[int]] = OrderedDict()
        self.tokens = 0

    def forget(self, key: tuple) -> None:
        output = self.outputs.pop(key, None)
        if output is not None:
            self.trie.add(output, sign=-1)
            self.tokens -= len(output)

    def remember(self, key: tuple, output: list[int]) -> None:
        self.forget(key)
        output = output[-self.max_tokens:]
        while self.outputs and self.tokens + len(output) > self.max_tokens:
            self.forget(next(iter(self.outputs)))
        if output:
            self.trie.add(output)
            self.outputs[key] = list(output)
            self.tokens += len(output)


def prompt_key(prompt: list[int]) -> tuple:
    return tuple(prompt)


class SuffixSource:
    """One row's suffix drafts: its own trie (prompt, then every committed token) and the shared cache of earlier
    outputs. `extend` with committed tokens, `propose` / `propose_tree` for the round."""

    def __init__(self, prompt: list[int], cache: SuffixCache | None, max_depth: int, min_prob: float, depth: int):
        self.trie = SuffixTrie(depth)
        self.text = list(prompt)
        self.trie.extend(prompt)
        self.cache, self.max_depth, self.min_prob = cache, max_depth, min_prob

    def extend(self, tokens: list[int]) -> None:
        self.text.extend(tokens)
        self.trie.extend(tokens)

    def propose(self, max_tokens: int) -> tuple[list[int], list[float]]:
        if max_tokens <= 0:
            return [], []
        own = self.trie.speculate(self.text, self.max_depth, max_tokens, self.min_prob)
        if self.cache is not None:
            shared = self.cache.trie.speculate(self.text, self.max_depth, max_tokens, self.min_prob)
            if sum(shared[1]) > sum(own[1]) or (sum(shared[1]) == sum(own[1]) and shared[2] > own[2]):
                own = shared
        return own[0], own[1]

    def propose_tree(self, max_tokens: int, budget: int) -> tuple[list[int], list[int]]:
        if max_tokens <= 0 or budget <= 0:
            return [], []
        trees = [self.trie.speculate_tree(self.text, self.max_depth, budget, max_tokens, self.min_prob)]
        if self.cache is not None:
            trees.append(self.cache.trie.speculate_tree(self.text, self.max_depth, budget, max_tokens, self.min_prob))
        tokens, parents, _ = max(trees, key=lambda tree: sum(tree[2]))  # a tie: the row's own (the first)
        return tokens, parents


class SuffixDrafter(HostTextDrafter):
    """Suffix decoding's drafts (point masses: probs None), a chain of at most gamma or, with `budget`, a tree of at
    most `budget` nodes. Rows of a static batch learn nothing from each other while it runs; `cache` (SuffixCache or
    None) is what earlier batches (served: earlier requests) left. `forwards` stays 0: no model."""

    def __init__(self, cache: SuffixCache | None, max_depth: int = 8, min_prob: float = 0.1,
                 budget: int | None = None, depth: int = 24):
        if max_depth < 1 or not 0.0 <= min_prob <= 1.0:
            raise ValueError(f"suffix needs max_depth >= 1 and 0 <= min_prob <= 1, got {max_depth}, {min_prob}")
        self.cache, self.max_depth, self.min_prob, self.budget, self.depth = cache, max_depth, min_prob, budget, depth

    def reset(self):
        self.rows: list[SuffixSource] = []
        self._observed = self._observed_drafts = None
        self.last_drafts: list[list[int]] = []
        self.last_tree = None

    def add_rows(self, prompt_ids, prompt_mask, host=None):
        """Each joining row's own trie of its prompt; its prompt's earlier output leaves the shared cache."""
        prompts = unpadded(prompt_ids, prompt_mask, host)
        if self.cache is not None:
            for prompt in prompts:  # a prompt that runs again never drafts from its own earlier output
                self.cache.forget(prompt_key(prompt))
        self.rows += [SuffixSource(p, self.cache, self.max_depth, self.min_prob, self.depth) for p in prompts]
        self.device = prompt_ids.device

    def propose(self, last_tokens, max_tokens, row_limits=None):
        limits = row_limits if row_limits is not None else [max_tokens] * len(self.rows)
        for row, token in enumerate(self._last_tokens_host(last_tokens)):
            self.rows[row].extend([token])
        if self.budget is not None:
            return self._propose_tree(max_tokens, limits)
        self.last_tree = None
        drafts = [source.propose(min(max_tokens, limit))[0] for source, limit in zip(self.rows, limits)]
        self.last_drafts = drafts
        width = max((len(d) for d in drafts), default=0)
        tokens = np.zeros((len(drafts), width), dtype=np.int64)
        for row, draft in enumerate(drafts):
            tokens[row, :len(draft)] = draft
        lengths = np.array([len(d) for d in drafts], dtype=np.int64)
        return Proposal(host_to_device(tokens, self.device), None, host_to_device(lengths, self.device))

    def _propose_tree(self, max_tokens, limits):
        trees = [source.propose_tree(min(max_tokens, limit), self.budget) for source, limit in zip(self.rows, limits)]
        self.last_tree = trees
        return tree_proposal(trees, self.device)


def remember_outputs(cache: SuffixCache | None, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, records) -> None:
    """After a batch: each row's output joins the cache of earlier outputs, under its prompt's key."""
    if cache is None:
        return
    for prompt, record in zip(unpadded(prompt_ids, prompt_mask), records):
        cache.remember(prompt_key(prompt), list(record.output_ids))
