"""The figures of a serving run (config load:, docs/metrics.md "Under load"): per request, per load point and method,
the speedups against the baseline of the same load point with their paired intervals over requests, and the
crossover where speculation stops paying, measured and predicted.

A serving point's records are its requests (SampleRecord with concurrency not None), each with its times in seconds
from the load point's start: arrival_s, admitted_s (its prefill began), first_token_s, finish_s and emits
[[time_s, tokens], ...]. Request i of a method and request i of the baseline are the same prompt on the same arrival
schedule (a conversation's later turn: the same rule, think_s after its previous turn ended): they pair by (repeat, position in the load point, sample_id).
"""
from __future__ import annotations

import heapq
import math
import statistics
from collections import defaultdict

from decode.methods import ENGINE_CAPS, ENGINE_TEXTS, FIXED, REGISTRY, caps_of, reference_method
from eval.costs import run_costs
from eval.figures import constant_draft_length
from eval.flags import CI_WIDE, flags_of
from eval.groups import groups_of, in_group
from eval.leviathan import predicted_speedup, solve_alpha
from eval.axes import axis as axis_named, label_of
from eval.records import Comparison, CostProbe, Point
from eval.replay import (MissingCost, Pricer, beyond_caches, beyond_note, lacking, load_resamples, part_times,
                         prediction_off, profile_resamples, replay_load)
from eval.sources import acceptance_by_source
from eval.stats import (MIN_PROMPTS, bootstrap_ci, distribution, expanded_interval, misses, ratio, ratio_of_totals,
                        strict)
from eval.totals import Pairing, Ratio, cross_process_pairs, paired_clusters, paired_units
from eval.trees import acceptance_by_depth_rank, tree_of

LOAD_AXES = ("concurrency", "request_rate")  # the crossover runs along each, the other held
SLO_KEYS = ("ttft_s", "tpot_ms")


# ---- per request ----------------------------------------------------------------------------------------------

def with_slots(samples: list[dict]) -> list[dict]:
    """The records, each with "slot_s": when its request got a concurrency slot, the moment its clock starts (vLLM's
    bench serve starts a request's clock when it passes its --max-concurrency semaphore). Per repeat, requests take
    slots in arrival order, then request order (FIFO, as the engines admit them: decode/arrivals.py Queue; a
    conversation's later turn arrives after its previous turn): request i's slot is free at the earliest time one of the
    C slots is released (a request's finish; all free at 0), and it starts at max(its arrival, that time). Without a
    cap binding (no concurrency given: C = the requests), slot_s = arrival_s. Derived from the raw times, so older
    records rebuild the same. serving_section gives every served record its slot once; the figures read it."""
    out = []
    for rows in by_repeat(samples).values():
        rows = sorted(rows, key=lambda s: (s["arrival_s"], s.get("request") or 0))
        cap = rows[0].get("concurrency") or len(rows)
        free = [0.0] * min(cap, len(rows))  # a heap: when each slot is next free
        for s in rows:
            start = max(s["arrival_s"], heapq.heappop(free))
            heapq.heappush(free, s["finish_s"])
            out.append(dict(s, slot_s=start))
    return out


def admitted(s: dict) -> float:
    """When the request's prefill began (records without it: its arrival)."""
    return s["admitted_s"] if s.get("admitted_s") is not None else s["arrival_s"]


def ttft(s: dict) -> float:
    """Time to first token from the request's slot (with_slots): its prefill and any wait inside the engine; the
    client's wait for a slot is queue_s."""
    return s["first_token_s"] - s["slot_s"]


def e2e(s: dict) -> float:
    """End to end from the request's slot to its last token."""
    return s["finish_s"] - s["slot_s"]


def tpot(s: dict) -> float | None:
    """Time per output token after the first: (finish - first token) / (N - 1); None for a one-token request."""
    if s["new_tokens"] <= 1 or s.get("finish_s") is None or s.get("first_token_s") is None:
        return None
    return (s["finish_s"] - s["first_token_s"]) / (s["new_tokens"] - 1)


def inter_token_gaps(s: dict) -> list[float]:
    """The gaps between successive emissions of a request, its first token the first emission: a round that emits
    several tokens at once is one gap (vLLM's ITL over streamed chunks)."""
    times = [e[0] for e in s.get("emits") or []]
    first = s.get("first_token_s")
    if first is not None and (not times or times[0] > first):
        times.insert(0, first)
    return [b - a for a, b in zip(times, times[1:])]


def meets_slo(s: dict, slo: dict) -> bool:
    """Every limit given: TTFT (from its slot) <= ttft_s and TPOT <= tpot_ms (a one-token request has no TPOT: nothing
    to exceed). s: a record with its slot_s (with_slots)."""
    if slo.get("ttft_s") is not None and ttft(s) > slo["ttft_s"]:
        return False
    per_token = tpot(s)
    return slo.get("tpot_ms") is None or per_token is None or per_token * 1000 <= slo["tpot_ms"]


def timed(s: dict) -> bool:
    """Whether a record carries a served request's times."""
    return all(s.get(key) is not None for key in ("arrival_s", "first_token_s", "finish_s"))


