"""Autoregressive baseline and speculative decoding over a left-padded batch.

Both share `prefill`, `choose_next`, the KV bookkeeping of decode/kv.py and the row bookkeeping
below, so the baseline and the speculative path count tokens, forwards and time the same way.
Metrics are not computed here: every row returns a `RowRecord` of raw facts (eval/ derives figures).
A speculative round runs the same steps over a chain of drafts or a token tree: the proposal's layout (`ChainRound`,
`TreeRound`) does what differs, and `_RoundRecorder` keeps the round's records and timing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from decode.drafters.base import Drafter, Proposal
from decode.hidden import CompiledTap, HiddenTap
from decode.kv import KVState, host_to_device, joined
from decode.round_graph import fused_round, fusable
from decode.arrivals import Load, Queue, RequestTimes, prefill_batches
from decode.static_kv import compiled_of, new_state
from decode.sampling import (accept_greedy, accept_sampled, accept_synthetic, accept_tree_greedy, accept_tree_sampled,
                             logits_to_probs, sample)
from decode.settings import Generation, Sampling


class Clock:
    """Wall time, and in-stream marks that split a round's time without stopping the device.

    `now()` is perf_counter after synchronising every CUDA device the models use (a model split by a device map spans
    several), so that a reading includes queued kernels: for the loop's start and end and for the probes, never inside
    a round. `host()` is perf_counter alone: right after a host read (which waited for the device) it is the device's
    time too. `mark()` is a point in the device's stream: a CUDA event recorded on the engine's device (a CPU's marks
    are perf_counter readings); `seconds(a, b)` between two marks is read once both have run, which a later host read
    guarantees (the loop reads them after the next round's read, or after the final `now()`). A model split over
    several CUDA devices has no one stream to mark: there `mark()` is `now()` (a synchronize), the one case that
    stops the device inside a round."""

    def __init__(self, device: torch.device | str, extra_devices: tuple = ()):
        devices = [torch.device(device), *map(torch.device, extra_devices)]
        self.cuda_devices = [d for i, d in enumerate(devices) if d.type == "cuda" and d not in devices[:i]]

    def now(self) -> float:
        for device in self.cuda_devices:
            torch.cuda.synchronize(device)
        return time.perf_counter()

    @staticmethod
    def host() -> float:
        return time.perf_counter()

    def mark(self):
        if len(self.cuda_devices) != 1:
            return self.now()  # a CPU's time (no device syncs), or a split model's (several streams)
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.cuda_devices[0]))
        return event

    @staticmethod
    def seconds(start, end) -> float:
        """Seconds between two marks (both already run on the device)."""
        if isinstance(start, float):
            return end - start
        return start.elapsed_time(end) / 1000.0


class _Spans:
    """Device seconds to add to records, kept as pairs of marks until a host read has passed them: `settle()` after a
    read adds every span marked before it (its events have run) without a sync."""

    def __init__(self, clock: Clock):
        self.clock, self.pending = clock, []

    def add(self, records: list, field_names: tuple[str, ...], start, end) -> None:
        """Add seconds(start, end) to each record's fields: at once for host readings, else once settled."""
        self.pending.append((records, field_names, start, end))
        if isinstance(end, float):
            self.settle()

    def settle(self) -> None:
        for records, field_names, start, end in self.pending:
            seconds = self.clock.seconds(start, end)
            for record in records:
                for name in field_names:
                    setattr(record, name, getattr(record, name) + seconds)
        self.pending = []


@dataclass
class RowRecord(RequestTimes):
    """What happened to one prompt: its new tokens and where time and forwards went; served under a Load, its
    request's times (RequestTimes)."""
    output_ids: list[int] = field(default_factory=list)
    stop_reason: str = ""  # "eos" | "length"
    prefill_s: float = 0.0  # time to first token (served: first_token_s - arrival_s, the queue's wait included)
    latency_s: float = 0.0  # from the batch's start until this row's last token (served: finish_s - arrival_s)
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


NON_FINITE = "the model returned NaN or inf logits at prefill"


def prefill(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | np.ndarray) -> tuple[KVState, torch.Tensor]:
    """prompt_ids [B, P], prompt_mask [B, P] (a host numpy mask costs no read) -> (the model's KV state, fp32 logits
    [B, V] of the next token). The caller checks the logits are finite (`first_tokens`: in the admission's one read)."""
    state = new_state(model)  # decode/kv.py's, or the compiled mode's static one
    return state, state.forward(model, prompt_ids, prompt_mask, last_only=True)[:, -1]


def first_tokens(first: torch.Tensor, logits: torch.Tensor) -> list[int]:
    """A prefill forward's one host read: the first tokens [G] and whether the prefill's logits [G, V] are all finite
    (broken weights or an fp16 overflow show up here). FloatingPointError where they are not."""
    *tokens, finite = torch.cat([first, torch.isfinite(logits).all().reshape(1).to(first.dtype)]).tolist()
    if not finite:
        raise FloatingPointError(NON_FINITE)
    return tokens


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
        if record.emits is not None:  # served: elapsed_s is from the serving loop's start
            record.emits.append((elapsed_s, len(tokens)))
        if not record.stop_reason and record.new_tokens >= generation.max_new_tokens:
            record.stop_reason = "length"
        if record.stop_reason:
            if record.arrival_s is None:
                record.latency_s = elapsed_s
            else:
                record.finish_s, record.latency_s = elapsed_s, elapsed_s - record.arrival_s
        else:
            still_running.append(local)
    return still_running, taken


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    """[..., V] logits -> [...] top-1 minus top-2 logit: how far the argmax is from flipping."""
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def baseline_step(state: KVState, model, token: torch.Tensor, sampling: Sampling, generator: torch.Generator | None,
                  greedy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One decode step of the baseline: the forward of each row's last token [B], the next token [B] and, greedy, its
    top2_gap [B] (left on the device). What the cost probes time as the unit of c and v (runner/probes.py)."""
    logits = state.forward(model, token[:, None], last_only=True)[:, -1]
    return choose_next(logits, sampling, generator), top2_gap(logits) if greedy else None


def generate_baseline(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, generation: Generation,
                      generator: torch.Generator | None = None, clock: Clock | None = None,
                      load: Load | None = None) -> list[RowRecord]:
    """The target alone: prefill, then one forward per token. prompt_ids, prompt_mask [B, P].

    Greedy, each row also keeps its top2_gaps (one per new token). With a load, the rows are requests served with
    continuous batching; without, a static batch: the same loop (`_Loop`) with every row arriving at once."""
    return _Loop(model, None, prompt_ids, prompt_mask, generation, 0, generator, clock, load).run()


def _keep_gaps(records: list[RowRecord], gaps: list[tuple[list[int], torch.Tensor]]) -> None:
    """Greedy baseline: each step's (rows, top2_gap [B']) into the records, in one transfer after the timed loop; a
    step's rows each took one token (_append stops the rest)."""
    if gaps:
        values = iter(torch.cat([gap for _, gap in gaps]).tolist())
        for rows, _ in gaps:
            for row in rows:
                records[row].top2_gaps.append(next(values))


