"""The prediction by replay of a point's schedule (#33): the decode a point ran, request by request and round by
round, priced with a cost profile (eval/costs.py: the run's probes, or a profile of another device) instead of
Leviathan's closed form for an average row at a fixed batch size.

The replay is the engine's one loop (decode/generate.py _Loop) with simulated time: a static batch is every request
arriving at 0 with a cap of its rows; a load point its requests at their arrivals with its concurrency cap. Each
request brings what the point measured of it: its prompt's length, its new tokens and its rounds (drafted,
accepted, emitted; a tree's nodes); the profile brings what each step costs at the rows in flight, the width it
verifies and the cache it reads, and the prefills of those joining. The figures of the replayed schedule are
computed by the same functions as the measured ones, so measured and predicted compare one to one.

At batch 1 with a constant gamma and no prefill it is Leviathan's E(alpha) / (gamma c + v) with the alpha solved from
the same rounds (tests/eval/test_schedule_replay.py); above it, it prices what the closed form leaves out: the batch
waiting for its slowest row, the rows that leave, the joining requests' prefills that the running rows wait for.
What it leaves out: the loop's host bookkeeping between steps (each profiled step includes its own host read).
"""
from __future__ import annotations

import json
import math
import random
from collections import defaultdict

from decode.k_model import admissions, best_k, round_parts, window_tokens
from decode.arrivals import Load, Queue, prefill_batches
from eval.stats import BOOTSTRAP_SEED, MIN_PROMPTS, expanded_interval, ratio, ratio_of_totals
from eval.totals import BATCHES, DECODE_SPEEDUP, SPEEDUP, paired_clusters, units


# ---- the schedule replayed in seconds, with a cost profile (eval/costs.py) ----------------------------------------
#
# The engine's one loop (decode/generate.py _Loop) replayed: admit / round / evict with simulated time instead of the
# clock. Each pass admits the requests that have arrived, in arrival order (decode/arrivals.py Queue), while fewer than C rows are in flight (a static
# batch: all at 0, C = its rows), prefilling those admitted together as the engine does (a static batch in one target
# forward over its widest prompt, a load's in forwards of like length: decode/arrivals.py prefill_batches; then the
# draft model's one prefill of those that go on, over its window where speculative.draft_context sets one); with
# nobody in flight and nobody arrived, time jumps to the next arrival. Then one round over the rows in flight: the baseline's 1-token step, or a speculative round priced
# at its widest draft (the draft model's forwards, then one verification of the widest chain + 1 or tree + 1 tokens);
# the rows' caches as long as the longest row's prompt and tokens so far. Then the rows whose recorded rounds are
# done leave. Each request's rounds (drafted, accepted, emitted) and lengths are the point's own, as measured; the
# costs are the profile's, never the point's timed steps. Host work between steps is in the profile's steps (each
# timed with its host read) or left out (the loop's own bookkeeping).

class MissingCost(LookupError):
    """The profile lacks a cost the schedule needs: what is missing, in words."""


class MissingRecord(MissingCost):
    """The records lack what the replay needs (not the profile): the reason whole, in words."""


def lacking(error: MissingCost, whose: str = "the profile") -> str:
    """Why no replay, in words: what `whose` profile lacks, or what the records lack."""
    return str(error) if isinstance(error, MissingRecord) else f"{whose} lacks {error}"