def by_repeat(samples: list[dict]) -> dict[int, list[dict]]:
    """A point's requests per repeat (one load point each), in the order written: request order."""
    out: dict[int, list[dict]] = defaultdict(list)
    for s in samples:
        out[s.get("repeat", 0)].append(s)
    return out


def request_keys(samples: list[dict]) -> dict[tuple, dict]:
    """(repeat, request index, sample_id) -> record: the record's `request`, else its place among its repeat's records
    (the runner writes a load point's requests in request order); the sample_id guards the pairing (request i is prompt i, cycling)."""
    return {(repeat, i if s.get("request") is None else s["request"], s["sample_id"]): s
            for repeat, rows in by_repeat(samples).items() for i, s in enumerate(rows)}


def request_rows(samples: list[dict]) -> list[tuple]:
    """A load point's requests as the pairing's rows: each request its own unit."""
    return [(key, key, s) for key, s in request_keys(samples).items()]


def request_clusters(samples: list[dict]):
    """A request carries all its repeats; a conversation all its turns (a later turn quotes the earlier answers)."""
    return lambda key, rows: (1, *key[1:]) if rows[0].get("conversation") is None else (0, rows[0]["conversation"])


def request_tokens_and_e2e(rows: list[dict]) -> tuple:
    return rows[0]["new_tokens"], e2e(rows[0])


def request_tpot(rows: list[dict]) -> tuple | None:
    """(1, TPOT): summed over requests, (1 / sum TPOT) / (1 / sum baseline TPOT) = mean baseline TPOT / mean TPOT;
    None for a one-token request."""
    per_token = tpot(rows[0])
    return None if per_token is None else (1, per_token)


# A load point pairs request by request (the same prompt on the same arrival schedule), both sides with their
# slots (with_slots): the throughput speedup over (N, E2E), the TPOT speedup over the requests with a TPOT on both.
REQUESTS = Pairing(rows=request_rows, row_names=("repeat", "request", "sample_id"), clusters=request_clusters,
                   ratios=(Ratio("speedup_tput", request_tokens_and_e2e), Ratio("speedup_tpot", request_tpot)),
                   reference_exact=False)


def requests_paired(samples: list[dict], baseline: list[dict]) -> int:
    """The requests both served, each counted once over its repeats."""
    return len({key[1:] for key in paired_units(samples, baseline, REQUESTS)})


# ---- per load point and method ------------------------------------------------------------------------------------

def load_figures(samples: list[dict], slo: dict | None) -> dict:
    """Every figure of a load point's requests alone (REQUEST_FIGURES, each a figure table entry's): latencies (mean,
    P50, P90, P99, linear interpolation between ranks; TTFT and E2E from each request's slot, the wait for it
    queue_s), rates over the span, goodput, and the rows in flight. samples: with their slots (with_slots)."""
    return {name: value for figures in REQUEST_FIGURES for name, value in figures(samples, slo).items()}


def span_of(samples: list[dict]) -> float:
    """Each repeat's start, t = 0, to its last finish, summed over repeats: vLLM's benchmark duration, which the
    first request's gap is part of."""
    return sum(max(s["finish_s"] for s in rows) for rows in by_repeat(samples).values())


def ttft_figures(samples: list[dict], slo: dict | None) -> dict:
    return {"ttft_s": distribution([ttft(s) for s in samples])}


def queue_figures(samples: list[dict], slo: dict | None) -> dict:
    return {"queue_s": distribution([s["slot_s"] - s["arrival_s"] for s in samples])}


def max_in_flight_figures(samples: list[dict], slo: dict | None) -> dict:
    return {"max_in_flight": max_in_flight(samples)}


def tpot_figures(samples: list[dict], slo: dict | None) -> dict:
    return {"tpot_s": distribution([t for t in map(tpot, samples) if t is not None])}


def itl_figures(samples: list[dict], slo: dict | None) -> dict:
    return {"itl_s": distribution([g for s in samples for g in inter_token_gaps(s)])}


def e2e_figures(samples: list[dict], slo: dict | None) -> dict:
    return {"e2e_s": distribution([e2e(s) for s in samples])}


def rate_figures(samples: list[dict], slo: dict | None) -> dict:
    """Tokens and requests over the span; goodput: the requests meeting every limit of the SLO, null without one."""
    span = span_of(samples)
    met = [meets_slo(s, slo) for s in samples] if slo else None
    return {"requests": len(samples), "output_tokens": sum(s["new_tokens"] for s in samples), "span_s": span,
            "output_tok_s": ratio(sum(s["new_tokens"] for s in samples), span),
            "requests_per_s": ratio(len(samples), span),
            "goodput_req_s": None if met is None else ratio(sum(met), span),
            "slo_met": None if met is None else ratio(sum(met), len(met))}


def occupancy_figures(samples: list[dict], slo: dict | None) -> dict:
    """The requests in flight: their time average over the span, and over the time any was in flight (busy)."""
    # the time average of requests between admission and finish: each contributes its time in flight
    in_flight = sum(s["finish_s"] - admitted(s) for s in samples)
    return {"mean_in_flight": ratio(in_flight, span_of(samples)),
            "busy_in_flight": ratio(in_flight, sum(map(busy_time, by_repeat(samples).values())))}