def generate_speculative(target, drafter: Drafter, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                         generation: Generation, gamma: int, generator: torch.Generator | None = None,
                         clock: Clock | None = None, synthetic_acceptance: float | None = None,
                         load: Load | None = None, on_finish=None, overlap: bool = False) -> list[RowRecord]:
    """Speculative decoding: per round the drafter proposes up to gamma tokens per row, the target
    scores them all in one forward, and each row keeps its own accepted prefix plus one target token.

    prompt_ids, prompt_mask [B, P], left padded. Output equals the target's own (greedy: the same
    tokens; sampling: the same distribution).

    gamma caps a round's drafts; each row's draft_limit is the least of gamma, its budget before
    max_new_tokens and its proposal length (its schedule, or no n-gram match). A row with draft_limit 0
    takes a plain target step inside the batch's forward; a round in which no row drafts (G = 0) is the
    baseline's step (`baseline_step`: one forward of the last tokens, the next token chosen, one read). Each
    row's draft_limit is recorded as the round's "drafted".

    Host syncs per round: one read of the verification result (with sdpa or eager attention on a model without
    sliding windows; more with a schedule that stops rows mid-round), plus the three clock reads, which
    synchronise CUDA devices to split time into draft and target. Every other host fact (hole counts, the
    drafters' view of the tokens) is derived from that read; host-to-device copies go through pinned memory.

    synthetic_acceptance alpha (a chain only): draft and target run their real forwards, but each row accepts its
    drafts by a Bernoulli(alpha) chain drawn from `generator` (decode/sampling.py accept_synthetic), then takes the
    target's own token there: it measures the cost at that alpha, and its output is not the target's.

    With a load, the rows are requests served with continuous batching; without, a static batch: the same loop
    (`_Loop`) with every row arriving at once, each round `_speculative_round`. on_finish(request, record), where given,
    is called (inside the timed loop, as a server would) as each request has its last token.
    """
    return _Loop(target, drafter, prompt_ids, prompt_mask, generation, gamma, generator, clock, load,
                 synthetic_acceptance, on_finish, overlap).run()


