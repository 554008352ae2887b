"""A speculative chain round as one function over tensors, for the compiled and captured modes (decode/static_kv.py).

`chain_round` runs a whole round of a draft model's chain over the two static caches (`head_round`: an EAGLE-3
head's): the draft's catch-up and its K draft steps, the target's verification of [last token, d_1 .. d_K], the
acceptance (greedy, or the rejection sampler of decode/sampling.py accept_sampled) and both rollbacks. It reads and
writes tensors only: no host value decides anything inside it, so `torch.compile(fullgraph=True)` traces it without a
break, once per (models, batch capacity, K), and on CUDA the captured mode records it as one graph. Its randomness is
an input (the draws made beforehand, in the order the eager engine makes them), so a sampled round gives the eager
engine's tokens too.

What lives on the device, per buffer row (B_cap rows; dead rows are masked and come out with 0 accepted):
- each model's columns in use, `length` (0-d): a step writes from it on, a rollback moves it back to the first
  column after the longest kept prefix;
- each model's `count` [B_cap] (the next position);
- the draft's pending token [B_cap] and whether there is one: after a round that accepted all K drafts, d_K (the draft
  never fed it); the next round's catch-up feeds [pending or a hole, last token] (width 2, always).

`fused_round` is the entry point the engine's round loop calls for a chain round of a draft model or an EAGLE-3 head at
a constant schedule (`fusable` says when): it fills the round's inputs in place, runs the round, and returns its
device results (`FusedRound`); after the round's one host read, `FusedRound.settle` brings the host's view (column
counts, the drafter's pending tokens, forwards) up to date.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from decode.drafters.base import pad_to_vocab
from decode.kv import host_to_device
from decode.sampling import accept_greedy, accept_sampled, logits_to_probs, sample
from decode.settings import Sampling
from decode.static_kv import CompiledModel, StaticKVState


# -- the round, over tensors ----------------------------------------------------------------------------------------
def _step(compiled: CompiledModel, buffers, length: torch.Tensor, count: torch.Tensor, ids: torch.Tensor,
          valid: torch.Tensor, **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Append ids, valid [B_cap, W] (and a head's per-column inputs) at the columns from length on; advance length and
    count in place. -> (fp32 logits [B_cap, W, V], the target's hidden states [B_cap, W, F] where it returns them)."""
    positions = (count[:, None] + valid.long().cumsum(dim=1) - 1).clamp_min(0)  # [B_cap, W]
    buffers.start.copy_(length)
    logits, hidden = compiled._forward(buffers, ids, positions, valid, **inputs)
    length.add_(ids.shape[1])
    count.add_(valid.long().sum(dim=1))
    return logits, hidden


def _keep_prefix(buffers, length: torch.Tensor, count: torch.Tensor, first: torch.Tensor, width: int,
                 kept: torch.Tensor) -> None:
    """Of the columns first .. first + width - 1 keep each row's first kept[b] [B_cap]; the rest become holes, and
    length moves back to the column after the longest kept prefix (a row with kept 0, a dead row, keeps none)."""
    offset = torch.arange(buffers.valid.shape[1], device=kept.device) - first  # [L_max]
    drop = (offset >= 0) & (offset < width) & (offset[None, :] >= kept[:, None])  # [B_cap, L_max]
    count.sub_((buffers.valid & drop).long().sum(dim=1))
    buffers.valid.logical_and_(~drop)
    length.copy_(first + kept.max())


def _draw(logits, sampling: Sampling, noise, step: int, probs: list) -> torch.Tensor:
    """A draft token [B_cap] from logits [B_cap, V]: under sampling the warped q (appended to probs) and this step's
    Exp(1) draw noise[step], otherwise the argmax."""
    if not sampling.do_sample:
        return logits.argmax(dim=-1)
    q = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    probs.append(q)
    return sample(q, exponential=noise[step])