REQUEST_FIGURES = (ttft_figures, queue_figures, max_in_flight_figures, tpot_figures, itl_figures, e2e_figures,
                   rate_figures, occupancy_figures)


def busy_time(rows: list[dict]) -> float:
    """The time at least one of a repeat's requests was in flight (the union of their admission-to-finish spans)."""
    spans = sorted((admitted(s), s["finish_s"]) for s in rows)
    total, end = 0.0, -math.inf
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def max_in_flight(samples: list[dict]) -> int:
    """The most requests in flight (admitted, not finished) at once in any repeat of the load point."""
    most = 0
    for rows in by_repeat(samples).values():
        events = sorted([(admitted(s), 1) for s in rows] + [(s["finish_s"], -1) for s in rows],
                        key=lambda e: (e[0], e[1]))  # a finish before an admission at the same instant
        now = 0
        for _, step in events:
            now += step
            most = max(most, now)
    return most


def acceptance_figures(samples: list[dict], point: Point) -> dict:
    """Acceptance and mean accepted tokens pooled over every round of every request (as vLLM's counters) and as the
    mean over requests of each request's own (as specdec_bench); Leviathan's alpha from the pooled chain rounds (a
    tree round, hybrid's merged ones too, is described by acceptance_by_depth_rank instead); a drafter of several
    sources' acceptance per source, every source it offers listed."""
    rounds = [r for s in samples for r in s.get("rounds") or []]
    chains = [r for r in rounds if "parents" not in r]  # a tree round records its nodes' parents
    drafted = sum(r["drafted"] for r in rounds)
    per_accept = [ratio(sum(r["accepted"] for r in s["rounds"]), sum(r["drafted"] for r in s["rounds"]))
                  for s in samples if s.get("rounds")]
    per_mat = [sum(r["emitted"] for r in s["rounds"]) / len(s["rounds"]) for s in samples if s.get("rounds")]
    per_accept = [a for a in per_accept if a is not None]
    chain = tree_of(point) is None and sum(r["drafted"] for r in chains) > 0
    trees = len(chains) < len(rounds)
    return {"rounds": len(rounds),
            "acceptance_pooled": ratio(sum(r["accepted"] for r in rounds), drafted),
            "acceptance_per_request": statistics.fmean(per_accept) if per_accept else None,
            "mean_accepted_tokens_pooled": ratio(sum(r["emitted"] for r in rounds), len(rounds)),
            "mean_accepted_tokens_per_request": statistics.fmean(per_mat) if per_mat else None,
            "alpha": solve_alpha(chains) if chain else None,
            "alpha_rounds": sum(r["drafted"] > 0 for r in chains) if chain else 0,
            "constant_draft_length": constant_draft_length(samples, point.gamma) if chain and not trees else None,
            "acceptance_by_depth_rank": acceptance_by_depth_rank([r for r in rounds if "parents" in r]) if trees else None,
            "acceptance_by_source": acceptance_by_source(rounds, REGISTRY[point.method].draft_sources)}


COST_ROWS_REACH = 0.1  # how far (relative) outside the probed batch sizes an occupancy may take their nearest


def priced_sizes(probes: dict[int, CostProbe], draft: str | None, gamma: int) -> list[int]:
    """The probed batch sizes that measured both c for this draft and v for this gamma, ascending."""
    return sorted(b for b, p in probes.items() if p is not None and p.c_for(draft) is not None
                  and p.v_for(gamma) is not None)


def costs_at(probes: dict[int, CostProbe], draft: str | None, gamma: int, rows: float) -> dict | None:
    """c and v at a batch of `rows` rows (the occupancy while busy): linear between the probed batch sizes around it,
    the nearest probed one within COST_ROWS_REACH outside their range. None where no probe measured both for this
    draft and gamma, or the occupancy lies farther outside the probed sizes (a rate without a cap probes every
    request in flight; a load that keeps 1.7 of them busy is not priced at 10)."""
    known = priced_sizes(probes, draft, gamma)
    if not known or not known[0] * (1 - COST_ROWS_REACH) <= rows <= known[-1] * (1 + COST_ROWS_REACH):
        return None
    at = min(max(rows, known[0]), known[-1])
    low, high = max(b for b in known if b <= at), min(b for b in known if b >= at)
    share = 0.0 if high == low else (at - low) / (high - low)

    def between(get):
        return get(probes[low]) + share * (get(probes[high]) - get(probes[low]))

    return {"c": between(lambda p: p.c_for(draft)), "v": between(lambda p: p.v_for(gamma)), "rows": at,
            "probed": [low, high] if high != low else [low]}


