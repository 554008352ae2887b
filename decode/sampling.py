"""Warping, sampling and the acceptance rules of speculative decoding (and the synthetic one, at a set alpha).

Letters follow Leviathan et al. 2023: p is the target's distribution, q the draft's.
Every distribution here is the *warped* one (temperature, top-k, top-p), in fp32.
"""
from __future__ import annotations

import torch


def logits_to_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None) -> torch.Tensor:
    """[..., V] logits -> [..., V] fp32 probabilities after temperature, top-k and top-p."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # keep the smallest prefix whose mass reaches top_p: drop a token once the mass before it does
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None,
           exponential: torch.Tensor | None = None) -> torch.Tensor:
    """[..., V] probabilities -> [...] token ids; argmax(p / Exp(1)) is an exact draw, with no host sync.
    exponential: the Exp(1) draws [..., V], drawn beforehand (a traced round takes its randomness as an input)."""
    if exponential is None:
        exponential = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return torch.argmax(probs / exponential, dim=-1)


def acceptance_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)) for a drafted token x; q(x) > 0 whenever x was drafted from q."""
    return torch.where(q_x > 0, p_x / q_x.clamp_min(torch.finfo(q_x.dtype).tiny), torch.ones_like(p_x)).clamp(max=1.0)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over the last dim: what to sample from after a rejection.

    Where p == q exactly a rejection has probability 0; if rounding makes one happen anyway the
    residual is empty and p itself is returned.
    """
    residual = (p - q).clamp_min(0.0)
    mass = residual.sum(-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp_min(torch.finfo(p.dtype).tiny), p)


def _leading_run(accepted: torch.Tensor) -> torch.Tensor:
    """[B, G] bool -> [B] length of the all-True prefix of each row."""
    return accepted.long().cumprod(dim=1).sum(dim=1)


def accept_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor,
                  draft_limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification.

    draft_tokens [B, G]; target_logits [B, G+1, V] (position i scores the token after draft i);
    draft_limit [B]: how many of the G drafts each row may accept (gamma clipped to its budget).
    Returns accepted_len [B] and next_token [B]: the target's own argmax after the accepted prefix
    (the correction, or the bonus token after a full accept).
    """
    num_drafted = draft_tokens.shape[1]
    target_tokens = target_logits.argmax(dim=-1)  # [B, G+1]
    positions = torch.arange(num_drafted, device=draft_tokens.device)
    accepted = (draft_tokens == target_tokens[:, :num_drafted]) & (positions < draft_limit[:, None])
    accepted_len = _leading_run(accepted)
    next_token = target_tokens.gather(1, accepted_len[:, None]).squeeze(1)
    return accepted_len, next_token