def _speculative_round(target, drafter: Drafter, state, token: torch.Tensor, active: list[int],
                       records: list[RowRecord], generation: Generation, gamma: int, generator, spans: _Spans,
                       start: float, synthetic_acceptance: float | None, tap: HiddenTap | CompiledTap | None = None
                       ) -> tuple[torch.Tensor, list[int], list]:
    """One round over the running rows (token [B]: each row's last committed token; active: their records): propose,
    verify, accept, the round's host read, roll back, the drafter's commit, and each row's tokens into its record
    (its round facts, forwards and seconds: `_RoundRecorder`). The proposal's layout (`round_layout`: a chain or a
    token tree) does verify / accept / read / roll back. Returns the next token [B], the local indices of the rows
    still running, and the round's host rows (RoundRow). The fixed batch's loop and the serving loop both run it.
    tap: the target's hidden states for a drafter that reads them (Drafter.target_layers), handed over after the
    verification."""
    # gamma clipped per row so that a round never emits past max_new_tokens
    budget_host = [min(gamma, generation.max_new_tokens - records[row].new_tokens - 1) for row in active]
    drafts = max(budget_host) > 0
    recorder = _RoundRecorder(spans, drafter)
    if drafts and fusable(state, drafter, gamma, budget_host, synthetic_acceptance):
        # the compiled and captured modes: the whole round (drafts, verification, acceptance, both rollbacks) as one
        # function over the static caches (decode/round_graph.py), then the same read and bookkeeping
        fused = fused_round(state, drafter, token, budget_host, gamma, generation.sampling, generator,
                            on_drafted=recorder.drafted)
        return _fused_recorded(fused, fused.readout().tolist(), None, records, active, generation, start, spans,
                               recorder, drafter)  # the round's one host read

    # 1. propose: the drafter decides each row's length (its schedule), within the budget; it may be 0
    if drafts:
        proposal = drafter.propose(token, max(budget_host), row_limits=budget_host)
    else:  # every row has one token left: a plain target step
        proposal = Proposal(token.new_zeros(len(active), 0), None)
    layout = round_layout(proposal, synthetic_acceptance)
    recorder.drafted()
    if proposal.tokens.shape[1] == 0 and proposal.layout is None and synthetic_acceptance is None and tap is None:
        # no row drafts (every K 0, or no budget left to draft): the round is the baseline's step, which is what a
        # schedule prices K 0 at; nothing to accept or roll back
        token, _ = baseline_step(state, target, token, generation.sampling, generator, greedy=False)
        host = [RoundRow(0, t, 0, [], []) for t in token.tolist()]  # the round's one host read
        spans.settle()
        drafter.observe([row.token for row in host], [[] for _ in host])
        if drafts:
            drafter.commit(torch.zeros_like(token), [0] * len(host), [0] * len(host))
        return _recorded(records, active, host, layout, generation, start, recorder, drafter if drafts else None,
                         token)
    draft_limit = host_to_device(budget_host, token.device).clamp(max=proposal.tokens.shape[1])  # [B]
    if proposal.lengths is not None:
        draft_limit = torch.minimum(draft_limit, proposal.lengths)

    # 2. verify: one target forward over [last token, d_1 .. d_G] (a tree: over its root and nodes)
    target_logits = layout.verify(state, target, token)
    if tap is not None:
        drafter.take_features(tap.pop())
    # 3. accept: each row's accepted drafts (a tree: a path) and the target's next token
    accepted_len, token, path = layout.accept(target_logits, draft_limit, generation.sampling, generator)
    # host sync, once per round: each row's accepted drafts decide which tokens it appends, whether it stopped
    # at EOS, and how far the caches roll back
    host = layout.read(layout.readout(accepted_len, token, draft_limit, path).tolist())
    spans.settle()  # the spans marked before this read have run: earlier rounds' seconds into their records
    # 4. roll both caches back to each row's accepted drafts
    layout.roll_back(state, accepted_len, host)
    drafter.observe([row.token for row in host], [row.drafts for row in host])
    if drafts:
        drafter.commit(accepted_len, [row.accepted for row in host], [row.drafted for row in host],
                       **layout.commit_facts(host))
    return _recorded(records, active, host, layout, generation, start, recorder, drafter if drafts else None, token)


def _fused_recorded(fused, values: list[list[int]], keep: list[int] | None, records: list[RowRecord],
                    active: list[int], generation: Generation, start: float, spans: _Spans,
                    recorder: _RoundRecorder, drafter: Drafter) -> tuple[torch.Tensor, list[int], list]:
    """A fused round's end (decode/round_graph.py FusedRound) after its host read, values [B, 3 + gamma] (ChainRound's
    readout): the settled seconds, the states and the drafter brought up to date, and _recorded for the rows keep
    (local indices; all where None). Returns _recorded's, its next token [B] over every row the round ran."""
    spans.settle()
    fused.settle([v[0] for v in values], [v[3:] for v in values], keep)
    layout = ChainRound(Proposal(fused.drafts, None, fused.draft_limit))
    host = layout.read(values if keep is None else [values[i] for i in keep])
    drafter.observe([row.token for row in host], [row.drafts for row in host])
    return _recorded(records, active, host, layout, generation, start, recorder, drafter, fused.token)


def _recorded(records: list[RowRecord], active: list[int], host: list[RoundRow], layout, generation: Generation,
              start: float, recorder: _RoundRecorder, drafter: Drafter | None, token: torch.Tensor
              ) -> tuple[torch.Tensor, list[int], list]:
    """A round's end after its read and rollback: each row's tokens into its record, the round's facts and seconds,
    and the drafter (None where it proposed nothing) told what the round cost."""
    verified_at = recorder.verified()
    emitted = [[row.drafts[node] for node in row.path] + [row.token] for row in host]
    running, taken = _append(records, active, emitted, generation, verified_at - start)
    recorder.record(records, active, host, taken, layout, drafter is not None)
    if drafter is not None:  # what the round it proposed cost, its wall on the host (a schedule may learn this machine's
        drafter.timed(verified_at - recorder.started)  # prices)
    return token, running, host


@dataclass
class _Prefilled:
    """One prefill forward's rows that go on (record indices), their cache, first tokens [G] (device) and host copy,
    and the target's features [G, P', F] from prompt column `lead` (None without a tap)."""
    rows: list[int]
    state: object  # decode/kv.py KVState or decode/static_kv.py StaticKVState
    first: torch.Tensor
    first_host: list[int]
    features: torch.Tensor | None
    lead: int


@dataclass
class _Flight:
    """An overlapped round launched and not yet read: its device results, the rows it ran (record indices, in the
    state's order at its launch), its recorder, and its readout on the way to the host (event: a CUDA copy's)."""
    fused: object  # decode/round_graph.py FusedRound
    rows: list[int]
    recorder: "_RoundRecorder"
    copy: torch.Tensor
    event: object | None

    def read(self) -> list[list[int]]:
        """The round's one host read: [B, 3 + gamma] rows of accepted_len, next token, draft_limit, drafts."""
        if self.event is not None:
            self.event.synchronize()
        return self.copy.tolist()