class Pricer:
    """A schedule's costs from a profile: the target's steps and prefills, and the draft model's when the method
    drafts with one (draft: its label in the profile). clamp_rows: a step at fewer rows than any profiled takes the
    smallest profiled rows' cost where those are at most clamp_rows, the batch's size (a static batch's tail, when
    its rows leave, where the run probed its full size only; a batch size not profiled is missing, not priced at
    another): the rows so priced are kept in `clamped`, and the prediction says so. The caches priced beyond the
    profiled ones (Profile.step_s) are kept in `beyond`, and the prediction says so too.

    A compiled profile (meta "compile") prices the steps the compiled engine runs (decode/static_kv.py): a batch
    keeps its capacity (the smallest profiled rows holding it) until its last row ends, finished rows running as dead
    rows, its prefill included; a step runs at the smallest profiled width holding its tokens (width_for)."""

    def __init__(self, profile, draft: str | None = None, clamp_rows: int = 0):
        from eval.costs import TARGET, draft_model
        self.profile, self.target, self.clamp_rows = profile, TARGET, clamp_rows
        self.draft = None if draft is None else draft_model(draft)
        self.compiled = bool(profile.meta.get("compile"))
        self.clamped: set[int] = set()
        self.beyond: set[float] = set()
        self._memo: dict[tuple, float | None] = {}

    def rows(self, in_flight: int, peak: int) -> int:
        """The rows a step over `in_flight` rows is priced at: those, or (compiled) the capacity of the most rows
        the batch held (`peak`)."""
        return _fitting(self.profile.rows_measured(self.target), peak) if self.compiled else in_flight

    def _width(self, width: int) -> int:
        return _fitting(self.profile.widths_measured(self.target), width) if self.compiled else width

    def _step(self, model: str, rows: int, width: int, kv: float) -> float | None:
        key = (model, rows, width, kv)
        if key not in self._memo:
            self._memo[key] = self._priced(model, rows, width, kv)
        return self._memo[key]

    def _priced(self, model: str, rows: int, width: int, kv: float) -> float | None:
        s = self.profile.step_s(model, rows, width, kv, self.beyond)
        if s is None and self.clamp_rows:
            above = [r for r in self.profile.rows_measured(model) if r > rows]
            if above and above[0] <= self.clamp_rows:
                s = self.profile.step_s(model, above[0], width, kv, self.beyond)
                if s is not None:
                    self.clamped.add(rows)
        return s

    def step(self, rows: int, width: int, kv: float) -> float:
        s = _finite(self._step(self.target, rows, self._width(width), kv))
        if s is None:
            raise MissingCost(f"the target's step at {rows} rows x {width} tokens (profiled: rows "
                              f"{self.profile.rows_measured(self.target)}, widths "
                              f"{self.profile.widths_measured(self.target)})")
        return s

    def draft_step(self, rows: int, kv: float) -> float:
        s = _finite(self._step(self.draft, rows, 1, kv))
        if s is None:
            raise MissingCost(f"the draft model's step at {rows} rows (profiled: rows "
                              f"{self.profile.rows_measured(self.draft)})")
        return s

    def draft_first(self, rows: int, kv: float, width: int) -> float:
        """A round's first draft forward, feeding `width` tokens a row (its catch-up: the tokens the draft has not
        been fed, and the last one): 1, a step; 2 (after a full accept: the last draft, never fed), the profile's
        2-token draft step, or its 1-token step where it has none (profiles written before it was probed); wider
        (a prompt or off rounds waiting), a prefill of that width where it costs more than that."""
        step = self.draft_step(rows, kv)
        if width <= 1:
            return step
        two = _finite(self._step(self.draft, rows, 2, kv))
        first = step if two is None else two
        return first if width == 2 else max(first, self.prefill(rows, width, draft=True))

    def prefill(self, rows: int, tokens: int, draft: bool = False) -> float:
        model = self.draft if draft else self.target
        s = _finite(self.profile.prefill_s(model, rows, tokens))
        if s is None:
            raise MissingCost(f"the {'draft model' if draft else 'target'}'s prefill (no prefill profiled)")
        return s


def _fitting(measured: list[int], n: int) -> int:
    """The smallest of `measured` holding n (n where none does: priced as the profile prices it, or missing)."""
    return min((m for m in measured if m >= n), default=n)


def _finite(s: float | None) -> float | None:
    return s if s is None or (math.isfinite(s) and s >= 0) else None


