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

import math
import statistics
from collections import deque

import torch


class Schedule:
    """The interface, and the constant schedule: gamma drafts every round (Leviathan et al. 2023)."""
    name = "constant"
    stops_mid_round = False  # True: keep_drafting may end rows during a round (the drafter asks it each step)
    reads_context = False  # True: add_rows(n, prompt_tokens=[...]) (the drafter reads the joining rows' prompt lengths)
    # True: a row may go many rounds without drafting (its K is 0 at some loads): a draft model leaves such a row out of
    # its cache while it does not draft (DraftModelDrafter: its prefill waits for the first round that drafts)
    idles_rows = False

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
    name = "cost_model"
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


TIMED_MIN = 3  # rounds of one width at one batch size measured before their seconds correct its price (after the
#   first of each, left out: a shape's first run pays one-time costs, kernel choice and allocator growth)
TIMED_KEEP = 16  # the latest rounds of each kept (their median: a round slowed by the machine weighs little)


class RecommendedSchedule(Schedule):
    """Each round, per row, the K that `python -m eval.recommend` predicted best (docs/recommend.md) at the batch in
    flight and the row's context length, from its table K(batch, context) (decode/methods/speculative.py
    recommended_table): K = 0 ("off") is a plain target step for the row; K is capped by gamma.

    Between tabulated values: the largest tabulated batch at or below the rows in flight (the smallest tabulated
    where none is), and the tabulated context nearest the row's in ratio, as eval.recommend bins a round (its bins
    meet at the geometric means; a table without contexts has one bin). A row's context is its prompt plus the
    tokens it has so far: the prefill's first, then each round's accepted + 1.

    The batch in flight changes under continuous batching (add_rows, select_rows) and as a static batch's rows end:
    each round reads it anew. Lossless: a row's K is decided before the round, from the batch's size and the row's
    length, never from the target's verdict.

    A row that ran off has tokens its draft cache has not seen (its prompt, where it joined off: decode/drafters/
    draft_model.py), and drafting again first feeds them all. With `catch_up` (decode/methods/speculative.py
    catch_up_prices: the seconds a row saves per token at each load and context, and the seconds a forward costs per
    row-token fed) the row starts drafting only where its tokens left repay that feed (catch_up_repaid; at the lower
    of its context's saving and the batch's longest context's), and rows joining together are prefilled only where
    the drafting ones' savings repay their one forward, as wide as the widest prompt (joining_repaid): a long prompt
    near its end, a short one beside a long one, or at a load where drafting barely pays, stays off. Without it every
    row drafts where its K says.

    A round is one batched forward for every row: where one row drafts K, every row's verification is K + 1 wide and
    the draft runs K steps for the batch. With `rounds` (decode/methods/speculative.py round_prices: at each load and
    context, each K's predicted decode speedup and tokens a row commits per round) the round is weighed as a whole
    (round_lengths): a row the table runs off but whose draft cache is within a token of the round's catch-up drafts
    the round's K too (it pays the wide round either way), a held row commits its one token, and the round drafts
    only where the rows' tokens over its cost (in plain steps: tokens / decode speedup at the batch's longest
    context, over whose cache every row's forward runs) beat a plain step's one token a row; else every row runs
    off. A batch of one context whose rows are far from their ends drafts its table K, as before; a row at its last
    tokens, drafting fewer, can turn the round off or to a shorter K.

    A row alone in flight, with `lone` (decode/methods/speculative.py lone_prices: at the load of one row, each
    context's best K, a K tied with off included, and the seconds it saves a token once the draft has the row's
    context) and catch-up prices, follows it instead of the table's row of one: the end-to-end speedup behind the
    table's tie rule carries the draft's prefill on average over the calibration's prompts, where the row's own
    catch-up (catch_up_repaid, at that saving) prices its own. At more rows in flight the table's tie rule stands
    (its what-ifs at a concurrency above one run optimistic on mixed contexts: docs/benchmarks.md).

    Under a load whose batch grows (requests arriving at a rate, not one joining as one leaves), a catch-up's saving
    is what the row is expected to save before and after the batch next grows (catch_up_repaid, `lasting`): the
    batch it was priced at lasts, in rounds, as long as the rounds between growths this run has seen so far (a
    budget's worth of rounds without one assumed before the first), and after the growth the row saves at one row
    more in flight (off where the table is). A static batch, a load at its concurrency cap and one whose batch has
    not grown are priced without growth. A row also outlives the rows beside it that are nearer their ends: its tokens
    after each one's end are priced at one row fewer in flight (`ahead`), but for the first as many ends as requests
    wait in the queue, and for as many as are expected to arrive by then (`queued`: they refill those rows). So a
    newcomer joining a batch that runs off, beside rows near their ends, is prefilled as it joins (in a forward of
    its own) where what it saves at the fewer rows repays it: put off, its prefill would cost a round's catch-up as
    wide for every row in flight, and the rows already caught up could not draft beside it: with `plain`
    (decode/methods/speculative.py plain_prices: a row's seconds a token off) what that lets the batch save counts
    too (`enabling`).

    A round's price is the profile's, of another sitting of the machine. With `plain` and `rounds` the schedule
    also times its own rounds (`timed`: the seconds from proposal to verdict, a catch-up's feed left out) against
    what the prices say of them, per batch in flight and width (K, 0 for a plain step): once TIMED_MIN rounds of a
    K and of plain steps are timed at the batch in flight, the K's cost in plain steps is scaled by the median
    measured / priced of its rounds over that of the plain steps (`_timing`). So a K the machine runs slower than
    profiled, against its own plain steps, stops being chosen where the prices alone would choose it."""
    name = "recommended"
    reads_context = True
    idles_rows = True

    def __init__(self, gamma: int, table: dict[int, dict[int | None, int]],
                 catch_up: tuple[dict[int, dict[int | None, float]], float] | None = None, budget: int | None = None,
                 rounds: dict[int, dict[int | None, dict[int, tuple[float, float]]]] | None = None,
                 lone: dict[int | None, tuple[int, float]] | None = None, most_rows: int | None = None,
                 plain: dict[int, dict[int | None, float]] | None = None):
        super().__init__(gamma)
        if not table or any(not by_context for by_context in table.values()) or \
                any(k < 0 for by_context in table.values() for k in by_context.values()):
            raise ValueError(f"the recommended schedule needs a table batch -> context -> K >= 0, got {table}")
        self.table = table
        self.batches = sorted(table)
        self.savings, self.price = catch_up if catch_up is not None else (None, None)
        self.budget = budget  # max_new_tokens: a row's tokens left are the budget less those it has
        self.rounds = rounds
        # a row alone in flight: its K and saving a token by context, where catch-ups are priced (it decides by its own)
        self.lone = lone if lone and self.savings is not None and budget is not None else None
        # how long a batch lasts: the rounds seen while it could grow (below most_rows, the load's concurrency) and
        # the times it grew (a round with more rows than the last: arrivals, not one joining as one leaves); kept
        # across the drafter's resets (a served run's idle gaps)
        self.most_rows = most_rows
        self.open_rounds, self.growths, self.last_round_rows, self.grown = 0, 0, None, False
        self.waiting, self.rate = 0, None  # the queue (`queued`): requests waiting, and arriving a second
        self.plain = plain  # a row's seconds a token off, by batch and context (what a round drafting saves: enabling)
        self.timings: dict[tuple[int, int], deque] = {}  # (rows, width) -> measured / priced seconds of its rounds
        self.proposed_longest = None  # the longest context in flight when the last round was proposed (`timed`)

    def start(self, rows):
        super().start(rows)
        self.contexts = [1] * rows  # a row of unknown prompt: its first token only
        self.prompts = [0] * rows
        self.last_round_rows = None  # an empty batch (a served run's idle gap) does not grow: its first rows start it

    def add_rows(self, rows, prompt_tokens: list[int] | None = None):
        super().add_rows(rows)
        if self.last_round_rows is not None and self.rows > self.last_round_rows and not self.grown:
            self.growths, self.grown = self.growths + 1, True  # one growth however many rows join before a round
        self.prompts += list(prompt_tokens) if prompt_tokens is not None else [0] * rows
        self.contexts += [p + 1 for p in self.prompts[-rows:]] if rows else []

    def queued(self, requests: int, rate: float | None = None) -> None:
        """What the serving loop sees of its queue before each admission: the requests that have arrived and wait
        for a row (a load at its concurrency cap: they refill the first rows that end) and the rate requests have
        arrived at so far, per second (more refill rows as they arrive: catch_up_saving, `ahead`)."""
        self.waiting, self.rate = requests, rate

    def select_rows(self, rows):
        super().select_rows(rows)
        self.contexts = [self.contexts[r] for r in rows]
        self.prompts = [self.prompts[r] for r in rows]

    def update(self, drafted, accepted):
        self.contexts = [c + a + 1 for c, a in zip(self.contexts, accepted)]
        self.last_round_rows, self.grown = self.rows, False
        if self.most_rows is None or self.rows < self.most_rows:
            self.open_rounds += 1

    def by_context(self, table: dict | None = None, rows: int | None = None) -> dict:
        """The table's row for the batch in flight, or for `rows` rows (of `table`: the savings, keyed as the
        table)."""
        table = self.table if table is None else table
        rows = self.rows if rows is None else rows
        below = [b for b in self.batches if b <= rows]
        return table[below[-1] if below else self.batches[0]]

    @staticmethod
    def _bin(by_context: dict, context: int):
        """The tabulated context nearest `context` in ratio (None where the table has no contexts)."""
        bins = sorted(c for c in by_context if c is not None)
        return min(bins, key=lambda c: (abs(math.log(max(context, 1) / c)), c)) if bins else None

    def _alone(self) -> bool:
        """A row alone in flight, where `lone` prices it (class doc)."""
        return self.lone is not None and self.rows == 1

    def lengths(self):
        self.proposed_longest = max(self.contexts, default=None)
        if self._alone():
            return [min(self.gamma, self.lone[self._bin(self.lone, self.contexts[0])][0])]
        ks = self.by_context()
        return [min(self.gamma, ks[self._bin(ks, context)]) for context in self.contexts]

    def catch_up_saving(self, row: int) -> float:
        """The seconds the row is expected to save on its tokens left (the budget less those it has, each round's
        accepted + 1 after its first) once its draft has caught up: each token at the saving of the batch it runs in
        (savings per token at the recommended K: a row alone `lone`'s where given; with company the lower of its
        context's and the longest context's in flight, over whose cache every row's forward runs, as a round is
        weighed: round_lengths). The batch shrinks as the rows beside it end, each at its own tokens left (the
        budget's: one that stops early only shrinks it sooner), but for the first `waiting` of them, which queued
        requests refill (`ahead`): a newcomer beside rows near their ends drafts at the fewer rows it outlives them
        at. Where the batch grows under the load, that over the batch's life, the rest at one more row in flight
        (`lasting`; class doc). Needs prices and a budget."""
        context, left = self.contexts[row], self._left(row)
        if self._alone():
            k = self.lone[self._bin(self.lone, context)][0]
        else:
            ks = self.by_context()
            k = min(self.gamma, ks[self._bin(ks, context)])
        saved = self.ahead(row, left)
        lasts = self.lasting(left, self._tokens_per_round(context, k)) if self.growths else 1.0
        if lasts < 1:
            grown = self._saving(self.by_context(self.savings, self.rows + 1), context, max(self.contexts))
            saved = lasts * saved + (1 - lasts) * left * grown
        return saved

    def _left(self, row: int) -> int:
        """The row's tokens left: the budget less those it has (its prefill's first, then each round's accepted + 1)."""
        return self.budget - (self.contexts[row] - self.prompts[row])

    def ahead(self, row: int, left: int) -> float:
        """The seconds the row saves on its `left` tokens as the batch shrinks (catch_up_saving): the rows beside it
        end in the order of their tokens left, the first `waiting` of them refilled by the queue; a later one is
        refilled where a request has arrived by then (arrivals Poisson at `rate`, over the seconds to its end at off's
        seconds a token, `plain`; none without either), else the batch runs one row fewer. Each stretch between ends
        is priced at its expected saving a token over how many rows it has lost: at those rows in flight and the
        longest context still in flight (a refilled row's kept: its newcomer's is not known)."""
        others = sorted((self._left(i), self.contexts[i]) for i in range(self.rows) if i != row)
        context, saved, done = self.contexts[row], 0.0, 0
        plain = self._plain(self.rows)
        rate = self.rate if plain is not None and self.rate else 0.0
        # the longest context among the rows not yet ended (after i ends: others[i:]) and among those ended first
        later = [context] * (len(others) + 1)
        for i in range(len(others) - 1, -1, -1):
            later[i] = max(later[i + 1], others[i][1])
        earlier = [0] * (len(others) + 1)
        for i, (_, other) in enumerate(others):
            earlier[i + 1] = max(earlier[i], other)
        priced: dict[tuple[int, int], float] = {}

        def at(rows: int, longest: int) -> float:
            if (rows, longest) not in priced:
                priced[rows, longest] = self._saving_at(rows, context, longest)
            return priced[rows, longest]

        for i in range(len(others) + 1):  # the stretch after the first i rows beside it have ended
            end = min(others[i][0], left) if i < len(others) else left
            if end <= done:
                continue
            stretch, done = end - done, end
            short = max(0, i - self.waiting)  # rows ended that the queue does not refill
            mu = rate * others[i - 1][0] * plain if i and rate else 0.0  # requests arriving by the i-th end
            p, mass, expected = math.exp(-mu), 0.0, 0.0
            for arrived in range(short):  # fewer arrivals than ends: short - arrived rows fewer (Poisson, stepwise)
                if p > 1e-12:  # the first i - fewer ended rows are refilled (their contexts kept)
                    fewer = short - arrived
                    expected += p * at(self.rows - fewer, max(later[i], earlier[i - fewer]))
                mass += p
                p *= mu / (arrived + 1)
            expected += max(0.0, 1 - mass) * at(self.rows, max(later[0], earlier[len(others)]))
            saved += stretch * expected
        return saved

    def _plain(self, rows: int, longest: int | None = None) -> float | None:
        """A row's seconds a token off at `rows` in flight and the batch's longest context (or `longest`: `plain`);
        None without."""
        if self.plain is None:
            return None
        plain = self.by_context(self.plain, rows)
        return plain[self._bin(plain, max(self.contexts) if longest is None else longest)]

    def _saving_at(self, rows: int, context: int, longest: int) -> float:
        """A row's saving a token at `rows` in flight: alone, `lone`'s where given; else _saving at the table's row
        for that many."""
        if rows == 1 and self.lone is not None:
            return self.lone[self._bin(self.lone, context)][1]
        return self._saving(self.by_context(self.savings, rows), context, longest)

    def _saving(self, savings: dict, context: int, longest: int) -> float:
        """A row's saving a token in a batch (savings: the table's row for its size): the lower of its context's and
        the batch's longest context's."""
        return min(savings[self._bin(savings, context)], savings[self._bin(savings, longest)])

    def catch_up_repaid(self, row: int, behind: int) -> bool:
        """Whether the row, `behind` tokens its draft cache has not seen (besides its last), drafts this round: what
        it saves (catch_up_saving) at least what feeding them costs the round's forward that feeds them (price x the
        batch's rows x behind; rows joining together: joining_repaid). True without prices or a budget."""
        if self.savings is None or self.budget is None:
            return True
        return self.catch_up_saving(row) >= self.price * self.rows * behind

    def joining_repaid(self, rows: list[int], width: int, backlogs: list[int] | None = None) -> bool:
        """Whether joining rows (`rows`, the last of the batch) are prefilled by the draft as they join, in one
        forward of their own: it costs price x their number x `width`, the widest prompt as fed (the narrower are
        left padded to it), and they save the sum of their catch_up_saving, which counts what a row off at the batch
        in flight saves once the batch has shrunk (a prefill put off costs a round's forward as wide for every row in
        flight), plus what their prefill lets the whole batch save where the table runs it off (`enabling`, with the
        other rows' backlogs). Without prices or a budget, where any of them drafts by its K now."""
        if self.savings is None or self.budget is None:
            return any(self.lengths()[row] for row in rows)
        saved = sum(self.catch_up_saving(row) for row in rows)
        if backlogs is not None:
            saved += self.enabling(rows, backlogs)
        return saved > 0 and saved >= self.price * len(rows) * width

    def enabling(self, rows: list[int], backlogs: list[int]) -> float:
        """The seconds the joining `rows` let the batch save by joining the draft's cache now, where the table runs
        every row off at the batch in flight: its rounds are then weighed as a whole (round_lengths), every row whose
        draft has caught up riding at each priced K, and a row held (its prefill put off) makes the round's tokens
        fewer, often too few to beat a plain step. So: the batch's wall time for the stretch it keeps its rows (the
        joiners' tokens until the first row beside them ends that no queued request refills), off a row's seconds a
        token at the batch and its longest context (`plain`), times 1 / the best round's value with the joiners held
        less 1 / that with them riding (a value under 1 runs off: 1). backlogs: the draft's pending tokens of the
        other rows (a row with more than one is held either way). 0 without `rounds` or `plain`, where the table
        drafts some row (each row's own saving prices it there), or where no row was in flight before them (a static
        batch, an empty batch's first rows: as the table says)."""
        if self.rounds is None or self.plain is None or not backlogs or any(self.lengths()):
            return 0.0
        joining = set(rows)
        caps = [min(self.gamma, max(0, self._left(row))) for row in range(self.rows)]
        riding = [row in joining or b <= 1 for row, b in enumerate(backlogs + [0] * len(rows))]
        held = [ride and row not in joining for row, ride in enumerate(riding)]
        (ks, with_them), (_, without) = self._round_value(riding, caps), self._round_value(held, caps)
        if ks is None or with_them <= without:
            return 0.0
        lefts = sorted(self._left(row) for row in range(self.rows) if row not in joining)
        stretch = max(self._left(row) for row in rows)
        if len(lefts) > self.waiting:
            stretch = min(stretch, lefts[self.waiting])
        return max(0, stretch) * self._plain(self.rows) * (1 / without - 1 / with_them)

    def _round_value(self, riding: list[bool], caps: list[int], ks: list[int] | None = None
                     ) -> tuple[list[int], float]:
        """The best chain round of the batch in flight with these rows riding (the others held: one token): at each
        K of `ks` (every K priced at the longest context up to gamma where None), the riding rows draft min(K, cap);
        its value is the rows' tokens (tokens per round at their context and K, 1 where held) over its cost in plain
        steps of the batch (each row's forward runs over the longest cache: tokens / decode speedup at the round's K
        and the longest context, rows times). Returns the lengths and value of the best K whose value is above 1,
        else every row off at value 1; None lengths where a K or context the round needs is not priced."""
        prices = self.by_context(self.rounds)
        at = [prices[self._bin(prices, context)] for context in self.contexts]
        longest = prices[self._bin(prices, max(self.contexts))]
        best, value = [0] * len(riding), 1.0
        for k in ks if ks is not None else sorted(k for k in longest if k <= self.gamma):
            lengths = [min(k, cap) if ride else 0 for ride, cap in zip(riding, caps)]
            if k not in longest or any(r and r not in p for p, r in zip(at, lengths)):
                return None, value
            tokens = sum(p[r][1] if r else 1.0 for p, r in zip(at, lengths))
            cost = len(lengths) * longest[k][1] / longest[k][0] * self._timing(k)
            if tokens / cost > value:
                best, value = lengths, tokens / cost
        return best, value

    def timed(self, seconds: float, rows: int, width: int, fed: int) -> None:
        """A chain round of `rows` rows drafting up to `width` (0: a plain step) that fed `fed` tokens a row (its
        catch-up: the last token, and the last draft of a full accept) took `seconds`: kept as measured / priced
        (a plain step: off's seconds a token at the batch and its longest context, `plain`; a K: that times its
        cost in plain steps, `rounds`' tokens per round / decode speedup at the longest context) for `_timing`. A
        round that fed a backlog (more than 2 a row) is its catch-up's, not the K's, and the first round of each
        batch size and width pays its one-time costs: both left out. Priced at the longest context when the round
        was proposed (`lengths`). Kept across the drafter's resets (the machine is the same)."""
        if self.plain is None or self.rounds is None or fed > 2 or rows != self.rows or seconds <= 0:
            return
        longest = self.proposed_longest or max(self.contexts)  # the contexts the round ran at, before its tokens
        predicted = self._plain(rows, longest)
        if width:
            prices = self.by_context(self.rounds)
            at = prices[self._bin(prices, longest)]
            if width not in at:
                return
            predicted *= at[width][1] / at[width][0]
        if (rows, width) not in self.timings:  # the shape's first round: its one-time costs, left out
            self.timings[rows, width] = deque(maxlen=TIMED_KEEP)
        elif predicted > 0:
            self.timings[rows, width].append(seconds / predicted)

    def _timing(self, k: int) -> float:
        """The scale of a K round's cost in plain steps at the batch in flight (`timed`): the median measured / priced
        of its rounds over that of the plain steps, each of at least TIMED_MIN rounds; 1 until both are."""
        drafting, off = self.timings.get((self.rows, k)), self.timings.get((self.rows, 0))
        if not drafting or not off or len(drafting) < TIMED_MIN or len(off) < TIMED_MIN:
            return 1.0
        return statistics.median(drafting) / statistics.median(off)

    def _tokens_per_round(self, context: int, k: int) -> float:
        """The tokens a row at this context commits per round at K (`rounds`' prices at the batch in flight); 1 where
        they are not given (a row that needs as many rounds as tokens: the batch's growth weighs most)."""
        if self.rounds is None or not k:
            return 1.0
        prices = self.by_context(self.rounds)
        return prices[self._bin(prices, context)].get(k, (None, 1.0))[1]

    def lasting(self, left: int, per_round: float) -> float:
        """The share of a row's `left` tokens (at `per_round` a round) it is expected to make before the batch in
        flight next grows: with growths at random at this run's rate so far (a mean of m rounds between them: the
        rounds seen while the batch could grow, plus a budget's worth before any growth, over the growths), and the
        row needing L = left / per_round rounds, E[min(X, L)] / L = (m / L)(1 - e^(-L / m)) for X exponential of
        mean m. 1 where the batch has not grown, cannot (at most_rows) or no tokens are left."""
        if self.growths == 0 or left <= 0 or (self.most_rows is not None and self.rows >= self.most_rows):
            return 1.0
        m = (self.open_rounds + (self.budget or 0)) / self.growths
        rounds = left / max(per_round, 1.0)
        return m / rounds * (1 - math.exp(-rounds / m))

    def round_lengths(self, lengths: list[int], backlogs: list[int], caps: list[int]) -> list[int]:
        """A chain round's lengths weighed as a whole (class doc). lengths: each row's K from the table (0 off; after
        catch_up_repaid), backlogs: the tokens each row's draft cache has not seen (DraftModelDrafter's pending),
        caps: the most each row may draft (its tokens left, the engine's gamma). For each K some row drafts, every
        row within a token of the round's catch-up (backlog at most the widest drafting row's + 1: a full accept's
        last draft beside a row that accepted less, which every plain round after keeps one ahead) drafts min(K,
        cap), the others are held (one token); the round's value is the rows' tokens (tokens per round at their
        context and K, 1 where none) over its cost in plain steps of the batch: each row's forward runs over the
        batch's longest cache (left padded), so tokens / decode speedup at the round's K and the longest context,
        rows times. The best K whose value is above 1; all off where none is. Where the table runs every row off,
        the rows whose draft cache has caught up (a backlog of at most one token: their prefill is paid) are weighed
        the same way at every K priced at the batch's longest context, the others held. As given without prices (no
        `rounds`, or a K or context they do not have) or where every row is off and none has caught up."""
        if self.rounds is None or not lengths or (not any(lengths) and min(backlogs) > 1):
            return lengths
        width = max((b for k, b in zip(lengths, backlogs) if k), default=0)
        rides = [k > 0 or b <= width + 1 for k, b in zip(lengths, backlogs)]
        # the table's Ks; where it runs every row off, the rows whose draft has caught up (its prefill paid) weigh
        # every priced K: they draft on where the round's decode gain pays, as the table's end-to-end figure (which
        # charges each row's prefill) cannot say
        best, _ = self._round_value(rides, caps, sorted(set(lengths) - {0}) if any(lengths) else None)
        return lengths if best is None else best


