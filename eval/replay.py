"""The prediction by replay of a static batch's schedule (#33): the decode a batch ran, round by round, priced with the
costs probed in the run, instead of Leviathan's closed form for an average row.

A static batch decodes in lockstep until its slowest row ends: round k runs over the rows still running, its draft
model drafts G_k = the most any of them drafted (the rest are padded), and its target verifies G_k + 1 tokens per row;
a round in which no row drafts is one plain target step. In units of the target's 1-token step T at the batch's
probed size, round k costs G_k c + v(G_k) (v(0) = 1), and the baseline's batch N_max - 1 steps, N_max its longest
row's new tokens. The predicted decode speedup is then

    (sum of the point's decode tokens / sum of its rounds' costs) / (sum of the baseline's decode tokens / its steps)

over the batches both ran (decode tokens: each row's new tokens after the prefill's). Rows that have finished leave
the batch in the engine; the probes run at the batch's size only, so every round is priced at that size: the tails of
both sides alike. At batch 1 with a constant gamma this is Leviathan's E(alpha) / (gamma c + v) with the alpha solved
from the same rounds (tests/eval/test_replay.py); above it, the gap to Leviathan's is the cost of the batch waiting for
its slowest row. What the replay leaves out: the prefills (the decode speedup is its measure), the host's work between
steps, and the shrinking batch's cheaper steps.
"""
from __future__ import annotations

import json
from collections import defaultdict

from eval.stats import ratio
from eval.totals import units


def round_cost(active: list[dict], c: float, v_of) -> float | None:
    """One round over the rows still running (their round records), in target steps: the widest draft prices both
    the draft's forwards and the verification. None where v is unknown at that width."""
    drafted = max(r["drafted"] for r in active)
    if drafted == 0:
        return 1.0
    v = v_of(drafted)
    return None if v is None else drafted * c + v


def speculative_steps(rows: list[list[dict]], c: float, v_of) -> float | None:
    """A static batch's decode in target steps: its rows' rounds (row i's rounds, in order) replayed in lockstep."""
    total = 0.0
    for k in range(max((len(r) for r in rows), default=0)):
        cost = round_cost([r[k] for r in rows if len(r) > k], c, v_of)
        if cost is None:
            return None
        total += cost
    return total


def baseline_steps(new_tokens: list[int]) -> int:
    """The baseline's static batch: one step per token after the prefill's, until its longest row ends."""
    return max((n - 1 for n in new_tokens), default=0)


def decode_tokens(batch: list[dict]) -> int:
    return sum(max(s["new_tokens"] - 1, 0) for s in batch)


def replay_speedup(samples: list[dict], baseline: list[dict], c: float | None, v_of) -> float | None:
    """The predicted decode speedup of a static point from its own batches' rounds and the baseline's rows (paired by
    batch: repeat and batch index), c and v_of(G) (v of a G-draft chain) at the batch's size. None without c, a
    paired batch, or v at a width a round verified."""
    if c is None:
        return None
    mine, theirs = units(samples), units(baseline)
    paired = sorted(set(mine) & set(theirs))
    spec_tokens = spec_steps = base_tokens = base_steps = 0.0
    for unit in paired:
        steps = speculative_steps([s.get("rounds") or [] for s in mine[unit]], c, v_of)
        if steps is None:
            return None
        spec_tokens += decode_tokens(mine[unit])
        spec_steps += steps
        base_tokens += decode_tokens(theirs[unit])
        base_steps += baseline_steps([s["new_tokens"] for s in theirs[unit]])
    return ratio(ratio(spec_tokens, spec_steps), ratio(base_tokens, base_steps))