def round_shape(rounds: list[dict]) -> tuple[int, int]:
    """A round over rows (their round records): (the target's verification width, the draft model's forwards). A
    chain verifies its widest draft + 1 and drafts it one forward a token; a tree verifies the widest of the rows'
    trees + 1 (each row's own: the nodes a round of it alone verifies, `verified`, where its drafter pads a tree,
    else its nodes; older records: the measured batch's, batch_nodes) with the forwards its drafter recorded
    (draft_forwards); a drafter of several sources
    (hybrid) runs the draft model for its own nodes only (sources["draft"]); a round nobody drafted is a 1-token
    step."""
    trees = [r for r in rounds if "batch_nodes" in r]
    if trees:  # the rows' own trees (parents: one per node) where recorded: the widest of those replayed together
        nodes = max(r.get("verified", len(r["parents"]) if "parents" in r else r["batch_nodes"]) for r in trees)
        return nodes + 1, max(r.get("draft_forwards", 0) for r in trees)
    widest = max((r["drafted"] for r in rounds), default=0)
    if any("sources" in r for r in rounds):  # a drafter of several sources: the draft model's nodes only
        return widest + 1, max((r.get("sources") or {}).get("draft", [0])[0] for r in rounds)
    return widest + 1, widest


def prefill_deferred(record: dict) -> bool:
    """Whether the draft prefilled this row in its first drafting round, not at its admission: its rounds' catch_up
    says so (the hybrid drafter's rows; a draft model's rows that joined where the recommended schedule drafted
    none of them, decode/drafters/draft_model.py); a row held after its prefill ("lagging") records its catch-ups
    too, and its prefill ran at admission."""
    return any("catch_up" in r and not r.get("lagging") for r in record.get("rounds") or ())