def draft_chain(draft: CompiledModel, buffers, length, count, pending, has_pending, token, live, gamma: int,
                vocab_size: int, input_vocab_size: int, sampling: Sampling, noise):
    """The draft's catch-up [pending or a hole, last token] and its gamma draft steps (the last one's token not fed).
    token, pending [B_cap] long, has_pending, live [B_cap] bool; noise [gamma, B_cap, V] Exp(1) draws (sampling) or
    None. Returns drafts [B_cap, gamma] and their q [B_cap, gamma, V] (sampling) or None."""
    ids = torch.stack([pending, token.clamp(max=input_vocab_size - 1)], dim=1)  # [B_cap, 2]
    valid = torch.stack([has_pending & live, live], dim=1)
    logits = _step(draft, buffers, length, count, ids, valid)[0][:, -1]
    tokens, probs = [], []
    for step in range(gamma):
        # [B_cap, V]: ids past the draft's vocabulary get q = 0
        drafted = _draw(pad_to_vocab(logits, vocab_size), sampling, noise, step, probs)
        tokens.append(drafted)
        if step + 1 < gamma:
            logits = _step(draft, buffers, length, count, drafted.clamp(max=input_vocab_size - 1)[:, None],
                           live[:, None])[0][:, -1]
    return torch.stack(tokens, dim=1), (torch.stack(probs, dim=1) if probs else None)


def verify_chain(target: CompiledModel, buffers, length, count, token, drafts, probs, draft_limit, live,
                 sampling: Sampling, uniform, exponential):
    """The target's verification of [token, d_1 .. d_G], the acceptance and the target's rollback. draft_limit [B_cap]
    (0 for a dead row); uniform [B_cap, G] and exponential [B_cap, V]: the acceptance's draws (sampling). Returns
    accepted_len [B_cap] (0 for a dead row), the next token [B_cap] and the target's hidden states at the layers it
    returns [B_cap, G + 1, F] (None where it returns none)."""
    gamma = drafts.shape[1]
    first = length.clone()
    logits, hidden = _step(target, buffers, length, count, torch.cat([token[:, None], drafts], dim=1),
                           live[:, None].expand(-1, gamma + 1))  # [B_cap, G + 1, V]
    if sampling.do_sample:
        target_probs = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
        accepted_len, next_token = accept_sampled(drafts, probs, target_probs, draft_limit, uniform=uniform,
                                                  exponential=exponential)
    else:
        accepted_len, next_token = accept_greedy(drafts, logits, draft_limit)
    accepted_len = torch.where(live, accepted_len, 0)
    _keep_prefix(buffers, length, count, first, gamma + 1, torch.where(live, accepted_len + 1, 0))
    return accepted_len, next_token, hidden


def chain_round(target: CompiledModel, target_buffers, target_length, target_count, draft: CompiledModel,
                draft_buffers, draft_length, draft_count, pending, has_pending, token, draft_limit, live,
                gamma: int, vocab_size: int, input_vocab_size: int, sampling: Sampling,
                draft_noise=None, uniform=None, exponential=None):
    """One speculative chain round over two static caches (module doc), all rows [B_cap]: drafts, verification,
    acceptance, both rollbacks, the draft's pending token. Writes the caches, lengths, counts and pending in place.
    Returns accepted_len [B_cap], next token [B_cap], drafts [B_cap, gamma]."""
    drafts, probs = draft_chain(draft, draft_buffers, draft_length, draft_count, pending, has_pending, token, live,
                                gamma, vocab_size, input_vocab_size, sampling, draft_noise)
    return chain_rest(drafts, probs, target, target_buffers, target_length, target_count, draft_buffers, draft_length,
                      draft_count, pending, has_pending, token, draft_limit, live, input_vocab_size, sampling, uniform,
                      exponential)


def chain_rest(drafts, probs, target: CompiledModel, target_buffers, target_length, target_count, draft_buffers,
               draft_length, draft_count, pending, has_pending, token, draft_limit, live, input_vocab_size: int,
               sampling: Sampling, uniform=None, exponential=None):
    """chain_round after draft_chain (drafts [B_cap, gamma], probs): the verification, the acceptance, both rollbacks
    and the pending token. Its own function where the draft's and the verification's seconds are told apart."""
    gamma = drafts.shape[1]
    accepted_len, next_token, _ = verify_chain(target, target_buffers, target_length, target_count, token, drafts,
                                               probs, draft_limit, live, sampling, uniform, exponential)
    # the draft fed [pending, last token, d_1 .. d_{G-1}]: of the last G columns keep the last token and the accepted
    # drafts it fed; after a full accept d_G waits for the next catch-up
    fed_from = draft_length - gamma
    _keep_prefix(draft_buffers, draft_length, draft_count, fed_from, gamma,
                 torch.where(live, accepted_len.clamp(max=gamma - 1) + 1, 0))
    pending.copy_(drafts[:, -1].clamp(max=input_vocab_size - 1))
    has_pending.copy_(live & (accepted_len == gamma))
    return accepted_len, next_token, drafts