def replayed_figures(samples: list[dict], baseline: list[dict]) -> dict:
    """The figures the replay predicts of a load point's schedule, computed as the measured ones are; parts_s: the
    seconds of each part (eval/replay.py part_times), what prediction_off weighs."""
    mine, theirs = with_slots(samples), with_slots(baseline)
    tput = paired_clusters(mine, theirs, REQUESTS)
    figures = load_figures(mine, None)
    tpot_mean = (figures["tpot_s"] or {}).get("mean")
    return {"speedup": ratio_of_totals(tput) if tput else None, "tok_s": figures["output_tok_s"],
            "ttft_p50_s": (figures["ttft_s"] or {}).get("p50"), "e2e_p50_s": (figures["e2e_s"] or {}).get("p50"),
            "tpot_mean_ms": None if tpot_mean is None else tpot_mean * 1000,
            "baseline_tpot_mean_ms": ((load_figures(theirs, None)["tpot_s"] or {}).get("mean") or 0) * 1000 or None,
            "parts_s": part_times(samples, baseline)}


def replay_prediction(point: Point, samples: list[dict], baseline: list[dict], profile) -> tuple[dict | None, str | None]:
    """The load point's schedule replayed with the run's cost profile (load_prediction); (figures, None) or (None,
    why not)."""
    if profile is None:
        return None, "no cost profile"
    draft = point.draft if REGISTRY[point.method].needs_draft else None
    try:
        return load_prediction(samples, baseline, profile, draft), None
    except MissingCost as error:
        return None, lacking(error, "the run's cost profile")


def load_prediction(samples: list[dict], baseline: list[dict], profile, draft: str | None,
                    concurrency: int | None = None) -> dict:
    """A load point's schedule replayed with a cost profile (eval/replay.py): its requests' arrivals, lengths and
    rounds, at its concurrency (or another: a what-if); the baseline's the same way. The speedup's 95% interval: the
    replay of paired resamples of the requests (eval/replay.py load_resamples), each priced by a resample of the
    profile's repetitions (profile_resamples: the probes' timing spread), the expanded percentile interval as the
    measured one's. Raises MissingCost where the profile lacks a cost."""
    def replayed(mine, theirs, costs=profile, pricers=None) -> dict:
        pricers = pricers or (Pricer(costs, draft), Pricer(costs))
        return replayed_figures(replay_load(mine, pricers[0], True, concurrency),
                                replay_load(theirs, pricers[1], False, concurrency))

    pricers = Pricer(profile, draft), Pricer(profile)
    figures = dict(replayed(samples, baseline, pricers=pricers), caches_priced_beyond=beyond_caches(*pricers))
    draws = load_resamples(samples, baseline)
    speedups = [replayed(a, b, costs)["speedup"] for (a, b), costs in zip(draws, profile_resamples(profile, len(draws)))]
    speedups = [x for x in speedups if x is not None]
    figures["speedup_ci95"] = expanded_interval(speedups, len({s.get("request") for s in samples}))
    figures["speedup_ci95_withheld"] = withheld(figures["speedup"], figures["speedup_ci95"])
    if figures["speedup_ci95_withheld"]:
        figures["speedup_ci95"] = None
    return figures


def withheld(point: float | None, interval: list[float] | None) -> str | None:
    """Why a replayed speedup's interval is not given where the replay of what ran lies outside it (None where it is
    inside): a resample re-draws requests into the recorded arrivals, each keeping its rounds, and rounds whose K a
    schedule chose for the batch they ran in (speculative.schedule: recommended) land beside other rows there, so the
    resamples do not vary what ran; such an interval is no interval of the point."""
    if not misses(point, interval):
        return None
    return (f"the replay of what ran ({point:.3f}) lies outside its resamples' [{interval[0]:.3f}, {interval[1]:.3f}]: "
            "requests re-drawn keep rounds whose K was chosen for the batch they ran in, so no interval")


def group_figures(point: Point, samples: list[dict], baseline: list[dict] | None, group_by: str | None,
                  figures_of) -> list[dict]:
    """Per group of the requests (eval/groups.py: group_by's values, a conversation's turns): its requests (each
    counted once over the repeats) and figures_of(point, its requests, the baseline's same requests): the figures
    the table gives per group (eval/figure_table.py group_metrics). Both sides with their slots."""
    out = []
    for group, field in groups_of(samples, group_by):
        mine = [s for s in samples if in_group(s, group, field)]
        theirs = [s for s in baseline or [] if in_group(s, group, field)]
        out.append({"group": group, "group_field": field, "requests": len({s.get("request") for s in mine}),
                    **figures_of(point, mine, theirs)})
    return out


def served_acceptance(inputs) -> dict:
    """acceptance_figures of a load point."""
    return acceptance_figures(inputs.samples, inputs.point)


def served_pairs(inputs) -> dict:
    """The requests both served, and the system's tok/s over the baseline's (a reading: no interval)."""
    baseline = inputs.baseline
    return {"requests_paired": requests_paired(inputs.samples, baseline) if baseline else 0,
            "output_tok_s_ratio": ratio(inputs.metrics["output_tok_s"], load_figures(baseline, None)["output_tok_s"])
            if baseline else None}