# ---- the schedule replayed in seconds, with a cost profile (eval/costs.py) ----------------------------------------
#
# The engine's one loop (decode/generate.py _Loop) replayed: admit / round / evict with simulated time instead of the
# clock. Each pass admits the requests that have arrived, in order, while fewer than C rows are in flight (a static
# batch: all at 0, C = its rows), prefilling those admitted together in one target forward over their widest prompt
# (then the draft model's prefill of those that go on); with nobody in flight and nobody arrived, time jumps to the
# next arrival. Then one round over the rows in flight: the baseline's 1-token step, or a speculative round priced
# at its widest draft (the draft model's forwards, then one verification of the widest chain + 1 or tree + 1 tokens);
# the rows' caches as long as the longest row's prompt and tokens so far. Then the rows whose recorded rounds are
# done leave. Each request's rounds (drafted, accepted, emitted) and lengths are the point's own, as measured; the
# costs are the profile's, never the point's timed steps. Host work between steps is in the profile's steps (each
# timed with its host read) or left out (the loop's own bookkeeping).

class MissingCost(LookupError):
    """The profile lacks a cost the schedule needs: what is missing, in words."""


class Pricer:
    """A schedule's costs from a profile: the target's steps and prefills, and the draft model's when the method
    drafts with one (draft: its label in the profile)."""

    def __init__(self, profile, draft: str | None = None):
        from eval.costs import TARGET, draft_model
        self.profile, self.target = profile, TARGET
        self.draft = None if draft is None else draft_model(draft)

    def step(self, rows: int, width: int, kv: float) -> float:
        s = self.profile.step_s(self.target, rows, width, kv)
        if s is None:
            raise MissingCost(f"the target's step at {rows} rows x {width} tokens (profiled: rows "
                              f"{self.profile.rows_measured(self.target)}, widths "
                              f"{self.profile.widths_measured(self.target)})")
        return s

    def draft_step(self, rows: int, kv: float) -> float:
        s = self.profile.step_s(self.draft, rows, 1, kv)
        if s is None:
            raise MissingCost(f"the draft model's step at {rows} rows (profiled: rows "
                              f"{self.profile.rows_measured(self.draft)})")
        return s

    def prefill(self, rows: int, tokens: int, draft: bool = False) -> float:
        model = self.draft if draft else self.target
        s = self.profile.prefill_s(model, rows, tokens)
        if s is None:
            raise MissingCost(f"the {'draft model' if draft else 'target'}'s prefill (no prefill profiled)")
        return s


def round_shape(rounds: list[dict]) -> tuple[int, int]:
    """A round over rows (their round records): (the target's verification width, the draft model's forwards). A
    chain verifies its widest draft + 1 and drafts it one forward a token; a tree verifies the batch's widest tree's
    nodes + 1 (batch_nodes) with the forwards its drafter recorded (draft_forwards); a drafter of several sources
    (hybrid) runs the draft model for its own nodes only (sources["draft"]); a round nobody drafted is a 1-token
    step."""
    trees = [r for r in rounds if "batch_nodes" in r]
    if trees:
        return max(r["batch_nodes"] for r in trees) + 1, max(r.get("draft_forwards", 0) for r in trees)
    widest = max((r["drafted"] for r in rounds), default=0)
    if any("sources" in r for r in rounds):  # a drafter of several sources: the draft model's nodes only
        return widest + 1, max((r.get("sources") or {}).get("draft", [0])[0] for r in rounds)
    return widest + 1, widest


