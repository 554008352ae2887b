"""Prompt lookup decoding (Saxena 2023; transformers' PromptLookupCandidateGenerator, vLLM's ngram proposer):
the tokens that followed the latest earlier occurrence of the row's last n tokens are the draft. No model."""
from __future__ import annotations

import torch

from decode.drafters.base import Drafter, Proposal


def lookup(history: list[int], ngram_max: int, ngram_min: int, max_tokens: int) -> list[int]:
    """The continuation of the most recent earlier match of history's last n tokens, n from ngram_max down
    to ngram_min; [] when none matches.

    The most recent match (vLLM's choice; transformers takes the first) follows the text being written
    now, which is what repeats in code and in edits of the prompt.
    """
    for n in range(min(ngram_max, len(history) - 1), ngram_min - 1, -1):
        tail = history[-n:]
        for start in range(len(history) - n - 1, -1, -1):  # an occurrence ending before the tail itself
            if history[start:start + n] == tail:
                continuation = history[start + n:start + n + max_tokens]
                if continuation:
                    return continuation
    return []


class PromptLookupDrafter(Drafter):
    """Deterministic drafts (q a point mass: probs None). Each row's history is kept on the host: the
    prompt without padding, then every committed token."""

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"prompt lookup needs 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.ngram_max, self.ngram_min = ngram_max, ngram_min

    def start(self, prompt_ids, prompt_mask):
        ids, mask = prompt_ids.tolist(), prompt_mask.tolist()
        self.history = [[t for t, m in zip(row, row_mask) if m] for row, row_mask in zip(ids, mask)]
        self.device = prompt_ids.device

    def propose(self, last_tokens, max_tokens, row_limits=None):
        limits = row_limits if row_limits is not None else [max_tokens] * len(self.history)
        drafts = []
        for row, token in enumerate(last_tokens.tolist()):
            self.history[row].append(token)
            drafts.append(lookup(self.history[row], self.ngram_max, self.ngram_min, min(max_tokens, limits[row])))
        width = max((len(d) for d in drafts), default=0)
        tokens = torch.zeros(len(drafts), width, dtype=torch.long)
        for row, draft in enumerate(drafts):
            tokens[row, :len(draft)] = torch.tensor(draft, dtype=torch.long)
        self.last_proposal = tokens
        lengths = torch.tensor([len(d) for d in drafts], dtype=torch.long)
        return Proposal(tokens.to(self.device), None, lengths.to(self.device))

    def commit(self, accepted_len, accepted_len_host):
        for row, accepted in enumerate(accepted_len_host):
            self.history[row].extend(self.last_proposal[row, :accepted].tolist())

    def select_rows(self, rows):
        self.history = [self.history[r] for r in rows.tolist()]
