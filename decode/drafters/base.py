"""The drafter interface: propose up to max_tokens drafts per row with their q, then learn from the verification."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from decode.kv import host_to_device
from decode.tree_layout import TreeLayout


def unpadded(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, host: tuple | None = None) -> list[list[int]]:
    """Left-padded prompts [B, P] (mask [B, P]) -> each row's tokens without its padding: from `host` (ids, mask as
    numpy [B, P]) where the engine gives it, else a host read."""
    ids, mask = host if host is not None else (prompt_ids.tolist(), prompt_mask.tolist())
    return [[int(t) for t, m in zip(row, row_mask) if m] for row, row_mask in zip(ids, mask)]


def right_aligned(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Token rows of different lengths as host ids and mask [B, longest] (int64), each row right aligned (left
    padded with 0, mask 0 there): a catch-up forward's inputs."""
    width = max(map(len, rows))
    ids = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for row, tokens in enumerate(rows):
        ids[row, width - len(tokens):] = tokens
        mask[row, width - len(tokens):] = 1
    return ids, mask


def pad_to_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits [..., V] -> [..., vocab_size]: the ids past V get -inf (q = 0), logits past vocab_size are dropped."""
    extra = vocab_size - logits.shape[-1]
    if extra > 0:
        return torch.nn.functional.pad(logits, (0, extra), value=float("-inf"))
    return logits[..., :vocab_size]


@dataclass
class Proposal:
    """One round's drafts. G = tokens.shape[1] is the longest row's draft: a drafter trims its proposal to
    max(lengths), so a round in which no row drafts has G = 0 and the engine takes a plain target step."""
    tokens: torch.Tensor  # [B, G] drafted token ids; row b's entries past lengths[b] are padding (never accepted)
    probs: torch.Tensor | None  # [B, G, V_target] q of each drafted position; None = deterministic drafter (point mass)
    lengths: torch.Tensor | None = None  # [B] long, each <= G: row b's drafts are tokens[b, :lengths[b]]; None = all G
    # a token tree (DeviceTree, decode/tree_layout.py): the structure of tokens [B, N]; probs [B, N, V] then holds the q
    # each node was drawn from (its parent's), None: point masses. None: a chain (lengths apply)
    layout: "DeviceTree | None" = None


class DeviceTree:
    """A round's token tree on the device, as a drafter proposes it and the engine verifies it without a host read:
    parents [B, N] long (-1: the root; each before its node), valid [B, N] bool (False: padding), columns [B, N] long
    (the draft cache column each node was fed at this round, -1: never fed), and two bounds the host knows: max_depth
    (no valid node deeper) and max_children (no node, the root included, with more valid children). The host learns
    the tree with the round's one read: `read` sets `host`, its TreeLayout (decode/generate.py TreeRound).

    widths: per row, the nodes a round of that row alone verifies, where the drafter pads a row's tree past its valid
    nodes (a static tree's nodes within the row's length, its rank padding included; a dynamic tree's budget of the
    candidates within the row's length, whether or not the sampling filter allows each); None where a row alone
    verifies its valid nodes. The replay prices a round by them (eval/replay.py round_shape)."""

    def __init__(self, parents: torch.Tensor, valid: torch.Tensor, columns: torch.Tensor, max_depth: int,
                 max_children: int, widths: list[int] | None = None):
        self.parents, self.valid, self.columns = parents, valid, columns
        self.max_depth, self.max_children, self.widths = max_depth, max_children, widths
        self.host: TreeLayout | None = None

    @classmethod
    def of(cls, parents: np.ndarray, valid: np.ndarray, device, columns: np.ndarray | None = None,
           widths: list[int] | None = None) -> "DeviceTree":
        """A tree the host built ([B, N] arrays): copied to the device without a sync, its bounds counted here."""
        layout = TreeLayout(parents, valid)
        columns = np.full(layout.parents.shape, -1, dtype=np.int64) if columns is None else columns
        return cls(host_to_device(layout.parents, device), host_to_device(layout.valid, device, torch.bool),
                   host_to_device(np.asarray(columns, dtype=np.int64), device), layout.max_depth,
                   layout.children.shape[2], widths)

    def verify_parents(self) -> torch.Tensor:
        """[B, N + 1] parents in verification columns (the root first, its parent -1: the committed prefix)."""
        shifted = torch.where(self.parents >= 0, self.parents + 1, 0)
        return torch.cat([torch.full_like(shifted[:, :1], -1), shifted], dim=1)

    def verify_valid(self) -> torch.Tensor:
        return torch.cat([torch.ones_like(self.valid[:, :1]), self.valid], dim=1)

    def children(self) -> torch.Tensor:
        """[B, N + 1, max_children]: each verification column's valid children (columns) in node order, -1 pads."""
        batch, nodes = self.parents.shape
        width = max(self.max_children, 1)
        earlier = torch.ones(nodes, nodes, dtype=torch.bool, device=self.parents.device).tril(-1)  # [N, N] j < i
        siblings = (self.parents[:, :, None] == self.parents[:, None, :]) & self.valid[:, None, :] & earlier
        ranks = siblings.sum(dim=2)  # [B, N] each node's rank among its parent's children
        slot = (self.parents + 1) * width + ranks
        slot = torch.where(self.valid & (ranks < width), slot, (nodes + 1) * width)  # padding: a slot cut off below
        table = torch.full((batch, (nodes + 1) * width + 1), -1, dtype=torch.long, device=self.parents.device)
        columns = torch.arange(1, nodes + 1, device=self.parents.device).expand(batch, -1)
        return table.scatter(1, slot, columns)[:, :-1].reshape(batch, nodes + 1, width)

    def readout(self) -> torch.Tensor:
        """What the round's host read copies of the tree, [B, 3N]: parents, valid, columns."""
        return torch.cat([self.parents, self.valid.long(), self.columns], dim=1)

    def read(self, values: list[list[int]]) -> TreeLayout:
        """The readout's host values -> `host`, the tree's TreeLayout (columns included)."""
        values = np.asarray(values, dtype=np.int64).reshape(len(values), 3, -1)
        self.host = TreeLayout(values[:, 0], values[:, 1].astype(bool), values[:, 2])
        return self.host


class Drafter(ABC):
    """A source of draft tokens for a batch of rows.

    The engine calls, per batch: `start` once with the prompts; then per round `propose` with each row's
    last committed token, `commit` with the verification result, and `select_rows` when rows finish. After
    `start` and after each round's verification, `observe` hands over host copies of what the engine read.
    The drafter owns the length of each row's draft (its schedule); a row may draft nothing. A new
    drafting method is one subclass (draft model, prompt lookup, early exit).

    Serving (decode/arrivals.py Load): requests join the running batch between rounds. `reset` empties the
    drafter (no rows; what it learns across batches is kept), `add_rows` appends the joining requests' rows at
    the end, after which the engine `observe`s every row's last token; `start` is reset, then add_rows.
    """

    forwards: int = 0  # model forwards spent drafting since `start` (its prefill included), for the records
    # the target's hidden states it reads (decode/hidden.py numbering: i < L the input of decoder layer i, L the final
    # norm's output); () reads none. The engine then hands it, by `take_features`, those of every target forward
    target_layers: tuple[int, ...] = ()
    _observed: list[int] | None = None  # each row's last committed token on the host, from `observe`
    _observed_drafts: list[list[int]] | None = None  # each row's last proposal on the host, from `observe`

    def observe(self, last_tokens: list[int], drafts: list[list[int]] | None = None) -> None:
        """Host copies of what the engine's sync read: each row's last committed token (what the next `propose`
        gets as last_tokens) and, after a round, each row's proposed tokens (the G of `Proposal.tokens`). Reading
        the tensors again would wait on every kernel queued since (a host sync); a drafter that needs them on
        the host takes them from here (`_last_tokens_host`, `_drafts_host`)."""
        self._observed, self._observed_drafts = list(last_tokens), drafts

    def queued(self, requests: int, rate: float | None = None) -> None:
        """Serving, where `reads_queue`: the requests that have arrived and wait for a row, and the rate requests have
        arrived at so far (per second), read from the queue before each admission (a schedule may price a row's
        future by the batch it will run in: RecommendedSchedule.queued)."""

    def timed(self, seconds: float) -> None:
        """The seconds the round it proposed took, from its proposal to its verdict read and commit (a schedule may
        learn what rounds cost on this machine: RecommendedSchedule.timed)."""

    @property
    def reads_queue(self) -> bool:
        """Whether `queued` is heard: the serving loop reads its queue for it only then (a scan of the requests)."""
        return False

    def take_features(self, features: torch.Tensor) -> None:
        """The target's hidden states at `target_layers` [B, S, F] of its last forward, handed over right after it:
        the prompts' (the prefill's columns, before `start` / `add_rows` of those rows) and each round's verification
        (its columns: the last token, then the drafts or tree nodes, before `commit`). Only for target_layers."""
        raise NotImplementedError(f"{type(self).__name__} reads no hidden states")

    def _last_tokens_host(self, last_tokens: torch.Tensor) -> list[int]:
        """last_tokens [B] on the host: as observed, else read (a host sync)."""
        observed, self._observed = self._observed, None
        return observed if observed is not None and len(observed) == last_tokens.shape[0] else last_tokens.tolist()

    def _drafts_host(self, drafts: torch.Tensor) -> list[list[int]]:
        """The last proposal's tokens [B, G] on the host: as observed, else read (a host sync)."""
        observed, self._observed_drafts = self._observed_drafts, None
        return observed if observed is not None and len(observed) == drafts.shape[0] else drafts.tolist()

    def _keep_observed(self, kept: list[int]) -> None:
        """select_rows for the observed last tokens."""
        if self._observed is not None:
            self._observed = [self._observed[r] for r in kept]

    def start(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, host: tuple | None = None) -> None:
        """A new batch: prompt_ids, prompt_mask [B, P], left padded; host: the same as numpy arrays (the engine's
        copy, so that a drafter reads its prompts without a device read), or None."""
        self.reset()
        self.add_rows(prompt_ids, prompt_mask, host)

    def reset(self) -> None:
        """No rows from now on (a new batch, or a serving run whose rows all left)."""
        raise NotImplementedError(f"{type(self).__name__} cannot serve under load (no reset)")

    def add_rows(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, host: tuple | None = None) -> None:
        """Append rows [B', P] (left padded) after the current ones: requests admitted into the running batch,
        whose target prefill has chosen their first token (the engine `observe`s it with every row's). host: as
        in `start`."""
        raise NotImplementedError(f"{type(self).__name__} cannot serve under load (no add_rows)")

    @abstractmethod
    def propose(self, last_tokens: torch.Tensor, max_tokens: int, row_limits: list[int] | None = None) -> Proposal:
        """last_tokens [B]: each row's last committed token (the previous round's correction or bonus token,
        or the prefill's token), not yet seen by the drafter. Returns at most max_tokens drafts per row (the
        round's cap: min(gamma, the largest budget left)), and at most row_limits[b] for row b (its own budget
        before max_new_tokens) where given."""

    @abstractmethod
    def commit(self, accepted_len: torch.Tensor, accepted_len_host: list[int], drafted_host: list[int],
               path_host: list[list[int]] | None = None) -> None:
        """After verification: accepted_len [B] (and the same on the host), how many of the last proposal each
        row kept; drafted_host, how many of its drafts the target verified (its length, clipped to its budget).
        After a tree proposal, path_host: each row's accepted nodes (indices into the proposal), depth by depth."""

    @abstractmethod
    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only these rows [B'] (a CPU tensor: reading it costs no sync) from now on."""


class HostTextDrafter(Drafter):
    """A drafter without a model whose rows are host texts (prompt lookup's NgramIndex, suffix decoding's
    SuffixSource: each `extend`s with committed tokens). `propose` keeps its drafts for `commit`: last_drafts, each
    row's chain, or last_tree, each row's (tokens, parents) of a tree round (None: a chain round)."""

    rows: list
    last_drafts: list[list[int]]
    last_tree: list | None = None

    def commit(self, accepted_len, accepted_len_host, drafted_host, path_host=None):
        if path_host is not None:  # a tree round: the accepted path's tokens join the text
            for row, path in enumerate(path_host):
                self.rows[row].extend([self.last_tree[row][0][node] for node in path])
            return
        if self.last_tree is not None:  # a tree round in which no row matched (G = 0): nothing was accepted
            return
        for row, accepted in enumerate(accepted_len_host):
            self.rows[row].extend(self.last_drafts[row][:accepted])

    def select_rows(self, rows):
        kept = rows.tolist()
        self.rows = [self.rows[r] for r in kept]
        self._keep_observed(kept)
