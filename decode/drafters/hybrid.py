"""One drafter over three sources, chosen per row and round by expected accepted tokens per unit of cost.

Sources: prompt lookup ("lookup", decode/drafters/prompt_lookup.py) and suffix decoding ("suffix",
decode/drafters/suffix.py), which cost no forward, and the draft model ("draft", decode/drafters/draft_model.py),
which costs c target steps a token. Each round, for each row, with b_i the acceptance factors of each source's
evidence (the cost_model schedule's estimator, CostModelSchedule.acceptance: the row's decayed counts shrunk toward
the point's pool; a free source's candidate is judged by the evidence of its strength, `stratum`: lookup by the n-gram
it matched, suffix by its first token's estimated probability, each apart where the other free source proposes a
different first token) and S(i) = b_1 ... b_i, the row takes the best of the options below, every length k up to the
round's cap (speculative.hybrid_max_draft, past gamma, else gamma): a free source whose evidence says it will not pay
never drafts, and one that keeps being accepted drafts long

    a plain step                                   1 / 1
    a free source s, its first k tokens            E_s(k) / v(k)                      E(k) = 1 + S(1) + ... + S(k)
    the draft model, k tokens                      E_d(k) / (k c + v(k))
    both in one tree: s's k_f tokens as one        E_m / (k_d c + v(k_f + k_d))       E_m = 1 + sum_i 1 - (1 - S_s(i))
    branch, the draft's k_d as another                                                              (1 - S_d(i))

(v(n): an (n+1)-token target forward over a 1-token one, measured in this run, made non-decreasing within the probes'
noise (schedules.monotone: a CPU whose 4-token forward is cheaper than its 1-token one keeps that) and extrapolated
with the last slope past the longest measured; the merged tree's E_m takes the branches as independent). A free
source with a long confident match makes the draft's options lose, and the draft does not run that round: its cache
catches up on the row's committed tokens the next time it drafts (DraftModelDrafter's pending tokens). A row that has
not drafted with the model for PROBE_EVERY rounds drafts at least one model token (the only way its evidence
recovers; once the draft's deferred prefill has run, and where the tokens it has left repay the catch-up:
HybridDrafter), and every PROBE_EVERY rounds below the cap a row
that drafts with the model drafts one token more than its best length (the cost_model schedule's probe: the draft's
position k + 1 is scored only where it was drafted, so one early rejection at position 2 would otherwise keep every
later row at k = 1 for good). With a confidence threshold (speculative.confidence), a row's draft branch also ends
after the step whose top probability falls under it, that token kept (ConfidenceSchedule's rule), and the round goes
on at the length drafted. The free sources need no probe: after every round each candidate is scored against what
the round committed (its longest common prefix with the accepted tokens and the target's next token), whether it was verified
or not; the draft model is scored the same way on the rounds it drafted. With point-mass drafts this counterfactual
test has the acceptance test's probability: a point mass x is accepted with probability p(x), the chance that the
target's own token is x.

Exactness: lookup and suffix tokens are point masses (q one-hot), draft tokens carry the draft's q. A chain round
whose rows draw from different sources passes per-row q (one-hot rows for the free sources). A merged tree puts the
free branch first and the draft branch second under the root, never merged even where they share a token: each node
keeps the q it was drawn from, and SpecInfer's rule (decode/sampling.py accept_tree_sampled) tries the point-mass
child, then, on the residual, the draft's child, which was drawn independently of that first test: each step is a
rejection sampler of the current p, so the output is the target's distribution; greedy takes the first child equal
to the target's argmax.

Records: each round's row gets "sources": {source: [drafted, accepted]} for the sources that drafted for it, accepted
= its nodes on the accepted path (each accepted token belongs to exactly one source's branch).
"""
from __future__ import annotations

import numpy as np
import torch

from decode.drafters.base import DeviceTree, Drafter, Proposal
from decode.drafters.draft_model import DraftModelDrafter
from decode.drafters.prompt_lookup import NgramIndex
from decode.drafters.schedules import CostModelSchedule, PointEvidence, Schedule, confident, prefill_steps
from decode.drafters.suffix import SuffixCache, SuffixSource, prompt_key, unpadded
from decode.k_model import feed_seconds, pick, round_seconds
from decode.kv import host_to_device