def occupancy_costs(inputs) -> dict:
    """Leviathan's prediction at the load point's occupancy while busy: c and v there (costs_at), for a chain of a
    constant draft length with alpha; None otherwise."""
    point, metrics = inputs.point, inputs.metrics
    out = dict.fromkeys(["draft_cost_ratio_c", "verify_cost_ratio_v", "cost_rows", "cost_batch_sizes",
                         "predicted_speedup"])
    if REGISTRY[point.method].has_rounds and point.gamma and tree_of(point) is None \
            and metrics.get("constant_draft_length"):
        busy = occupancy_figures(inputs.samples, None)["busy_in_flight"]  # its own: the table lists it later
        at = costs_at(inputs.probes, point.draft, point.gamma, busy or point.batch_size)
        if at is not None and metrics.get("alpha") is not None:
            out.update(draft_cost_ratio_c=at["c"], verify_cost_ratio_v=at["v"], cost_rows=at["rows"],
                       cost_batch_sizes=at["probed"],
                       predicted_speedup=predicted_speedup(metrics["alpha"], point.gamma, at["c"], at["v"]))
    return out


def served_replay(inputs) -> dict:
    """The replay of the load point's schedule with the run's cost profile (replay_prediction), for a method of an
    engine that times its forwards (synthetic points too: their rounds are real), and prediction_off."""
    point, samples, baseline = inputs.point, inputs.samples, inputs.baseline
    out = dict.fromkeys(["predicted_speedup_replay", "predicted_speedup_replay_ci95", "replay", "replay_missing",
                         "prediction_off"])
    if REGISTRY[point.method].has_rounds and caps_of(point.method).times_forwards and baseline:
        out["replay"], out["replay_missing"] = replay_prediction(point, samples, baseline, inputs.profile)
        if out["replay"] is not None and out["replay"]["speedup"] is not None:
            out["predicted_speedup_replay"] = out["replay"]["speedup"]
            out["predicted_speedup_replay_ci95"] = out["replay"]["speedup_ci95"]
            out["prediction_off"] = prediction_off(inputs.metrics["speedup_tput"], out["replay"],
                                                   part_times(samples, baseline))
    return out


def prediction_gap(point: Point, metrics: dict, probes: dict[int, CostProbe]) -> str | None:
    """Why a serving point with rounds has no predicted speedup (None when it has one or drafted nothing)."""
    if metrics.get("predicted_speedup") is not None or metrics.get("acceptance_pooled") is None:
        return None
    return leviathan_gap(point, metrics, probes)


def leviathan_gap(point: Point, metrics: dict, probes: dict[int, CostProbe]) -> str | None:
    if not caps_of(point.method).times_forwards:
        return ENGINE_TEXTS[REGISTRY[point.method].engine].no_prediction_load
    if tree_of(point) is not None:
        return "the prediction under load is Leviathan's, of a chain; a tree has none here"
    if not metrics.get("constant_draft_length"):
        return "their draft length varied from round to round, and Leviathan's model assumes a constant gamma"
    if point.draft is None:
        return "no draft model: no draft cost c was measured for this drafter"
    if not probes:
        return "no cost probe ran at the batch sizes of this run's load points"
    measured = priced_sizes(probes, point.draft, point.gamma)
    if measured and metrics.get("busy_in_flight") is not None:
        return (f"its load kept {metrics['busy_in_flight']:.2f} requests in flight while busy, outside the batch sizes "
                f"whose c and v were probed ({', '.join(map(str, measured))} rows; each load point probes at 1 and "
                "min(C, its requests)): sweep a concurrency near it to price it")
    return "no c and v were measured for this draft and gamma"


# ---- flags and the section ------------------------------------------------------------------------------------

def serving_flags(point: Point, metrics: dict, requests: int, ci_target: float, machine_flags: list[dict]) -> list[dict]:
    """few_samples (fewer than MIN_PROMPTS requests paired: no interval) or ci_wide (an interval beyond +-ci_target of
    its speedup), by the same rule as a fixed batch's; then the machine's flags (drift, costs, exactness)."""
    if REGISTRY[point.method].is_reference or metrics.get("speedup_tput") is None:
        return machine_flags
    flags = []
    if requests < MIN_PROMPTS:
        flags.append({"code": "few_samples", "message": f"{requests} request(s) back its speedups, fewer than "
                      f"{MIN_PROMPTS}: no interval is given, so they are readings, not estimates: serve more requests "
                      "(load.requests)"})
    else:
        wide = [f"{name} {metrics[key]:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" for name, key in
                (("throughput", "speedup_tput"), ("TPOT", "speedup_tpot"))
                if metrics.get(key) is not None and (ci := metrics.get(key + "_ci95"))
                and (ci[0] < metrics[key] * (1 - ci_target) or ci[1] > metrics[key] * (1 + ci_target))]
        if wide:
            flags.append({"code": "ci_wide", "message": f"the 95% CI of its speedup ({'; '.join(wide)}) reaches beyond "
                          f"+-{ci_target * 100:g}% of it: the requests disagree more than that (more requests narrow it)"})
    return flags + [f for f in machine_flags if f["code"] not in ("few_samples", "ci_wide")]


def _line(run: dict) -> dict:
    """A serving run's axes but those its load point sets (eval/axes.py Axis.load)."""
    return {name: value for name, value in Point.of(run).values().items() if not axis_named(name).load}


def line_of(run: dict) -> tuple:
    return tuple(_line(run).values())


def line_label(run: dict) -> str:
    """A point's label without its load: the line it draws across load points."""
    return label_of(_line(run))


