"""Draft-length schedules: how many tokens each row of a draft-model drafter drafts each round.

A schedule follows the batch's rows: `start(rows)` once, `lengths()` before each round (each row's wanted
length, at most gamma), `update(drafted, accepted)` after it with what the target verified and kept per row,
`select_rows(kept)` when rows finish, `add_rows(n)` when n rows join (serving: requests admitted between rounds; a
schedule that `reads_context` is also told their prompt lengths).
`keep_drafting(q, tokens)` may stop rows in the middle of a round. The
drafter asks the schedule and clips its answer to the row's budget; the engine only sees proposal lengths.

Every schedule here is lossless under sampling: a row's length is decided before the round or, for
confidence, from the draft's own state before the next position, never from the target's verdict on it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the method registry reads SCHEDULES without torch
    import torch

from decode.k_model import expected_tokens, round_seconds, window_tokens
from decode.names import TARGET


class Schedule:
    """The interface, and the constant schedule: gamma drafts every round (Leviathan et al. 2023)."""
    name = "constant"
    stops_mid_round = False  # True: keep_drafting may end rows during a round (the drafter asks it each step)
    reads_context = False  # True: add_rows(n, prompt_tokens=[...]) (the drafter reads the joining rows' prompt lengths)
    reads_queue = False  # True: queued(requests, rate) before each admission (the serving loop scans its queue)
    measured = False  # True: it reads this run's measured c and v and the draft's prefill cost (runner/probes.py times
    #   every draft length up to gamma, and the prefill)
    # True: a row may go many rounds without drafting (its K is 0 at some loads): a draft model leaves such a row out of
    # its cache while it does not draft (DraftModelDrafter: its prefill waits for the first round that drafts)
    idles_rows = False
    priced = False  # True: it chooses K by what a round costs and yields (K 0 in every round is then its choice)

    def __init__(self, gamma: int):
        if gamma < 1:
            raise ValueError(f"a schedule needs gamma >= 1, got {gamma}")
        self.gamma = gamma
        self.rows = 0

    def start(self, rows: int) -> None:
        """A new batch of `rows` rows; what was learnt about an earlier batch is dropped."""
        self.rows = rows

    def lengths(self) -> list[int]:
        """Each row's draft length for the coming round, 0..gamma (0: a plain target step for that row)."""
        return [self.gamma] * self.rows

    def update(self, drafted: list[int], accepted: list[int]) -> None:
        """Per row: how many drafts the target verified in the last round, and how many it accepted."""

    def select_rows(self, rows: list[int]) -> None:
        """Keep these rows (indices into the current batch), in this order."""
        self.rows = len(rows)

    def add_rows(self, rows: int) -> None:
        """`rows` new rows after the current ones, each as a row at `start`."""
        self.rows += rows

    def keep_drafting(self, step_probs: torch.Tensor, step_tokens: torch.Tensor) -> torch.Tensor | None:
        """After a drafting step, asked only when stops_mid_round: q [B, V] of the step and the drafted tokens
        [B] -> [B] bool, the rows that may draft another token (the token just drawn is kept either way)."""
        return None

    # what a drafter may tell a schedule and ask of it besides (DraftModelDrafter): each a no-op here

    def queued(self, requests: int, rate: float | None = None) -> None:
        """Serving, where reads_queue: the requests waiting for a row, and the rate they arrived at so far."""

    def plan(self, backlogs: list[int]) -> list[int]:
        """lengths(), told each row's tokens the draft has not been fed (a catch-up a drafting round pays first)."""
        return self.lengths()

    def worth_drafting(self, prompt_width: int) -> bool:
        """Whether a static batch of prompts this wide runs the draft at all (cost_model decides)."""
        return True

    def timed(self, seconds: float, rows: int, width: int, fed: int) -> None:
        """The seconds the last chain round took: its rows, the most a row drafted (0: a plain step), the tokens its
        first draft forward fed a row."""


class ConstantSchedule(Schedule):
    """gamma drafts every round (Leviathan et al. 2023)."""