def head_chain(head: CompiledModel, buffers, length, count, pending_ids, pending_valid, pending_features, token, live,
               gamma: int, vocab_size: int, index, embedding_size: int, sampling: Sampling, noise):
    """An EAGLE-3 head's catch-up and gamma draft steps (decode/drafters/head_drafters.py Eagle3Drafter, over a static
    cache). The pending pairs, right aligned in gamma + 1 columns: pending_features [B_cap, gamma + 1, F] (the target's states
    the head has not read) and pending_ids (the token after each; the last column's is this round's `token`), masked
    by pending_valid. Each later step feeds the head's own pre-norm state with the token drafted; those steps' columns
    go at the end (they read the head's states, not the target's). index [V_d]: each draft id's target id.
    Returns drafts [B_cap, gamma] and their q (sampling) or None."""
    ids = torch.cat([pending_ids[:, :-1], token[:, None]], dim=1).clamp(max=embedding_size - 1)  # [B_cap, gamma + 1]
    logits, _ = _step(head, buffers, length, count, ids, pending_valid & live[:, None], features=pending_features)
    logits, hidden = logits[:, -1], head.model.last_hidden[:, -1:]
    tokens, probs = [], []
    for step in range(gamma):
        over_target = logits.new_full((logits.shape[0], vocab_size), float("-inf")).index_copy(-1, index, logits)
        drafted = _draw(over_target, sampling, noise, step, probs)
        tokens.append(drafted)
        if step + 1 < gamma:
            logits, _ = _step(head, buffers, length, count, drafted.clamp(max=embedding_size - 1)[:, None],
                              live[:, None], hidden=hidden)
            logits, hidden = logits[:, -1], head.model.last_hidden[:, -1:]
    _keep_prefix(buffers, length, count, length - (gamma - 1), gamma - 1, torch.zeros_like(token))
    return torch.stack(tokens, dim=1), (torch.stack(probs, dim=1) if probs else None)


def head_round(target: CompiledModel, target_buffers, target_length, target_count, head: CompiledModel, head_buffers,
               head_length, head_count, pending_ids, pending_valid, pending_features, token, draft_limit, live,
               gamma: int, vocab_size: int, index, embedding_size: int, sampling: Sampling,
               draft_noise=None, uniform=None, exponential=None):
    """chain_round for an EAGLE-3 head (head_chain): the target's verification returns its hidden states at the
    head's layers, and the next round's pending pairs are each row's verification columns of its last token and
    accepted drafts (right aligned; written in place). Returns accepted_len [B_cap], next token [B_cap], drafts
    [B_cap, gamma]."""
    drafts, probs = head_chain(head, head_buffers, head_length, head_count, pending_ids, pending_valid,
                               pending_features, token, live, gamma, vocab_size, index, embedding_size, sampling,
                               draft_noise)
    return head_rest(drafts, probs, target, target_buffers, target_length, target_count, pending_ids, pending_valid,
                     pending_features, token, draft_limit, live, sampling, uniform, exponential)


def head_rest(drafts, probs, target: CompiledModel, target_buffers, target_length, target_count, pending_ids,
              pending_valid, pending_features, token, draft_limit, live, sampling: Sampling, uniform=None,
              exponential=None):
    """head_round after head_chain: the verification, the acceptance, the target's rollback and the next pending
    pairs."""
    gamma = drafts.shape[1]
    accepted_len, next_token, hidden = verify_chain(target, target_buffers, target_length, target_count, token, drafts,
                                                    probs, draft_limit, live, sampling, uniform, exponential)
    # column c of the next catch-up holds verification column j = c - (gamma - accepted): the state at the last token
    # (j = 0) and at each accepted draft, each paired with the token after it (d_{j+1}; the last: the next token)
    columns = torch.arange(gamma + 1, device=token.device)
    source = columns[None, :] - (gamma - accepted_len)[:, None]  # [B_cap, gamma + 1]
    pending_valid.copy_((source >= 0) & live[:, None])
    source = source.clamp(min=0)
    pending_features.copy_(hidden.gather(1, source[..., None].expand(-1, -1, hidden.shape[-1])))
    pending_ids.copy_(drafts.gather(1, source.clamp(max=gamma - 1)))
    return accepted_len, next_token, drafts