def simulate(requests: list[dict], concurrency: int, pricer: Pricer) -> list[dict]:
    """The loop over requests (each: arrival_s, prompt_tokens, new_tokens, and rounds for a speculative point, None
    for the baseline) at most `concurrency` in flight: each request's admitted_s, first_token_s, finish_s (seconds
    from the start). Raises MissingCost where the profile lacks a cost the schedule needs."""
    n = len(requests)
    out = [dict(r) for r in requests]
    done = [0] * n  # tokens so far
    taken = [0] * n  # rounds replayed
    now, waiting, active = 0.0, 0, []
    drafts = pricer.draft is not None

    def finished(i: int) -> bool:
        rounds = requests[i].get("rounds")
        return done[i] >= requests[i]["new_tokens"] if rounds is None else taken[i] >= len(rounds)

    while waiting < n or active:
        if waiting < n:
            group = []
            while waiting < n and len(active) + len(group) < concurrency and requests[waiting]["arrival_s"] <= now:
                group.append(waiting)
                waiting += 1
            if not group and not active:
                now = max(now, requests[waiting]["arrival_s"])
                continue
            if group:
                width = max(requests[i]["prompt_tokens"] for i in group)
                admitted = now
                now += pricer.prefill(len(group), width)
                for i in group:
                    out[i]["admitted_s"], out[i]["first_token_s"] = admitted, now
                    done[i] = min(1, requests[i]["new_tokens"])
                going = [i for i in group if requests[i]["new_tokens"] > 1 and not finished(i)]
                for i in set(group) - set(going):
                    out[i]["finish_s"] = now
                if going and drafts:
                    now += pricer.prefill(len(going), width, draft=True)
                active += going
        if not active:
            continue
        rows = len(active)
        kv = max(requests[i]["prompt_tokens"] + done[i] for i in active)
        if requests[active[0]].get("rounds") is None:
            now += pricer.step(rows, 1, kv)
            for i in active:
                done[i] += 1
        else:
            this = [requests[i]["rounds"][taken[i]] for i in active]
            width, forwards = round_shape(this)
            if forwards and drafts:
                now += forwards * pricer.draft_step(rows, kv)
            now += pricer.step(rows, width, kv)
            for i, r in zip(active, this):
                done[i] += r["emitted"]
                taken[i] += 1
        for i in [i for i in active if finished(i)]:
            out[i]["finish_s"] = now
        active = [i for i in active if not finished(i)]
    return out


# ---- a point's schedule as requests ---------------------------------------------------------------------------

def _rounds(s: dict):
    rounds = s.get("rounds")
    if isinstance(rounds, str):  # written as a JSON string in the records
        rounds = json.loads(rounds)
    return rounds


def as_request(s: dict, arrival: float = 0.0, speculative: bool = True) -> dict:
    return {"arrival_s": arrival, "prompt_tokens": int(s["prompt_tokens"]), "new_tokens": int(s["new_tokens"]),
            "rounds": (_rounds(s) or []) if speculative else None}


def replay_static(samples: list[dict], pricer: Pricer, speculative: bool, batch_size: int | None = None) -> list[dict]:
    """Each batch of the point (or, with batch_size, its rows regrouped so, in order) replayed as a static batch:
    the records with latency_s, prefill_s, draft_prefill_s as the replay times them."""
    out = []
    for unit, batch in sorted(units(samples).items()):
        batch = sorted(batch, key=lambda s: s["sample_id"])
        groups = [batch] if batch_size is None else [batch[i:i + batch_size] for i in range(0, len(batch), batch_size)]
        for k, group in enumerate(groups):
            timed = simulate([as_request(s, 0.0, speculative) for s in group], len(group), pricer)
            for s, t in zip(group, timed):
                index = s["batch_index"] if batch_size is None else (unit, k)
                out.append(dict(s, batch_index=index, latency_s=t["finish_s"], prefill_s=t["first_token_s"],
                                draft_prefill_s=0.0))
    return out


def replay_load(samples: list[dict], pricer: Pricer, speculative: bool, concurrency: int | None = None) -> list[dict]:
    """Each repeat of a load point replayed: its requests at their arrivals, at most `concurrency` (default: the
    point's) in flight; the records with admitted_s, first_token_s, finish_s as the replay times them."""
    out = []
    by_repeat = defaultdict(list)
    for s in samples:
        by_repeat[s.get("repeat", 0)].append(s)
    for repeat, rows in sorted(by_repeat.items()):
        rows = sorted(rows, key=lambda s: s.get("request") or 0)
        cap = concurrency or rows[0].get("concurrency") or len(rows)
        timed = simulate([as_request(s, s["arrival_s"], speculative) for s in rows], cap, pricer)
        for s, t in zip(rows, timed):
            out.append(dict(s, concurrency=cap, admitted_s=t["admitted_s"], first_token_s=t["first_token_s"],
                            finish_s=t["finish_s"]))
    return out