def simulate(requests: list[dict], concurrency: int, pricer: Pricer, think_s: float = 0.0,
             served: bool = True) -> list[dict]:
    """The loop over requests (each: arrival_s, prompt_tokens, new_tokens, and rounds for a speculative point, None
    for the baseline; "follows": the index of the request whose next turn it is, if any) at most `concurrency` in
    flight, admitted in the engine's order (decode/arrivals.py Queue; a follower arrives think_s after the request it
    follows finished): each request's admitted_s, first_token_s, finish_s (seconds from the start), a follower's
    arrival_s, and target_s, draft_s and draft_prefill_s as the engine's records time them (decode/generate.py
    RowRecord: the target's prefill and the rounds' verifications or steps it was in; the draft's prefill and the
    rounds' drafting it was in). Those admitted together are prefilled as the engine does: served, prompts of like
    length in one forward (decode/arrivals.py prefill_batches), a static batch (served False) all in one; then the
    draft's one prefill of them all. Raises MissingCost where the profile lacks a cost the schedule needs."""
    n = len(requests)
    if pricer.draft is None and any(r.get("draft_forwards") for r in requests if r.get("rounds") is not None):
        raise MissingCost("the drafter's forwards: it runs a model the profile has no steps for (early exit's first "
                          "layers)")
    out = [dict(r) for r in requests]
    done = [0] * n  # tokens so far
    taken = [0] * n  # rounds replayed
    now, active, peak = 0.0, [], 0
    drafts = pricer.draft is not None
    follows = [r.get("follows") for r in requests]
    queue = Queue(Load([r["arrival_s"] for r in requests], concurrency, follows, think_s))

    def finished(i: int) -> bool:
        rounds = requests[i].get("rounds")
        return done[i] >= requests[i]["new_tokens"] if rounds is None else taken[i] >= len(rounds)

    unfed = [0] * n  # a chain's tokens the draft has not been fed (decode/drafters/draft_model.py: pending)

    def feed_unfed(rows: list[int], rounds: list[dict], width: int) -> None:
        """After a chain round whose first draft forward fed `width` tokens a row (0: a round nobody drafted): a row
        that drafted keeps its last draft where all were accepted (never fed: it waits with the next last token);
        one that drafted nothing was fed where its tokens fit the forward (riding along), else it was held and its
        last token waits too."""
        for i, r in zip(rows, rounds):
            if r["drafted"]:
                unfed[i] = int(r["accepted"] >= r["drafted"])
            else:
                unfed[i] = 0 if unfed[i] + 1 <= width else unfed[i] + 1

    def end(rows: list[int]) -> None:
        for i in rows:
            out[i]["finish_s"] = now
            for j in queue.finished(i, now):
                out[j]["arrival_s"] = queue.arrival[j]

    while queue.left or active:
        if queue.left:
            group = queue.admit(now, concurrency - len(active))
            if not group and not active:
                now = max(now, queue.next_arrival())
                continue
            if group:  # the target's prefill forwards (served: prompts of like length together), then the draft's
                peak = max(peak, len(active) + len(group))
                going, batches = [], [group]
                if served:
                    batches = prefill_batches(group, [requests[i]["prompt_tokens"] for i in group])
                for batch in batches:
                    width = max(requests[i]["prompt_tokens"] for i in batch)
                    prefilled = pricer.prefill(pricer.rows(len(batch), peak), width)
                    admitted, now = now, now + prefilled  # a later forward's rows wait for those before (the engine's)
                    for i in batch:
                        out[i]["admitted_s"], out[i]["first_token_s"] = admitted, now
                        out[i]["target_s"], out[i]["draft_s"] = prefilled, 0.0
                        done[i] = min(1, requests[i]["new_tokens"])
                    going += [i for i in batch if requests[i]["new_tokens"] > 1 and not finished(i)]
                    end([i for i in batch if i not in going])
                # the draft's one prefill of the rows that go on; a deferred prefill is a round's catch-up (below)
                eager = [i for i in going if not prefill_deferred(requests[i])]
                if eager and drafts:  # over the draft's window of each prompt where it has one
                    draft_width = max(requests[i].get("draft_tokens", requests[i]["prompt_tokens"]) for i in going)
                    draft_prefill = pricer.prefill(pricer.rows(len(going), peak), draft_width, draft=True)
                    now += draft_prefill
                    for i in eager:
                        out[i]["draft_prefill_s"] = out[i]["draft_s"] = draft_prefill
                for i in going:
                    out[i].setdefault("draft_prefill_s", 0.0)
                active += going
        if not active:
            continue
        rows = pricer.rows(len(active), peak)
        kv = max(requests[i]["prompt_tokens"] + done[i] for i in active)
        if requests[active[0]].get("rounds") is None:
            step = pricer.step(rows, 1, kv)
            now += step
            for i in active:
                done[i] += 1
                out[i]["target_s"] += step
        else:
            this = [requests[i]["rounds"][taken[i]] for i in active]
            width, forwards = round_shape(this)
            drafting = 0.0
            chain = all("batch_nodes" not in r and "sources" not in r for r in this)
            # the first forward's width: where recorded (catch_up), and a chain's rows' unfed tokens and last one
            catch_up = max([r.get("catch_up", 0) for r in this]
                           + [unfed[i] + 1 for i, r in zip(active, this) if chain and r["drafted"]])
            # the draft's cache: its window of the prompt and the tokens since
            draft_kv = max(requests[i].get("draft_tokens", requests[i]["prompt_tokens"]) + done[i] for i in active)
            if chain and drafts:  # a draft model's chain: the round as the one model prices it (decode/k_model.py)
                drafting, verifying = round_parts(lambda w: pricer.step(rows, w, kv),
                                                  lambda w: pricer.draft_first(rows, draft_kv, w), forwards, catch_up)
            else:
                if forwards and drafts:
                    drafting = pricer.draft_first(rows, draft_kv, catch_up) + (forwards - 1) * pricer.draft_step(
                        rows, draft_kv)
                verifying = pricer.step(rows, width, kv)
            now += drafting
            if chain:
                feed_unfed(active, this, catch_up if forwards else 0)
            now += verifying
            for i, r in zip(active, this):
                done[i] += r["emitted"]
                taken[i] += 1
                out[i]["draft_s"] += drafting
                out[i]["target_s"] += verifying
        end([i for i in active if finished(i)])
        active = [i for i in active if not finished(i)]
    return out