class _RoundRecorder:
    """A round's records and timing, beside the algorithm: the drafter's forwards, per row its round facts
    ({"drafted", "accepted", "emitted"} plus the layout's and a drafter of several sources' own), one target forward,
    and the round's draft and target seconds, split by marks in the device's stream (Clock.mark: no synchronize) and
    added to the records once a later host read has passed them (_Spans). The round's wall is the host's clock from its
    start to after its rollback and the drafter's commit, which follow its one read."""

    def __init__(self, spans: _Spans, drafter: Drafter):
        self.spans, self.clock, self.drafter = spans, spans.clock, drafter
        self.started = self.clock.host()
        self.start_mark = self.clock.mark()
        self.verified_mark = None  # an overlapped round marks its end as it is launched
        self.draft_forwards_before = drafter.forwards

    def drafted(self) -> None:
        self.drafted_mark = self.clock.mark()

    def verified(self) -> float:
        """The round's end: a mark for its seconds, and the host's time (for the records' emits and Drafter.timed)."""
        if self.verified_mark is None:
            self.verified_mark = self.clock.mark()
        self.verified_at = self.clock.host()
        return self.verified_at

    def record(self, records: list[RowRecord], active: list[int], host: list[RoundRow], taken: list[int], layout,
               drafts: bool) -> None:
        """Each active row's round into its record; drafts: whether the drafter proposed this round."""
        # a drafter of several sources says per row which drafted and how many of each were accepted (hybrid)
        source_facts = getattr(self.drafter, "round_facts", None) if drafts else None
        draft_forwards = self.drafter.forwards - self.draft_forwards_before
        for local, row in enumerate(active):
            record = records[row]
            facts = layout.record_facts(host[local], draft_forwards)
            if source_facts:
                facts = {**facts, **source_facts[local]}
            # a draft counts as accepted only where it was emitted: a round cut at EOS (or its budget) emits fewer
            # tokens than the target accepted, all of them drafts
            record.rounds.append({"drafted": host[local].drafted, "accepted": min(host[local].accepted, taken[local]),
                                  "emitted": taken[local], **facts})
            record.target_forwards += 1
            record.draft_forwards += draft_forwards
        rows = [records[row] for row in active]
        if not draft_forwards and not any(h.drafted for h in host):
            # no row drafted and no draft forward ran (every row's K 0, or no tokens left to draft): a plain step,
            # its seconds the target's, and a row off carries no draft seconds
            self.spans.add(rows, ("target_s",), self.start_mark, self.verified_mark)
            return
        self.spans.add(rows, ("draft_s",), self.start_mark, self.drafted_mark)
        self.spans.add(rows, ("target_s",), self.drafted_mark, self.verified_mark)


# A round's layouts: a chain of drafts or a token tree, each with its own verify / accept / readout and read (the
# round's one host read) / roll back and the facts a round of it adds to the drafter's commit and to each row's record.
# The round picks one per proposal (`round_layout`) and runs the same steps whatever the layout.

SYNTHETIC_TREE = "synthetic acceptance applies to a chain of drafts, not to a token tree"


@dataclass
class RoundRow:
    """One row's verification result, as read to the host."""
    accepted: int  # drafts accepted (a tree: the path's length)
    token: int  # the target's next token
    drafted: int  # drafts it could accept (a tree: its valid nodes)
    drafts: list[int]  # the proposal's tokens (G of them; a tree: its N nodes)
    path: list[int]  # the accepted drafts' indices in `drafts`
    # a tree round's record facts: "ranks", "tried", "parents", and "batch_nodes": the nodes the round's target forward
    # verified besides the root (the batch's widest tree, whatever the row's own: what its verification cost)
    tree_facts: dict = field(default_factory=dict)


def _target_probs(target_logits: torch.Tensor, sampling: Sampling) -> torch.Tensor | None:
    """Sampling: the target's warped fp32 distribution [B, G+1, V]; greedy: None."""
    if not sampling.do_sample:
        return None
    return logits_to_probs(target_logits, sampling.temperature, sampling.top_k, sampling.top_p)