# -- compiled or captured -------------------------------------------------------------------------------------------
_COMPILED: dict = {}  # (round function, backend, mode) -> it under torch.compile


def compiled_round(round_fn=None, backend="inductor", mode: str | None = None):
    """chain_round (or head_round) under torch.compile(fullgraph=True, dynamic=False): one graph per (models,
    capacity, gamma, sampling setting)."""
    round_fn = round_fn or chain_round
    key = (round_fn, str(backend), mode)
    if key not in _COMPILED:
        options = {"mode": mode} if backend == "inductor" and mode else {}
        _COMPILED[key] = torch.compile(round_fn, backend=backend, fullgraph=True, dynamic=False, **options)
    return _COMPILED[key]


@dataclass
class _RoundInputs:
    """A (target buffer set, drafter's buffer set, gamma, sampling or not)'s round inputs, allocated once and written in
    place before each round (a captured round replays on fixed addresses)."""
    target_length: torch.Tensor  # 0-d long
    draft_length: torch.Tensor  # 0-d long
    token: torch.Tensor  # [B_cap] long
    draft_limit: torch.Tensor  # [B_cap] long
    live: torch.Tensor  # [B_cap] bool
    pending: torch.Tensor  # a draft model: [B_cap] long; a head: the pending ids [B_cap, gamma + 1]
    has_pending: torch.Tensor  # a draft model: [B_cap] bool; a head: pending_valid [B_cap, gamma + 1]
    pending_features: torch.Tensor | None = None  # a head: [B_cap, gamma + 1, F]
    draft_noise: torch.Tensor | None = None  # [gamma, B_cap, V] (sampling)
    uniform: torch.Tensor | None = None  # [B_cap, gamma]
    exponential: torch.Tensor | None = None  # [B_cap, V]
    graphs: dict = field(default_factory=dict)  # the captured mode on CUDA: part -> (graph, outputs)


def _round_inputs(state: StaticKVState, draft_state: StaticKVState, gamma: int, vocab: int, sampled: bool,
                  features: tuple | None) -> _RoundInputs:
    """features: a head's (width, dtype) of the target's states it reads; None: a draft model."""
    key = (id(draft_state.buffers), gamma, sampled)
    table = state.buffers.steps.setdefault("rounds", {})
    found = table.get(key)
    if found is None:
        capacity, device = state.buffers.valid.shape[0], state.compiled.device
        zeros = lambda *shape, dtype=torch.long: torch.zeros(*shape, dtype=dtype, device=device)  # noqa: E731
        pending = (capacity,) if features is None else (capacity, gamma + 1)
        found = _RoundInputs(zeros(()), zeros(()), zeros(capacity), zeros(capacity), zeros(capacity, dtype=torch.bool),
                             zeros(*pending), zeros(*pending, dtype=torch.bool))
        if features is not None:
            found.pending_features = zeros(capacity, gamma + 1, features[0], dtype=features[1])
        if sampled:
            found.draft_noise = torch.ones(gamma, capacity, vocab, device=device)
            found.uniform = zeros(capacity, gamma, dtype=torch.float32)
            found.exponential = torch.ones(capacity, vocab, device=device)
        table[key] = found
    return found


def _kind(drafter) -> str | None:
    """"model" (a draft model), "head" (an EAGLE-3 head), or None: no fused round for this drafter."""
    from decode.drafters.draft_model import DraftModelDrafter
    from decode.drafters.head_drafters import Eagle3Drafter

    if isinstance(drafter, DraftModelDrafter):
        return "model"
    return "head" if isinstance(drafter, Eagle3Drafter) else None