def priced_k(pricer: Pricer, rates: list[float], rows: int, kv: float, candidates,
             served: tuple[float, int] | None = None) -> int:
    """The K the one model picks (decode/k_model.py best_k) at `rows` in flight and a cache of `kv` tokens, each
    candidate's round priced as the replay prices a chain round; a K the profile cannot price is no candidate.
    served: (a joining request's prompt tokens, its new tokens), where requests arrive: each round carries its share
    of their draft prefills, each priced as the replay prices one at admission (k_model.admissions)."""
    def priced(cost):
        def at(width: int) -> float | None:
            try:
                return cost(width)
            except MissingCost:
                return None
        return at
    joining = admissions(rates, rows, priced(lambda w: pricer.prefill(1, w, draft=True))(served[0]),
                         served[1]) if served else None
    return best_k(rates, priced(lambda w: pricer.step(rows, w, kv)), priced(lambda w: pricer.draft_first(rows, kv, w)),
                  candidates, extra=joining)


# ---- a point's schedule as requests ---------------------------------------------------------------------------

def _rounds(s: dict):
    rounds = s.get("rounds")
    if isinstance(rounds, str):  # written as a JSON string in the records
        rounds = json.loads(rounds)
    return rounds


def as_request(s: dict, arrival: float = 0.0, speculative: bool = True) -> dict:
    """A record as the replay's request; MissingRecord where the record cannot say what its decode did (no prompt
    length; a speculative row whose rounds emit fewer tokens than it has after its first)."""
    if s.get("prompt_tokens") is None:
        raise MissingRecord("the records lack their prompt lengths (prompt_tokens; written by runs since the replay)")
    rounds = (_rounds(s) or []) if speculative else None
    if rounds is not None and sum(r["emitted"] for r in rounds) < int(s["new_tokens"]) - 1:
        raise MissingRecord("the records lack rounds: a row's rounds emit fewer tokens than it has")
    prompt = int(s["prompt_tokens"])
    return {"arrival_s": arrival, "prompt_tokens": prompt, "new_tokens": int(s["new_tokens"]),
            "draft_tokens": window_tokens(prompt, s.get("draft_context")),
            "rounds": rounds, "draft_forwards": int(s.get("draft_forwards") or 0)}


def replay_static(samples: list[dict], pricer: Pricer, speculative: bool, batch_size: int | None = None) -> list[dict]:
    """Each batch of the point replayed as a static batch (with batch_size: each repeat's rows regrouped into batches
    of that size in sample order, a what-if): the records with latency_s, prefill_s, draft_prefill_s, target_s and
    draft_s as the replay times them."""
    if batch_size is None:
        groups = [(unit, sorted(batch, key=lambda s: s["sample_id"])) for unit, batch in sorted(units(samples).items())]
    else:
        groups = []
        for repeat in sorted({s.get("repeat", 0) for s in samples}):
            rows = sorted((s for s in samples if s.get("repeat", 0) == repeat), key=lambda s: s["sample_id"])
            groups += [((repeat, k), rows[i:i + batch_size]) for k, i in enumerate(range(0, len(rows), batch_size))]
    out = []
    for (_, index), group in groups:
        timed = simulate([as_request(s, 0.0, speculative) for s in group], len(group), pricer, served=False)
        for s, t in zip(group, timed):
            out.append(dict(s, batch_index=index, latency_s=t["finish_s"], prefill_s=t["first_token_s"],
                            draft_prefill_s=t.get("draft_prefill_s", 0.0), target_s=t["target_s"],
                            draft_s=t["draft_s"]))
    return out


