"""Autoregressive baseline and speculative decoding over a left-padded batch.

Both share `prefill`, `choose_next`, the KV bookkeeping of decode/kv.py and the row bookkeeping
below, so the baseline and the speculative path count tokens, forwards and time the same way.
Metrics are not computed here: every row returns a `RowRecord` of raw facts (eval/ derives figures).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from decode.drafters.base import Drafter, Proposal
from decode.kv import KVState, host_to_device
from decode.static_kv import new_state
from decode.sampling import accept_greedy, accept_sampled, logits_to_probs, sample
from decode.settings import Generation, Sampling


class Clock:
    """perf_counter after synchronising every CUDA device the models use (a model split by a device map
    spans several), so that a reading includes queued kernels."""

    def __init__(self, device: torch.device | str, extra_devices: tuple = ()):
        devices = [torch.device(device), *map(torch.device, extra_devices)]
        self.cuda_devices = [d for i, d in enumerate(devices) if d.type == "cuda" and d not in devices[:i]]

    def now(self) -> float:
        for device in self.cuda_devices:
            torch.cuda.synchronize(device)
        return time.perf_counter()


@dataclass
class RowRecord:
    """What happened to one prompt: its new tokens and where time and forwards went."""
    output_ids: list[int] = field(default_factory=list)
    stop_reason: str = ""  # "eos" | "length"
    prefill_s: float = 0.0  # time to first token
    latency_s: float = 0.0  # from the batch's start until this row's last token
    target_forwards: int = 0  # prefill included
    draft_forwards: int = 0
    target_s: float = 0.0
    draft_s: float = 0.0  # draft prefill included
    draft_prefill_s: float = 0.0
    rounds: list[dict] = field(default_factory=list)  # speculative only: {"drafted", "accepted", "emitted"}
    # greedy baseline only: per new token, its top-1 minus top-2 fp32 logit. A method's token that differs at
    # step k can be a rounding flip only if this gap is within the logits' drift (eval/flags.py possible_bug)
    top2_gaps: list[float] = field(default_factory=list)

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)


def prefill(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[KVState, torch.Tensor]:
    """prompt_ids, prompt_mask [B, P] -> (the model's KV state, fp32 logits [B, V] of the next token)."""
    state = new_state(model)  # decode/kv.py's, or the compiled mode's static one
    logits = state.forward(model, prompt_ids, prompt_mask, last_only=True)[:, -1]
    # one check per batch (a host sync): broken weights or an fp16 overflow show up here
    if not bool(torch.isfinite(logits).all()):
        raise FloatingPointError("the model returned NaN or inf logits at prefill")
    return state, logits


def choose_next(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    """[..., V] logits -> [...] tokens: argmax, or a draw from the warped distribution."""
    if not sampling.do_sample:
        return logits.argmax(dim=-1)
    return sample(logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p), generator)


def _append(records: list[RowRecord], active: list[int], emitted: list[list[int]], generation: Generation,
            elapsed_s: float) -> tuple[list[int], list[int]]:
    """Append each active row's emitted tokens, cut at EOS and at max_new_tokens.

    Returns the local indices of rows still running and how many tokens each row really took.
    """
    still_running, taken = [], []
    for local, tokens in enumerate(emitted):
        record = records[active[local]]
        tokens = tokens[: generation.max_new_tokens - record.new_tokens]
        for position, token in enumerate(tokens):
            if token in generation.eos_token_ids:
                tokens = tokens[: position + 1]
                record.stop_reason = "eos"
                break
        record.output_ids.extend(tokens)
        taken.append(len(tokens))
        if not record.stop_reason and record.new_tokens >= generation.max_new_tokens:
            record.stop_reason = "length"
        if record.stop_reason:
            record.latency_s = elapsed_s
        else:
            still_running.append(local)
    return still_running, taken


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] logits -> [...] top-1 minus top-2 logit: how far the argmax is from flipping."""
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def generate_baseline(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, generation: Generation,
                      generator: torch.Generator | None = None, clock: Clock | None = None) -> list[RowRecord]:
    """The target alone: prefill, then one forward per token. prompt_ids, prompt_mask [B, P].

    Greedy, each row also keeps its top2_gaps (one per new token)."""
    clock = clock or Clock(prompt_ids.device)
    records = [RowRecord() for _ in range(prompt_ids.shape[0])]
    active = list(range(len(records)))
    greedy = not generation.sampling.do_sample
    gaps = []  # greedy: per step, (the rows it ran, their top2_gap [B'] left on the device)
    start = clock.now()
    state, logits = prefill(model, prompt_ids, prompt_mask)
    token = choose_next(logits, generation.sampling, generator)  # [B]
    if greedy:
        gaps.append((active, top2_gap(logits)))
    # host sync, once per step: the loop needs each row's token to stop it at its own EOS
    emitted = [[t] for t in token.tolist()]
    elapsed = clock.now() - start
    for record in records:
        record.prefill_s = elapsed
        record.target_forwards = 1
    running, _ = _append(records, active, emitted, generation, elapsed)
    while running:
        if len(running) < len(active):
            rows = torch.tensor(running, device=token.device)
            state.select_rows(rows)
            token, active = token[rows], [active[i] for i in running]
        logits = state.forward(model, token[:, None], last_only=True)[:, -1]
        token = choose_next(logits, generation.sampling, generator)
        if greedy:
            gaps.append((active, top2_gap(logits)))
        emitted = [[t] for t in token.tolist()]  # host sync, as above
        elapsed = clock.now() - start
        for row in active:
            records[row].target_forwards += 1
        running, _ = _append(records, active, emitted, generation, elapsed)
    for record in records:
        record.target_s = record.latency_s
    if gaps:  # one transfer after the timed loop; a step's active rows each took one token (_append stops the rest)
        values = iter(torch.cat([gap for _, gap in gaps]).tolist())
        for rows, _ in gaps:
            for row in rows:
                records[row].top2_gaps.append(next(values))
    return records


def generate_speculative(target, drafter: Drafter, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                         generation: Generation, gamma: int, generator: torch.Generator | None = None,
                         clock: Clock | None = None) -> list[RowRecord]:
    """Speculative decoding: per round the drafter proposes up to gamma tokens per row, the target
    scores them all in one forward, and each row keeps its own accepted prefix plus one target token.

    prompt_ids, prompt_mask [B, P], left padded. Output equals the target's own (greedy: the same
    tokens; sampling: the same distribution).

    gamma caps a round's drafts; each row's draft_limit is the least of gamma, its budget before
    max_new_tokens and its proposal length (its schedule, or no n-gram match). A row with draft_limit 0
    takes a plain target step inside the batch's forward; a round in which no row drafts (G = 0) is one
    target forward of the last tokens alone. Each row's draft_limit is recorded as the round's "drafted".

    Host syncs per round: one read of the verification result (with sdpa or eager attention on a model without
    sliding windows; more with a schedule that stops rows mid-round), plus the three clock reads, which
    synchronise CUDA devices to split time into draft and target. Every other host fact (hole counts, the
    drafters' view of the tokens) is derived from that read; host-to-device copies go through pinned memory.
    """
    clock = clock or Clock(prompt_ids.device)
    sampling = generation.sampling
    records = [RowRecord() for _ in range(prompt_ids.shape[0])]
    active = list(range(len(records)))
    start = clock.now()
    state, logits = prefill(target, prompt_ids, prompt_mask)
    token = choose_next(logits, sampling, generator)  # [B]
    emitted = [[t] for t in token.tolist()]  # host sync: the first token may already be EOS
    elapsed = clock.now() - start
    for record in records:
        record.prefill_s = elapsed
        record.target_forwards = 1
        record.target_s = elapsed
    running, _ = _append(records, active, emitted, generation, elapsed)
    if running:
        drafter.start(prompt_ids, prompt_mask)
        draft_prefill_s = clock.now() - start - elapsed
        for record in records:
            record.draft_s += draft_prefill_s
            record.draft_prefill_s = draft_prefill_s
            record.draft_forwards += drafter.forwards  # the draft's prefill; 0 for a drafter without a model
        drafter.observe([row[0] for row in emitted])
    while running:
        if len(running) < len(active):
            state.select_rows(running)
            drafter.select_rows(torch.tensor(running))
            token, active = token[host_to_device(running, token.device)], [active[i] for i in running]
        # gamma clipped per row so that a round never emits past max_new_tokens
        budget_host = [min(gamma, generation.max_new_tokens - records[row].new_tokens - 1) for row in active]

        # 1. propose: the drafter decides each row's length (its schedule), within the budget; it may be 0
        #    (each clock read syncs a CUDA device: the price of splitting time into draft and target)
        round_start = clock.now()
        draft_forwards_before = drafter.forwards
        if max(budget_host) > 0:
            proposal = drafter.propose(token, max(budget_host), row_limits=budget_host)
        else:  # every row has one token left: a plain target step
            proposal = Proposal(token.new_zeros(len(active), 0), None)
        num_drafted = proposal.tokens.shape[1]  # G: the widest row's draft
        draft_limit = host_to_device(budget_host, token.device).clamp(max=num_drafted)  # [B]
        if proposal.lengths is not None:
            draft_limit = torch.minimum(draft_limit, proposal.lengths)
        drafted_at = clock.now()

        if proposal.layout is not None:
            host, kept_rounds, accepted_len, token = _tree_round(state, target, token, proposal, sampling, generator)
            accepted_host = [row[0] for row in host]
            draft_limit_host = proposal.layout.row_nodes()
            drafter.observe([row[1] for row in host], [row[2] for row in host])
            drafter.commit(accepted_len, accepted_host, draft_limit_host, [row[3] for row in host])
            verified_at = clock.now()
            emitted = [[row[2][node] for node in row[3]] + [row[1]] for row in host]
        else:
            kept_rounds = None
            emitted, accepted_host, draft_limit_host, verified_at, token = _chain_round(
                state, target, drafter, token, proposal, draft_limit, num_drafted, budget_host, sampling, generator,
                clock)
        running, taken = _append(records, active, emitted, generation, verified_at - start)
        draft_forwards = drafter.forwards - draft_forwards_before
        for local, row in enumerate(active):
            record = records[row]
            facts = {"draft_forwards": draft_forwards, **kept_rounds[local]} if kept_rounds else {}
            record.rounds.append({"drafted": draft_limit_host[local], "accepted": accepted_host[local],
                                  "emitted": taken[local], **facts})
            record.target_forwards += 1
            record.draft_forwards += draft_forwards
            record.draft_s += drafted_at - round_start
            record.target_s += verified_at - drafted_at
    return records


def _chain_round(state, target, drafter, token, proposal, draft_limit, num_drafted, budget_host, sampling, generator,
                 clock):
    """Verify, accept and roll back a chain proposal. Returns (emitted per row, accepted per row, drafted per row,
    the clock reading after the round, the next token [B])."""
    # 2. verify: one target forward over [last token, d_1 .. d_G]
    target_logits = state.forward(target, torch.cat([token[:, None], proposal.tokens], dim=1))  # [B, G+1, V]

    # 3. select the accepted prefix and the next token
    if sampling.do_sample:
        target_probs = logits_to_probs(target_logits, sampling.temperature, sampling.top_k, sampling.top_p)
        accepted_len, token = accept_sampled(proposal.tokens, proposal.probs, target_probs, draft_limit, generator)
    else:
        accepted_len, token = accept_greedy(proposal.tokens, target_logits, draft_limit)
    # host sync, once per round: each row's accepted length decides which tokens it appends,
    # whether it stopped at EOS, and how far the caches roll back
    host = torch.cat([accepted_len[:, None], token[:, None], draft_limit[:, None], proposal.tokens], dim=1).tolist()
    accepted_host = [row[0] for row in host]
    draft_limit_host = [row[2] for row in host]

    # 4. roll both caches back to each row's accepted prefix
    state.keep_prefix_of_last(num_drafted + 1, accepted_len + 1, max(accepted_host) + 1,
                              [accepted + 1 for accepted in accepted_host])
    drafter.observe([row[1] for row in host], [row[3:] for row in host])
    if max(budget_host) > 0:
        drafter.commit(accepted_len, accepted_host, draft_limit_host)
    verified_at = clock.now()
    emitted = [row[3: 3 + row[0]] + [row[1]] for row in host]
    return emitted, accepted_host, draft_limit_host, verified_at, token


def _tree_round(state, target, token, proposal, sampling, generator):
    """Verify a tree proposal in one target forward over [root, nodes] with the tree mask, accept a path, roll the
    target's cache back to it. Returns per row [accepted length, next token, the proposal's tokens, the path's node
    indices], read in one host sync; each row's round facts for its record: the tree ("parents", valid nodes
    only), the accepted nodes' sibling "ranks" and the children "tried" at each depth reached (decode/tree.py), and
    "batch_nodes": the nodes the round's target forward verified besides the root (the batch's widest tree, whatever
    the row's own: what the round's verification cost); and accepted_len [B], the next token [B] on the device."""
    from decode.sampling import accept_tree_greedy, accept_tree_sampled

    layout = proposal.layout
    depth = max(layout.max_depth, 1)
    target_logits = state.forward_tree(target, torch.cat([token[:, None], proposal.tokens], dim=1),
                                       layout.verify_parents(), layout.verify_valid(), new_round=True)
    children = host_to_device(layout.children, token.device)
    if sampling.do_sample:
        target_probs = logits_to_probs(target_logits, sampling.temperature, sampling.top_k, sampling.top_p)
        accepted_len, next_token, path = accept_tree_sampled(proposal.tokens, proposal.probs, target_probs, children,
                                                             depth, generator)
    else:
        accepted_len, next_token, path = accept_tree_greedy(proposal.tokens, target_logits, children, depth)
    # host sync, once per round, as for a chain
    read = torch.cat([accepted_len[:, None], next_token[:, None], path, proposal.tokens], dim=1).tolist()
    host, facts = [], []
    keep = np.zeros((layout.batch, layout.nodes + 1), dtype=bool)
    keep[:, 0] = True  # the root: the last committed token
    for row, values in enumerate(read):
        nodes = [node for node in values[2: 2 + depth] if node >= 0]
        keep[row, [node + 1 for node in nodes]] = True
        host.append([values[0], values[1], values[2 + depth:], nodes])
        ranks, tried = layout.round_facts(row, nodes)
        facts.append({"ranks": ranks, "tried": tried, "parents": layout.row_parents(row), "batch_nodes": layout.nodes})
    state.keep_region(keep)
    return host, facts, accepted_len, next_token