def load_label(run: dict) -> str:
    """conc=4 rate=2.0/s T=0.7 (rate all at once: no rate): its comparison."""
    return Comparison.of(run).label


def load_value(run: dict, axis: str) -> float:
    """A load on its axis: a rate of None (all at once) is the highest; a concurrency above the load point's requests
    is the requests (its batch size, min(C, requests): a higher cap is the same load)."""
    value = run.get(axis)
    if value is None:
        return math.inf
    return min(value, run.get("batch_size") or value) if axis == "concurrency" else value


# ---- the crossover ------------------------------------------------------------------------------------------

def crossing(loads: list[float], values: list[float | None], intervals: list | None = None) -> dict:
    """Where a speedup curve over increasing load crosses 1: each crossing between two measured loads, at the load
    where the straight line between them meets 1 (None where one of them is all at once: no straight line reaches
    it), the first of them, and the highest load whose interval lies wholly above 1. loads: numbers (math.inf for
    all at once)."""
    points = sorted((x, y, (intervals or [None] * len(loads))[i]) for i, (x, y) in enumerate(zip(loads, values))
                    if y is not None)
    crossings = []
    for (x0, y0, _), (x1, y1, _) in zip(points, points[1:]):
        if (y0 >= 1) != (y1 >= 1):
            at = x0 + (1 - y0) * (x1 - x0) / (y1 - y0) if math.isfinite(x1) else None
            crossings.append({"load": at, "between": [x0, x1], "direction": "down" if y1 < y0 else "up"})
    above = [x for x, _, ci in points if ci and ci[0] > 1]
    if not points:
        verdict = "no speedup measured"
    elif crossings:
        verdict = "crosses 1"
    elif all(y >= 1 for _, y, _ in points):
        verdict = "above 1 at every load measured"
    else:
        verdict = "below 1 at every load measured"
    found = {"verdict": verdict, "crossing": crossings[0] if crossings else None, "crossings": crossings}
    if intervals is not None:
        found["highest_load_ci_above_1"] = max(above) if above else None
    return found


def crossovers(runs: list[dict]) -> list[dict]:
    """Per method line (its axes but load) and per sweep along one load axis (the other axis held): the measured
    throughput speedup's crossing and the predicted one's (the replay's where it priced every load of the line, with
    its intervals; else Leviathan's at each occupancy: predicted_by), TPOT's too. A sweep needs two loads or more."""
    measured = [r for r in runs if r["status"] in ("ok", "partial") and not REGISTRY[r["method"]].is_reference
                and r["metrics"].get("speedup_tput") is not None
                and r.get("synthetic_acceptance") is None]  # a synthetic line's speedup is at a set alpha
    out = []
    for axis in LOAD_AXES:
        other = next(a for a in LOAD_AXES if a != axis)
        lines: dict[tuple, list[dict]] = defaultdict(list)
        for run in measured:
            lines[line_of(run) + (run.get(other),)].append(run)
        for key, rows in lines.items():
            rows = sorted(rows, key=lambda r: (load_value(r, axis), r.get(axis) or math.inf))
            # caps above the requests are one load: its lowest cap stands for it
            rows = [r for i, r in enumerate(rows) if i == 0 or load_value(r, axis) != load_value(rows[i - 1], axis)]
            if len(rows) < 2:
                continue
            loads = [load_value(r, axis) for r in rows]
            m = [r["metrics"] for r in rows]
            # the replay where it priced every load of the line, else Leviathan's closed form at each occupancy
            replayed = [x.get("predicted_speedup_replay") for x in m]
            by_replay = all(x is not None for x in replayed)
            predicted = replayed if by_replay else [x.get("predicted_speedup") for x in m]
            predicted_ci = [x.get("predicted_speedup_replay_ci95") for x in m] if by_replay else None
            out.append({"line": line_label(rows[0]), "axis": axis, other: key[-1], "temperature": rows[0]["temperature"],
                        "loads": [None if x == math.inf else x for x in loads], "labels": [r["label"] for r in rows],
                        "speedup_tput": [x["speedup_tput"] for x in m],
                        "speedup_tput_ci95": [x.get("speedup_tput_ci95") for x in m],
                        "predicted_speedup": predicted, "predicted_speedup_ci95": predicted_ci,
                        "predicted_by": "replay" if by_replay else "leviathan",
                        "measured": crossing(loads, [x["speedup_tput"] for x in m], [x.get("speedup_tput_ci95") for x in m]),
                        "predicted": crossing(loads, predicted, predicted_ci),
                        "tpot": crossing(loads, [x.get("speedup_tpot") for x in m], [x.get("speedup_tpot_ci95") for x in m])})
    return [strict(c) for c in out]  # math.inf (all at once) written as null: summary.json is strict JSON


# ---- a schedule against the best fixed K ----------------------------------------------------------------------