def fusable(state, drafter, gamma: int, budget_host: list[int], synthetic_acceptance=None) -> bool:
    """Whether this chain round runs as one function: a compiled or captured target and drafter (a draft model, or an
    EAGLE-3 head, each with a compiled step: static states of one batch capacity, the target returning the head's
    layers), a chain (no tree) at a constant schedule, no synthetic acceptance, every row's backlog within the
    round's catch-up (a draft model's: the one token a full accept leaves; a head's: gamma + 1 states), and some row
    drafting the full gamma (a shorter round's verification and random draws are narrower in the eager engine)."""
    from decode.drafters.schedules import ConstantSchedule

    kind = _kind(drafter)
    if kind is None or synthetic_acceptance is not None or gamma < 1 or max(budget_host, default=0) < gamma:
        return False
    schedule = getattr(drafter, "schedule", None)
    if drafter.tree is not None or (schedule is not None and type(schedule) is not ConstantSchedule):
        return False
    draft_state = drafter.state
    if not isinstance(state, StaticKVState) or not isinstance(draft_state, StaticKVState):
        return False
    if state.buffers is None or draft_state.buffers is None or state._tree is not None or draft_state._tree is not None:
        return False
    if state.buffers.valid.shape[0] != draft_state.buffers.valid.shape[0] or len(state.rows) != len(draft_state.rows):
        return False
    if kind == "model":
        return not drafter.off and all(len(p) <= 1 for p in drafter.pending)
    reads = set(drafter.target_layers) <= set(state.compiled.head_layers)
    held = getattr(drafter, "features", None)
    return reads and bool(held) and all(len(f) <= gamma + 1 for f in held)


@dataclass
class FusedRound:
    """A fused round's device results, live rows only, and what `settle` needs after the host read."""
    accepted_len: torch.Tensor  # [B]
    token: torch.Tensor  # [B] the target's next token (correction or bonus)
    drafts: torch.Tensor  # [B, gamma]
    draft_limit: torch.Tensor  # [B] drafts each row could accept: min(gamma, its budget)
    state: StaticKVState
    drafter: object
    target_first: int  # the target's first column of the round (host)
    draft_first: int  # the drafter's first column of the round (host)
    features: torch.Tensor | None = None  # a head: the next round's pending states [B, gamma + 1, F], right aligned

    def readout(self) -> torch.Tensor:
        """What the round's one host read copies, [B, 3 + gamma], as decode/generate.py ChainRound.readout:
        accepted_len, next token, draft_limit, the drafts."""
        return torch.cat([self.accepted_len[:, None], self.token[:, None], self.draft_limit[:, None], self.drafts],
                         dim=1)

    def settle(self, accepted_host: list[int], drafts_host: list[list[int]], keep: list[int] | None = None) -> None:
        """After the host read: each state's columns in use (the device already rolled back), the drafter's pending
        tokens (a draft model: d_gamma after a full accept; a head: its pending states and tokens), its last
        proposal, forwards and schedule, as its commit would leave them: an eager round may follow. The round's first
        columns are the states' lengths as the host has them now (an overlapped round launched before its
        predecessor's read starts where that one's settle leaves them). keep: the local rows still in the drafter
        (an overlapped round ran rows that had ended a round before; they left the drafter since), all where None."""
        gamma, drafter = self.drafts.shape[1], self.drafter
        self.target_first, self.draft_first = self.state.length, drafter.state.length
        most = max(accepted_host, default=0)
        if keep is not None:
            accepted_host, drafts_host = [accepted_host[i] for i in keep], [drafts_host[i] for i in keep]
        self.state.length = self.target_first + most + 1
        self.state.forwards += 1
        draft_state = drafter.state
        draft_state.forwards += gamma
        drafter.last_proposal = self.drafts
        if self.features is not None:  # a head: the catch-up's columns stay, its draft steps' went
            draft_state.length = self.draft_first + gamma + 1
            drafter.features = [self.features[row, gamma - accepted:] for row, accepted in enumerate(accepted_host)]
            drafter.tokens = [list(drafts[:accepted]) for accepted, drafts in zip(accepted_host, drafts_host)]
            drafter.fed, drafter.speculative_columns, drafter.last_host = True, 0, None
            return
        draft_state.length = self.draft_first + 1 + min(most, gamma - 1) + 1
        vocab_cap = drafter.input_vocab_size - 1
        drafter.pending = [[min(drafts[-1], vocab_cap)] if accepted == gamma else []
                           for accepted, drafts in zip(accepted_host, drafts_host)]
        if drafter.schedule is not None:
            drafter.schedule.update([gamma] * len(accepted_host), accepted_host)


