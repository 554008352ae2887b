"""A smaller causal LM as the drafter (Leviathan et al. 2023), with a draft-length schedule."""
from __future__ import annotations

import numpy as np
import torch

from decode.drafters.base import Drafter, Proposal, pad_to_vocab, right_aligned, unpadded
from decode.drafters.schedules import Schedule
from decode.k_model import window_tokens
from decode.kv import KVState, host_to_device, joined
from decode.static_kv import new_state
from decode.sampling import logits_to_probs, sample
from decode.settings import Sampling


class DraftModelDrafter(Drafter):
    """Drafts autoregressively with its own KV cache, each row as many tokens as its schedule says.

    Cache invariant between rounds: the cache holds every committed token of a row except its `pending`
    ones: the last committed token always (it arrives as `last_tokens`), plus, after a round in which the
    row accepted all its drafts, the last draft (never fed), plus every token committed in rounds the row
    did not draft. The next round that drafts feeds a row's pending tokens first, in one forward, masked
    where a row has fewer than another.

    schedule: each row's length per round (decode/drafters/schedules.py); None drafts max_tokens every round,
    the constant schedule at the engine's gamma (clipped to the budget).

    context: the draft's window over the prompt (speculative.draft_context): each row's prompt is prefilled from its
    last `context` tokens only, so the draft's prefill costs that many tokens, not the prompt's (a long prompt, a
    conversation's later turn); every token generated after joins its cache as usual. The target still reads the
    whole prompt and decides every token: only acceptance can change. None: the whole prompt.

    defer: the draft's prefill waits for the first round that drafts (HybridDrafter sets it: a row whose free
    sources do well may never need the draft). Until then each joining row's prompt (its window's) waits in its
    pending tokens, and the first round that drafts feeds them in its catch-up forward, which on an empty cache is
    the prefill (left padded, as add_rows would run it). Once the cache exists, joining rows are prefilled as usual.

    A schedule that idles rows (Schedule.idles_rows: recommended, whose K is 0 where speculation does not pay)
    defers a joining group whose rows it will not draft in the coming round, whether or not the cache
    exists: the group joins the cache as empty rows (KVState.add_empty_rows) and its prompts wait in the pending
    tokens, with every token it commits while it does not draft. A row that never drafts never costs the draft a
    forward; one that starts later pays its prefill then, in the catch-up. Rows joining while the cache does not
    exist but earlier rows do wait too (the catch-up builds the cache for all). Each row that joined so says it in
    every round's record (`round_facts`: "catch_up", the width its first forward fed that round, its pending tokens
    and its last one, 0 where the round drafted nothing), as the hybrid drafter's rows do: the replay
    (eval/replay.py prefill_deferred) then prices its prefill where it ran, in a round, not at its admission.

    Held rows: in a round that drafts (a chain), a row the schedule drafts nothing for whose pending tokens would
    widen the catch-up forward (more of them than any drafting row has) is not caught up: the other rows' drafting
    does not pay its catch-up (a long prompt that joined where drafting did not pay would otherwise be fed whole by a
    neighbour's first drafting round). It is fed its last token alone, so the batched forward has a real token to
    attend to in every row (an empty cache fed only masked slots would attend over nothing), and everything the
    round fed it is dropped at commit; its last token joins its pending ones. A row within the forward's width is
    fed as before (free). A row held after its prefill ran says its catch-ups in its records from then on ("catch_up"
    with "lagging": its prefill was not deferred), so the replay prices a wide one where it runs.

    The model may sit on other devices than the engine (another GPU, a device map): KVState feeds it on its
    input embedding's device and brings its logits back to the engine's device.
    """

    def __init__(self, model, target_vocab_size: int, sampling: Sampling, generator: torch.Generator | None = None,
                 schedule: Schedule | None = None, tree=None, context: int | None = None):
        if context is not None and context < 1:
            raise ValueError(f"the draft's context window must be >= 1 token, got {context}")
        self.model = model
        self.context = context
        # a token tree instead of a chain (decode/drafters/draft_tree.py: StaticTree, DynamicTree, or auto's policy)
        self.tree = tree
        self.target_vocab_size = target_vocab_size
        self.sampling = sampling
        self.generator = generator
        self.schedule = schedule
        self.state: KVState | None = None  # None: no rows yet
        self.input_vocab_size = model.get_input_embeddings().num_embeddings
        self.off = False  # True: this batch does not run the draft (start asks the schedule)
        self.defer = False  # True: no prefill before the first round that drafts (see the class doc)
        self.joined_empty: list[bool] = []  # per row: its prefill waited for a round that drafts (idles_rows)
        self.lagging: list[bool] = []  # per row: held after its prefill (its records say its catch-ups)
        self.round_facts: list[dict] | None = None  # per row, this round's facts for its record (idles_rows)
        self.held: list[int] = []  # rows held this round: fed their last token only, dropped at commit
        self.held_last: list[int] = []  # those rows' last tokens (host), which join their pending at commit
        self.round_shape: tuple[int, int, int] | None = None  # (rows, width, tokens fed a row) of a chain round

    @property
    def forwards(self) -> int:
        return 0 if self.state is None else self.state.forwards

    @property
    def started(self) -> bool:
        """Whether the draft's cache exists (a deferred prefill, `defer`, has run)."""
        return self.state is not None

    def start(self, prompt_ids, prompt_mask, host=None):
        self.reset()
        # a schedule may judge the draft's prefill dearer than anything drafting can save on this batch
        # (cost_model: a long prompt, few new tokens): then the draft never runs and every round is a plain step.
        # Serving (reset + add_rows) never asks: the batch holds requests that have not arrived yet
        width = self.prefill_width(prompt_ids.shape[1])
        self.off = self.schedule is not None and not self.schedule.worth_drafting(width)
        self.add_rows(prompt_ids, prompt_mask, host)

    def reset(self):
        self.state = None
        self.pending: list[list[int]] = []  # per row: committed tokens, not yet fed
        self.joined_empty = []
        self.lagging = []
        self.round_facts = None
        self.held, self.held_last = [], []
        self._observed = self._observed_drafts = None
        self.off = False
        if self.schedule is not None:
            self.schedule.start(0)

    def prefill_width(self, prompt_width: int) -> int:
        """The tokens the draft prefills of a prompt this wide: its window's, at most."""
        return window_tokens(prompt_width, self.context)

    def add_rows(self, prompt_ids, prompt_mask, host=None):
        """The joining rows' prompts prefilled into a cache of their own, joined to the running one (decode/kv.py
        KVState.join: the narrower left padded); their schedule state starts as a new batch's rows' does. A tree
        (static, dynamic, auto) keeps nothing per row between rounds: its rows join with the cache (auto's recent
        rounds go on across joins)."""
        self.pending += [[] for _ in range(prompt_ids.shape[0])]
        self.joined_empty += [False] * prompt_ids.shape[0]
        self.lagging += [False] * prompt_ids.shape[0]
        self.device = prompt_ids.device
        if self.schedule is not None and self.schedule.reads_context:  # each row's prompt, its context's start
            self.schedule.add_rows(prompt_ids.shape[0], prompt_tokens=[int(t) for t in (
                host[1].sum(axis=1) if host is not None else prompt_mask.sum(dim=1).tolist())])
        elif self.schedule is not None:
            self.schedule.add_rows(prompt_ids.shape[0])
        if not self.off:
            if self.context is not None:  # the window: each (left-padded) row's last tokens
                prompt_ids, prompt_mask = prompt_ids[:, -self.context:], prompt_mask[:, -self.context:]
                host = None if host is None else (host[0][:, -self.context:], host[1][:, -self.context:])
            if self._waits(prompt_mask):  # the prefill waits in the pending tokens (class doc)
                if self.state is not None:
                    self.state.add_empty_rows(prompt_ids.shape[0])
                self.pending[-prompt_ids.shape[0]:] = [[min(t, self.input_vocab_size - 1) for t in prompt]
                                                       for prompt in unpadded(prompt_ids, prompt_mask, host)]
                if self._idles:  # hybrid (defer) records its rows' catch-up itself
                    self.joined_empty[-prompt_ids.shape[0]:] = [True] * prompt_ids.shape[0]
                return
            state = new_state(self.model)
            # a prompt id past the draft's embeddings (a smaller vocabulary, decode/vocab.py) is fed clamped, as every
            # later feed is: the draft predicts worse there, the target still decides
            state.forward(self.model, prompt_ids.clamp(max=self.input_vocab_size - 1),
                          prompt_mask if host is None else host[1], last_only=True)
            self.state = joined(self.state, state)

    def _waits(self, prompt_mask: torch.Tensor) -> bool:
        """Whether the joining rows' prefill (the last rows; prompt_mask [J, P] as fed) waits for a round that drafts
        (class doc: defer, idles_rows): none of them drafts at once by its K."""
        joining = prompt_mask.shape[0]
        if self.state is None and (self.defer or (self._idles and len(self.pending) > joining)):  # earlier rows wait
            return True
        # the coming round's K as that round will plan it, told the rows' backlogs (the joining ones' none): a K the
        # rows' catch-ups price out is no reason to prefill
        return self._idles and not any(self.schedule.plan([len(p) for p in self.pending])[-joining:])

    @property
    def _idles(self) -> bool:
        return self.schedule is not None and self.schedule.idles_rows

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [B, V_d] -> [B, V_t]: tokens outside the draft's vocabulary get q = 0."""
        return pad_to_vocab(logits, self.target_vocab_size)

    def _lengths(self, max_tokens: int, row_limits: list[int] | None) -> list[int]:
        rows = len(self.pending)
        # the schedule is told each row's pending tokens: a drafting round feeds them first
        wanted = [max_tokens] * rows if self.schedule is None else self.schedule.plan([len(p) for p in self.pending])
        limits = row_limits if row_limits is not None else [max_tokens] * rows
        caps = [max(0, min(limit, max_tokens)) for limit in limits]  # the most each row may draft
        return [max(0, min(w, cap)) for w, cap in zip(wanted, caps)]

    @property
    def reads_queue(self) -> bool:
        return self.schedule is not None and self.schedule.reads_queue

    def queued(self, requests: int, rate: float | None = None) -> None:
        self.schedule.queued(requests, rate)

    def timed(self, seconds: float) -> None:
        if self.schedule is not None and self.round_shape is not None:
            self.schedule.timed(seconds, *self.round_shape)

    def held_rows(self, lengths: list[int]) -> list[int]:
        """The rows a drafting chain round of these lengths holds (class doc): drafting nothing, with more pending
        tokens than any drafting row has."""
        width = max((len(p) for k, p in zip(lengths, self.pending) if k), default=0)
        return [row for row, (k, p) in enumerate(zip(lengths, self.pending)) if not k and len(p) > width]

    def _catch_up_inputs(self, last_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """last_tokens [B] -> [B, P] ids and mask: each row's pending tokens, then its last token, right-aligned; a
        held row (self.held) its last token alone (P = 1 and no mask when nothing else is fed, the usual case: no
        copy through the host). The mask is built on the host (numpy), the ids copied to the device without a
        sync."""
        held = set(self.held)
        width = 1 + max((len(p) for row, p in enumerate(self.pending) if row not in held), default=0)
        if width == 1 and not held:
            return last_tokens[:, None], None
        last = [min(t, self.input_vocab_size - 1) for t in self._last_tokens_host(last_tokens)]
        self.held_last = [last[row] for row in self.held]
        if width == 1:
            return last_tokens[:, None], None
        ids, mask = right_aligned([([] if row in held else tokens) + [last[row]]
                                   for row, tokens in enumerate(self.pending)])
        return host_to_device(ids, self.device), mask

    def propose(self, last_tokens, max_tokens, row_limits=None):
        self.round_shape = None  # (rows, width, tokens fed a row) of a chain round, for `timed`
        if self.off:
            self.last_proposal = last_tokens.new_zeros(last_tokens.shape[0], 0)  # [B, 0]: nothing queued either
            return Proposal(self.last_proposal, None, torch.zeros_like(last_tokens))
        lengths = self._lengths(max_tokens, row_limits)  # each row's schedule, clipped to its budget
        num_tokens = max(lengths, default=0)
        self.round_shape = (len(lengths), 0, 0)
        shape = None
        if self.tree is not None and num_tokens > 0:
            shape = self.tree.shape_for_round(num_tokens)  # None: no drafting this round (auto)
            if shape is None:
                num_tokens = 0
        # a chain's rows that draft nothing and whose pending tokens would widen the catch-up are held (class doc); a
        # tree feeds every row
        self.held = self.held_rows(lengths) if num_tokens > 0 and shape is None else []
        for row in self.held:  # a row that was prefilled says its catch-ups from now on (class doc)
            self.lagging[row] = self.lagging[row] or not self.joined_empty[row]
        self._note_catch_up(num_tokens > 0)
        if num_tokens == 0:
            return self._no_drafts(last_tokens)
        # an id the draft cannot embed (a padded row of a bigger target) only costs acceptance
        last_tokens = last_tokens.clamp(max=self.input_vocab_size - 1)
        # 1. catch up: each row's pending tokens and its last token in one forward, whose last logits draft d_1
        input_ids, input_mask = self._catch_up_inputs(last_tokens)  # [B, P]
        held = set(self.held)
        self.pending = [p if row in held else [] for row, p in enumerate(self.pending)]
        if self.state is None:  # a deferred prefill (defer): the catch-up fills an empty cache
            self.state = new_state(self.model)
        self.round_shape = None if shape is not None else (len(lengths), num_tokens, input_ids.shape[1])
        if shape is not None:
            root_logits = self._to_target_vocab(self.state.forward(self.model, input_ids, input_mask,
                                                                   last_only=True)[:, -1])
            proposal = self.tree.draft(self, root_logits, lengths, shape)
            self.last_proposal, self.last_layout = proposal.tokens, proposal.layout
            return proposal
        remaining = host_to_device(lengths, last_tokens.device)  # [B] each row's draft length so far allowed
        tokens, probs = [], []
        for step in range(num_tokens):
            # 2. one draft step for every row: rows that wanted fewer tokens (or stopped) draft on, ignored
            #    past their length, since one batched forward costs the same
            draft_logits = self.state.forward(self.model, input_ids, input_mask, last_only=True)[:, -1]  # [B, V_d]
            logits = self._to_target_vocab(draft_logits)  # [B, V_t]
            q = logits_to_probs(logits, self.sampling.temperature, self.sampling.top_k, self.sampling.top_p) \
                if self.sampling.do_sample else None  # [B, V_t] warped q under sampling
            token = sample(q, self.generator) if q is not None else logits.argmax(dim=-1)  # [B]
            tokens.append(token)
            if q is not None:
                probs.append(q)
            # 3. a schedule may end a row's draft after this token (confidence), on the device: the chain runs its
            #    steps whatever the rows decided (asking the host whether every row has ended would stop the device
            #    each step, and a captured loop cannot end early); the verification reads only each row's length
            if step + 1 < num_tokens:
                self._end_rows(step, logits, q, token, remaining)
            input_ids, input_mask = token[:, None], None
        drafted = torch.stack(tokens, dim=1)  # [B, G]
        self.last_proposal = drafted
        return Proposal(drafted, torch.stack(probs, dim=1) if probs else None, remaining.clamp(max=drafted.shape[1]))

    def _end_rows(self, step: int, logits: torch.Tensor, q: torch.Tensor | None, token: torch.Tensor,
                  remaining: torch.Tensor) -> None:
        """Apply the schedule's mid-round stop to remaining [B] in place (no host read): a row that stops keeps this
        step's token and no more. logits [B, V_t], q [B, V_t] or None in greedy (the schedule then sees the softmax of
        the logits), token [B]."""
        if self.schedule is None or not self.schedule.stops_mid_round:
            return
        keep = self.schedule.keep_drafting(q if q is not None else torch.softmax(logits, dim=-1), token)  # [B] bool
        remaining.copy_(torch.where(keep, remaining, remaining.clamp(max=step + 1)))

    def _note_catch_up(self, drafting: bool) -> None:
        """This round's facts for the records of rows whose prefill waited (joined_empty) or that were held after
        their prefill (lagging, so marked: their prefill ran at admission): the width their catch-up feeds (pending
        tokens and the last one), 0 where the round drafts nothing for them; None where no row is either."""
        if not any(self.joined_empty) and not any(self.lagging):
            self.round_facts = None
            return
        facts = []
        for row, (p, empty, lagging) in enumerate(zip(self.pending, self.joined_empty, self.lagging)):
            fact = {"catch_up": len(p) + 1 if drafting and row not in self.held else 0} if empty or lagging else {}
            facts.append({**fact, "lagging": True} if lagging else fact)
        self.round_facts = facts

    def _no_drafts(self, last_tokens: torch.Tensor) -> Proposal:
        """No row drafts this round: the engine takes a plain target step; each last token waits to be fed."""
        last = [min(t, self.input_vocab_size - 1) for t in self._last_tokens_host(last_tokens)]
        for row in range(len(self.pending)):
            self.pending[row].append(last[row])
        self.last_proposal = last_tokens.new_zeros(len(last), 0)  # [B, 0]
        return Proposal(self.last_proposal, None, torch.zeros_like(last_tokens))

    def tree_forward(self, ids: torch.Tensor, parents, new_round: bool) -> torch.Tensor:
        """One draft forward over tree nodes ids [B, F] (parents: region columns, -1: after the root; decode/kv.py
        forward_tree) -> their logits over the target's vocabulary [B, F, V_t]."""
        ids = ids.clamp(max=self.input_vocab_size - 1)
        valid = torch.ones_like(ids, dtype=torch.bool)
        return self._to_target_vocab(self.state.forward_tree(self.model, ids, parents, valid, new_round))

    def commit(self, accepted_len, accepted_len_host, drafted_host, path_host=None):
        drafted = self.last_proposal.shape[1]  # G
        if self.schedule is not None:
            self.schedule.update(drafted_host, accepted_len_host)
        if path_host is not None:
            self._commit_tree(path_host)
            return
        if drafted == 0:
            return
        # this round fed [pending.., last token, d_1 .. d_{G-1}]: of the last G slots keep the last token and
        # the accepted drafts that were fed; a held row keeps none (its last token waits with its pending ones)
        kept = accepted_len.clamp(max=drafted - 1) + 1  # [B]
        kept_host = [min(accepted, drafted - 1) + 1 for accepted in accepted_len_host]
        if self.held:
            for row, last in zip(self.held, self.held_last):
                kept_host[row] = 0
                self.pending[row].append(last)
            kept = host_to_device(kept_host, kept.device)
            self.held, self.held_last = [], []
        self.state.keep_prefix_of_last(drafted, kept, max(kept_host), kept_host)
        full = [row for row, accepted in enumerate(accepted_len_host) if accepted == drafted]
        if full:  # every one of G drafts accepted: the last one was never fed (its ids were in the engine's sync)
            drafts = self._drafts_host(self.last_proposal)
            for row in full:
                self.pending[row].append(drafts[row][-1])

    def _commit_tree(self, path_host: list[list[int]]) -> None:
        """Keep the fed nodes of each row's accepted path in the draft cache; a path's last node, if the draft never
        fed it (a leaf), waits in `pending` like a chain's last draft after a full accept."""
        layout = self.last_layout.host  # read with the round
        if hasattr(self.tree, "observe"):
            self.tree.observe(path_host, layout)
        width = self.state.region_width
        if width:
            keep = np.zeros((len(path_host), width), dtype=bool)
            for row, path in enumerate(path_host):
                keep[row, [layout.columns[row, node] for node in path if layout.columns[row, node] >= 0]] = True
            self.state.keep_region(keep)
        drafts = self._drafts_host(self.last_proposal) if any(path_host) else None
        for row, path in enumerate(path_host):
            if path and layout.columns[row, path[-1]] < 0:
                self.pending[row].append(min(drafts[row][path[-1]], self.input_vocab_size - 1))

    def select_rows(self, rows):
        kept = rows.tolist()
        if self.state is not None:
            self.state.select_rows(kept)
        self._keep_observed(kept)
        self.pending = [self.pending[r] for r in kept]
        self.joined_empty = [self.joined_empty[r] for r in kept]
        self.lagging = [self.lagging[r] for r in kept]
        if self.schedule is not None:
            self.schedule.select_rows(kept)