def accept_sampled(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                   draft_limit: torch.Tensor, generator: torch.Generator | None = None,
                   uniform: torch.Tensor | None = None, exponential: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023).

    draft_tokens [B, G] drawn from draft_probs q [B, G, V]; target_probs p [B, G+1, V]; draft_limit [B]:
    how many of the G drafts row b may accept (positions past it are padding). Draft i is accepted with
    probability min(1, p(x)/q(x)); at the first rejection the next token is drawn from norm(max(0, p - q));
    after a full accept (or with no drafts) from p. The output is distributed exactly as p.

    draft_probs None: a deterministic drafter (prompt lookup), q a point mass on x. Then x is accepted with
    probability p(x), and a rejection draws from norm(max(0, p - onehot(x))), i.e. p with x removed:
    P(next = y) = p(x) [y = x] + (1 - p(x)) p(y) / (1 - p(x)) [y != x] = p(y). Only the one-hot of the
    rejected position is built ([B, V]), never q for all G positions.

    uniform [B, G] and exponential [B, V]: the draws, made beforehand in the order this function makes them (a traced
    round takes its randomness as an input: decode/round_graph.py); None: drawn here from `generator`.
    """
    batch, num_drafted = draft_tokens.shape
    vocab = target_probs.shape[-1]
    p_x = target_probs[:, :num_drafted].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, G]
    if draft_probs is None:
        q_x = torch.ones_like(p_x)  # [B, G]
    else:
        q_x = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)  # [B, G]
    if uniform is None:
        uniform = torch.rand(p_x.shape, generator=generator, device=p_x.device)  # [B, G]
    positions = torch.arange(num_drafted, device=draft_tokens.device)  # [G]
    accepted = (uniform < acceptance_probability(p_x, q_x)) & (positions < draft_limit[:, None])  # [B, G]
    accepted_len = _leading_run(accepted)  # [B]

    p_next = target_probs.gather(1, accepted_len[:, None, None].expand(batch, 1, vocab)).squeeze(1)  # [B, V]
    if num_drafted == 0:
        return accepted_len, sample(p_next, generator, exponential)
    at_rejection = accepted_len.clamp(max=num_drafted - 1)  # [B]; only read where a draft was rejected
    if draft_probs is None:
        rejected_token = draft_tokens.gather(1, at_rejection[:, None])  # [B, 1]
        q_next = torch.zeros_like(p_next).scatter_(-1, rejected_token, 1.0)  # [B, V] point mass
    else:
        q_next = draft_probs.gather(1, at_rejection[:, None, None].expand(batch, 1, vocab)).squeeze(1)  # [B, V]
    rejected = (accepted_len < draft_limit)[:, None]  # [B, 1]
    next_probs = torch.where(rejected, residual_distribution(p_next, q_next), p_next)  # [B, V]
    return accepted_len, sample(next_probs, generator, exponential)


def accept_synthetic(draft_limit: torch.Tensor, num_drafted: int, alpha: float, target_logits: torch.Tensor,
                     target_probs: torch.Tensor | None, generator: torch.Generator | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic acceptance at a set alpha: draft i of row b is accepted iff drafts 1..i-1 were, i < draft_limit[b],
    and an independent Bernoulli(alpha) draw (a uniform from `generator`, on the device) says yes, whatever the
    tokens. The accepted length of g drafts is then a geometric truncated at g: P(a = k) = alpha^k (1 - alpha) for
    k < g, alpha^g for k = g, E[a] = alpha (1 - alpha^g) / (1 - alpha) (eval/leviathan.py expected_accepted).

    draft_limit [B]; target_logits [B, G+1, V]; target_probs: the warped p [B, G+1, V] when sampling, else None.
    Returns accepted_len [B] and next_token [B]: the target's own token after the accepted prefix (its argmax, or a
    draw from p there), as the correction or bonus token of accept_greedy / accept_sampled. The output is a mix of
    the draft's and the target's tokens, not the target's. No host sync."""
    batch = draft_limit.shape[0]
    uniform = torch.rand((batch, num_drafted), generator=generator, device=draft_limit.device)  # [B, G]
    positions = torch.arange(num_drafted, device=draft_limit.device)
    accepted_len = _leading_run((uniform < alpha) & (positions < draft_limit[:, None]))  # [B]
    if target_probs is None:
        return accepted_len, target_logits.argmax(dim=-1).gather(1, accepted_len[:, None]).squeeze(1)
    vocab = target_probs.shape[-1]
    p_next = target_probs.gather(1, accepted_len[:, None, None].expand(batch, 1, vocab)).squeeze(1)  # [B, V]
    return accepted_len, sample(p_next, generator)