class ChainRound:
    """A chain of up to G drafts per row (proposal.tokens [B, G], row b's first draft_limit[b] of them count).
    synthetic_acceptance alpha: each row accepts by a Bernoulli(alpha) chain instead (decode/sampling.py
    accept_synthetic)."""

    def __init__(self, proposal: Proposal, synthetic_acceptance: float | None = None):
        self.proposal, self.synthetic_acceptance = proposal, synthetic_acceptance

    def verify(self, state, target, token: torch.Tensor) -> torch.Tensor:
        """fp32 target logits [B, G+1, V] over [last token, d_1 .. d_G]."""
        return state.forward(target, torch.cat([token[:, None], self.proposal.tokens], dim=1))

    def accept(self, target_logits: torch.Tensor, draft_limit: torch.Tensor, sampling: Sampling,
               generator) -> tuple[torch.Tensor, torch.Tensor, None]:
        """(accepted_len [B], next token [B], None): greedy or speculative sampling (decode/sampling.py accept_greedy /
        accept_sampled), or the synthetic chain at alpha."""
        proposal = self.proposal
        if self.synthetic_acceptance is not None:
            return (*accept_synthetic(draft_limit, proposal.tokens.shape[1], self.synthetic_acceptance, target_logits,
                                      _target_probs(target_logits, sampling), generator), None)
        if sampling.do_sample:
            return (*accept_sampled(proposal.tokens, proposal.probs, _target_probs(target_logits, sampling),
                                    draft_limit, generator), None)
        return (*accept_greedy(proposal.tokens, target_logits, draft_limit), None)

    def readout(self, accepted_len: torch.Tensor, token: torch.Tensor, draft_limit: torch.Tensor,
                path: None = None) -> torch.Tensor:
        """What the round's host read copies, [B, 3 + G]: accepted_len, next token, draft_limit, the drafts."""
        return torch.cat([accepted_len[:, None], token[:, None], draft_limit[:, None], self.proposal.tokens], dim=1)

    def read(self, values: list[list[int]]) -> list[RoundRow]:
        """The host rows of the readout's values: a row's path is its first `accepted` drafts."""
        return [RoundRow(v[0], v[1], v[2], v[3:], list(range(v[0]))) for v in values]

    def roll_back(self, state, accepted_len: torch.Tensor, host: list[RoundRow]) -> None:
        """Keep each row's last token and accepted drafts: a prefix of the round's G + 1 slots."""
        state.keep_prefix_of_last(self.proposal.tokens.shape[1] + 1, accepted_len + 1,
                                  max(r.accepted for r in host) + 1, [r.accepted + 1 for r in host])

    def commit_facts(self, host: list[RoundRow]) -> dict:
        """What Drafter.commit gets besides the accepted lengths: nothing."""
        return {}

    def record_facts(self, row: RoundRow, draft_forwards: int) -> dict:
        """A row's round record beyond "drafted", "accepted", "emitted": nothing."""
        return {}