def versus_fixed(runs: list[dict], by_point: dict[Point, list[dict]]) -> list[dict]:
    """Per load point and method line but its gamma and schedule: each point whose schedule is not the constant one
    against the constant schedule's best K there (the highest throughput speedup's point estimate, so the choice
    favours the constant K): its (sum N / sum E2E) over that K's, over the requests both served (REQUESTS:
    the same requests on the same arrivals, each with all its repeats), with its 95% paired bootstrap interval; the
    ratio of their system tok/s as a reading; and the verdict: "above" or "below" where the interval lies wholly
    above or below 1, "tied" where it holds 1, "too few requests" where fewer than MIN_PROMPTS pair (no interval).
    by_point: the points' timed records with their slots."""
    measured = [r for r in runs if r["status"] in ("ok", "partial") and r.get("schedule") is not None
                and r["metrics"].get("speedup_tput") is not None and r.get("synthetic_acceptance") is None]
    lines: dict[tuple, list[dict]] = defaultdict(list)
    for run in measured:
        lines[tuple(Point.of(run).without("gamma", "schedule").items())].append(run)
    out = []
    for rows in lines.values():
        fixed = [r for r in rows if r["schedule"] == FIXED]
        if not fixed:
            continue
        best = max(fixed, key=lambda r: (r["metrics"]["speedup_tput"], -(r.get("gamma") or 0)))
        for run in rows:
            if run["schedule"] == FIXED:
                continue
            mine, theirs = by_point[Point.of(run)], by_point[Point.of(best)]
            tput, paired = paired_clusters(mine, theirs, REQUESTS), requests_paired(mine, theirs)
            value = ratio_of_totals(tput) if tput else None
            interval = bootstrap_ci(tput) if tput else None
            if value is None:
                continue
            verdict = "too few requests" if interval is None else \
                "above" if interval[0] > 1 else "below" if interval[1] < 1 else "tied"
            out.append({"load": load_label(run), "label": run["label"], "line": line_label(run),
                        "best_fixed": best["label"], "best_fixed_line": line_label(best),
                        "best_fixed_gamma": best.get("gamma"), "requests_paired": paired, "tput_ratio": value,
                        "tput_ratio_ci95": interval, "verdict": verdict,
                        "output_tok_s_ratio": ratio(run["metrics"].get("output_tok_s"),
                                                    best["metrics"].get("output_tok_s"))})
    return [strict(v) for v in out]


def load_text(value, axis: str) -> str:
    """A load as the report prints it: conc 2.6, 4.0/s, all at once (a rate of None)."""
    if value is None or value == math.inf:
        return "all at once" if axis == "request_rate" else "-"
    return f"{value:g}/s" if axis == "request_rate" else f"{value:g}"


def crossing_text(found: dict, axis: str) -> str:
    """'crosses 1 at 2.6 (between 2 and 4), falling', 'above 1 at every load measured', ..."""
    first = found.get("crossing")
    if not first:
        return found["verdict"]
    low, high = (load_text(x, axis) for x in first["between"])
    text = f"crosses 1 between {low} and {high}" if first["load"] is None else \
        f"crosses 1 at {load_text(round(first['load'], 2), axis)} (between {low} and {high})"
    text += ", falling" if first["direction"] == "down" else ", rising"
    if len(found["crossings"]) > 1:
        text += f" ({len(found['crossings'])} crossings)"
    return text


# ---- the summary's serving section --------------------------------------------------------------------------------

def slo_of(config: dict | None) -> dict | None:
    """config.yaml's load.slo, the limits given ({ttft_s, tpot_ms}); None where none is set."""
    slo = (((config or {}).get("load") or {}).get("slo") or {})
    limits = {key: slo[key] for key in SLO_KEYS if slo.get(key) is not None}
    return limits or None