FREE = ("lookup", "suffix")
SOURCES = (*FREE, "draft")
# A free candidate's evidence is kept by its strength: a 3-gram match, or a suffix continuation most earlier texts
# share, is accepted far more often than a 1-gram match or a rare continuation, and one estimate for all of them would
# let the weak ones draft on the strong ones' record (or keep the strong ones out).
STRATA = {"lookup": ("n1", "n2", "n3+"), "suffix": ("p<.5", "p<.9", "p>=.9")}


# And by whether the other free source contests it: both copy from the same context (the prompt, the row's output,
# earlier outputs), so where they propose different next tokens at most one of them is right. On the held-out prompts
# and MT-Bench's extraction and reasoning conversations, contested 1-gram lookup candidates had their first token
# accepted 2 times in 33, uncontested ones 28 times in 55; pooled in one record, the contested ones drafted on the
# others' evidence, in the rounds where nothing else looked good.
CONTESTED = "contested"


def stratum(source: str, strength: float, contested: bool = False) -> str:
    """The evidence key of a free source's candidate: lookup by the n-gram it matched (1, 2, 3 or more), suffix by its
    first token's estimated probability (below 0.5, below 0.9, above); ":contested" where the other free source
    proposes a different first token (see CONTESTED)."""
    if source == "lookup":
        key = f"lookup:{STRATA['lookup'][min(max(int(strength), 1), 3) - 1]}"
    else:
        key = f"suffix:{STRATA['suffix'][0 if strength < 0.5 else 1 if strength < 0.9 else 2]}"
    return f"{key}:{CONTESTED}" if contested else key


def candidate_keys(lookup: list[int], matched: int, suffix: list[int], probs: list[float]) -> dict[str, str]:
    """Each free candidate's evidence key (`stratum`): lookup's candidate and the n-gram it matched, suffix's and its
    tokens' estimated probabilities; contested where both propose and their first tokens differ."""
    contested = bool(lookup) and bool(suffix) and lookup[0] != suffix[0]
    return {"lookup": stratum("lookup", matched, contested),
            "suffix": stratum("suffix", probs[0] if probs else 0, contested)}


EVIDENCE = ("draft", *(f"{s}:{k}{tail}" for s in FREE for k in STRATA[s] for tail in ("", f":{CONTESTED}")))


class _Wanted(Schedule):
    """The draft model's lengths as the hybrid decided them this round; with a threshold, a row's draft also ends after
    the step whose top probability falls under it (ConfidenceSchedule's rule: that step's token is kept)."""
    name = "hybrid"
    threshold: float | None = None

    @property
    def stops_mid_round(self) -> bool:
        return self.threshold is not None

    def keep_drafting(self, step_probs, step_tokens):
        return confident(step_probs, self.threshold)

    def start(self, rows):
        super().start(rows)
        self.wanted = [0] * rows

    def add_rows(self, rows):
        super().add_rows(rows)
        self.wanted += [0] * rows

    def lengths(self):
        return list(self.wanted)

    def select_rows(self, rows):
        super().select_rows(rows)
        self.wanted = [self.wanted[r] for r in rows]


def survival(rates: list[float], k: int) -> list[float]:
    """[S(1) .. S(k)], S(i) = b_1 ... b_i."""
    out, s = [], 1.0
    for b in rates[:k]:
        s *= b
        out.append(s)
    return out


class StepPrices:
    """Hybrid's costs in target steps, as the K model's round pricing reads them (decode/k_model.py round_seconds,
    feed_seconds: one pricing for a round, its catch-up and the draft's deferred prefill). A hybrid run has no step
    table, only its cost probes: target(w), a verification w tokens wide: v(w - 1) (1: a plain step); draft(w), the
    draft's forward feeding w tokens a row: c, and wider the probes' prefill line at w, at least c (c where no line
    was measured: the feed then costs nothing more)."""

    def __init__(self, c: float, v_of, prefill_cost: dict | None = None):
        self.c, self.v_of, self.prefill_cost = c, v_of, prefill_cost

    def target(self, width: int) -> float:
        return 1.0 if width <= 1 else self.v_of(width - 1)

    def draft(self, width: int) -> float:
        if width <= 1 or self.prefill_cost is None:
            return self.c
        return max(self.c, prefill_steps(self.prefill_cost, width))

    def round(self, k_draft: int, nodes: int | None = None, fed: int = 1) -> float:
        """A round of k_draft draft tokens (their first forward feeding `fed` a row) and `nodes` verified (k_draft
        where None: a chain of the draft's)."""
        return round_seconds(self.target, self.draft, k_draft, fed, nodes)

    def feed(self, fed: int) -> float:
        """Feeding the draft `fed` tokens (a catch-up or the deferred prefill) beyond a caught-up round's one."""
        return feed_seconds(self.draft, fed)