class TreeRound:
    """A token tree per row (proposal.tokens [B, N], its structure on the device proposal.layout: DeviceTree,
    decode/drafters/base.py; probs [B, N, V]: the q each node was drawn from). The host learns the structure with the
    round's read."""

    def __init__(self, proposal: Proposal):
        self.proposal, self.layout = proposal, proposal.layout
        self.depth = max(self.layout.max_depth, 1)  # the accepted path's width (a bound: deeper than no valid node)

    def verify(self, state, target, token: torch.Tensor) -> torch.Tensor:
        """fp32 target logits [B, N+1, V] by verification column (0: the root, i + 1: node i), with the tree mask:
        each node sees the prefix and its ancestors."""
        ids = torch.cat([token[:, None], self.proposal.tokens], dim=1)
        return state.forward_tree(target, ids, self.layout.verify_parents(), self.layout.verify_valid(),
                                  new_round=True)

    def accept(self, target_logits: torch.Tensor, draft_limit: torch.Tensor, sampling: Sampling,
               generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(path length [B], next token [B], path [B, depth] of node indices, -1 past its end): greedy or SpecInfer's
        multi-step speculative sampling (decode/sampling.py accept_tree_greedy / accept_tree_sampled)."""
        proposal = self.proposal
        target_probs = _target_probs(target_logits, sampling)
        children = self.layout.children()
        if sampling.do_sample:
            return accept_tree_sampled(proposal.tokens, proposal.probs, target_probs, children, self.depth, generator)
        return accept_tree_greedy(proposal.tokens, target_logits, children, self.depth)

    def readout(self, accepted_len: torch.Tensor, token: torch.Tensor, draft_limit: torch.Tensor,
                path: torch.Tensor) -> torch.Tensor:
        """What the round's host read copies, [B, 3 + depth + 4N]: path length, next token, draft_limit, the path, the
        nodes' tokens, the tree (DeviceTree.readout)."""
        return torch.cat([accepted_len[:, None], token[:, None], draft_limit[:, None], path, self.proposal.tokens,
                          self.layout.readout()], dim=1)

    def read(self, values: list[list[int]]) -> list[RoundRow]:
        """The host rows of the readout's values; each row's record facts come from the tree as read (TreeLayout)."""
        depth, nodes_end = self.depth, 3 + self.depth + self.proposal.tokens.shape[1]
        layout = self.layout.read([v[nodes_end:] for v in values])
        rows = []
        for row, v in enumerate(values):
            nodes = [node for node in v[3: 3 + depth] if node >= 0]
            ranks, tried = layout.round_facts(row, nodes)
            rows.append(RoundRow(v[0], v[1], int(layout.valid[row].sum()), v[3 + depth: nodes_end], nodes,
                                 {"ranks": ranks, "tried": tried, "parents": layout.row_parents(row),
                                  "batch_nodes": layout.nodes,
                                  **({"verified": self.layout.widths[row]} if self.layout.widths else {})}))
        return rows

    def roll_back(self, state, accepted_len: torch.Tensor, host: list[RoundRow]) -> None:
        """Keep each row's root (its last committed token) and its path's columns, mask the rest."""
        keep = np.zeros((len(host), self.proposal.tokens.shape[1] + 1), dtype=bool)
        keep[:, 0] = True
        for row, r in enumerate(host):
            keep[row, [node + 1 for node in r.path]] = True
        state.keep_region(keep)

    def commit_facts(self, host: list[RoundRow]) -> dict:
        """Drafter.commit's path_host: each row's accepted node indices."""
        return {"path_host": [row.path for row in host]}

    def record_facts(self, row: RoundRow, draft_forwards: int) -> dict:
        """A tree round's record adds the round's draft forwards and the row's tree facts (RoundRow.tree_facts)."""
        return {"draft_forwards": draft_forwards, **row.tree_facts}


def round_layout(proposal: Proposal, synthetic_acceptance: float | None = None) -> ChainRound | TreeRound:
    """The proposal's layout: a chain (proposal.layout None) or a token tree. ValueError for a tree with
    synthetic_acceptance."""
    if proposal.layout is None:
        return ChainRound(proposal, synthetic_acceptance)
    if synthetic_acceptance is not None:
        raise ValueError(SYNTHETIC_TREE)
    return TreeRound(proposal)


class _Loop:
    """The one decode loop: static batches and continuous batching, the baseline and every drafter. Row i of
    prompt_ids, prompt_mask [N, P] (left padded) is request i, arriving at load.arrivals[i] seconds after the loop's
    start (a conversation's later turn: load.think_s after the request it follows ended); without a load, a static batch: every row arrives at 0 and all N are in flight (nobody joins later). Each
    pass runs three steps:

    - admit: the requests that have arrived join, in arrival order (decode/arrivals.py Queue: a conversation's next turn
      arrives load.think_s after its previous turn's last token), while fewer than load.concurrency rows are in flight.
      Those admitted at one moment are prefilled (a static batch in one target forward; under a load in forwards of
      like length, shortest first, decode/arrivals.py prefill_batches, each over its own width) and take their first
      token; their cache joins the running batch's (decode/kv.py KVState.join) and the drafter gets their rows (a
      static batch: Drafter.start, which may ask a schedule whether drafting pays at all; under a load
      Drafter.add_rows, reset first when no row was in flight). That prefill and the draft's run between rounds: they
      count in the joining requests' TTFT and target_s / draft_s (draft_prefill_s: the draft's), and delay the running
      rows' next tokens, as in a server.
      With no row in flight and nobody waiting, the loop sleeps until the next arrival.
    - round: the baseline's one target step (`baseline_step`) or a speculative round (`_speculative_round`) over the
      running rows.
    - evict: finished rows leave (select_rows on the target's cache and the drafter).

    Records come back in request order; served, with the serving fields (RowRecord.arrival_s ...) set: times in
    seconds from the loop's start. Host reads per round are those of the round alone: the clock is read to admit only
    while requests are still to come. A compiled model's static caches take joining rows in row buckets
    (decode/static_kv.py StaticKVState.join: a join moves the rows to the next bucket's compiled steps).
    """

    def __init__(self, target, drafter: Drafter | None, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                 generation: Generation, gamma: int, generator: torch.Generator | None, clock: Clock | None,
                 load: Load | None, synthetic_acceptance: float | None = None, on_finish=None, overlap: bool = False):
        requests = prompt_ids.shape[0]
        # overlap: asked here or by the compiled model (engine.overlap); flight: the round launched and not yet read
        self.overlap = overlap or getattr(compiled_of(target), "overlap", False) and drafter is not None
        self.flight = None
        self.on_finish = on_finish
        self.served = load is not None
        if self.served:
            load.check(requests)
        self.load = load or Load([0.0] * requests, max(requests, 1))
        self.target, self.drafter, self.generation, self.gamma = target, drafter, generation, gamma
        self.generator, self.synthetic_acceptance = generator, synthetic_acceptance
        self.clock = clock or Clock(prompt_ids.device)
        self.spans = _Spans(self.clock)
        self.prompt_ids, self.prompt_mask = prompt_ids, prompt_mask
        self.greedy_gaps = drafter is None and not generation.sampling.do_sample
        self.queue = Queue(self.load)  # the requests not yet admitted; a conversation's next turn arrives after its last
        # served, each record's arrival (a follower's once the request it follows has finished: Queue.finished)
        self.records = [RowRecord(arrival_s=a, emits=[]) if self.served else RowRecord() for a in self.queue.arrival]
        # the running batch: the target's cache, each row's last token [B] (device) and host copy, its records
        self.state, self.token, self.active, self.last_host = None, None, [], []
        self.gaps = []  # greedy baseline: (rows, their top2_gap) per forward
        self.tap = None  # a drafter that reads the target's hidden states: the hooks that keep them (decode/hidden.py)
        if drafter is not None and drafter.target_layers:
            compiled = compiled_of(target)  # a compiled target returns them from its graphs
            self.tap = (CompiledTap(compiled, drafter.target_layers, prompt_ids.device) if compiled is not None
                        else HiddenTap(target, drafter.target_layers, prompt_ids.device))

    def run(self) -> list[RowRecord]:
        try:
            return self._run()
        finally:
            if self.tap is not None:
                self.tap.close()

    def _run(self) -> list[RowRecord]:
        # the prompts on the host, read once before the clock starts: admissions and drafters take their rows from here
        self.ids_host, self.mask_host = self.prompt_ids.cpu().numpy(), self.prompt_mask.cpu().numpy().astype(np.int64)
        if self.served:
            real = self.mask_host != 0
            self.first_real = np.where(real.any(axis=1), real.argmax(axis=1), real.shape[1])
        clock = self.clock
        self.start = clock.now()
        self.last_read = 0.0  # seconds from the start at the latest clock read: a baseline step's time runs from it
        queue, rate = self.queue, None
        hears = self.served and self.drafter is not None and self.drafter.reads_queue
        while queue.left or self.active:
            if queue.left:
                # a static batch: all arrive at 0, admitted at once, no clock read before the prefill
                now = clock.host() - self.start if self.served else 0.0
                group = queue.admit(now, self.load.concurrency - len(self.active))
                if hears:  # those waiting, and arriving, refill rows that end
                    rate = queue.rate(now)
                    self.drafter.queued(queue.waiting(now), rate)
                if not group and not self.active:  # nobody in flight: wait for the next arrival
                    time.sleep(max(0.0, queue.next_arrival() - now))
                    continue
                if group:
                    self._drain()  # an overlapped round in flight is read before rows join
                    self._admit(group, now)
            elif hears:  # every request admitted: the rate as last read
                self.drafter.queued(0, rate)
            if not self.active:
                continue
            running = self._round()
            self._evict(running)
            if self.flight is not None and not self.active:
                self.flight = None  # every row ended: the round launched after them has nobody to record
        clock.now()  # the last spans' marks have run
        self.spans.settle()
        _keep_gaps(self.records, self.gaps)
        return self.records

    def _finished(self, rows: list[int]) -> None:
        """These requests had their last token: on_finish is told, and the turns that follow them arrive (records'
        arrival_s)."""
        if self.on_finish is not None:
            for row in rows:
                self.on_finish(row, self.records[row])
        if self.served:
            for row in rows:
                for follower in self.queue.finished(row, self.records[row].finish_s):
                    self.records[follower].arrival_s = self.queue.arrival[follower]

    def _admit(self, group: list[int], now: float) -> None:
        """The group admitted at `now`: its prefill forwards (served: prompts of unlike length apart, shortest first,
        decode/arrivals.py prefill_batches), one after another, each with its first tokens (a host read: one may
        already be EOS); then the rows that go on join the running batch together (`_join`)."""
        batches = [group]
        if self.served:
            batches = prefill_batches(group, (self.mask_host.shape[1] - self.first_real[group]).tolist())
        parts, began = [], now
        for batch in batches:
            part = self._prefill(batch, now, began)
            began = self.last_read  # the next forward starts where this one's read ended
            if part is not None:
                parts.append(part)
        if parts:
            self._join(parts)

    def _prefill(self, group: list[int], now: float, began: float) -> "_Prefilled | None":
        """One prefill forward over `group` (admitted at `now`, its forward begun at `began`, the records'
        admitted_s: a row of a later forward waits for the ones before); the records' first token; None if every row
        ended there, else the rows that go on."""
        records, device, sampling = self.records, self.prompt_ids.device, self.generation.sampling
        lead = int(min(self.first_real[i] for i in group)) if self.served else 0
        ids = self.prompt_ids[host_to_device(group, device), lead:] if self.served else self.prompt_ids
        group_state, logits = prefill(self.target, ids, self.mask_host[group, lead:] if self.served else self.mask_host)
        features = self.tap.pop() if self.tap is not None else None  # [G, P', F]
        first = choose_next(logits, sampling, self.generator)  # [G]
        if self.greedy_gaps:
            self.gaps.append((group, top2_gap(logits)))
        first_host = first_tokens(first, logits)
        prefilled = self.clock.host() - self.start
        self.last_read = prefilled
        for row in group:
            record = records[row]
            record.target_forwards, record.target_s = 1, prefilled - began
            record.prefill_s = prefilled - (record.arrival_s or 0.0)
            if self.served:
                record.admitted_s, record.first_token_s = began, prefilled  # its prefill began: after those before
        running, _ = _append(records, group, [[t] for t in first_host], self.generation, prefilled)
        self._finished([row for i, row in enumerate(group) if i not in running])
        if not running:
            return None
        if len(running) < len(group):  # rows done at their first token never join
            group_state.select_rows(running)
            keep = host_to_device(running, device)
            first = first[keep]
            features = features[keep] if features is not None else None
        return _Prefilled([group[i] for i in running], group_state, first, [first_host[i] for i in running], features,
                          lead)

    def _join(self, parts: list[_Prefilled]) -> None:
        """The rows of one admission's prefill forwards (`_prefill`'s parts) join the running batch: their caches, last
        tokens and records, and the drafter's rows, all of them at once (its model's prefill of them: a static batch
        Drafter.start, under a load Drafter.add_rows, each prompt cut to the rows' own width)."""
        records, drafter = self.records, self.drafter
        joining = [row for part in parts for row in part.rows]
        if drafter is not None:  # the drafter's rows (its model's prefill of them)
            lead = int(min(self.first_real[i] for i in joining)) if self.served else 0
            index = host_to_device(joining, self.prompt_ids.device)
            ids, mask = self.prompt_ids[index, lead:], self.prompt_mask[index, lead:]
            host = (self.ids_host[joining, lead:], self.mask_host[joining, lead:])
            if self.tap is not None:  # each forward's features from its own lead, left padded to the rows' width
                drafter.take_features(torch.cat([torch.nn.functional.pad(part.features, (0, 0, part.lead - lead, 0))
                                                 for part in parts]))
            if self.served and not self.active:  # before its count is read: a reset drafter counts from 0
                drafter.reset()
            forwards, before = drafter.forwards, self.clock.mark()
            if not self.served:
                drafter.start(ids, mask, host)
            else:
                drafter.add_rows(ids, mask, host)
            # the draft's prefill, in the stream: its seconds reach the records after the next read
            self.spans.add([records[row] for row in joining], ("draft_s", "draft_prefill_s"), before, self.clock.mark())
            for row in joining:
                records[row].draft_forwards = drafter.forwards - forwards
        for part in parts:
            self.state = joined(self.state, part.state)
            self.token = part.first if self.token is None else torch.cat([self.token, part.first])
            self.last_host = self.last_host + part.first_host
        self.active = self.active + joining
        if drafter is not None:
            drafter.observe(self.last_host)

    def _round(self) -> list[int]:
        """One round over the running rows; the local indices of those still running."""
        records, active = self.records, self.active
        if self.drafter is None:
            self.token, gap = baseline_step(self.state, self.target, self.token, self.generation.sampling,
                                            self.generator, self.greedy_gaps)
            if self.greedy_gaps:
                self.gaps.append((active, gap))
            self.last_host = self.token.tolist()  # host sync, once per step: each row's token may be its EOS
            stepped = self.clock.host() - self.start
            for row in active:
                records[row].target_forwards += 1
                records[row].target_s += stepped - self.last_read
            self.last_read = stepped
            running, _ = _append(records, active, [[t] for t in self.last_host], self.generation, stepped)
            return running
        if self.overlap:
            return self._overlapped()
        self.token, running, host = _speculative_round(self.target, self.drafter, self.state, self.token, active,
                                                       records, self.generation, self.gamma, self.generator,
                                                       self.spans, self.start, self.synthetic_acceptance, self.tap)
        self.last_host = [row.token for row in host]
        return running

    # -- overlap: round k + 1 launched from round k's device results before the host reads round k --------------------
    def _launch(self, rows: list[int], budget: list[int], token: torch.Tensor, carry: bool) -> "_Flight":
        """A fused round over `rows` (record indices, the state's live rows in order), its readout copied to the host
        without waiting (pinned memory, an event): read by `_Flight.read`."""
        recorder = _RoundRecorder(self.spans, self.drafter)
        fused = fused_round(self.state, self.drafter, token, budget, self.gamma, self.generation.sampling,
                            self.generator, on_drafted=recorder.drafted, carry=carry)
        recorder.verified_mark = self.clock.mark()  # the round's end in the stream, before the next is launched
        readout = fused.readout()
        if readout.device.type != "cuda":
            return _Flight(fused, rows, recorder, readout, None)
        copy = torch.empty(readout.shape, dtype=readout.dtype, pin_memory=True)
        copy.copy_(readout, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return _Flight(fused, rows, recorder, copy, event)

    def _overlapped(self) -> list[int]:
        """engine.overlap: a fused round (decode/round_graph.py) is launched, then the next from its device results
        (lengths, pending tokens and next tokens carried on the device; budgets one round late: each row's tokens left
        less a whole round's gamma + 1), then the first is read and recorded. A row that ends in round k ran in round
        k + 1 too: its tokens there are dropped and it leaves before round k + 2. Where the next round cannot be
        launched so (a row short of gamma, no room for two rounds in the static caches), the loop reads and goes on
        one round at a time."""
        records, gamma, generation = self.records, self.gamma, self.generation
        left = [generation.max_new_tokens - records[row].new_tokens - 1 for row in self.active]
        flight = self.flight
        if flight is None:
            budget = [min(gamma, b) for b in left]
            if not (max(budget) > 0 and fusable(self.state, self.drafter, gamma, budget, self.synthetic_acceptance)):
                self.token, running, host = _speculative_round(
                    self.target, self.drafter, self.state, self.token, self.active, records, generation, gamma,
                    self.generator, self.spans, self.start, self.synthetic_acceptance, self.tap)
                self.last_host = [row.token for row in host]
                return running
            flight = self._launch(list(self.active), budget, self.token, carry=False)
        # the next round, before this one is read: the rows now in flight (those ended a round ago have left)
        index = {row: i for i, row in enumerate(flight.rows)}
        lagged = [min(gamma, b - (gamma + 1)) for b in left]
        room = all(s.length + 2 * (gamma + 1) <= s.compiled.max_length for s in (self.state, self.drafter.state))
        self.flight = None
        if room and max(lagged) >= gamma and fusable(self.state, self.drafter, gamma, lagged, None):
            token = flight.fused.token[host_to_device([index[row] for row in self.active], self.token.device)]
            self.flight = self._launch(list(self.active), [max(0, b) for b in lagged], token, carry=True)
        return self._read(flight)

    def _read(self, flight: "_Flight") -> list[int]:
        """An overlapped round's one read and its records, for the rows still in flight (those that ended a round
        before ran in it too: their tokens there are dropped); the local indices of the rows still running."""
        index = {row: i for i, row in enumerate(flight.rows)}
        values = flight.read()
        keep = [index[row] for row in self.active]
        token, running, host = _fused_recorded(flight.fused, values, None if len(keep) == len(values) else keep,
                                               self.records, self.active, self.generation, self.start, self.spans,
                                               flight.recorder, self.drafter)
        self.token = token[host_to_device(keep, token.device)] if len(keep) < len(values) else token
        self.last_host = [row.token for row in host]
        return running

    def _drain(self) -> None:
        """Read the overlapped round in flight, if any (before rows join): its records, then the rows that ended
        leave."""
        flight, self.flight = self.flight, None
        if flight is not None and self.active:
            self._evict(self._read(flight))

    def _evict(self, running: list[int]) -> None:
        """Finished rows leave the target's cache and the drafter."""
        kept = set(running)
        self._finished([row for i, row in enumerate(self.active) if i not in kept])
        if not running:
            self.state, self.token, self.active, self.last_host = None, None, [], []
        elif len(running) < len(self.active):
            self.state.select_rows(running)
            if self.drafter is not None:
                self.drafter.select_rows(torch.tensor(running))
            self.token = self.token[host_to_device(running, self.token.device)]
            self.active = [self.active[i] for i in running]
            self.last_host = [self.last_host[i] for i in running]