class HeuristicSchedule(Schedule):
    """transformers' "heuristic" schedule (candidate_generator.py, update_candidate_strategy), per row: +2 after
    a round whose drafts were all accepted, -1 otherwise, never below 1; a round the row did not draft (its
    budget was spent) changes nothing. transformers starts at num_assistant_tokens (20 in transformers 5) and
    has no cap; here the start is gamma and gamma is the cap, so the sweep's gamma bounds every point, and for
    gamma <= 20 the start is transformers' own start, capped."""
    name = "heuristic"

    def start(self, rows: int) -> None:
        super().start(rows)
        self.current = [self.gamma] * rows

    def lengths(self) -> list[int]:
        return list(self.current)

    def update(self, drafted, accepted):
        self.current = [self._next(n, d, a) for n, d, a in zip(self.current, drafted, accepted)]

    def _next(self, length: int, drafted: int, accepted: int) -> int:
        if drafted == 0:
            return length
        if accepted == drafted:
            return min(self.gamma, length + 2)
        return max(1, length - 1)

    def select_rows(self, rows):
        super().select_rows(rows)
        self.current = [self.current[r] for r in rows]

    def add_rows(self, rows):
        super().add_rows(rows)
        self.current += [self.gamma] * rows


class ConfidenceSchedule(Schedule):
    """Stop drafting a row once the draft's top probability at a step falls under a threshold (transformers'
    assistant_confidence_threshold, default 0.4). The probabilities are the warped q under sampling, the softmax
    of the logits in greedy.

    The token drawn at the step that falls under the threshold is kept, then the row stops: transformers'
    ConfidenceCriteria is a stopping criterion, checked after the token is appended. Keeping it is also what
    keeps sampling lossless: whether position i+1 is drafted depends only on the draft's tokens up to i, so
    each position either follows the accept/resample rule or is the target's own draw. (Under transformers' test
    on the drawn token's probability, dropping that token would keep x only when q(x) is high: the kept drafts
    would no longer be distributed as q, and the acceptance rule would be off.) transformers checks the
    drafted token's probability, which in greedy is the top probability; under sampling we take the top
    probability (a property of the position, not of the draw); both are lossless. transformers also retunes
    its threshold from past rounds (with scikit-learn); this one is fixed.
    """
    name = "confidence"
    stops_mid_round = True

    def __init__(self, gamma: int, threshold: float = 0.4):
        super().__init__(gamma)
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"confidence threshold must be within [0, 1], got {threshold}")
        self.threshold = threshold

    def keep_drafting(self, step_probs, step_tokens):
        return confident(step_probs, self.threshold)


def confident(step_probs: torch.Tensor, threshold: float) -> torch.Tensor:
    """[B] bool: each row's top probability at a drafting step is at least the threshold (ConfidenceSchedule's rule,
    hybrid's draft branch)."""
    return step_probs.max(dim=-1).values >= threshold


class AcceptanceCounts:
    """Per draft position i = 1..gamma: `tested[i]`, the rounds that verified draft i (it was drafted and every
    draft before it accepted), and `accepted[i]`, those that accepted it. Their ratio estimates
    beta_i = P(draft i accepted | drafts 1..i-1 accepted), the Kaplan-Meier factors of the run length of
    accepted drafts: P(at least i accepted) = beta_1 ... beta_i. Drafts after a rejection were never tested
    and count nowhere. No independence between positions is assumed: where acceptance comes in runs (code,
    quoted text), the later positions show it."""

    def __init__(self, gamma: int):
        self.tested = [0.0] * (gamma + 1)  # index 0 unused
        self.accepted = [0.0] * (gamma + 1)

    def add(self, drafted: int, accepted: int, decay: float = 1.0) -> None:
        if decay != 1.0:
            self.tested = [x * decay for x in self.tested]
            self.accepted = [x * decay for x in self.accepted]
        for i in range(1, min(accepted + 1, drafted, len(self.tested) - 1) + 1):
            self.tested[i] += 1
        for i in range(1, min(accepted, len(self.tested) - 1) + 1):
            self.accepted[i] += 1

    def rates(self, prior: list[float | None], weight: float) -> list[float]:
        """[beta_1 .. beta_gamma], each (accepted_i + weight m_i) / (tested_i + weight): m_i = prior[i - 1]
        where given, else the beta of the position before (0.5 for the first): a position with no evidence
        is taken to be as likely as the one before it."""
        out, previous = [], 0.5
        for i in range(1, len(self.tested)):
            m = prior[i - 1] if prior[i - 1] is not None else previous
            previous = (self.accepted[i] + weight * m) / (self.tested[i] + weight)
            out.append(previous)
        return out