def serving_section(by_point: dict[Point, list[dict]], failures: dict[Point, list[dict]], progress: dict,
                    slo: dict | None, costs_of, order, machine_of, metrics_of, group_metrics_of) -> tuple[dict, list[str]]:
    """summary.json's "serving": {slo, runs, crossovers}, and its notes. by_point and failures: the serving points'
    records and failures; costs_of(progress, point, samples) -> CostProbe (eval/summary.py); order: the points' sort
    key; machine_of(point, costs) -> what eval/flags.py flags_of reads (drift, numerics, ci_target); metrics_of: a
    point's figures (eval/figure_table.py serving_metrics); group_metrics_of: a group's (group_metrics)."""
    untimed = {p: sum(not timed(s) for s in rows) for p, rows in by_point.items()}
    by_point = {p: with_slots([s for s in rows if timed(s)]) for p, rows in by_point.items()}
    baselines = {(REGISTRY[p.method].engine, p.comparison): rows for p, rows in by_point.items()
                 if REGISTRY[p.method].is_reference}
    planned = progress.get("planned") or {}
    batch_sizes = sorted(int(b) for b in (progress.get("costs") or {}))
    profile = run_costs(progress, {}, None)
    runs, notes, gaps, flagged, capped, synthetic = [], [], defaultdict(list), {}, {}, []
    unreplayed = defaultdict(list)  # why the replay could not price a point -> those points
    beyond = {}  # label -> the caches its replay priced beyond the profiled ones
    for point in sorted(set(by_point) | set(failures), key=order):  # a load point's methods together, loads rising
        samples, failed = by_point.get(point, []), failures.get(point, [])
        error = "; ".join(dict.fromkeys(f.get("error") or f.get("status") for f in failed)) or None
        if untimed.get(point):
            notes.append(f"{point.label}: {untimed[point]} of its records carry no request times (arrival_s, "
                         "finish_s): left out of every figure")
            error = error or ("its records carry no request times" if not samples else None)
        run = {**point.values(), "label": point.label}
        expected = planned.get(point.label)
        if not samples:
            status = "failed" if any(f.get("status") == "failed" for f in failed) else "skipped"
            runs.append({**run, "status": status, "error": error, "repeats": {"done": 0, "planned": expected},
                         "flags": [], "metrics": {}})
            continue
        engine = REGISTRY[point.method].engine
        done = len(by_repeat(samples))
        status = "partial" if failed or (expected is not None and done < expected) else "ok"
        baseline = baselines.get((engine, point.comparison))
        probes = {b: costs_of(progress, Point(method=point.method, batch_size=b), samples) for b in batch_sizes} \
            if ENGINE_CAPS[engine].times_forwards else {}
        probes = {b: p for b, p in probes.items() if p is not None}
        metrics = metrics_of(point, samples, baseline, probes, slo, profile)
        by_group = group_figures(point, samples, baseline, progress.get("group_by"), group_metrics_of)
        if by_group:
            metrics["by_group"] = by_group
        paired_repeats = len(set(by_repeat(samples)) & set(by_repeat(baseline or [])))
        repeats = {"done": done, "planned": expected, "paired": paired_repeats,
                   "cross_process": cross_process_pairs(samples, baseline or [])}
        machine = machine_of(point, probes.get(point.batch_size))
        as_fixed = dict(metrics, speedup=metrics["speedup_tput"], speedup_ci95=metrics["speedup_tput_ci95"])
        flags = serving_flags(point, metrics, metrics["requests_paired"], machine.get("ci_target") or CI_WIDE,
                              flags_of(point, as_fixed, {"prompts": metrics["requests_paired"],
                                                         "paired": paired_repeats,
                                                         "cross_process": repeats["cross_process"]}, machine))
        if metrics.get("prediction_off"):
            flags.append({"code": "prediction_off", "message": metrics["prediction_off"]})
        runs.append({**run, "status": status, **({"error": error} if error else {}), "repeats": repeats,
                     "flags": flags, "metrics": metrics})
        for flag in flags:
            flagged.setdefault((flag["code"], flag["message"]), []).append(point.label)
        requests = max(len(rows) for rows in by_repeat(samples).values())
        if point.concurrency is not None and point.concurrency > requests:
            label = load_label(run)
            most = max(metrics["max_in_flight"], capped.get(label, (0, 0))[1])
            capped[label] = (requests, most)
        if point.synthetic_acceptance is not None:
            synthetic.append(point.label)
        if not REGISTRY[point.method].is_reference and metrics["speedup_tput"] is None:
            notes.append(f"{point.label}: no {reference_method(engine)} at {load_label(run)} "
                         "to pair with: no speedups" if not metrics["requests_paired"] else
                         f"{point.label}: its paired requests' total time or tokens are 0: no speedup")
        if status == "partial":
            notes.append(f"{point.label}: partial, {done} of {expected} repeats of its load point "
                         f"({error or 'the run stopped first'})")
        gap = prediction_gap(point, metrics, probes) if REGISTRY[point.method].has_rounds else None
        if gap:
            gaps[gap].append(point.label)
        if metrics.get("replay_missing"):
            unreplayed[metrics["replay_missing"]].append(point.label)
        if (metrics.get("replay") or {}).get("speedup_ci95_withheld"):
            notes.append(f"{point.label}: no interval on its replayed speedup: "
                         f"{metrics['replay']['speedup_ci95_withheld']}")
        if (metrics.get("replay") or {}).get("caches_priced_beyond"):
            beyond[point.label] = metrics["replay"]["caches_priced_beyond"]
    for reason, labels in unreplayed.items():
        notes.append(f"no replayed prediction under load for {'; '.join(labels)}: {reason} (python -m eval.predict "
                     "FOLDER --costs PROFILE.json replays it with a profile of the device)")
    if beyond:
        notes.append(f"{'; '.join(beyond)}: the replay's {beyond_note(list(beyond.values()), profile.caches())}")
    for label, (requests, most) in capped.items():
        notes.append(f"{label}: its concurrency exceeds the load point's {requests} requests: at most {requests} could "
                     f"be in flight (the most measured: {most}), and its costs were probed at {requests} rows; a "
                     "higher cap would change nothing (serve more requests: load.requests)")
    if synthetic:
        notes.append(f"{'; '.join(synthetic)}: synthetic acceptance (drafts accepted by a seeded Bernoulli(alpha) chain, "
                     "not by the target): outputs are not the target's, no exact match; their speedups measure the "
                     "cost at the set alpha, and they take no part in the crossovers")
    for (code, message), labels in flagged.items():
        notes.append(f"{'; '.join(labels)}: flagged {code}: {message}")
    for reason, labels in gaps.items():
        notes.append(f"predicted speedup under load is null for {'; '.join(labels)}: {reason}")
    return {"slo": slo, "runs": runs, "crossovers": crossovers(runs), "versus_fixed": versus_fixed(runs, by_point)}, notes