def replay_load(samples: list[dict], pricer: Pricer, speculative: bool, concurrency: int | None = None) -> list[dict]:
    """Each repeat of a load point replayed: its requests at their arrivals, at most `concurrency` (default: the
    point's) in flight; the records with admitted_s, first_token_s, finish_s, target_s, draft_s and draft_prefill_s
    as the replay times them. A compiled profile prices no load yet: a served compiled run's rows sit in row buckets
    (decode/static_kv.py StaticKVState.join) whose steps the replay does not price (MissingCost)."""
    if pricer.compiled:
        raise MissingCost("a load's steps: it is compiled, and the replay does not price a compiled load's row buckets "
                          "yet (profile the device with engine.compile: false for a load's prediction)")
    out = []
    by_repeat = defaultdict(list)
    for s in samples:
        by_repeat[s.get("repeat", 0)].append(s)
    for repeat, rows in sorted(by_repeat.items()):
        rows = sorted(rows, key=lambda s: s.get("request") or 0)
        cap = concurrency or rows[0].get("concurrency") or len(rows)
        position = {s.get("request"): k for k, s in enumerate(rows)}
        requests = [dict(as_request(s, s["arrival_s"], speculative), follows=position.get(s.get("follows")))
                    if s.get("follows") is not None else as_request(s, s["arrival_s"], speculative) for s in rows]
        think = next((s["think_s"] for s in rows if s.get("think_s") is not None), 0.0)  # a load of conversations
        timed = simulate(requests, cap, pricer, think)
        for s, t in zip(rows, timed):
            out.append(dict(s, concurrency=cap, arrival_s=t["arrival_s"], admitted_s=t["admitted_s"],
                            first_token_s=t["first_token_s"], finish_s=t["finish_s"], target_s=t["target_s"],
                            draft_s=t["draft_s"], draft_prefill_s=t.get("draft_prefill_s", 0.0)))
    return out


# ---- the predictions a report prints ------------------------------------------------------------------------------

PART_OFF = 0.10  # a part of the schedule whose measured time is this far (relative) from the replay's is named
OFF_BY = 0.05  # without the replay's interval, a measured speedup this far (relative) from it: prediction_off
PREDICTION_RESAMPLES = 200  # a load point's bootstrap replays its schedule once per resample


def profile_resamples(profile, resamples: int = PREDICTION_RESAMPLES, seed: int = 0) -> list:
    """The profile's timing noise for a prediction's interval: one resampled profile (Profile.resampled) per
    resample, seeded (a rebuild gives the same interval)."""
    rng = random.Random(seed)
    return [profile.resampled(rng) for _ in range(resamples)]


def _static_replays(samples, baseline, profile, draft, batch_size, clamp_rows):
    """(the method's replayed records, the baseline's, the method's Pricer, the baseline's)."""
    pricer, base = Pricer(profile, draft, clamp_rows=clamp_rows), Pricer(profile, clamp_rows=clamp_rows)
    return (replay_static(samples, pricer, True, batch_size), replay_static(baseline, base, False, batch_size),
            pricer, base)


CLUSTER_DRAWS = 20  # draws of the prompt batches per replay: 200 x 20 = 4000 values, as the measured interval's


def joint_interval(replays: list[tuple[list, list]], decode: bool = False,
                   seed: int = BOOTSTRAP_SEED) -> list[float] | None:
    """95% interval of a replayed speedup over both of its sources of doubt: per resample, the batches replayed with
    one resampled profile (the probes' timing spread), then those prompt batches drawn with replacement
    (CLUSTER_DRAWS times: the acceptance's spread over prompts), the ratio of totals; the expanded percentile interval
    (eval/stats.py, its n the prompt batches), None with fewer than MIN_PROMPTS batches."""
    rng, values, n = random.Random(seed), [], None
    for mine, theirs in replays:
        clusters = paired_clusters(mine, theirs, BATCHES, DECODE_SPEEDUP if decode else SPEEDUP)
        n = len(clusters)
        if n < MIN_PROMPTS:
            return None
        for _ in range(CLUSTER_DRAWS):
            value = ratio_of_totals(rng.choices(clusters, k=n))
            if value is not None:
                values.append(value)
    return expanded_interval(values, n)


