"""A speculative chain round as one function over tensors, for the compiled and captured modes (decode/static_kv.py).

`chain_round` runs a whole round of a draft model's chain over the two static caches: the draft's catch-up and its
K draft steps, the target's verification of [last token, d_1 .. d_K], the acceptance (greedy, or the rejection sampler
of decode/sampling.py accept_sampled) and both rollbacks. It reads and writes tensors only: no host value decides
anything inside it, so `torch.compile(fullgraph=True)` traces it without a break, once per (models, batch capacity, K),
and on CUDA the captured mode records it as one graph. Its randomness is an input (the draws made beforehand, in the
order the eager engine makes them), so a sampled round gives the eager engine's tokens too.

What lives on the device, per buffer row (B_cap rows; dead rows are masked and come out with 0 accepted):
- each model's columns in use, `length` (0-d): a step writes from it on, a rollback moves it back to the first
  column after the longest kept prefix;
- each model's `count` [B_cap] (the next position);
- the draft's pending token [B_cap] and whether there is one: after a round that accepted all K drafts, d_K (the draft
  never fed it); the next round's catch-up feeds [pending or a hole, last token] (width 2, always).

`fused_round` is the entry point the engine's round loop calls for a chain round of a draft model at a constant
schedule (`fusable` says when): it fills the round's inputs in place, runs the round, and returns its device results
(`FusedRound`); after the round's one host read, `FusedRound.settle` brings the host's view (column counts, the
drafter's pending tokens, forwards) up to date.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import torch

from decode.drafters.base import pad_to_vocab
from decode.kv import host_to_device
from decode.sampling import accept_greedy, accept_sampled, logits_to_probs, sample
from decode.settings import Sampling
from decode.static_kv import CompiledModel, StaticKVState, compiled_of


# -- the round, over tensors ----------------------------------------------------------------------------------------
def _step(compiled: CompiledModel, buffers, length: torch.Tensor, count: torch.Tensor, ids: torch.Tensor,
          valid: torch.Tensor) -> torch.Tensor:
    """Append ids, valid [B_cap, W] at the columns from length on; advance length and count in place. -> fp32 logits
    [B_cap, W, V]."""
    positions = (count[:, None] + valid.long().cumsum(dim=1) - 1).clamp_min(0)  # [B_cap, W]
    buffers.start.copy_(length)
    logits, _ = compiled._forward(buffers, ids, positions, valid)
    length.add_(ids.shape[1])
    count.add_(valid.long().sum(dim=1))
    return logits


def _keep_prefix(buffers, length: torch.Tensor, count: torch.Tensor, first: torch.Tensor, width: int,
                 kept: torch.Tensor) -> None:
    """Of the columns first .. first + width - 1 keep each row's first kept[b] [B_cap]; the rest become holes, and
    length moves back to the column after the longest kept prefix (a row with kept 0, a dead row, keeps none)."""
    offset = torch.arange(buffers.valid.shape[1], device=kept.device) - first  # [L_max]
    drop = (offset >= 0) & (offset < width) & (offset[None, :] >= kept[:, None])  # [B_cap, L_max]
    count.sub_((buffers.valid & drop).long().sum(dim=1))
    buffers.valid.logical_and_(~drop)
    length.copy_(first + kept.max())


def draft_chain(draft: CompiledModel, buffers, length, count, pending, has_pending, token, live, gamma: int,
                vocab_size: int, input_vocab_size: int, sampling: Sampling, noise):
    """The draft's catch-up [pending or a hole, last token] and its gamma draft steps (the last one's token not fed).
    token, pending [B_cap] long, has_pending, live [B_cap] bool; noise [gamma, B_cap, V] Exp(1) draws (sampling) or
    None. Returns drafts [B_cap, gamma] and their q [B_cap, gamma, V] (sampling) or None."""
    ids = torch.stack([pending, token.clamp(max=input_vocab_size - 1)], dim=1)  # [B_cap, 2]
    valid = torch.stack([has_pending & live, live], dim=1)
    logits = _step(draft, buffers, length, count, ids, valid)[:, -1]
    tokens, probs = [], []
    for step in range(gamma):
        logits = pad_to_vocab(logits, vocab_size)  # [B_cap, V]: ids past the draft's vocabulary get q = 0
        if sampling.do_sample:
            q = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
            drafted = sample(q, exponential=noise[step])
            probs.append(q)
        else:
            drafted = logits.argmax(dim=-1)
        tokens.append(drafted)
        if step + 1 < gamma:
            logits = _step(draft, buffers, length, count, drafted.clamp(max=input_vocab_size - 1)[:, None],
                           live[:, None])[:, -1]
    return torch.stack(tokens, dim=1), (torch.stack(probs, dim=1) if probs else None)


def verify_chain(target: CompiledModel, buffers, length, count, token, drafts, probs, draft_limit, live,
                 sampling: Sampling, uniform, exponential):
    """The target's verification of [token, d_1 .. d_G], the acceptance and the target's rollback. draft_limit [B_cap]
    (0 for a dead row); uniform [B_cap, G] and exponential [B_cap, V]: the acceptance's draws (sampling). Returns
    accepted_len [B_cap] (0 for a dead row) and the next token [B_cap]."""
    gamma = drafts.shape[1]
    first = length.clone()
    logits = _step(target, buffers, length, count, torch.cat([token[:, None], drafts], dim=1),
                   live[:, None].expand(-1, gamma + 1))  # [B_cap, G + 1, V]
    if sampling.do_sample:
        target_probs = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
        accepted_len, next_token = accept_sampled(drafts, probs, target_probs, draft_limit, uniform=uniform,
                                                  exponential=exponential)
    else:
        accepted_len, next_token = accept_greedy(drafts, logits, draft_limit)
    accepted_len = torch.where(live, accepted_len, 0)
    _keep_prefix(buffers, length, count, first, gamma + 1, torch.where(live, accepted_len + 1, 0))
    return accepted_len, next_token


def chain_round(target: CompiledModel, target_buffers, target_length, target_count, draft: CompiledModel,
                draft_buffers, draft_length, draft_count, pending, has_pending, token, draft_limit, live,
                gamma: int, vocab_size: int, input_vocab_size: int, sampling: Sampling,
                draft_noise=None, uniform=None, exponential=None):
    """One speculative chain round over two static caches (module doc), all rows [B_cap]: drafts, verification,
    acceptance, both rollbacks, the draft's pending token. Writes the caches, lengths, counts and pending in place.
    Returns accepted_len [B_cap], next token [B_cap], drafts [B_cap, gamma]."""
    drafts, probs = draft_chain(draft, draft_buffers, draft_length, draft_count, pending, has_pending, token, live,
                                gamma, vocab_size, input_vocab_size, sampling, draft_noise)
    accepted_len, next_token = verify_chain(target, target_buffers, target_length, target_count, token, drafts, probs,
                                            draft_limit, live, sampling, uniform, exponential)
    # the draft fed [pending, last token, d_1 .. d_{G-1}]: of the last G columns keep the last token and the accepted
    # drafts it fed; after a full accept d_G waits for the next catch-up
    fed_from = draft_length - gamma
    _keep_prefix(draft_buffers, draft_length, draft_count, fed_from, gamma,
                 torch.where(live, accepted_len.clamp(max=gamma - 1) + 1, 0))
    pending.copy_(drafts[:, -1].clamp(max=input_vocab_size - 1))
    has_pending.copy_(live & (accepted_len == gamma))
    return accepted_len, next_token, drafts


# -- compiled or captured -------------------------------------------------------------------------------------------
_COMPILED: dict = {}  # (backend, mode) -> chain_round under torch.compile


def compiled_round(backend="inductor", mode: str | None = None):
    """chain_round under torch.compile(fullgraph=True, dynamic=False): one graph per (models, capacity, gamma,
    sampling setting)."""
    key = (str(backend), mode)
    if key not in _COMPILED:
        options = {"mode": mode} if backend == "inductor" and mode else {}
        _COMPILED[key] = torch.compile(chain_round, backend=backend, fullgraph=True, dynamic=False, **options)
    return _COMPILED[key]


@dataclass
class _RoundInputs:
    """A (target buffer set, draft buffer set, gamma)'s round inputs, allocated once and written in place before each
    round (a captured round replays on fixed addresses)."""
    target_length: torch.Tensor  # 0-d long
    draft_length: torch.Tensor  # 0-d long
    pending: torch.Tensor  # [B_cap] long
    has_pending: torch.Tensor  # [B_cap] bool
    token: torch.Tensor  # [B_cap] long
    draft_limit: torch.Tensor  # [B_cap] long
    live: torch.Tensor  # [B_cap] bool
    draft_noise: torch.Tensor | None = None  # [gamma, B_cap, V] (sampling)
    uniform: torch.Tensor | None = None  # [B_cap, gamma]
    exponential: torch.Tensor | None = None  # [B_cap, V]
    graph: tuple | None = None  # the captured mode on CUDA: (graph, outputs)
    owner: weakref.ref = field(default=lambda: None)


def _round_inputs(state: StaticKVState, draft_state: StaticKVState, gamma: int, vocab: int,
                  sampled: bool) -> _RoundInputs:
    key = (id(draft_state.buffers), gamma, sampled)
    table = state.buffers.steps.setdefault("rounds", {})
    found = table.get(key)
    if found is None:
        capacity, device = state.buffers.valid.shape[0], state.compiled.device
        zeros = lambda *shape, dtype=torch.long: torch.zeros(*shape, dtype=dtype, device=device)  # noqa: E731
        found = _RoundInputs(zeros(()), zeros(()), zeros(capacity), zeros(capacity, dtype=torch.bool), zeros(capacity),
                             zeros(capacity), zeros(capacity, dtype=torch.bool))
        if sampled:
            found.draft_noise = torch.ones(gamma, capacity, vocab, device=device)
            found.uniform = zeros(capacity, gamma, dtype=torch.float32)
            found.exponential = torch.ones(capacity, vocab, device=device)
        table[key] = found
    return found


def fusable(state, drafter, gamma: int, budget_host: list[int], synthetic_acceptance=None, tap=None) -> bool:
    """Whether this chain round runs as one function: a compiled or captured target and draft model (static states of
    one batch capacity), a chain (no tree) at a constant schedule, no synthetic acceptance, every row's backlog at
    most the one token a full accept leaves, and some row drafting the full gamma (a shorter round's verification and
    random draws are narrower in the eager engine)."""
    from decode.drafters.draft_model import DraftModelDrafter
    from decode.drafters.schedules import ConstantSchedule

    if not isinstance(drafter, DraftModelDrafter) or synthetic_acceptance is not None or tap is not None:
        return False
    schedule = drafter.schedule
    if drafter.tree is not None or drafter.off or (schedule is not None and type(schedule) is not ConstantSchedule):
        return False
    draft_state = drafter.state
    if not isinstance(state, StaticKVState) or not isinstance(draft_state, StaticKVState):
        return False
    if state.buffers is None or draft_state.buffers is None or state._tree is not None or draft_state._tree is not None:
        return False
    if state.buffers.valid.shape[0] != draft_state.buffers.valid.shape[0] or compiled_of(drafter.model) is None:
        return False
    return gamma >= 1 and max(budget_host, default=0) >= gamma and all(len(p) <= 1 for p in drafter.pending)


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
    draft_first: int  # the draft's first column of the round (host)

    def readout(self) -> torch.Tensor:
        """What the round's one host read copies, [B, 3 + gamma], as decode/generate.py ChainRound.readout: accepted_len,
        next token, draft_limit, the drafts."""
        return torch.cat([self.accepted_len[:, None], self.token[:, None], self.draft_limit[:, None], self.drafts], dim=1)

    def settle(self, accepted_host: list[int], drafts_host: list[list[int]]) -> None:
        """After the host read: each state's columns in use (the device already rolled back), the drafter's pending
        tokens (d_gamma after a full accept), its last proposal, forwards and schedule."""
        gamma, drafter = self.drafts.shape[1], self.drafter
        most = max(accepted_host, default=0)
        self.state.length = self.target_first + most + 1
        self.state.forwards += 1
        draft_state = drafter.state
        draft_state.length = self.draft_first + 1 + min(most, gamma - 1) + 1
        draft_state.forwards += gamma
        vocab_cap = drafter.input_vocab_size - 1
        drafter.pending = [[min(drafts[-1], vocab_cap)] if accepted == gamma else []
                           for accepted, drafts in zip(accepted_host, drafts_host)]
        drafter.last_proposal = self.drafts
        if drafter.schedule is not None:
            drafter.schedule.update([gamma] * len(accepted_host), accepted_host)


def fused_round(state: StaticKVState, drafter, token: torch.Tensor, budget_host: list[int], gamma: int,
                sampling: Sampling, generator: torch.Generator | None = None) -> FusedRound:
    """One chain round of a draft model (DraftModelDrafter over a compiled or captured model) against the target's
    static state, as one function (`chain_round`): token [B] each live row's last committed token, budget_host its
    budget before max_new_tokens (draft_limit = min(gamma, budget)). `fusable` must hold. Sampling draws its
    randomness from `generator` first, in the eager engine's order (each draft step's Exp(1) [B, V], the acceptance's
    uniforms [B, gamma], the next token's Exp(1) [B, V]), so the tokens are the eager engine's."""
    draft_state = drafter.state
    compiled, draft = state.compiled, draft_state.compiled
    state._room(gamma + 1)  # compaction (rare) reads the host: before the round, not inside it
    draft_state._room(gamma + 1)
    rows, vocab, device = state.rows, drafter.target_vocab_size, token.device
    inputs = _round_inputs(state, draft_state, gamma, vocab, sampling.do_sample)
    inputs.owner = weakref.ref(state)
    inputs.target_length.fill_(state.length)
    inputs.draft_length.fill_(draft_state.length)
    inputs.live.zero_()
    inputs.live[rows] = True
    inputs.token.zero_()
    inputs.token[rows] = token
    inputs.draft_limit.zero_()
    inputs.draft_limit[rows] = host_to_device([min(gamma, b) for b in budget_host], device)
    inputs.pending.zero_()
    inputs.has_pending.zero_()
    if any(drafter.pending):
        inputs.pending[rows] = host_to_device([p[0] if p else 0 for p in drafter.pending], device)
        inputs.has_pending[rows] = host_to_device([bool(p) for p in drafter.pending], device, dtype=torch.bool)
    if sampling.do_sample:
        batch = len(budget_host)
        noise = [torch.empty(batch, vocab, device=device).exponential_(1.0, generator=generator) for _ in range(gamma)]
        inputs.draft_noise[:, rows] = torch.stack(noise)
        inputs.uniform[rows] = torch.rand((batch, gamma), generator=generator, device=device)
        inputs.exponential[rows] = torch.empty(batch, vocab, device=device).exponential_(1.0, generator=generator)
    args = (compiled, state.buffers, inputs.target_length, state.count, draft, draft_state.buffers,
            inputs.draft_length, draft_state.count, inputs.pending, inputs.has_pending, inputs.token,
            inputs.draft_limit, inputs.live, gamma, vocab, drafter.input_vocab_size, sampling, inputs.draft_noise,
            inputs.uniform, inputs.exponential)
    with compiled._attention(), draft._attention():
        accepted_len, next_token, drafts = _run(compiled, inputs, args)
    return FusedRound(accepted_len[rows], next_token[rows], drafts[rows], inputs.draft_limit[rows], state, drafter,
                      state.length, draft_state.length)


def _run(compiled: CompiledModel, inputs: _RoundInputs, args: tuple):
    """The round as the target's mode runs its steps: captured (a graph recorded at its first round on CUDA, uncaptured
    on a CPU) or under torch.compile with the target's backend and mode (its graphs counted as the target's)."""
    if compiled.captured:
        if compiled.device.type != "cuda":
            return chain_round(*args)
        if inputs.graph is None:
            inputs.graph = _capture_round(compiled, args)
        graph, outputs = inputs.graph
        graph.replay()
        return outputs
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    out = compiled_round(compiled.backend, compiled.mode if compiled.backend == "inductor" else None)(*args)
    compiled.count_events(counters["stats"]["unique_graphs"] - before, (None, 0), (None, 0))
    return out


def _capture_round(compiled: CompiledModel, args: tuple):
    """Capture a whole round on CUDA, as CompiledModel._capture does a step. Unlike a step, a round's warm run is not
    harmless to repeat (it rolls back and moves the pending token): the warm run goes on a copy of the round's
    device state, restored before the capture."""
    state_tensors = [a for a in args if isinstance(a, torch.Tensor)]
    saved = [t.clone() for t in state_tensors]
    caches = [args[1], args[5]]
    saved_caches = [[(layer.keys.clone(), layer.values.clone()) for layer in b.cache.layers if layer.is_initialized]
                    for b in caches]
    saved_columns = [(b.valid.clone(), b.positions.clone()) for b in caches]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain_round(*args)
    torch.cuda.current_stream().wait_stream(side)
    for tensor, copy in zip(state_tensors, saved):
        tensor.copy_(copy)
    for b, layers, (valid, positions) in zip(caches, saved_caches, saved_columns):
        for layer, (keys, values) in zip([x for x in b.cache.layers if x.is_initialized], layers):
            layer.keys.copy_(keys)
            layer.values.copy_(values)
        b.valid.copy_(valid)
        b.positions.copy_(positions)
    if compiled._pool is None:
        compiled._pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    began = time.perf_counter()
    with torch.cuda.graph(graph, pool=compiled._pool):
        outputs = chain_round(*args)
    compiled.capture_s.append(time.perf_counter() - began)
    if compiled.recordings is not None:
        compiled.recordings += 1
    if compiled.warm:
        compiled.recordings_after_warmup += 1
    return graph, outputs