class PointEvidence:
    """What the cost_model schedule of one sweep point has learnt across its batches, kept by the caller
    (RunContext.memory, one per process) and handed to each batch's schedule:

    counts: every drafting round of every row, undecayed (AcceptanceCounts), warmup included: the prior of
        each new row.
    batches, eos_batches, eos_tokens: how long timed batches ran, for the draft-prefill decision. A batch runs
        until its longest row ends: one that ended at EOS ran max(new_tokens) tokens; one with a row stopped by
        max_new_tokens ran to its budget.
    skipped: batches in a row that did not run the draft (worth_drafting said no)."""

    def __init__(self, gamma: int):
        self.counts = AcceptanceCounts(gamma)
        self.batches = 0
        self.eos_batches = 0
        self.eos_tokens = 0
        self.skipped = 0

    def finish(self, new_tokens: list[int], stopped_at_eos: list[bool]) -> None:
        """A timed batch ended: each row's generated tokens, and whether it stopped at EOS."""
        self.batches += 1
        if all(stopped_at_eos):
            self.eos_batches += 1
            self.eos_tokens += max(new_tokens)

    def expected_tokens(self, budget: int, weight: float = 1.0) -> float:
        """Tokens a new batch is expected to run: batches that ended at EOS count what they ran (at most the
        budget), the others the budget, shrunk toward the budget with `weight` batches' weight."""
        eos = self.eos_batches
        total = min(self.eos_tokens, eos * budget) + (self.batches - eos + weight) * budget
        return total / (self.batches + weight)


NOISE = 0.10  # a probe's v within 10% under a narrower one's is its noise (the drift flag's threshold)


def monotone(v: dict[int, float], noise: float = NOISE) -> dict[int, float]:
    """v(k) over the measured k, made non-decreasing where the measurements allow it: a measured v(3) a few % under
    v(2) is the probe's noise (the size of the differences the schedule decides on), which would otherwise pick k = 3
    over k = 2 for nothing. A measured v more than `noise` under the one measured just narrower (v(0) = 1, a plain
    step, included) is the machine's: some CPUs run a 1-token forward on a slower kernel path than a 4-token one (an
    AMD EPYC here: v = 1.26 at k = 1, 0.78 at k = 3), and a schedule priced on a flattened v drafts past the cheap
    widths, which costs it 20-30% a round. So the k are cut into runs at each such dip, and each run gets the
    non-decreasing least-squares fit (pool-adjacent-violators), the first run starting at v(0) = 1, which nothing
    moves: a value within the noise under a plain step is a plain step's 1."""
    ks = sorted(v)
    runs: list[list[int]] = [[]]
    for previous, k in zip([0] + ks, ks):
        if (1.0 if previous == 0 else v[previous]) > v[k] * (1 + noise):
            runs.append([])
        runs[-1].append(k)
    fitted: dict[int, float] = {}
    for index, run in enumerate(runs):
        blocks: list[list] = [[1.0, None, []]] if index == 0 else []  # [mean, weight (None: v(0), fixed), [k ...]]
        for k in run:
            blocks.append([v[k], 1, [k]])
            while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
                (m2, w2, k2), (m1, w1, k1) = blocks.pop(), blocks.pop()
                blocks.append([m1, None, k1 + k2] if w1 is None else [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, k1 + k2])
        fitted.update({k: mean for mean, _, members in blocks for k in members})
    return fitted