def fused_round(state: StaticKVState, drafter, token: torch.Tensor, budget_host: list[int], gamma: int,
                sampling: Sampling, generator: torch.Generator | None = None, on_drafted=None,
                carry: bool = False) -> FusedRound:
    """One chain round of a draft model (DraftModelDrafter) or an EAGLE-3 head (Eagle3Drafter), each over a compiled
    or captured step, against the target's static state, as one function (`chain_round`, `head_round`): token [B] each
    live row's last committed token, budget_host its budget before max_new_tokens (draft_limit = min(gamma, budget)).
    `fusable` must hold. Sampling draws its randomness from `generator` first, in the eager engine's order (each
    draft step's Exp(1) [B, V], the acceptance's uniforms [B, gamma], the next token's Exp(1) [B, V]), so the tokens
    are the eager engine's. on_drafted: called between the drafts and the verification (a clock's mark), which then
    run as two functions (a graph each: draft_chain or head_chain, then chain_rest or head_rest); None: one."""
    draft_state, head = drafter.state, _kind(drafter) == "head"
    compiled, draft = state.compiled, draft_state.compiled
    state._room(gamma + 1)  # compaction (rare) reads the host: before the round, not inside it
    draft_state._room(2 * gamma + 1 if head else gamma + 1)
    rows, vocab, device = state.rows, drafter.target_vocab_size, token.device
    features = None
    if head:
        sample_state = drafter.features[0]
        features = (sample_state.shape[-1], sample_state.dtype)
    inputs = _round_inputs(state, draft_state, gamma, vocab, sampling.do_sample, features)
    if not carry:  # carry (an overlapped round): the lengths and the pending tokens the last round left on the device
        inputs.target_length.fill_(state.length)
        inputs.draft_length.fill_(draft_state.length)
    inputs.live.zero_()
    inputs.live[rows] = True
    inputs.token.zero_()
    inputs.token[rows] = token
    inputs.draft_limit.zero_()
    inputs.draft_limit[rows] = host_to_device([min(gamma, b) for b in budget_host], device)
    if not carry:
        inputs.pending.zero_()
        inputs.has_pending.zero_()
    if head and not carry:  # the pending pairs, right aligned in gamma + 1 columns
        inputs.pending_features.zero_()
        for local, (row_states, row_tokens) in enumerate(zip(drafter.features, drafter.tokens)):
            row, held = rows[local], len(row_states)
            inputs.pending_features[row, gamma + 1 - held:] = row_states
            inputs.has_pending[row, gamma + 1 - held:] = True
            if row_tokens:
                inputs.pending[row, gamma + 1 - held: gamma] = host_to_device(row_tokens, device)
    elif not carry and any(drafter.pending):
        inputs.pending[rows] = host_to_device([p[0] if p else 0 for p in drafter.pending], device)
        inputs.has_pending[rows] = host_to_device([bool(p) for p in drafter.pending], device, dtype=torch.bool)
    if sampling.do_sample:
        batch = len(budget_host)
        noise = [torch.empty(batch, vocab, device=device).exponential_(1.0, generator=generator) for _ in range(gamma)]
        inputs.draft_noise[:, rows] = torch.stack(noise)
        inputs.uniform[rows] = torch.rand((batch, gamma), generator=generator, device=device)
        inputs.exponential[rows] = torch.empty(batch, vocab, device=device).exponential_(1.0, generator=generator)
    target_part = (compiled, state.buffers, inputs.target_length, state.count)
    chances = (inputs.uniform, inputs.exponential)
    if head:
        drafter_part = (draft, draft_state.buffers, inputs.draft_length, draft_state.count, inputs.pending,
                        inputs.has_pending, inputs.pending_features)
        whole = (head_round, (*target_part, *drafter_part, inputs.token, inputs.draft_limit, inputs.live, gamma, vocab,
                              drafter.index, drafter.embedding_size, sampling, inputs.draft_noise, *chances))
        drafting = (head_chain, (*drafter_part, inputs.token, inputs.live, gamma, vocab, drafter.index,
                                 drafter.embedding_size, sampling, inputs.draft_noise))
        rest = (head_rest, (*target_part, *drafter_part[4:], inputs.token, inputs.draft_limit, inputs.live, sampling,
                            *chances))
    else:
        drafter_part = (draft, draft_state.buffers, inputs.draft_length, draft_state.count, inputs.pending,
                        inputs.has_pending)
        whole = (chain_round, (*target_part, *drafter_part, inputs.token, inputs.draft_limit, inputs.live, gamma,
                               vocab, drafter.input_vocab_size, sampling, inputs.draft_noise, *chances))
        drafting = (draft_chain, (*drafter_part, inputs.token, inputs.live, gamma, vocab, drafter.input_vocab_size,
                                  sampling, inputs.draft_noise))
        rest = (chain_rest, (*target_part, *drafter_part[1:], inputs.token, inputs.draft_limit, inputs.live,
                             drafter.input_vocab_size, sampling, *chances))
    held_layers = compiled.hidden_layers
    compiled.hidden_layers = tuple(drafter.target_layers)  # the states the head reads, in its order (or none)
    try:
        with compiled._attention(), draft._attention():
            if on_drafted is None:
                accepted_len, next_token, drafts = _run(*whole, compiled, inputs, "round")
            else:
                drafted = _run(*drafting, compiled, inputs, "draft")
                on_drafted()
                accepted_len, next_token, drafts = _run(rest[0], (*drafted, *rest[1]), compiled, inputs, "rest")
    finally:
        compiled.hidden_layers = held_layers
    return FusedRound(accepted_len[rows], next_token[rows], drafts[rows], inputs.draft_limit[rows], state, drafter,
                      state.length, draft_state.length, inputs.pending_features[rows] if head else None)