def plan_row(rates: dict[str, list[float]], lengths: dict[str, int], limit: int, prices: StepPrices,
             need_draft: bool = False, merge: bool = True, fed: int = 1) -> tuple[str | None, int, int, float]:
    """One row's choice: (free source or None, its tokens k_f, draft tokens k_d, expected tokens per cost). rates: each
    source's [b_1 ..]; lengths: each free source's candidate length (<= limit); prices: each option's round
    (StepPrices.round). need_draft: only options with k_d >= 1 (a probe); merge False: no tree of two sources; fed: the
    tokens the draft's first forward feeds this round (its catch-up: the tokens committed since the draft last ran,
    and the last one), priced into every option that drafts. On a tie (k_model.pick) the option listed first
    (cheaper) wins."""
    options: list[tuple[str | None, int, int, float]] = []
    if not need_draft:
        options.append((None, 0, 0, 1.0 / prices.round(0)))
        for source in FREE:
            s = survival(rates[source], lengths.get(source, 0))
            for k in range(1, len(s) + 1):
                options.append((source, k, 0, (1 + sum(s[:k])) / prices.round(0, nodes=k)))
    draft = survival(rates["draft"], limit)
    for k in range(1, limit + 1):
        options.append((None, 0, k, (1 + sum(draft[:k])) / prices.round(k, fed=fed)))
    for source in FREE if merge else ():
        s = survival(rates[source], lengths.get(source, 0))
        for kf in range(1, len(s) + 1):
            for kd in range(1, limit + 1):
                either = [1 - (1 - (s[i] if i < kf else 0.0)) * (1 - (draft[i] if i < kd else 0.0))
                          for i in range(max(kf, kd))]
                options.append((source, kf, kd, (1 + sum(either)) / prices.round(kd, nodes=kf + kd, fed=fed)))
    if not options:
        return None, 0, 0, 1.0
    return options[pick({index: option[3] for index, option in enumerate(options)})]


class StartRecord:
    """Sums over the rounds of a row, a dataset group or a point: the target steps a token costs at each round's best
    plan without the draft model (`free`) and with it (`with_draft`: its tokens at c each, no catch-up, as once its
    cache exists). What the deferred prefill's decision reads (HybridDrafter._start_pays)."""

    def __init__(self):
        self.free = self.with_draft = 0.0
        self.rounds = 0

    def add(self, free: float, with_draft: float) -> None:
        self.free += free
        self.with_draft += with_draft
        self.rounds += 1

    def per_token(self, prior: "StartRecord | None" = None, weight: float = 4.0) -> tuple[float, float]:
        """(free, with_draft) per token: these rounds' means, shrunk toward `prior`'s by `weight` rounds of it."""
        if prior is None or not prior.rounds:
            return self.free / max(self.rounds, 1), self.with_draft / max(self.rounds, 1)
        n = self.rounds + weight
        return ((self.free + weight * prior.free / prior.rounds) / n,
                (self.with_draft + weight * prior.with_draft / prior.rounds) / n)


class LengthRecord:
    """How long the point's finished requests ran, per dataset group (None: the point's): what the deferred prefill's
    decision expects a row still to generate. A prompt that stops at EOS after 15 tokens (MT-Bench's extraction: 14 to
    34 tokens of a 64-token budget, after 200- to 270-token prompts) would otherwise be priced as if it ran to the
    budget, and a draft prefill it never repays would look paid for."""

    GROUP_PRIOR = 1.0  # the point's expectation counts as this many of the group's requests
    BUDGET_PRIOR = 1.0  # and the budget (the uninformed guess) as this many of the point's

    def __init__(self):
        self.lengths: dict[str | None, list[int]] = {}

    def add(self, group: str | None, new_tokens: int) -> None:
        """A finished request's generated tokens (one stopped by the budget counts as the budget)."""
        self.lengths.setdefault(None, []).append(new_tokens)
        if group is not None:
            self.lengths.setdefault(group, []).append(new_tokens)

    def remaining(self, group: str | None, generated: int, budget: int) -> float:
        """Expected tokens still to come for a row of `group` that has `generated` and may run to `budget`: the mean of
        L - generated over the finished requests that ran past `generated` (those that ended before it say nothing
        about a row still running), the budget counted as BUDGET_PRIOR of the point's requests, and the point's
        expectation as GROUP_PRIOR of the group's."""
        left = max(0, budget - generated)

        def shrunk(lengths: list[int], prior: float, weight: float) -> float:
            longer = [min(n, budget) - generated for n in lengths if n > generated]
            return (sum(longer) + weight * prior) / (len(longer) + weight)
        point = shrunk(self.lengths.get(None, []), left, self.BUDGET_PRIOR)
        if group is None or group not in self.lengths:
            return point
        return shrunk(self.lengths[group], point, self.GROUP_PRIOR)