def static_prediction(samples: list[dict], baseline: list[dict], profile, draft: str | None,
                      batch_size: int | None = None, clamp_rows: bool = True,
                      whose: str = "the profile") -> tuple[dict | None, str | None]:
    """A static point's batches and the baseline's replayed with the profile (a batch's tail priced at the
    smallest profiled rows above it, up to the point's batch size, where fewer were not profiled: Pricer
    clamp_rows): the predicted speedup and decode speedup as the measured ones are computed (paired batches, ratio
    of totals) and their 95% intervals (joint_interval: the probes' timing spread and the acceptance's spread over
    prompts). (figures, None) or (None, why not: what `whose` profile or the records lack). batch_size: the rows
    regrouped into batches of that size (a what-if)."""
    # a what-if's rows are priced where profiled, or not at all; a measured batch's tail at most at its batch size
    clamp_rows = max([int(s["batch_size"]) for s in samples if s.get("batch_size")]
                     + [len(rows) for rows in units(samples).values()]) if clamp_rows and batch_size is None else 0
    try:
        mine, theirs, pricer, base = _static_replays(samples, baseline, profile, draft, batch_size, clamp_rows)
    except MissingCost as error:
        return None, lacking(error, whose)
    clusters, decode = paired_clusters(mine, theirs), paired_clusters(mine, theirs, BATCHES, DECODE_SPEEDUP)
    if not clusters:
        return None, "no batch both ran"
    # a resampled profile prices the same steps as the profile: no MissingCost here
    replays = [_static_replays(samples, baseline, p, draft, batch_size, clamp_rows)[:2]
               for p in profile_resamples(profile)] if len(clusters) >= MIN_PROMPTS else []
    return {"speedup": ratio_of_totals(clusters), "speedup_ci95": joint_interval(replays) if replays else None,
            "decode_speedup": ratio_of_totals(decode) if decode else None,
            "decode_speedup_ci95": joint_interval(replays, decode=True) if decode and replays else None,
            "tok_s": ratio(sum(c[0] for c in clusters), sum(c[1] for c in clusters)),
            "prefill_s": sum(s["prefill_s"] + s["draft_prefill_s"] for s in mine), "parts_s": part_times(mine, theirs),
            "rows_priced_above": sorted(pricer.clamped | base.clamped),
            "caches_priced_beyond": beyond_caches(pricer, base)}, None


def beyond_note(spans: list[list[int]], caches: list[int]) -> str:
    """What a prediction says of its steps priced beyond the profiled caches (their [shortest, longest])."""
    return (f"steps at caches of {min(s[0] for s in spans)} to {max(s[1] for s in spans)} tokens priced beyond the "
            f"profiled caches ({', '.join(map(str, caches))} tokens): along the line through the nearest two, never "
            "falling (a profile with longer caches prices them as measured)")


def beyond_caches(*pricers: Pricer) -> list[int]:
    """The shortest and the longest cache the pricers priced beyond the profiled ones (Pricer.beyond), [] if none."""
    kvs = set().union(*(p.beyond for p in pricers))
    return [int(min(kvs)), int(max(kvs))] if kvs else []


def load_resamples(samples: list[dict], baseline: list[dict], resamples: int = PREDICTION_RESAMPLES,
                   seed: int = 0) -> list[tuple[list[dict], list[dict]]]:
    """Paired resamples of a load point's requests for the prediction's interval: one draw of requests with
    replacement per resample, applied to every repeat (a request carries all its repeats, as the measured interval's
    clusters do); each position keeps its arrival and takes the drawn request's prompt, lengths and rounds, on both
    sides alike. Requests not served on both sides keep their own. Fewer than MIN_PROMPTS paired requests: none."""
    import numpy as np

    def keyed(rows):
        return {(s.get("repeat", 0), s.get("request") if s.get("request") is not None else i): s
                for i, s in enumerate(rows)}

    mine, theirs = keyed(samples), keyed(baseline)
    requests = sorted({r for _, r in mine} & {r for _, r in theirs})
    if len(requests) < MIN_PROMPTS:
        return []
    rng = np.random.default_rng(seed)
    lengths = ("prompt_tokens", "new_tokens", "rounds", "sample_id", "draft_forwards")

    def redrawn(side: dict, drawn: dict) -> list[dict]:
        out = []
        for (repeat, request), s in side.items():
            source = side.get((repeat, drawn.get(request, request)))
            out.append(s if source is None else dict(s, **{k: source.get(k) for k in lengths}))
        return out

    out = []
    for _ in range(resamples):
        drawn = dict(zip(requests, (requests[i] for i in rng.integers(0, len(requests), len(requests)))))
        out.append((redrawn(mine, drawn), redrawn(theirs, drawn)))
    return out