def _run(round_fn, args: tuple, compiled: CompiledModel, inputs: _RoundInputs, part: str):
    """The round as the target's mode runs its steps: captured (a graph recorded at its first round on CUDA, uncaptured
    on a CPU) or under torch.compile with the target's backend and mode (its graphs counted as the target's)."""
    if compiled.captured:
        if compiled.device.type != "cuda":
            return round_fn(*args)
        if part not in inputs.graphs:
            inputs.graphs[part] = _capture_round(round_fn, compiled, args)
        graph, outputs = inputs.graphs[part]
        graph.replay()
        return outputs
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    out = compiled_round(round_fn, compiled.backend, compiled.mode if compiled.backend == "inductor" else None)(*args)
    compiled.count_events(counters["stats"]["unique_graphs"] - before, (None, 0), (None, 0))
    return out


def _capture_round(round_fn, compiled: CompiledModel, args: tuple):
    """Capture a whole round on CUDA, as CompiledModel.capture_graph does a step. Unlike a step, a round's warm run is not
    harmless to repeat (it rolls back and moves the pending token): the warm run goes on a copy of the round's
    device state, restored before the capture."""
    state_tensors = [a for a in args if isinstance(a, torch.Tensor)]
    saved = [t.clone() for t in state_tensors]
    caches = [a for a in args if hasattr(a, "cache") and hasattr(a, "valid")]  # the buffer sets it writes
    saved_caches = [[(layer.keys.clone(), layer.values.clone()) for layer in b.cache.layers if layer.is_initialized]
                    for b in caches]
    saved_columns = [(b.valid.clone(), b.positions.clone()) for b in caches]

    def restore():
        for tensor, copy in zip(state_tensors, saved):
            tensor.copy_(copy)
        for b, layers, (valid, positions) in zip(caches, saved_caches, saved_columns):
            for layer, (keys, values) in zip([x for x in b.cache.layers if x.is_initialized], layers):
                layer.keys.copy_(keys)
                layer.values.copy_(values)
            b.valid.copy_(valid)
            b.positions.copy_(positions)

    return compiled.capture_graph(round_fn, *args, restore=restore)