def prefill_steps(prefill_cost: dict, width: int) -> float:
    """The draft's prefill of `width` tokens in target steps, on the line the cost probes fitted
    (runner/probes.py draft_prefill_cost: {"fixed": .., "per_token": ..})."""
    return prefill_cost["fixed"] + prefill_cost["per_token"] * width


class CostModelSchedule(Schedule):
    """Each round, per row, the draft length k in 0..gamma that maximises expected tokens per unit of cost:

        E(k) = 1 + b_1 + b_1 b_2 + ... + b_1...b_k tokens   for   k c + v(k)   (v(k): a (k+1)-token target
                                                                               forward over a 1-token one;
                                                                               v(0) = 1, a plain step)

    b_i = P(draft i accepted | drafts 1..i-1 accepted) (AcceptanceCounts): with b_i = a for every i this is
    Leviathan's (1 - a^(k+1)) / (1 - a), but acceptance is not independent from position to position, and
    a row that accepted four drafts in a row is likely to accept a fifth. c and v are the cost ratios measured
    in this run (runner/probes.py); v is keyed, as there, by the draft length k (the forward is k+1 tokens
    wide), made non-decreasing in k within the probes' noise (`monotone`: a deeper dip is the machine's and is
    kept) and interpolated linearly between measured lengths. k = 0 is a plain target step: speculation
    switches itself off where it does not pay.

    Each row's b_i is its own recent evidence (counts decayed by `decay` each round it drafts, about
    1 / (1 - decay) rounds' memory: the text changes, and so does acceptance) shrunk toward the point's pooled
    b_i with `prior_weight` rounds' weight. The pool (`evidence.counts`, kept by the caller across the batches
    of one point) counts every round of every row, undecayed: a new sequence does not start from ignorance,
    and one early rejection does not switch a row off. A position neither has tested is taken as likely as the
    one before it; with no evidence at all, b = 0.5.

    Exploration. A length that is never drafted gathers no evidence: a row at k = 0 would stay there for good,
    even where its text turned easy (a quoted passage, code being repeated), and a row at k would never learn
    that position k + 1 is now accepted (an early rejection at k + 1, pooled, would keep every later row at
    k). So every `probe_every` rounds a row drafts one token more than its best length (0 -> 1, k -> k + 1
    up to gamma; rounds at gamma do not count): about (c + v(k+1) - v(k)) / probe_every target steps a round, for
    an estimate that recovers.

    Before a batch, the draft's prefill: with `prefill_cost` (fixed + per_token * P target steps, measured in
    this run) and `budget` (max_new_tokens), a batch whose draft prefill costs more than drafting can save does
    not run the draft at all (`worth_drafting`): every round is a plain target step, as the baseline's. The
    saving is (T - 1)(1 - 1/R) target steps: T the tokens a batch is expected to run (the point's timed batches
    that ended at EOS, the others at the budget, shrunk toward the budget), R the best tokens per cost at an
    optimistic acceptance (each pooled b_i raised by 1.64 standard errors; a position the pool never tested
    as likely as the one before): a batch is skipped only when the evidence says with some confidence that
    drafting does not pay, since a skipped batch teaches nothing. For the same reason, after probe_every - 1
    skipped batches in a row the next one drafts (a probe batch), and the rule decides only once the pool holds
    MIN_POOLED_ROUNDS rounds (before, it drafts to learn). Under a load (serving) this decision is never taken:
    it is one for the whole batch, and the batch then holds requests that have not arrived yet, whose prompts and
    budgets nobody knows; the draft stays on, and each row's length is still chosen per round (0: a plain step).
    """
    measured = True
    name = "cost_model"
    priced = True
    PROBE_EVERY = 8
    DECAY = 0.8
    PRIOR_WEIGHT = 2.0
    MIN_POOLED_ROUNDS = 8
    OPTIMISM = 1.64  # standard errors added to each pooled b_i in the prefill decision (one-sided 95%)

    def __init__(self, gamma: int, c: float, v: dict[int, float], probe_every: int = PROBE_EVERY,
                 evidence: PointEvidence | None = None, decay: float = DECAY, prior_weight: float = PRIOR_WEIGHT,
                 prefill_cost: dict | None = None, budget: int | None = None):
        super().__init__(gamma)
        if c < 0 or any(value <= 0 for value in v.values()):
            raise ValueError(f"cost_model needs c >= 0 and v > 0, got c={c}, v={v}")
        if not 0 < decay <= 1 or prior_weight <= 0:
            raise ValueError(f"cost_model needs 0 < decay <= 1 and prior_weight > 0, got {decay}, {prior_weight}")
        self.c = c
        self.v = {0: 1.0, **monotone({int(k): float(value) for k, value in v.items()})}  # draft length k -> v(k)
        self.probe_every = probe_every
        if evidence is not None and len(evidence.counts.tested) != gamma + 1:
            raise ValueError(f"cost_model's pool counts {len(evidence.counts.tested) - 1} positions, gamma is {gamma}")
        self.evidence = evidence if evidence is not None else PointEvidence(gamma)
        self.pool = self.evidence.counts
        self.decay = decay
        self.prior_weight = prior_weight
        self.prefill_cost = prefill_cost  # {"fixed": .., "per_token": ..} in target steps, or None
        self.budget = budget

    def worth_drafting(self, prompt_width: int) -> bool:
        """Whether this batch (prompts P wide) should prefill the draft at all (see the class doc). A batch it
        says no to is counted as skipped; one it says yes to resets the count."""
        worth = self._prefill_pays(prompt_width)
        self.evidence.skipped = 0 if worth else self.evidence.skipped + 1
        return worth

    def _prefill_pays(self, prompt_width: int) -> bool:
        if self.prefill_cost is None or self.budget is None or self.pool.tested[1] < self.MIN_POOLED_ROUNDS \
                or self.evidence.skipped + 1 >= self.probe_every:
            return True
        optimistic, previous = [], 1.0
        for i, b in enumerate(self.pool.rates([None] * self.gamma, self.prior_weight)):
            n = self.pool.tested[i + 1]  # a position the pool never tested: as likely as the one before
            previous = min(1.0, b + self.OPTIMISM * (b * (1 - b) / (n + self.prior_weight)) ** 0.5) if n else previous
            optimistic.append(previous)
        best = max(self.tokens_per_cost(k, optimistic) for k in range(self.gamma + 1))  # R >= 1 (k = 0 gives 1)
        saving = (self.evidence.expected_tokens(self.budget) - 1) * (1 - 1 / best)
        return saving > prefill_steps(self.prefill_cost, prompt_width)

    def start(self, rows):
        super().start(rows)
        self.counts = [AcceptanceCounts(self.gamma) for _ in range(rows)]  # each row's recent evidence
        self.groups: list[AcceptanceCounts | None] = [None] * rows  # each row's group's pool (add_rows), if any
        self.since_probe = [0] * rows  # rounds below gamma since the row's last probe (or its start)

    def verify_cost(self, k: int) -> float:
        """v(k): measured, interpolated linearly between measured lengths; past the longest, the last slope (none
        where it falls: a wider forward is never priced under the widest measured)."""
        known = self.v
        if k in known:
            return known[k]
        below = max(j for j in known if j < k)
        above = min((j for j in known if j > k), default=None)
        if above is None:
            lower = max((j for j in known if j < below), default=None)
            slope = 0.0 if lower is None else max(0.0, (known[below] - known[lower]) / (below - lower))
            return known[below] + slope * (k - below)
        return known[below] + (known[above] - known[below]) * (k - below) / (above - below)

    def pool_prior(self, group: AcceptanceCounts | None = None) -> list[float | None]:
        """The pool's b_i where the pool has tested position i (b_1 always), else None: the rows' prior. With a
        group's pool (a dataset category's rows, add_rows): its counts shrunk toward the point's pool (`prior_weight`
        rounds' weight), so a category's first rows start from the point and its own record takes over."""
        pooled = self.pool.rates([None] * self.gamma, self.prior_weight)
        prior = [b if (i == 0 or self.pool.tested[i + 1] > 0) else None for i, b in enumerate(pooled)]
        if group is None:
            return prior
        grouped = group.rates(prior, self.prior_weight)
        return [b if (i == 0 or group.tested[i + 1] > 0 or prior[i] is not None) else None
                for i, b in enumerate(grouped)]

    def row_priors(self) -> list[list[float | None]]:
        """Each row's prior (pool_prior of its group's pool, or the point's), computed once per pool: the pools
        change only in update, once per round, not per row."""
        by_pool = {}
        for group in self.groups:
            if id(group) not in by_pool:
                by_pool[id(group)] = self.pool_prior(group)
        return [by_pool[id(group)] for group in self.groups]

    def acceptance(self, row: int, prior: list[float | None] | None = None) -> list[float]:
        """The row's [b_1 .. b_gamma]: its own decayed counts, shrunk toward its prior: its group's pool or the
        point's, where tested (prior: the row's row_priors(), when the caller has it already)."""
        return self.counts[row].rates(prior if prior is not None else self.pool_prior(self.groups[row]),
                                      self.prior_weight)

    def tokens_per_cost(self, k: int, rates: list[float]) -> float:
        """E(k) / (k c + v(k)), E(k) = 1 + sum over i <= k of b_1 ... b_i."""
        expected, survive = 1.0, 1.0
        for b in rates[:k]:
            survive *= b
            expected += survive
        return expected / (k * self.c + self.verify_cost(k))

    def best_length(self, rates: list[float]) -> int:
        """The k in 0..gamma with the most tokens per cost; on a tie the shorter."""
        return max(range(self.gamma + 1), key=lambda k: (round(self.tokens_per_cost(k, rates), 12), -k))

    def lengths(self):
        out = []
        for row, prior in enumerate(self.row_priors()):
            k = self.best_length(self.acceptance(row, prior))
            self.since_probe[row] = 0 if k == self.gamma else self.since_probe[row] + 1  # nothing deeper
            if self.since_probe[row] >= self.probe_every:
                k += 1  # a probe: the only way evidence about position k + 1 arrives
                self.since_probe[row] = 0
            out.append(k)
        return out

    def update(self, drafted, accepted):
        for row, (d, a) in enumerate(zip(drafted, accepted)):
            if d:
                self.counts[row].add(d, a, self.decay)
                self.pool.add(d, a)
                if self.groups[row] is not None:
                    self.groups[row].add(d, a)

    def select_rows(self, rows):
        super().select_rows(rows)
        self.counts = [self.counts[r] for r in rows]
        self.groups = [self.groups[r] for r in rows]
        self.since_probe = [self.since_probe[r] for r in rows]

    def add_rows(self, rows, groups: list[AcceptanceCounts | None] | None = None):
        """New requests: the pool is their prior, or each one's group's pool (`groups`, one per row; None: none)."""
        super().add_rows(rows)
        self.counts += [AcceptanceCounts(self.gamma) for _ in range(rows)]
        self.groups += groups if groups is not None else [None] * rows
        self.since_probe += [0] * rows