PARTS = (("the draft's steps", "draft_steps_s"), ("the verifications", "verifications_s"),
         ("the prefills", "prefills_s"))  # part_times' parts that prediction_off names, in words


def part_times(samples: list[dict], baseline: list[dict]) -> dict | None:
    """The seconds each part of a schedule took, summed over its requests as their records time them (measured, or
    replayed: simulate times them alike): the draft's steps (draft_s less the draft's prefill), the verifications
    (target_s less the target's prefill, which runs from admission, a static batch's start, to the first token), the
    prefills (the target's and the draft's) and the baseline's steps (its target_s less its prefill). None where a
    record lacks a time."""
    def prefill(s: dict) -> float:
        return s["first_token_s"] - s["admitted_s"] if s.get("admitted_s") is not None else s["prefill_s"]

    try:
        return {"draft_steps_s": sum(s["draft_s"] - s["draft_prefill_s"] for s in samples),
                "verifications_s": sum(s["target_s"] - prefill(s) for s in samples),
                "prefills_s": sum(prefill(s) + s["draft_prefill_s"] for s in samples),
                "baseline_steps_s": sum(s["target_s"] - prefill(s) for s in baseline)}
    except (KeyError, TypeError):
        return None


def parts_off(measured: dict | None, replayed: dict | None) -> str:
    """Which parts of the schedule ran otherwise than the replay priced them (part_times of both): each part's
    measured seconds over the replay's, in units of the baseline's steps' (measured over replayed: the machine's pace
    against the profile, which moves the method and the baseline alike and no speedup), as the static check's
    c_run / c; those more than PART_OFF from 1, in words. A machine uniformly slower than its probes names none."""
    pace = ratio(measured["baseline_steps_s"], replayed["baseline_steps_s"]) if measured and replayed else None
    if not pace:
        return "the records do not time the parts of the schedule"
    parts = [(name, ratio(measured[key], replayed[key]) / pace) for name, key in PARTS if replayed[key] > 0]
    named = [f"{name} {x:.2f}x" for name, x in parts if abs(x - 1) > PART_OFF]
    return (f"each part against the replay's, in units of the baseline's steps (which ran {pace:.2f}x the replay's): "
            + ("; ".join(named) or f"no single part is off by more than {PART_OFF:.0%}: the sum of small ones"))


def prediction_off_reason(measured: float | None, predicted: float | None, interval) -> str | None:
    """prediction_off's one rule (docs/predict.md), for the report's static and load points and python -m eval.predict
    alike: the measured speedup outside the replay's 95% interval, or, where the replay has none (fewer than
    MIN_PROMPTS prompt batches or requests), more than OFF_BY from its prediction. The comparison as text, or None."""
    if measured is None or not predicted:
        return None
    if interval[0] <= measured <= interval[1] if interval else abs(measured / predicted - 1) <= OFF_BY:
        return None
    shown = f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""
    return (f"measured {measured:.3f} against the replay's {predicted:.3f}{shown} (measured / predicted "
            f"{measured / predicted:.3f})")


def prediction_off(measured: float | None, replay: dict, measured_parts: dict | None) -> str | None:
    """prediction_off of a load point, or of any point eval.predict replays: the rule (prediction_off_reason) against
    the replay's figures (speedup, speedup_ci95), and the parts off (parts_off: the measured records' part_times
    against the replay's, parts_s)."""
    verdict = prediction_off_reason(measured, replay.get("speedup"), replay.get("speedup_ci95"))
    return None if verdict is None else f"{verdict}: {parts_off(measured_parts, replay.get('parts_s'))}"