def longest_common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


class HybridDrafter(Drafter):
    """See the module. draft: a DraftModelDrafter (a chain; its schedule is replaced by the hybrid's choice); gamma:
    the longest draft of a round from any source (speculative.hybrid_max_draft, else the point's gamma); c, v: the
    measured cost ratios (v keyed by nodes n, as runner/probes.py measures them); pools: per evidence key (EVIDENCE:
    the draft model, each free source's strata, contested or not) the point's PointEvidence (RunContext.memory), the
    rows' prior; group_pools and group_of: a row's group (group_of(its prompt's ids): a dataset category, None for
    none) keeps pools of its own (group -> evidence key -> PointEvidence), its rows' prior, shrunk toward the point's
    (CostModelSchedule.pool_prior): where one source pays in one category and not in another, each category's rows
    start from their own record; cache: the suffix source's earlier outputs (SuffixCache).

    The draft model's prefill is deferred (DraftModelDrafter.defer): a batch starts with the free sources alone and
    prefills the draft in the first round whose plans draft with it and where starting pays (_start_pays): summed over
    the rows it feeds (those drafting with it, and those whose prompts are no longer than theirs: the others are held,
    DraftModelDrafter.held_rows), the tokens each is expected still to generate (lengths: LengthRecord, from the
    point's finished requests of its group, which may stop at EOS long before the budget; without it, budget: max_new_tokens, minus what it has)
    times what a token costs it without the draft model (its best plans' 1 / tokens per cost, in target steps) less
    what it costs with it, both averaged over the row's rounds so far and shrunk toward its group's or the point's
    rounds (start_pools, StartRecord),
    exceeds what feeding the prompts costs beyond a caught-up round (StepPrices.feed: the draft's first forward on the
    prefill line, prefill_cost: fixed + per_token * the tokens fed in target steps measured in this run, at least c,
    less the c its plan counts). Once started, each round that drafts also pays its catch-up (the tokens the free
    sources committed since the draft last ran), priced into its options the same way (StepPrices.round); a probe runs
    only where that row's expected saving, as above, exceeds its catch-up's price (_feed_pays). While the point's
    draft record holds fewer than MIN_POOLED_ROUNDS rounds (a draft that never runs learns nothing) it starts in the
    first round a plan drafts with it and every probe runs; so it does without prefill_cost or budget (priced_start),
    a probe's round included.
    """
    PROBE_EVERY = 8
    START_PRIOR_ROUNDS = 4.0

    def __init__(self, draft: DraftModelDrafter, target_vocab_size: int, gamma: int, c: float, v: dict[int, float],
                 pools: dict[str, PointEvidence] | None = None, cache: SuffixCache | None = None, ngram_max: int = 3,
                 ngram_min: int = 1, suffix_max_depth: int = 8, suffix_min_prob: float = 0.1, merge: bool = True,
                 group_pools: dict[str, dict[str, PointEvidence]] | None = None, group_of=None,
                 prefill_cost: dict | None = None, budget: int | None = None,
                 start_pools: dict[str | None, StartRecord] | None = None, confidence: float | None = None,
                 lengths: LengthRecord | None = None):
        self.draft = draft
        self.lengths = lengths
        draft.defer = True
        self.prefill_cost, self.budget = prefill_cost, budget
        self.start_pools = start_pools if start_pools is not None else {}
        self.wanted = _Wanted(gamma)
        self.wanted.threshold = confidence
        draft.schedule, draft.tree = self.wanted, None
        self.vocab = target_vocab_size
        self.gamma, self.c = gamma, c
        self.prices = StepPrices(c, self.v_of, prefill_cost)
        pools = pools if pools is not None else {}
        self.estimators = {key: CostModelSchedule(gamma, c if key == "draft" else 0.0, v,
                                                  evidence=pools.setdefault(key, PointEvidence(gamma)))
                           for key in EVIDENCE}
        self.cache = cache
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self.suffix_max_depth, self.suffix_min_prob = suffix_max_depth, suffix_min_prob
        self.merge = merge
        self.group_pools = group_pools if group_pools is not None else {}
        self.group_of = group_of
        self.round_facts: list[dict] | None = None

    @property
    def forwards(self) -> int:
        return self.draft.forwards

    @property
    def priced_start(self) -> bool:
        """Whether the deferred prefill waits until starting pays (_start_pays): with the draft's measured prefill
        and the budget. Without them the draft starts in the first round that drafts with it, a probe included."""
        return self.prefill_cost is not None and self.budget is not None

    def v_of(self, nodes: int) -> float:
        return self.estimators["draft"].verify_cost(nodes)

    def reset(self):
        self.lookups: list[NgramIndex] = []
        self.suffixes: list[SuffixSource] = []
        for estimator in self.estimators.values():
            estimator.start(0)
        self.since_draft: list[int] = []
        self.since_deeper: list[int] = []
        self.generated: list[int] = []  # each row's tokens so far (the target's prefill gave the first)
        self.starts: list[StartRecord] = []  # each row's rounds, for the deferred prefill's decision
        self.row_groups: list[str | None] = []
        self.draft.reset()  # and its schedule, self.wanted
        self._observed = self._observed_drafts = None
        self.round_facts = None

    def add_rows(self, prompt_ids, prompt_mask, host=None):
        """Each joining row's lookup index and suffix source (its prompt's earlier output leaves the shared cache),
        its estimators' rows (the pools their prior) and the draft model's rows (DraftModelDrafter.add_rows)."""
        prompts = unpadded(prompt_ids, prompt_mask, host)
        if self.cache is not None:
            for prompt in prompts:
                self.cache.forget(prompt_key(prompt))
        self.lookups += [NgramIndex(p) for p in prompts]
        depth = self.suffix_max_depth + self.gamma
        self.suffixes += [SuffixSource(p, self.cache, self.suffix_max_depth, self.suffix_min_prob, depth)
                          for p in prompts]
        groups = [self.group_of(p) if self.group_of is not None else None for p in prompts]
        for key, estimator in self.estimators.items():
            estimator.add_rows(len(prompts), [None if group is None else self.group_pools.setdefault(group, {})
                                              .setdefault(key, PointEvidence(self.gamma)).counts for group in groups])
        self.since_draft += [0] * len(prompts)
        self.since_deeper += [0] * len(prompts)
        self.generated += [1] * len(prompts)
        self.starts += [StartRecord() for _ in prompts]
        self.row_groups += groups
        self.draft.add_rows(prompt_ids, prompt_mask, host)  # and self.wanted, its schedule
        self.device = prompt_ids.device

    def _priors(self) -> dict[str, list]:
        """The rows' priors of the evidence keys this round's candidates read (3 of EVIDENCE's 13 keys a row)."""
        used = {"draft", *(key for keys in self.keys for key in keys.values())}
        return {key: self.estimators[key].row_priors() for key in used}

    def _rates(self, row: int, priors: dict[str, list]) -> dict[str, list[float]]:
        """Each source's acceptance factors [b_1 ..] for this row's candidate: the draft's record, each free
        candidate's by its stratum's."""
        return {s: self.estimators[key].acceptance(row, priors[key][row])
                for s, key in {"draft": "draft", **self.keys[row]}.items()}

    def _plans(self, limits: list[int]) -> list[tuple[str | None, int, int, float]]:
        priors = self._priors()
        started = self.draft.started
        plans, free_plans = [], []
        for row, limit in enumerate(limits):
            rates = self._rates(row, priors)
            lengths = {s: len(self.candidates[row][s]) for s in FREE}
            free = plan_row(rates, lengths, 0, self.prices, merge=self.merge)
            steady = plan_row(rates, lengths, limit, self.prices, merge=self.merge)
            self._note(row, free[3], steady[3])
            free_plans.append(free)
            if not started and self.priced_start:  # no probe before the draft's cache exists: _start_pays decides
                plans.append(steady)
                continue
            fed = len(self.draft.pending[row]) + 1
            probe = self.since_draft[row] + 1 >= self.PROBE_EVERY and limit > 0 and self._feed_pays([row], fed)
            plan = plan_row(rates, lengths, limit, self.prices, need_draft=probe, merge=self.merge, fed=fed) \
                if probe or self.prices.feed(fed) else steady
            plans.append(plan)
        if not started and self.priced_start and not self._start_pays(plans):
            return free_plans
        return [self._deepen(row, plan, limit) for row, (plan, limit) in enumerate(zip(plans, limits))]

    def _note(self, row: int, free: float, with_draft: float) -> None:
        """A round's best values without and with the draft model, as target steps a token, into the row's, its
        group's and the point's StartRecord."""
        pools = [self.starts[row], self.start_pools.setdefault(None, StartRecord())]
        if self.row_groups[row] is not None:
            pools.append(self.start_pools.setdefault(self.row_groups[row], StartRecord()))
        for record in pools:
            record.add(1 / free, 1 / with_draft)

    def _saving(self, row: int) -> float:
        """What the draft model is expected to save the row over its remaining tokens, in target steps: the tokens it
        is expected still to generate times a token's cost without the draft less with it (its StartRecord, shrunk
        toward its group's or the point's)."""
        point = self.start_pools.get(None)
        group = self.start_pools.get(self.row_groups[row]) if self.row_groups[row] is not None else None
        prior = group if group is not None and group.rounds >= self.START_PRIOR_ROUNDS else point
        free, with_draft = self.starts[row].per_token(prior, self.START_PRIOR_ROUNDS)
        left = max(0, self.budget - self.generated[row]) if self.lengths is None else \
            self.lengths.remaining(self.row_groups[row], self.generated[row], self.budget)
        return left * (free - with_draft)

    def _feed_pays(self, rows: list[int], fed: int) -> bool:
        """Whether feeding the draft `fed` tokens (a probe's catch-up, or the deferred prefill) pays for these rows:
        their savings (_saving) above the feed's price (StepPrices.feed). Where it cannot be priced (no prefill line
        or budget) or the point's draft record is thin (a draft that never runs learns nothing), it does."""
        if not self.priced_start or self.estimators["draft"].pool.tested[1] < CostModelSchedule.MIN_POOLED_ROUNDS:
            return True
        return sum(self._saving(row) for row in rows) > self.prices.feed(fed)

    def _start_pays(self, plans: list[tuple[str | None, int, int, float]]) -> bool:
        """Whether this round prefills the draft model (see the class doc)."""
        if not any(plan[2] for plan in plans):
            return False
        # the rows this start feeds: the others are held (DraftModelDrafter.held_rows), not prefilled now, and save
        # nothing by it
        held = set(self.draft.held_rows([plan[2] for plan in plans]))
        fed = [row for row in range(len(plans)) if row not in held]
        return self._feed_pays(fed, 1 + max(len(self.draft.pending[row]) for row in fed))

    def _deepen(self, row: int, plan: tuple[str | None, int, int, float], limit: int):
        """The draft-length probe: a round below the cap counts toward it; after PROBE_EVERY of them, the next round
        whose plan drafts with the model drafts one token more (its tree or chain as planned, the draft branch one
        longer). A round at the cap resets the count: nothing deeper to learn."""
        source, k_free, k_draft, value = plan
        if k_draft >= limit:
            self.since_deeper[row] = 0
            return plan
        self.since_deeper[row] += 1
        if k_draft and self.since_deeper[row] >= self.PROBE_EVERY:
            self.since_deeper[row] = 0
            return source, k_free, k_draft + 1, value
        return plan

    def propose(self, last_tokens, max_tokens, row_limits=None):
        rows = len(self.lookups)
        limits = [min(max_tokens, limit) for limit in (row_limits if row_limits is not None else [max_tokens] * rows)]
        host = self._last_tokens_host(last_tokens)
        self.candidates, self.keys = [], []
        for row, token in enumerate(host):
            self.lookups[row].extend([token])
            self.suffixes[row].extend([token])
            lookup, matched = self.lookups[row].propose_match(self.ngram_max, self.ngram_min, limits[row])
            suffix, probs = self.suffixes[row].propose(limits[row])
            self.candidates.append({"lookup": lookup, "suffix": suffix})
            self.keys.append(candidate_keys(lookup, matched, suffix, probs))
        plans = self._plans(limits)
        free = [self.candidates[row][plan[0]][:plan[1]] if plan[0] else [] for row, plan in enumerate(plans)]
        k_draft = [plan[2] for plan in plans]
        self.draft._observed = list(host)
        drafting = max(k_draft) > 0
        # each row's catch-up: the tokens the draft's first forward feeds (a deferred prefill: the prompt and all since);
        # a row the draft drafts nothing for, whose pending tokens would widen that forward, is held with them
        # (DraftModelDrafter's class doc)
        held = set(self.draft.held_rows(k_draft))
        self.catch_up = [len(p) + 1 if drafting and row not in held else 0 for row, p in enumerate(self.draft.pending)]
        if drafting:
            self.wanted.wanted = k_draft
            # with a confidence threshold the draft may end rows early: its lengths stay on the device (the proposal's
            # valid nodes or lengths), and the host learns them with the round's read (commit's drafted_host)
            drafted = self.draft.propose(last_tokens, max(k_draft), row_limits=k_draft)
            self.draft_ran = True
        else:
            self.draft._no_drafts(last_tokens)
            drafted, self.draft_ran = None, False
        self.plans, self.free, self.k_draft = plans, free, k_draft
        return self._combine(free, k_draft, drafted)

    def _combine(self, free: list[list[int]], k_draft: list[int], drafted: Proposal | None) -> Proposal:
        """Each row's branches -> one proposal: a chain where no row has two branches, else a tree (the free branch
        first, then the draft's). self.branches[row]: source -> its node indices in the proposal."""
        rows = len(free)
        both = any(f and k for f, k in zip(free, k_draft))
        free_width = max((len(f) for f in free), default=0)
        if drafted is not None and free_width == 0:  # the draft's chain as it is
            self.branches = [{"draft": list(range(k))} if k else {} for k in k_draft]
            self.layout = None
            return drafted
        free_ids = np.zeros((rows, max(free_width, 1)), dtype=np.int64)
        for row, tokens in enumerate(free):
            free_ids[row, :len(tokens)] = tokens
        free_tokens = host_to_device(free_ids, self.device)  # [B, Wf]
        sampled = drafted is not None and drafted.probs is not None
        source_of = [self.plans[row][0] for row in range(rows)]
        if not both:
            self.layout = None
            self.branches = [{source_of[row]: list(range(len(free[row])))} if free[row] else
                             ({"draft": list(range(k_draft[row]))} if k_draft[row] else {}) for row in range(rows)]
            free_lengths = host_to_device(np.array([len(f) for f in free], dtype=np.int64), self.device)  # [B]
            if drafted is None:
                return Proposal(free_tokens[:, :free_width], None, free_lengths)
            width = max(free_width, drafted.tokens.shape[1])
            use_free = free_lengths > 0  # [B]
            pad = lambda t, w: torch.nn.functional.pad(t, (0, w - t.shape[1]))  # noqa: E731
            tokens = torch.where(use_free[:, None], pad(free_tokens, width), pad(drafted.tokens, width))
            probs = None
            if sampled:  # the draft's q, one-hot rows for the free sources' point masses
                onehot = torch.nn.functional.one_hot(pad(free_tokens, width), self.vocab).to(drafted.probs.dtype)
                q = torch.nn.functional.pad(drafted.probs, (0, 0, 0, width - drafted.probs.shape[1]))
                probs = torch.where(use_free[:, None, None], onehot, q)
            return Proposal(tokens, probs, torch.where(use_free, free_lengths, drafted.lengths))
        # a tree: per row the free branch (nodes 0 .. Lf-1), then the draft's (Lf .. Lf+kd-1), both under the root
        nodes = max(len(f) + k for f, k in zip(free, k_draft))
        index = np.zeros((rows, nodes), dtype=np.int64)  # into [free tokens (Wf) | draft tokens (Gd)]
        parents = np.full((rows, nodes), -1, dtype=np.int64)
        valid = np.zeros((rows, nodes), dtype=bool)
        position = np.full((rows, nodes), -1, dtype=np.int64)  # a draft node's index in the draft's chain
        self.branches = []
        for row in range(rows):
            lf, kd = len(free[row]), k_draft[row]
            index[row, :lf] = np.arange(lf)
            index[row, lf:lf + kd] = free_ids.shape[1] + np.arange(kd)
            parents[row, :lf] = np.arange(-1, lf - 1)
            parents[row, lf:lf + kd] = [-1] + list(range(lf, lf + kd - 1))
            valid[row, :lf + kd] = True
            position[row, lf:lf + kd] = np.arange(kd)
            branches = {}
            if lf:
                branches[source_of[row]] = list(range(lf))
            if kd:
                branches["draft"] = list(range(lf, lf + kd))
            self.branches.append(branches)
        gather = host_to_device(index, self.device)  # [B, N]
        tokens = torch.cat([free_tokens, drafted.tokens], dim=1).gather(1, gather)
        probs = None
        if sampled:
            onehot = torch.nn.functional.one_hot(free_tokens, self.vocab).to(drafted.probs.dtype)  # [B, Wf, V]
            q = torch.cat([onehot, drafted.probs], dim=1)  # [B, Wf + Gd, V]
            probs = q.gather(1, gather[:, :, None].expand(-1, -1, q.shape[-1]))
        self.layout = DeviceTree.of(parents, valid, self.device)
        # the draft's nodes past the length it drafted (a confidence threshold ended its row) are padding
        self.layout.valid &= host_to_device(position, self.device) < drafted.lengths[:, None]
        return Proposal(tokens, probs, layout=self.layout)

    def commit(self, accepted_len, accepted_len_host, drafted_host, path_host=None):
        drafts = self._observed_drafts or []
        next_tokens = self._observed or []
        rows = len(self.lookups)
        # the draft's lengths as drafted (a confidence threshold may have ended rows early), read with the round: a
        # row's drafts are its free branch's and then the draft's
        self.k_draft = [max(count - len(free), 0) for count, free in zip(drafted_host, self.free)]
        for branches, k in zip(self.branches, self.k_draft):
            if "draft" in branches:
                branches["draft"] = branches["draft"][:k]
        facts, draft_accepted = [], []
        evidence = {key: ([0] * rows, [0] * rows) for key in EVIDENCE}  # per key, per row: (tested, matched)
        for row in range(rows):
            path = path_host[row] if path_host is not None else list(range(accepted_len_host[row]))
            path_tokens = [drafts[row][node] for node in path]
            committed = path_tokens + ([next_tokens[row]] if row < len(next_tokens) else [])
            on_path = set(path)
            branches = self.branches[row]
            facts.append({"sources": {s: [len(nodes), sum(n in on_path for n in nodes)]
                                      for s, nodes in branches.items()}, "catch_up": self.catch_up[row]})
            self.generated[row] += len(path_tokens) + 1
            draft_nodes = branches.get("draft", [])
            draft_accepted.append(sum(n in on_path for n in draft_nodes))
            # evidence: each candidate against what the round committed (the draft's only where it drafted)
            chains = {s: self.candidates[row][s] for s in FREE}
            chains["draft"] = [drafts[row][n] for n in draft_nodes]
            for s, chain in chains.items():
                tested = min(len(chain), len(committed))
                key = "draft" if s == "draft" else self.keys[row][s]
                evidence[key][0][row] = tested
                evidence[key][1][row] = longest_common_prefix(chain[:tested], committed)
            self.lookups[row].extend(path_tokens)
            self.suffixes[row].extend(path_tokens)
            self.since_draft[row] = 0 if draft_nodes else self.since_draft[row] + 1
        for key, (tested, matched) in evidence.items():
            self.estimators[key].update(tested, matched)
        if self.draft_ran:
            width = self.draft.last_proposal.shape[1]
            full = [[drafts[row][n] for n in self.branches[row].get("draft", [])] for row in range(rows)]
            self.draft._observed_drafts = [f + [0] * (width - len(f)) for f in full]
            self.draft.commit(host_to_device(np.array(draft_accepted, dtype=np.int64), self.device), draft_accepted,
                              list(self.k_draft))
        for row in range(rows):  # the committed tokens the draft's cache has not seen wait in its pending tokens
            path = path_host[row] if path_host is not None else list(range(accepted_len_host[row]))
            self.draft.pending[row].extend(min(drafts[row][node], self.draft.input_vocab_size - 1)
                                           for node in path[draft_accepted[row]:])
        self.round_facts = facts

    def select_rows(self, rows):
        kept = rows.tolist()
        self.lookups = [self.lookups[r] for r in kept]
        self.suffixes = [self.suffixes[r] for r in kept]
        self.since_draft = [self.since_draft[r] for r in kept]
        self.since_deeper = [self.since_deeper[r] for r in kept]
        self.generated = [self.generated[r] for r in kept]
        self.starts = [self.starts[r] for r in kept]
        self.row_groups = [self.row_groups[r] for r in kept]
        for estimator in self.estimators.values():
            estimator.select_rows(kept)
        self.draft.select_rows(rows)
        self._keep_observed(kept)
