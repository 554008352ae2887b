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
recovers), and every PROBE_EVERY rounds below the cap a row that drafts with the model drafts one token more than its
best length (the cost_model schedule's probe: the draft's position k + 1 is scored only where it was drafted, so
one early rejection at position 2 would otherwise keep every later row at k = 1 for good). The free sources need
no probe: after every round each candidate is scored against what the round
committed (its longest common prefix with the accepted tokens and the target's next token), whether it was verified
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

from decode.drafters.base import Drafter, Proposal
from decode.drafters.draft_model import DraftModelDrafter
from decode.drafters.prompt_lookup import NgramIndex
from decode.drafters.schedules import CostModelSchedule, PointEvidence, Schedule
from decode.drafters.suffix import SuffixCache, SuffixSource, prompt_key, unpadded
from decode.kv import host_to_device
from decode.tree_layout import TreeLayout

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
    """The draft model's lengths as the hybrid decided them this round."""
    name = "hybrid"

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


def plan_row(rates: dict[str, list[float]], lengths: dict[str, int], limit: int, c: float, v_of,
             need_draft: bool = False, merge: bool = True) -> tuple[str | None, int, int, float]:
    """One row's choice: (free source or None, its tokens k_f, draft tokens k_d, expected tokens per cost). rates: each
    source's [b_1 ..]; lengths: each free source's candidate length (<= limit); v_of(n): the verification cost of n
    nodes. need_draft: only options with k_d >= 1 (a probe); merge False: no tree of two sources. On a tie the option listed first (cheaper) wins."""
    options: list[tuple[str | None, int, int, float]] = []
    if not need_draft:
        options.append((None, 0, 0, 1.0))
        for source in FREE:
            s = survival(rates[source], lengths.get(source, 0))
            for k in range(1, len(s) + 1):
                options.append((source, k, 0, (1 + sum(s[:k])) / v_of(k)))
    draft = survival(rates["draft"], limit)
    for k in range(1, limit + 1):
        options.append((None, 0, k, (1 + sum(draft[:k])) / (k * c + v_of(k))))
    for source in FREE if merge else ():
        s = survival(rates[source], lengths.get(source, 0))
        for kf in range(1, len(s) + 1):
            for kd in range(1, limit + 1):
                either = [1 - (1 - (s[i] if i < kf else 0.0)) * (1 - (draft[i] if i < kd else 0.0))
                          for i in range(max(kf, kd))]
                options.append((source, kf, kd, (1 + sum(either)) / (kd * c + v_of(kf + kd))))
    if not options:
        return None, 0, 0, 1.0
    best = options[0]
    for option in options[1:]:
        if option[3] > best[3] + 1e-12:
            best = option
    return best


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
    start from their own record; cache: the suffix source's earlier outputs (SuffixCache)."""
    PROBE_EVERY = 8

    def __init__(self, draft: DraftModelDrafter, target_vocab_size: int, gamma: int, c: float, v: dict[int, float],
                 pools: dict[str, PointEvidence] | None = None, cache: SuffixCache | None = None, ngram_max: int = 3,
                 ngram_min: int = 1, suffix_max_depth: int = 8, suffix_min_prob: float = 0.1, merge: bool = True,
                 group_pools: dict[str, dict[str, PointEvidence]] | None = None, group_of=None):
        self.draft = draft
        self.wanted = _Wanted(gamma)
        draft.schedule, draft.tree = self.wanted, None
        self.vocab = target_vocab_size
        self.gamma, self.c = gamma, c
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

    def v_of(self, nodes: int) -> float:
        return self.estimators["draft"].verify_cost(nodes)

    def reset(self):
        self.lookups: list[NgramIndex] = []
        self.suffixes: list[SuffixSource] = []
        for estimator in self.estimators.values():
            estimator.start(0)
        self.since_draft: list[int] = []
        self.since_deeper: list[int] = []
        self.draft.reset()  # and its schedule, self.wanted
        self._observed = self._observed_drafts = None
        self.round_facts = None

    def add_rows(self, prompt_ids, prompt_mask):
        """Each joining row's lookup index and suffix source (its prompt's earlier output leaves the shared cache),
        its estimators' rows (the pools their prior) and the draft model's rows (DraftModelDrafter.add_rows)."""
        prompts = unpadded(prompt_ids, prompt_mask)
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
        self.draft.add_rows(prompt_ids, prompt_mask)  # and self.wanted, its schedule
        self.device = prompt_ids.device

    def _plans(self, limits: list[int]) -> list[tuple[str | None, int, int, float]]:
        used = {"draft", *(key for keys in self.keys for key in keys.values())}  # 3 of EVIDENCE's 13 keys a row
        priors = {key: self.estimators[key].row_priors() for key in used}
        plans = []
        for row, limit in enumerate(limits):
            keys = {"draft": "draft", **self.keys[row]}  # each free candidate's evidence: its stratum's
            rates = {s: self.estimators[key].acceptance(row, priors[key][row]) for s, key in keys.items()}
            lengths = {s: len(self.candidates[row][s]) for s in FREE}
            probe = self.since_draft[row] + 1 >= self.PROBE_EVERY and limit > 0
            plan = plan_row(rates, lengths, limit, self.c, self.v_of, need_draft=probe, merge=self.merge)
            plans.append(self._deepen(row, plan, limit))
        return plans

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
        if max(k_draft) > 0:
            self.wanted.wanted = k_draft
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
            lengths = [len(free[row]) or k_draft[row] for row in range(rows)]
            if drafted is None:
                width = free_width
                return Proposal(free_tokens[:, :width], None, host_to_device(np.array(lengths, dtype=np.int64),
                                                                              self.device))
            width = max(free_width, drafted.tokens.shape[1])
            use_free = host_to_device(np.array([bool(f) for f in free]), self.device).bool()  # [B]
            pad = lambda t, w: torch.nn.functional.pad(t, (0, w - t.shape[1]))  # noqa: E731
            tokens = torch.where(use_free[:, None], pad(free_tokens, width), pad(drafted.tokens, width))
            probs = None
            if sampled:  # the draft's q, one-hot rows for the free sources' point masses
                onehot = torch.nn.functional.one_hot(pad(free_tokens, width), self.vocab).to(drafted.probs.dtype)
                q = torch.nn.functional.pad(drafted.probs, (0, 0, 0, width - drafted.probs.shape[1]))
                probs = torch.where(use_free[:, None, None], onehot, q)
            return Proposal(tokens, probs, host_to_device(np.array(lengths, dtype=np.int64), self.device))
        # a tree: per row the free branch (nodes 0 .. Lf-1), then the draft's (Lf .. Lf+kd-1), both under the root
        nodes = max(len(f) + k for f, k in zip(free, k_draft))
        index = np.zeros((rows, nodes), dtype=np.int64)  # into [free tokens (Wf) | draft tokens (Gd)]
        parents = np.full((rows, nodes), -1, dtype=np.int64)
        valid = np.zeros((rows, nodes), dtype=bool)
        self.branches = []
        for row in range(rows):
            lf, kd = len(free[row]), k_draft[row]
            index[row, :lf] = np.arange(lf)
            index[row, lf:lf + kd] = free_ids.shape[1] + np.arange(kd)
            parents[row, :lf] = np.arange(-1, lf - 1)
            parents[row, lf:lf + kd] = [-1] + list(range(lf, lf + kd - 1))
            valid[row, :lf + kd] = True
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
        self.layout = TreeLayout(parents, valid)
        return Proposal(tokens, probs, layout=self.layout)

    def commit(self, accepted_len, accepted_len_host, drafted_host, path_host=None):
        drafts = self._observed_drafts or []
        next_tokens = self._observed or []
        rows = len(self.lookups)
        facts, draft_accepted = [], []
        evidence = {key: ([0] * rows, [0] * rows) for key in EVIDENCE}  # per key, per row: (tested, matched)
        for row in range(rows):
            path = path_host[row] if path_host is not None else list(range(accepted_len_host[row]))
            path_tokens = [drafts[row][node] for node in path]
            committed = path_tokens + ([next_tokens[row]] if row < len(next_tokens) else [])
            on_path = set(path)
            branches = self.branches[row]
            facts.append({"sources": {s: [len(nodes), sum(n in on_path for n in nodes)] for s, nodes in branches.items()}})
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
        for estimator in self.estimators.values():
            estimator.select_rows(kept)
        self.draft.select_rows(rows)
        self._keep_observed(kept)