EXPLORE_EVERY = 16  # every this many rounds, a round runs the neighbour of the chosen K least timed at its rows
CORRECTION = 0.25  # a timed round's weight in its (rows, K)'s running ratio of measured to priced seconds


class RecommendedSchedule(Schedule):
    """Each round one K for the batch in flight, by the one model eval.recommend and the replay price with
    (decode/k_model.py KModel.choose): at the rows in flight and the longest of their contexts (each row's prompt and
    the tokens it has), the K of 0..gamma (0: a plain step) with the most tokens a second, E(K) / S(K), from
    recommend.json's step table and the draft's acceptance. One K a round: the round is one batched forward whose
    verification is as wide as its widest row, so a row drafting fewer saves nothing.

    A catch-up: rows that ran off have tokens their draft has not been fed (a row that joined off, its prompt: the
    drafter's pending tokens, decode/drafters/draft_model.py), and the next round that drafts feeds them in its first
    forward. The model prices that forward at its width (`plan`'s backlogs); what it costs over a 1-token forward is
    paid once, so a K carries its share over the rounds the batch has left (the longest row's tokens left, the
    budget less those it has, over E(K)).

    Served (requests arriving), a round of K > 0 also carries its share of the draft prefills of the requests that
    will join, each as long as the mean prompt in flight within the draft's window (`window`: speculative.draft_context;
    decode/k_model.py admissions): a request admitted while the schedule drafts pays its prefill then, and none is paid
    while it is off.

    Online correction: each round the drafter times (`timed`) is kept as measured over priced seconds, a running mean
    per (rows, K), the first round of each left out (its one-time costs); a K is priced times its own ratio, one not
    yet timed at those rows times the mean of those that are (the machine's pace). Exploration: every EXPLORE_EVERY
    rounds a round runs the neighbour of the chosen K (one below or above) least timed at its rows, so a K priced
    out by the profile or by a slow sitting can come back; not a drafting neighbour whose catch-up (rows that ran off:
    their prompts, their tokens since) would cost more than its round, which would be a prefill, not a probe.

    Lossless: a round's K is decided before it, from the rows, their contexts and backlogs, never from the target's
    verdict."""
    name = "recommended"
    priced = True
    reads_context = True
    idles_rows = True  # at K 0 a joining row's prefill waits in its pending tokens: the catch-up, priced, pays it

    def __init__(self, gamma: int, model, draft: str, budget: int | None = None, ratios: dict | None = None,
                 served: bool = False, window: int | None = None):
        super().__init__(gamma)
        self.served, self.window = served, window
        if draft not in model.acceptance:
            raise ValueError(f"speculative.recommendation has no acceptance of the draft {draft}; give a "
                             "recommendation of a run that measured its chain")
        self.model, self.draft, self.budget = model, draft, budget
        self.ks = range(min(gamma, len(model.rates(draft))) + 1)
        # (rows, K) -> (rounds timed, their running measured / priced): the caller's, kept across batches, where given
        self.ratios: dict[tuple[int, int], tuple[int, float | None]] = {} if ratios is None else ratios
        self.rounds = 0
        self.proposed: tuple[int, int, float] | None = None  # the last planned round: rows, K, its priced seconds
        self.contexts: list[int] = []
        self.prompts: list[int] = []

    def start(self, rows):
        super().start(rows)
        self.contexts, self.prompts = [1] * rows, [0] * rows  # a row of unknown prompt: its first token only

    def add_rows(self, rows, prompt_tokens: list[int] | None = None):
        super().add_rows(rows)
        prompts = list(prompt_tokens) if prompt_tokens is not None else [0] * rows
        self.prompts += prompts
        self.contexts += [p + 1 for p in prompts]

    def select_rows(self, rows):
        super().select_rows(rows)
        self.contexts = [self.contexts[r] for r in rows]
        self.prompts = [self.prompts[r] for r in rows]

    def update(self, drafted, accepted):
        self.contexts = [c + a + 1 for c, a in zip(self.contexts, accepted)]
        self.rounds += 1

    def lengths(self):
        return self.plan([])

    def plan(self, backlogs: list[int]) -> list[int]:
        if not self.rows:
            return []
        rows, context, fed = self.rows, max(self.contexts), 1 + max(backlogs, default=0)
        rates = self.model.rates(self.draft)

        def target(width):
            return self.model.seconds(TARGET, rows, width, context)

        def draft(width):
            return self.model.draft_forward(self.draft, rows, width, context)

        left = max(self.budget - (c - p) for c, p in zip(self.contexts, self.prompts)) if self.budget else 1
        first, step = draft(fed), draft(1)
        catch_up = max(0.0, first - step) if fed > 1 and None not in (first, step) else 0.0
        fed_prompts = [window_tokens(p, self.window) for p in self.prompts]
        joining = (sum(fed_prompts) / rows, self.budget) if self.served and self.budget else None
        k = self.model.choose(self.draft, rows, context, self.gamma, scale=lambda k: self._scale(rows, k),
                              extra=lambda k: catch_up * min(1.0, expected_tokens(rates, k) / max(left, 1)),
                              served=joining)
        if self.rounds % EXPLORE_EVERY == EXPLORE_EVERY - 1:
            # a drafting neighbour whose catch-up costs more than its round is no probe but a prefill: not explored
            priced = {j: round_seconds(target, draft, j) for j in (k - 1, k + 1) if j in self.ks}
            near = [j for j, s in priced.items() if s is not None and (j == 0 or catch_up <= s)]
            k = min(near, key=lambda j: (self.ratios.get((rows, j), (0, None))[0], j), default=k)
        self.proposed = rows, k, round_seconds(target, draft, k, fed)
        return [k] * rows

    def _scale(self, rows: int, k: int) -> float:
        """Measured over priced seconds of a round of K at these rows: its own, else the mean of the K timed there,
        else 1."""
        timed = {j: r for (n, j), (_, r) in self.ratios.items() if n == rows and r is not None}
        return timed.get(k, sum(timed.values()) / len(timed) if timed else 1.0)

    def timed(self, seconds: float, rows: int, width: int, fed: int) -> None:
        """The round last planned took `seconds` (rows, the most a row drafted, the tokens fed a row): its measured
        over priced seconds joins its (rows, K)'s running mean, the first of each left out."""
        if self.proposed is None or self.proposed[:2] != (rows, width) or not self.proposed[2] or seconds <= 0:
            return
        count, mean = self.ratios.get((rows, width), (0, None))
        ratio = seconds / self.proposed[2]
        if count:
            mean = ratio if mean is None else mean + CORRECTION * (ratio - mean)
        self.ratios[rows, width] = count + 1, mean