SCHEDULES = {"constant": ConstantSchedule, "heuristic": HeuristicSchedule, "confidence": ConfidenceSchedule,
             "cost_model": CostModelSchedule, "recommended": RecommendedSchedule}


def make_schedule(name: str, gamma: int, *, confidence: float = 0.4, c: float | None = None,
                  v: dict[int, float] | None = None, evidence: PointEvidence | None = None,
                  prefill_cost: dict | None = None, budget: int | None = None,
                  table: dict[int, dict[int | None, int]] | None = None,
                  catch_up: tuple[dict, float] | None = None, rounds: dict | None = None,
                  lone: dict | None = None, most_rows: int | None = None, plain: dict | None = None) -> Schedule:
    """A schedule by name (SCHEDULES). confidence: the threshold; c, v: cost_model's measured cost ratios
    (v keyed by draft length k, as runner/probes.py measures it); evidence: what cost_model learnt on the
    point's earlier batches (PointEvidence); prefill_cost, budget: cost_model's draft prefill in target steps
    and max_new_tokens (whether a batch runs the draft at all); table: recommended's K by batch and context, catch_up:
    its prices of a row's catch-up, rounds: its prices of a round, lone: a row alone's K and saving, most_rows: the
    load's concurrency, plain: a row's seconds a token off (RecommendedSchedule)."""
    if name == "confidence":
        return ConfidenceSchedule(gamma, confidence)
    if name == "cost_model":
        if c is None or not v:
            raise ValueError("the cost_model schedule needs the measured cost ratios c and v")
        return CostModelSchedule(gamma, c, v, evidence=evidence, prefill_cost=prefill_cost, budget=budget)
    if name == "recommended":
        if not table:
            raise ValueError("the recommended schedule needs its table K(batch, context) (speculative.recommendation)")
        return RecommendedSchedule(gamma, table, catch_up, budget, rounds, lone, most_rows, plain)
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; one of {', '.join(SCHEDULES)}")
    return SCHEDULES[name](gamma)