def _children_of(children: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
    """children [B, N+1, K], column [B] -> [B, K] the children (verification columns, -1 pads) of each row's column."""
    return children.gather(1, column[:, None, None].expand(-1, 1, children.shape[2])).squeeze(1)


def _tree_columns(tokens: torch.Tensor) -> torch.Tensor:
    """tokens [B, N] -> [B, N+1] by verification column: column 0 is the root (its token is never compared)."""
    return torch.cat([tokens.new_zeros(tokens.shape[0], 1), tokens], dim=1)


def accept_tree_greedy(tokens: torch.Tensor, target_logits: torch.Tensor, children: torch.Tensor, max_depth: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy verification of a token tree (decode/tree_layout.py).

    tokens [B, N] the nodes; target_logits [B, N+1, V] by verification column (0: the root, i + 1: node i);
    children [B, N+1, K] each column's children in rank order (verification columns, -1 pads). From the root, follow
    the first child whose token is the target's argmax at its parent, for at most max_depth steps.
    Returns accepted_len [B], next_token [B] (the target's argmax after the path) and path [B, max_depth] (the
    accepted nodes' indices, depth by depth; -1 past the path). A row on one path only ever follows the tokens the
    target itself would produce: the output equals the target's own.
    """
    target_tokens = target_logits.argmax(dim=-1)  # [B, N+1]
    by_column = _tree_columns(tokens)
    batch = tokens.shape[0]
    column = torch.zeros(batch, dtype=torch.long, device=tokens.device)
    alive = torch.ones(batch, dtype=torch.bool, device=tokens.device)
    path = torch.full((batch, max_depth), -1, dtype=torch.long, device=tokens.device)
    for depth in range(max_depth):
        kids = _children_of(children, column)  # [B, K]
        match = (kids >= 0) & (by_column.gather(1, kids.clamp(min=0)) == target_tokens.gather(1, column[:, None]))
        match &= alive[:, None]
        found = match.any(dim=1)
        chosen = kids.gather(1, match.long().argmax(dim=1, keepdim=True)).squeeze(1)  # the first matching sibling
        column = torch.where(found, chosen, column)
        path[:, depth] = torch.where(found, chosen - 1, -1)
        alive &= found
    accepted_len = (path >= 0).sum(dim=1)
    return accepted_len, target_tokens.gather(1, column[:, None]).squeeze(1), path


def accept_tree_sampled(tokens: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                        children: torch.Tensor, max_depth: int, generator: torch.Generator | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SpecInfer's multi-step speculative sampling over a token tree (Miao et al. 2024, Alg. 2, Thm. 4.2).

    tokens [B, N]; draft_probs [B, N, V]: the q each node was drawn from (its parent's draft distribution; siblings
    drawn i.i.d. from it may repeat a token), or None: every node a point mass (deterministic children: a draft's
    top-k, n-gram matches); target_probs [B, N+1, V] by verification column; children as in accept_tree_greedy.
    At each node on the path, with p the target's distribution there: children are tried in rank order, child x
    accepted with probability min(1, p(x) / q(x)); after a rejection p <- norm(max(0, p - q)) (a point mass: p with
    x removed). When no child is accepted (or the node is a leaf) the next token is drawn from the current p.
    Each step is a rejection sampler of the current p whose proposal is independent of the earlier steps, so the
    token emitted at every depth is distributed exactly as the target's. Returns accepted_len, next_token, path as
    accept_tree_greedy. No host sync.
    """
    batch, vocab = tokens.shape[0], target_probs.shape[-1]
    device = tokens.device
    by_column = _tree_columns(tokens)
    q_by_column = None if draft_probs is None else torch.cat([draft_probs[:, :1], draft_probs], dim=1)  # [B, N+1, V]
    column = torch.zeros(batch, dtype=torch.long, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    path = torch.full((batch, max_depth), -1, dtype=torch.long, device=device)
    next_probs = torch.zeros(batch, vocab, dtype=target_probs.dtype, device=device)
    rows_of = lambda table, cols: table.gather(1, cols[:, None, None].expand(-1, 1, vocab)).squeeze(1)  # noqa: E731
    for depth in range(max_depth):
        p = rows_of(target_probs, column)  # [B, V]
        kids = _children_of(children, column)  # [B, K]
        accepted = torch.full((batch,), -1, dtype=torch.long, device=device)
        for rank in range(kids.shape[1]):
            kid = kids[:, rank]
            tried = (kid >= 0) & alive & (accepted < 0)
            x = by_column.gather(1, kid.clamp(min=0)[:, None])  # [B, 1]
            if q_by_column is None:
                q = torch.zeros_like(p).scatter_(1, x, 1.0)
            else:
                q = rows_of(q_by_column, kid.clamp(min=0))
            ratio = acceptance_probability(p.gather(1, x).squeeze(1), q.gather(1, x).squeeze(1))
            uniform = torch.rand(batch, generator=generator, device=device)
            take = tried & (uniform < ratio)
            p = torch.where((tried & ~take)[:, None], residual_distribution(p, q), p)
            accepted = torch.where(take, kid, accepted)
        found = accepted >= 0
        next_probs = torch.where((alive & ~found)[:, None], p, next_probs)
        column = torch.where(found, accepted, column)
        path[:, depth] = torch.where(found, accepted - 1, -1)
        alive &= found
    next_probs = torch.where(alive[:, None], rows_of(target_probs, column), next_probs)
    return (path >= 0).sum(dim=1), sample(next_probs, generator), path