SCHEDULES = {"constant": ConstantSchedule, "heuristic": HeuristicSchedule, "confidence": ConfidenceSchedule,
             "cost_model": CostModelSchedule, "recommended": RecommendedSchedule}
FIXED = ConstantSchedule.name  # one K every round: what a deploy target takes and a recommendation's sweeps measure
PRICED = tuple(name for name, schedule in SCHEDULES.items() if schedule.priced)


def make_schedule(name: str, gamma: int, *, confidence: float = 0.4, c: float | None = None,
                  v: dict[int, float] | None = None, evidence: PointEvidence | None = None,
                  prefill_cost: dict | None = None, budget: int | None = None, model=None,
                  draft: str | None = None, ratios: dict | None = None, served: bool = False,
                  window: int | None = None) -> Schedule:
    """A schedule by name (SCHEDULES). confidence: the threshold; c, v: cost_model's measured cost ratios
    (v keyed by draft length k, as runner/probes.py measures it); evidence: what cost_model learnt on the
    point's earlier batches (PointEvidence); prefill_cost, budget: cost_model's draft prefill in target steps
    and max_new_tokens (whether a batch runs the draft at all; recommended's tokens left); model, draft: recommended's
    recommendation (decode/k_model.py KModel) and the draft's label, ratios: what its rounds measured against their
    prices (kept by the caller across batches), served: requests arrive (each round carries their draft prefills),
    window: the draft's window over a prompt (speculative.draft_context; None: the whole prompt)."""
    if name == "confidence":
        return ConfidenceSchedule(gamma, confidence)
    if name == "cost_model":
        if c is None or not v:
            raise ValueError("the cost_model schedule needs the measured cost ratios c and v")
        return CostModelSchedule(gamma, c, v, evidence=evidence, prefill_cost=prefill_cost, budget=budget)
    if name == "recommended":
        if model is None or draft is None:
            raise ValueError("the recommended schedule needs its model (speculative.recommendation) and its draft")
        return RecommendedSchedule(gamma, model, draft, budget, ratios, served, window)
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; one of {', '.join(SCHEDULES)}")
    return SCHEDULES[name](gamma)
