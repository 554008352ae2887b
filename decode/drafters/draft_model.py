"""A smaller causal LM as the drafter (Leviathan et al. 2023)."""
from __future__ import annotations

import torch

from decode.drafters.base import Drafter, Proposal
from decode.kv import KVState
from decode.sampling import logits_to_probs, sample
from decode.settings import Sampling


class DraftModelDrafter(Drafter):
    """Drafts autoregressively with its own KV cache.

    Cache invariant between rounds: it holds every committed token of a row except the last one,
    and, after a row accepted all G drafts, except also the last draft (which was never fed); that
    draft is fed first in the next round as a "catch-up" slot, masked in rows that do not need it.
    """

    def __init__(self, model, target_vocab_size: int, sampling: Sampling,
                 generator: torch.Generator | None = None):
        self.model = model
        self.target_vocab_size = target_vocab_size
        self.sampling = sampling
        self.generator = generator
        self.state = KVState()
        self.input_vocab_size = model.get_input_embeddings().num_embeddings

    @property
    def forwards(self) -> int:
        return self.state.forwards

    def start(self, prompt_ids, prompt_mask):
        self.state = KVState()
        self.state.forward(self.model, prompt_ids, prompt_mask, last_only=True)
        self.catchup_tokens = prompt_ids[:, -1]  # unused until a round fully accepts
        self.catchup_mask = torch.zeros_like(prompt_ids[:, -1])
        self.catchup_any = False

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [B, V_d] -> [B, V_t]: tokens outside the draft's vocabulary get q = 0."""
        extra = self.target_vocab_size - logits.shape[-1]
        if extra > 0:
            return torch.nn.functional.pad(logits, (0, extra), value=float("-inf"))
        return logits[..., : self.target_vocab_size]

    def propose(self, last_tokens, num_tokens):
        # an id the draft cannot embed (a padded row of a bigger target) only costs acceptance
        last_tokens = last_tokens.clamp(max=self.input_vocab_size - 1)
        if self.catchup_any:
            input_ids = torch.stack([self.catchup_tokens, last_tokens], dim=1)  # [B, 2]
            input_mask = torch.stack([self.catchup_mask, torch.ones_like(last_tokens)], dim=1)
        else:
            input_ids, input_mask = last_tokens[:, None], None
        tokens, probs = [], []
        for _ in range(num_tokens):
            logits = self._to_target_vocab(self.state.forward(self.model, input_ids, input_mask, last_only=True)[:, -1])
            if self.sampling.do_sample:
                q = logits_to_probs(logits, self.sampling.temperature, self.sampling.top_k, self.sampling.top_p)
                token = sample(q, self.generator)
                probs.append(q)
            else:
                token = logits.argmax(dim=-1)
            tokens.append(token)
            input_ids, input_mask = token[:, None], None
        drafted = torch.stack(tokens, dim=1)  # [B, G]
        self.last_proposal = drafted
        return Proposal(drafted, torch.stack(probs, dim=1) if probs else None)

    def commit(self, accepted_len, accepted_len_host):
        drafted = self.last_proposal.shape[1]
        # this round fed [last token, d_1 .. d_{G-1}] (after the catch-up slot, if any)
        kept = accepted_len.clamp(max=drafted - 1) + 1
        self.state.keep_prefix_of_last(drafted, kept, min(max(accepted_len_host), drafted - 1) + 1)
        full = accepted_len == drafted
        self.catchup_tokens = self.last_proposal[:, -1]
        self.catchup_mask = full.long()
        self.catchup_any = any(a == drafted for a in accepted_len_host)

    def select_rows(self, rows):
        self.state.select_rows(rows)
        self.catchup_tokens = self.catchup_tokens[rows]
        self.catchup_mask = self.catchup_mask[rows]
