"""Drafters that read the target's hidden states (decode/head_models.py): an EAGLE-3 head and Medusa heads, chains of up
to gamma drafts per row, in static batches and under load, greedy or sampled (the drafted token's q is the head's
softmax, warped as the target's is; a token outside an EAGLE-3 head's draft vocabulary has q = 0).

The engine hands the drafter the target's hidden states of each forward (`take_features`): the prompt's at prefill,
and each verification's columns [last token, d_1 .. d_G]. A row's accepted prefix (its last token and accepted
drafts) is what the target really computed, so those columns' states are what the head reads next.
"""
from __future__ import annotations

import numpy as np
import torch

from decode.drafters.base import Drafter, Proposal, pad_to_vocab, right_aligned
from decode.kv import KVState, host_to_device, joined, on_device
from decode.sampling import logits_to_probs, sample
from decode.static_kv import new_state
from decode.settings import Sampling
from decode.tree_layout import depths_and_ranks


class _HeadDrafter(Drafter):
    """What both kinds share: the target's layers they read, the features handed over, each round's lengths, and
    the choice of a token from logits over the target's vocabulary."""

    def __init__(self, head, target_vocab_size: int, sampling: Sampling, generator: torch.Generator | None = None):
        self.head, self.target_vocab_size = head, target_vocab_size
        self.sampling, self.generator = sampling, generator
        self.target_layers = head.target_layers
        self._incoming: torch.Tensor | None = None

    def take_features(self, features):
        self._incoming = features

    def _features(self) -> torch.Tensor:
        features, self._incoming = self._incoming, None
        if features is None:
            raise RuntimeError(f"{type(self).__name__}: the engine handed over no hidden states of the target")
        return features

    def _lengths(self, max_tokens: int, row_limits: list[int] | None, rows: int, cap: int | None = None) -> list[int]:
        limits = row_limits if row_limits is not None else [max_tokens] * rows
        return [max(0, min(limit, max_tokens, cap if cap is not None else max_tokens)) for limit in limits]

    def _choose(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits [B, V_t] -> (token [B], q [B, V_t] under sampling, else None)."""
        if not self.sampling.do_sample:
            return logits.argmax(dim=-1), None
        q = logits_to_probs(logits, self.sampling.temperature, self.sampling.top_k, self.sampling.top_p)
        return sample(q, self.generator), q

    def _no_drafts(self, last_tokens: torch.Tensor) -> Proposal:
        self.last_proposal = last_tokens.new_zeros(last_tokens.shape[0], 0)
        return Proposal(self.last_proposal, None, torch.zeros_like(last_tokens))


class Eagle3Drafter(_HeadDrafter):
    """An EAGLE-3 head with a KV cache of its own (one layer). The head's cache entry for position i reads the target's
    hidden state at i and the embedding of token i + 1.

    Between rounds each row holds `pending` target states (those of its positions the head has not read, the last
    one that of the token before its last committed one) and the tokens after each but the last (that one is the
    next `propose`'s last token). A round feeds them in one forward (right aligned, masked where a row has fewer),
    whose last logits draft d_1; each later draft step feeds the head's own pre-norm state with the token drafted.
    After the verification those draft steps' cache entries go (they read the head's states, not the target's), and
    the pending states are the verification's columns of the row's last token and its accepted drafts."""

    def __init__(self, head, target_vocab_size, sampling, generator=None, tree=None):
        super().__init__(head, target_vocab_size, sampling, generator)
        self.index = head.draft_to_target  # [V_draft] target ids
        self.state: KVState | None = None
        # a token tree instead of a chain (decode/drafters/draft_tree.py: StaticTree, DynamicTree, auto's policy): its
        # nodes are drafted from the head's own probabilities, each node's forward reading its parent's head state
        self.tree = tree
        self.embedding_size = head.embed_tokens.num_embeddings  # the ids it can read (the target's vocabulary)
        self.input_vocab_size = min(len(self.index), self.embedding_size)  # the tokens it can rank (a tree's ranks)

    @property
    def forwards(self) -> int:
        return 0 if self.state is None else self.state.forwards

    def reset(self):
        self.state = None
        self.features: list[torch.Tensor] = []  # per row [k, F]
        self.tokens: list[list[int]] = []  # per row k - 1 ids
        self.fed, self.speculative_columns, self.last_host = False, 0, None
        self._observed = self._observed_drafts = None

    def add_rows(self, prompt_ids, prompt_mask, host=None):
        """Read the prompts' states but the last (paired with the next prompt token) in one head forward; the last
        waits for the token the target's prefill chose."""
        features = self._features()  # [G, P, F]
        self.device = prompt_ids.device
        width = prompt_ids.shape[1]
        mask_host = host[1] if host is not None else prompt_mask.cpu().numpy()  # the cache's host mask: no read
        if width > 1:
            ids, mask, read = prompt_ids[:, 1:], mask_host[:, :-1], features[:, :-1]
        else:  # nothing to read yet: one masked column gives the rows a cache to join
            ids, mask, read = prompt_ids, np.zeros_like(mask_host), torch.zeros_like(features)
        state = new_state(self.head)  # the compiled modes' static cache where the head has a compiled step
        state.forward(self.head, ids.clamp(max=self.head.embed_tokens.num_embeddings - 1), mask, last_only=True,
                      features=read)
        self.state = joined(self.state, state)
        self.features += [features[row, -1:] for row in range(features.shape[0])]
        self.tokens += [[] for _ in range(features.shape[0])]

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [..., V_d] -> [..., V_t], -inf outside the draft vocabulary."""
        out = logits.new_full((*logits.shape[:-1], self.target_vocab_size), float("-inf"))
        return out.index_copy_(-1, self.index, logits)

    def _catch_up(self, last_tokens: torch.Tensor):
        """The pending pairs as one forward's inputs: ids [B, K] (the tokens after each state, the last token last),
        the host mask [B, K] or None, features [B, K, F] (right aligned)."""
        width = max(len(f) for f in self.features)
        if width == 1:
            return last_tokens.clamp(max=self.embedding_size - 1)[:, None], None, \
                torch.stack([f[0] for f in self.features])[:, None]
        last = [min(t, self.embedding_size - 1) for t in self._last_tokens_host(last_tokens)]
        ids, mask = right_aligned([tokens + [last[row]] for row, tokens in enumerate(self.tokens)])
        features = torch.stack([torch.nn.functional.pad(f, (0, 0, width - len(f), 0)) for f in self.features])
        return host_to_device(ids, self.device), mask, features

    def propose(self, last_tokens, max_tokens, row_limits=None):
        lengths = self._lengths(max_tokens, row_limits, len(self.features))
        num_tokens = max(lengths, default=0)
        self.last_host = None
        if num_tokens == 0:  # nothing read: the pending pairs grow by this round's at commit
            self.fed = False
            self.last_host = self._last_tokens_host(last_tokens)
            return self._no_drafts(last_tokens)
        shape = self.tree.shape_for_round(num_tokens) if self.tree is not None else None
        if self.tree is not None and shape is None:  # auto: no drafting this round
            self.fed, self.last_host = False, self._last_tokens_host(last_tokens)
            return self._no_drafts(last_tokens)
        ids, mask, features = self._catch_up(last_tokens)
        logits = self.state.forward(self.head, ids, mask, last_only=True, features=features)[:, -1]
        if shape is not None:
            self.fed, self.region = True, self.head.last_hidden[:, -1:]  # [B, 1 + R, H]: the root's, then the nodes'
            proposal = self.tree.draft(self, self._to_target_vocab(logits), lengths, shape)
            self.last_proposal, self.last_layout = proposal.tokens, proposal.layout
            return proposal
        tokens, probs = [], []
        for step in range(num_tokens):
            token, q = self._choose(self._to_target_vocab(logits))
            tokens.append(token)
            if q is not None:
                probs.append(q)
            if step + 1 < num_tokens:
                hidden = self.head.last_hidden[:, -1:]
                logits = self.state.forward(self.head, token[:, None], None, last_only=True, hidden=hidden)[:, -1]
        self.fed, self.speculative_columns = True, num_tokens - 1
        self.last_proposal = torch.stack(tokens, dim=1)
        return Proposal(self.last_proposal, torch.stack(probs, dim=1) if probs else None,
                        host_to_device(lengths, last_tokens.device))

    def tree_forward(self, ids: torch.Tensor, parents, new_round: bool) -> torch.Tensor:
        """One head forward over tree nodes ids [B, F] (parents: region columns, -1: the root) -> their logits over the
        target's vocabulary [B, F, V_t]; each node reads its parent's head state (the root's: the round's first
        forward's last)."""
        index = on_device(parents, self.region.device) + 1  # [B, F]
        hidden = self.region.gather(1, index[:, :, None].expand(-1, -1, self.region.shape[-1]))
        valid = torch.ones_like(ids, dtype=torch.bool)
        logits = self.state.forward_tree(self.head, ids.clamp(max=self.embedding_size - 1), parents, valid,
                                         new_round, hidden=hidden)
        self.region = torch.cat([self.region, self.head.last_hidden], dim=1)
        return self._to_target_vocab(logits)

    def _commit_tree(self, path_host: list[list[int]], features: torch.Tensor) -> None:
        """A tree round: its nodes' cache columns go (they read the head's states), and each row's pending states are
        the verification's columns of its root and accepted path (node i: column i + 1)."""
        if hasattr(self.tree, "observe"):
            self.tree.observe(path_host, self.last_layout.host)
        if self.state.region_width:
            self.state.keep_region(np.zeros((len(path_host), self.state.region_width), dtype=bool))
        drafts = self._drafts_host(self.last_proposal) if any(path_host) else [[]] * len(path_host)
        width = 1 + max(len(path) for path in path_host)
        columns = np.zeros((len(path_host), width), dtype=np.int64)  # one copy: each row's root and path columns
        for row, path in enumerate(path_host):
            columns[row, 1: 1 + len(path)] = [node + 1 for node in path]
        index = host_to_device(columns, features.device)
        kept = features.gather(1, index[:, :, None].expand(-1, -1, features.shape[-1]))  # [B, width, F]
        self.features = [kept[row, : 1 + len(path)] for row, path in enumerate(path_host)]
        self.tokens = [[drafts[row][node] for node in path] for row, path in enumerate(path_host)]

    def commit(self, accepted_len, accepted_len_host, drafted_host, path_host=None):
        features = self._features()  # [B, G + 1, F]: the verification's columns
        rows = features.shape[0]
        if not self.fed:  # G = 0: the round's one column joins the pending pairs, after the last token it read
            for row in range(rows):
                self.features[row] = torch.cat([self.features[row], features[row, :1]])
                self.tokens[row] = self.tokens[row] + [self.last_host[row]]
            return
        if path_host is not None:
            self._commit_tree(path_host, features)
            return
        if self.speculative_columns:
            self.state.keep_prefix_of_last(self.speculative_columns, torch.zeros_like(accepted_len), 0, [0] * rows)
        drafts = self._drafts_host(self.last_proposal) if any(accepted_len_host) else [[]] * rows
        self.features = [features[row, : accepted + 1] for row, accepted in enumerate(accepted_len_host)]
        self.tokens = [list(drafts[row][:accepted]) for row, accepted in enumerate(accepted_len_host)]

    def select_rows(self, rows):
        kept = rows.tolist()
        self.state.select_rows(kept)
        self._keep_observed(kept)
        self.features = [self.features[r] for r in kept]
        self.tokens = [self.tokens[r] for r in kept]


class MedusaDrafter(_HeadDrafter):
    """Medusa heads: each row's drafts come from the target's last hidden state at its last accepted position (head k
    drafts the token k + 2 places after it, i.e. d_k after the last committed token). Stateless between rounds but
    for that state [B, H]; at most as many drafts as heads.

    A token tree (Cai et al. 2024's tree attention): the children of every node at depth d come from head d + 1,
    whatever the node (the heads read the same state); greedy they are its top-k, sampled i.i.d. draws from its q. One
    call of the heads per round serves every depth (decode/drafters/draft_tree.py asks for each depth's logits)."""

    state = None  # no cache

    def __init__(self, head, target_vocab_size, sampling, generator=None, tree=None):
        super().__init__(head, target_vocab_size, sampling, generator)
        self.count, self.tree = 0, tree
        self.input_vocab_size = head.config.vocab_size  # the tokens it can rank (a tree's ranks)

    @property
    def forwards(self) -> int:
        return self.count

    def reset(self):
        self.last: torch.Tensor | None = None  # [B, H]
        self._observed = self._observed_drafts = None

    def add_rows(self, prompt_ids, prompt_mask, host=None):
        features = self._features()[:, -1]  # the prompt's last position (left padded: always real)
        self.last = features if self.last is None else torch.cat([self.last, features])

    def _heads(self, count: int) -> torch.Tensor:
        """The first `count` heads' logits over the target's vocabulary [B, count, V_t]."""
        self.count += count  # a head per draft depth: the probes' c times one
        return pad_to_vocab(self.head(self.last, count).float(), self.target_vocab_size)

    def propose(self, last_tokens, max_tokens, row_limits=None):
        lengths = self._lengths(max_tokens, row_limits, self.last.shape[0], cap=self.head.num_heads)
        num_tokens = max(lengths, default=0)
        shape = self.tree.shape_for_round(num_tokens) if self.tree is not None and num_tokens else None
        if num_tokens == 0 or (self.tree is not None and shape is None):
            return self._no_drafts(last_tokens)
        if shape is not None:
            depth = shape if isinstance(shape, int) else max(depths_and_ranks(shape)[0])
            self.round_logits = self._heads(depth)
            proposal = self.tree.draft(self, self.round_logits[:, 0], lengths, shape)
            self.last_proposal, self.last_layout = proposal.tokens, proposal.layout
            return proposal
        logits = self._heads(num_tokens)  # [B, G, V_t]
        chosen = [self._choose(logits[:, k]) for k in range(num_tokens)]
        self.last_proposal = torch.stack([token for token, _ in chosen], dim=1)
        probs = torch.stack([q for _, q in chosen], dim=1) if self.sampling.do_sample else None
        return Proposal(self.last_proposal, probs, host_to_device(lengths, last_tokens.device))

    def tree_forward(self, ids: torch.Tensor, parents, new_round: bool) -> torch.Tensor:
        """The logits of the children of tree nodes ids [B, F], all at one depth d (the tree asks depth by depth,
        from 1): head d + 1's, the same for every node [B, F, V_t]."""
        self.depth = 1 if new_round else self.depth + 1
        return self.round_logits[:, self.depth, None].expand(-1, ids.shape[1], -1)

    def commit(self, accepted_len, accepted_len_host, drafted_host, path_host=None):
        features = self._features()  # [B, G + 1, H]: a chain's columns, or a tree's root and nodes (node i: i + 1)
        if path_host is None:
            self.last = features[torch.arange(features.shape[0], device=features.device), accepted_len]
            return
        if hasattr(self.tree, "observe"):
            self.tree.observe(path_host, self.last_layout.host)
        columns = host_to_device([path[-1] + 1 if path else 0 for path in path_host], features.device)
        self.last = features[torch.arange(features.shape[0], device=features.device), columns]

    def select_rows(self, rows):
        kept = rows.tolist()
        self._keep_observed(kept)
        self.last = self.last[host_to_device(kept, self.last.device)]


def head_drafter(head, target_vocab_size: int, sampling: Sampling, generator: torch.Generator | None = None,
                 tree=None):
    """The drafter of a head (decode/head_models.py) by its kind, drafting `tree` where given (None: a chain)."""
    kind = {"eagle3": Eagle3Drafter, "medusa": MedusaDrafter}[head.kind]  # decode/head_models.py KINDS
    return kind(head, target_vocab_size, sampling, generator, tree=tree)


def is_head(model) -> bool:
    """Whether a draft is a head (it reads the target's hidden states) rather than a causal LM."""
    from decode.head_models import KINDS  # imported when asked: decode/head_models.py loads transformers

    return getattr(model, "kind", None) in KINDS
