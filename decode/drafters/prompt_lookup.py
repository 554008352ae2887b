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

import torch

from decode.drafters.base import Drafter, Proposal
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
        if not self.tokens or max_tokens <= 0:
            return []
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
            return []
        return self.tokens[best_end + 1: best_end + 1 + max_tokens]


def lookup(history: list[int], ngram_max: int, ngram_min: int, max_tokens: int) -> list[int]:
    """The prompt-lookup draft for one text: see NgramIndex.propose."""
    return NgramIndex(history).propose(ngram_max, ngram_min, max_tokens)


class PromptLookupDrafter(Drafter):
    """Deterministic drafts (q a point mass: probs None). Each row's text lives on the host: the prompt without
    padding, then each round's last token (the correction or bonus token, or the prefill's token) when it
    arrives with `propose`, then the drafts `commit` says were accepted. `forwards` stays 0: no model."""

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"prompt lookup needs 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.ngram_max, self.ngram_min = ngram_max, ngram_min

    def start(self, prompt_ids, prompt_mask):
        ids, mask = prompt_ids.tolist(), prompt_mask.tolist()
        self.rows = [NgramIndex([t for t, m in zip(row, row_mask) if m]) for row, row_mask in zip(ids, mask)]
        self.device = prompt_ids.device
        self._observed = self._observed_drafts = None

    def propose(self, last_tokens, max_tokens, row_limits=None):
        limits = row_limits if row_limits is not None else [max_tokens] * len(self.rows)
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

    def commit(self, accepted_len, accepted_len_host, drafted_host):
        for row, accepted in enumerate(accepted_len_host):
            self.rows[row].extend(self.last_drafts[row][:accepted])

    def select_rows(self, rows):
        kept = rows.tolist()
        self.rows = [self.rows[r] for r in kept]
        self._keep_observed(kept)
