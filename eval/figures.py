"""The figures of one run (a point, overall or one group) from its records and its baseline's (docs/metrics.md)."""
from __future__ import annotations

import statistics

from decode.methods import ENGINE_TEXTS, REGISTRY, caps_of
from decode.tree_layout import tree_depth, tree_nodes
from eval.leviathan import predicted_speedup, solve_alpha
from eval.records import CostProbe, Point
from eval.replay import PART_OFF, part_times, prediction_off_reason, prefill_deferred, static_prediction
from eval.stats import bootstrap_ci, distribution, ratio, ratio_of_totals
from eval.sources import acceptance_by_source
from eval.synthetic_acceptance import not_the_targets, synthetic_prediction
from eval.totals import (BATCHES, Pairing, block_efficiency, paired_clusters, paired_units, throughput, unit_totals,
                          units)
from eval.trees import acceptance_by_depth_rank, round_depth, tree_of, tree_prediction
from utils.data import extract_gsm8k_answer


def constant_draft_length(samples: list[dict], gamma: int | None) -> bool:
    """Whether the rounds drafted gamma: every round drafted min(gamma, budget - generated - 1), the engine's cut
    near max_new_tokens (`generated` counting the prefill's token), and at least one round drafted the full gamma
    (gamma 8 with max_new_tokens 6 never drafts 8: its rounds are not gamma 8's).

    The budget is not recorded: a round drafting g < gamma after `generated` tokens implies max_new_tokens =
    generated + g + 1. Every short round must imply the same one, every round after it must draft what that budget
    leaves, no row may exceed it, and a row stopped at "length" must have reached it. Anything else is a variable
    draft length (a schedule, prompt lookup without a match)."""
    if not gamma:
        return False
    implied = set()
    for s in samples:
        generated = 1  # the prefill's token
        for r in s.get("rounds") or []:
            if r["drafted"] != gamma:
                implied.add(generated + r["drafted"] + 1)
            generated += r["emitted"]
    if len(implied) > 1:
        return False
    budget = implied.pop() if implied else None
    reached_gamma = False
    for s in samples:
        generated = 1
        for r in s.get("rounds") or []:
            expected = gamma if budget is None else min(gamma, budget - generated - 1)
            if r["drafted"] != expected:
                return False
            reached_gamma |= r["drafted"] == gamma
            generated += r["emitted"]
    if not reached_gamma:
        return False
    if budget is None:
        return True
    reached = {s["new_tokens"] for s in samples if s.get("stop_reason") == "length"}
    return all(s["new_tokens"] <= budget for s in samples) and reached <= {budget}


def speculation_figures(samples: list[dict], gamma: int | None, tree: str | None = None,
                        sources: tuple[str, ...] = ()) -> dict:
    """Acceptance figures from the rounds; those of drafted tokens None when no round drafted one. A tree (its label,
    decode/tree_layout.py) drafts nodes: acceptance by position is by depth, and Leviathan's alpha and constant draft length,
    which describe a chain, are None; a chain point some of whose rounds were trees (hybrid's merged trees) takes alpha
    from its chain rounds only. sources: the draft sources the method offers (acceptance_by_source's zero rows)."""
    rounds = [r for s in samples for r in s.get("rounds") or []]
    figures = dict.fromkeys(["rounds", "acceptance_rate", "mean_accepted_tokens", "alpha", "per_position_acceptance",
                             "accepted_histogram", "drafted_per_round", "max_drafted", "zero_draft_rounds",
                             "constant_draft_length", "acceptance_by_depth_rank"])
    figures["rounds"] = len(rounds)
    figures["acceptance_by_source"] = acceptance_by_source(rounds, sources)  # drafters of several sources (hybrid)
    if not rounds:
        return figures
    drafted = [r["drafted"] for r in rounds]
    accepted = [r["accepted"] for r in rounds]
    figures.update(
        mean_accepted_tokens=sum(r["emitted"] for r in rounds) / len(rounds),
        drafted_per_round=sum(drafted) / len(rounds),
        max_drafted=max(drafted),
        zero_draft_rounds=sum(d == 0 for d in drafted) / len(rounds),
    )
    if not sum(drafted):
        return figures
    depths = [round_depth(r) for r in rounds]  # a chain's: its drafted tokens
    longest = max(max(depths), tree_depth(tree, gamma) or 0)
    figures["acceptance_rate"] = sum(accepted) / sum(drafted)
    figures["per_position_acceptance"] = [
        ratio(sum(a >= i for a, d in zip(accepted, depths) if d >= i), sum(d >= i for d in depths))
        for i in range(1, longest + 1)]
    figures["accepted_histogram"] = [sum(a == k for a, d in zip(accepted, drafted) if d > 0) for k in range(longest + 1)]
    figures["acceptance_by_depth_rank"] = acceptance_by_depth_rank(rounds)
    chains = [r for r in rounds if "parents" not in r]  # a tree round records its nodes' parents
    if tree is None and sum(r["drafted"] for r in chains):
        figures["constant_draft_length"] = len(chains) == len(rounds) and constant_draft_length(samples, gamma)
        figures["alpha"] = solve_alpha(chains)
    return figures


def gsm8k_figures(samples: list[dict]) -> dict:
    graded = [s for s in samples if s.get("reference") is not None and s.get("preset") == "gsm8k"]
    if not graded:
        return {}
    right = 0
    for s in graded:
        answer = extract_gsm8k_answer(s.get("output_text") or "")
        right += answer is not None and answer == extract_gsm8k_answer(s["reference"])
    cut = sum(s.get("stop_reason") == "length" and "####" not in (s.get("output_text") or "") for s in graded)
    return {"accuracy": right / len(graded), "accuracy_cut": cut, "accuracy_graded": len(graded)}


def first_mismatch(output: list[int], reference: list[int]) -> int | None:
    """The first token index where two outputs differ (the shorter one's length if one is a prefix); None if equal."""
    if output == reference:
        return None
    return next((i for i, (a, b) in enumerate(zip(output, reference)) if a != b), min(len(output), len(reference)))


def exact_match(samples: list[dict], baseline: list[dict], pairing: Pairing = BATCHES) -> dict | None:
    """Greedy outputs against the baseline's, row by row (the pairing's rows: (repeat, sample_id) at a fixed batch,
    (repeat, request, sample_id) under load) over the units both finished. Each mismatch names its row, says where it
    starts (first_mismatch) and, where the baseline recorded its top-2 logit gaps, baseline_gap: the baseline's top-1
    minus top-2 logit at that token (eval/flags.py weighs it against the numerics drift), null where the outputs
    differ in length only (no token to compare: no rounding flip does that)."""
    both = set(paired_units(samples, baseline, pairing))
    mine = {row: s for row, unit, s in pairing.rows(samples) if unit in both}
    reference = {row: s for row, _, s in pairing.rows(baseline)}
    paired = sorted(set(mine) & set(reference))
    if not paired:
        return None
    mismatches = []
    for key in paired:
        s, ref = mine[key], reference[key]
        first = first_mismatch(s["output_ids"], ref["output_ids"])
        if first is None:
            continue
        mismatch = {**dict(zip(pairing.row_names, key)), "first_mismatch": first}
        gaps = ref.get("top2_gaps")
        if gaps:
            mismatch["baseline_gap"] = gaps[first] if first < min(len(gaps), len(s["output_ids"])) else None
        mismatches.append(mismatch)
    return {"exact_match": 1 - len(mismatches) / len(paired), "mismatches": mismatches}


def tree_draft_cost(point: Point, costs: CostProbe) -> float | None:
    """c of a tree point's drafter: 0 for one that runs no model (no draft, no exit layer: n-gram lookup); None where
    its forward was not measured (early exit's layers)."""
    if point.draft is None and point.exit_layer is None:
        return 0.0
    return costs.c_for(point.draft)


def run_step_costs(samples: list[dict], baseline: list[dict] | None) -> tuple[float | None, float | None]:
    """(c_run, v_run): the draft forward and the verification round as the run's own records time them, in the
    baseline's decode steps of the same batches: what the probes' c and v stand for. Per batch both sides finished,
    the baseline's steps are its longest row's new tokens less the prefill's, in its decode wall; the speculative
    batch's rounds, draft forwards (its draft prefill's one left out, where it ran at admission: a deferred prefill
    is a round's catch-up, eval/replay.py prefill_deferred) and time after both prefills are its longest row's,
    whose record spans them all: draft_s less the draft prefill over the draft forwards, target_s less the
    prefill over the rounds (each round's acceptance, host read and rollback included, as in the probes). (None, None)
    where anything is unrecorded."""
    if not baseline or any(s.get("prefill_s") is None for s in samples + baseline):
        return None, None
    mine, theirs = units(samples), units(baseline)
    base_steps = base_wall = forwards = draft_s = rounds = verify_s = 0
    for key in set(mine) & set(theirs):
        base = unit_totals(theirs[key])
        longest = max(mine[key], key=lambda s: len(s.get("rounds") or []))
        base_steps += max(s["new_tokens"] for s in theirs[key]) - 1
        base_wall += base["decode_wall"]
        forwards += longest["draft_forwards"] - (0 if prefill_deferred(longest) else 1)  # its prefill's forward
        draft_s += longest["draft_s"] - longest["draft_prefill_s"]
        rounds += len(longest.get("rounds") or [])
        verify_s += longest["target_s"] - longest["prefill_s"]
    step = ratio(base_wall, base_steps)
    if not step or forwards <= 0 or not rounds:
        return None, None
    return draft_s / forwards / step, verify_s / rounds / step


def cost_figures(point: Point, metrics: dict, costs: CostProbe | None, samples: list[dict],
                 baseline: list[dict] | None = None, profile=None) -> dict:
    """c, v and the predicted speedup: for a chain where Leviathan's model applies (a constant draft length, measured
    costs); for a tree (Sequoia's model, eval/trees.py) from its rounds, with v at each round's node count. Beside c,
    what says whether it measures the models or the host: the weight bytes ratio, the GPU's busy shares. Beside a
    chain's c and v with a draft model of our engine, c_run and v_run from the records (run_step_costs): where the
    decode efficiency is off 1, whether the probes' costs or the tokens per round are.

    predicted_speedup and efficiency are Leviathan's closed form, as METRICS.md defines them. Beside them, for every
    method of our engine with rounds, the replay of the point's own schedule with the run's cost profile
    (replay_figures): predicted_speedup_replay with its interval, replay_efficiency, and prediction_off where the
    measured speedup falls outside the replay's interval."""
    out = dict.fromkeys(["draft_cost_ratio_c", "verify_cost_ratio_v", "draft_cost_ratio_c_run",
                         "verify_cost_ratio_v_run", "weight_bytes_ratio", "draft_busy_share", "target_busy_share", "predicted_speedup",
                         "predicted_speedup_v1", "efficiency", "decode_efficiency", "predicted_speedup_replay",
                         "predicted_speedup_replay_ci95", "predicted_decode_speedup_replay", "replay_efficiency",
                         "replay_decode_efficiency", "replay", "replay_missing", "prediction_off"])
    tree = tree_of(point)
    spec = REGISTRY[point.method]
    if spec.has_rounds and caps_of(point.method).times_forwards and tree is None and point.draft is not None and point.gamma:
        out["draft_cost_ratio_c_run"], out["verify_cost_ratio_v_run"] = run_step_costs(samples, baseline)
    if spec.has_rounds and caps_of(point.method).times_forwards and baseline and profile is not None:
        out["replay"], out["replay_missing"] = replay_figures(point, samples, baseline, profile)
    if not spec.has_rounds or costs is None or (point.gamma is None and tree is None):
        return with_replay(out, metrics)
    c, v = costs.c_for(point.draft), costs.v_for(tree_nodes(tree, point.gamma))  # a chain's nodes: gamma
    out["draft_cost_ratio_c"], out["verify_cost_ratio_v"] = c, v
    if point.draft is not None:
        out["weight_bytes_ratio"] = costs.bytes_ratio_for(point.draft)
        out["draft_busy_share"] = costs.busy_share_for(point.draft)
        out["target_busy_share"] = costs.busy_share_for(None)
    if tree is not None:
        out["verify_cost_by_nodes"] = {str(n): x for n, x in sorted(costs.v.items())}
        c_tree = tree_draft_cost(point, costs)
        if c_tree is None or metrics.get("acceptance_rate") is None:
            return with_replay(out, metrics)
        rounds = [r for s in samples for r in s.get("rounds") or []]
        out["predicted_speedup"], out["predicted_speedup_v1"] = tree_prediction(rounds, c_tree, costs.v_at_nodes)
    else:
        alpha = metrics.get("alpha")
        if c is None or v is None or alpha is None or not metrics.get("constant_draft_length"):
            return with_replay(out, metrics)
        out["predicted_speedup"] = predicted_speedup(alpha, point.gamma, c, v)
        out["predicted_speedup_v1"] = predicted_speedup(alpha, point.gamma, c, 1.0)
    out["efficiency"] = ratio(metrics.get("speedup"), out["predicted_speedup"])
    out["decode_efficiency"] = ratio(metrics.get("decode_speedup"), out["predicted_speedup"])
    return with_replay(out, metrics)


def replay_figures(point: Point, samples: list[dict], baseline: list[dict], profile) -> tuple[dict | None, str | None]:
    """The point's batches and the baseline's replayed with the run's cost profile (eval/replay.py
    static_prediction); (figures, None) or (None, what the profile lacks)."""
    if profile is None or not profile.steps:
        return None, "no cost profile (no probe ran)"
    draft = point.draft if REGISTRY[point.method].needs_draft else None
    figures, missing = static_prediction(samples, baseline, profile, draft, whose="the run's cost profile")
    if figures is not None and all(s.get("prefill_s") is not None for s in samples):
        figures["prefill_measured_s"] = sum(s["prefill_s"] + (s.get("draft_prefill_s") or 0.0) for s in samples)
        figures["parts_measured_s"] = part_times(samples, baseline)
    return figures, missing


def with_replay(out: dict, metrics: dict) -> dict:
    """The replay's prediction beside the closed form's, where it ran: predicted_speedup_replay and its interval, the
    decode speedup's, replay_efficiency and replay_decode_efficiency, and prediction_off."""
    replay = out.get("replay")
    if replay is None or replay.get("speedup") is None:
        return out
    out.update(predicted_speedup_replay=replay["speedup"], predicted_speedup_replay_ci95=replay["speedup_ci95"],
               predicted_decode_speedup_replay=replay["decode_speedup"],
               replay_efficiency=ratio(metrics.get("speedup"), replay["speedup"]),
               replay_decode_efficiency=ratio(metrics.get("decode_speedup"), replay["decode_speedup"]))
    out["prediction_off"] = static_prediction_off(metrics, out)
    return out


def static_prediction_off(metrics: dict, out: dict) -> str | None:
    """prediction_off (eval/replay.py prediction_off_reason), and which part the replay priced otherwise than the
    batches ran it: the draft's steps (c_run against the probed c), the verifications (v_run against v), the
    prefills (the records' against the replay's)."""
    verdict = prediction_off_reason(metrics.get("speedup"), out["predicted_speedup_replay"],
                                    out["predicted_speedup_replay_ci95"])
    if verdict is None:
        return None
    parts = [f"{name} ran {got / want:.2f}x the probes'" for name, got, want in (
        ("the draft's steps (c_run / c)", out.get("draft_cost_ratio_c_run"), out.get("draft_cost_ratio_c")),
        ("the verifications (v_run / v)", out.get("verify_cost_ratio_v_run"), out.get("verify_cost_ratio_v")))
        if got is not None and want and abs(got / want - 1) > PART_OFF]
    replay = out["replay"]
    prefill, replayed = replay.get("prefill_measured_s"), replay.get("prefill_s")
    # in units of the baseline's steps (measured over replayed), as c_run / c is of the target's forward: a machine
    # uniformly slower than its probes names no part (eval/replay.py parts_off, as under load)
    measured_parts, replayed_parts = replay.get("parts_measured_s"), replay.get("parts_s")
    pace = ratio(measured_parts["baseline_steps_s"], replayed_parts["baseline_steps_s"]) \
        if measured_parts and replayed_parts else None
    if prefill is not None and replayed and pace and abs(prefill / replayed / pace - 1) > PART_OFF:
        parts.append(f"the prefills took {prefill / replayed / pace:.2f}x the replay's in units of the baseline's "
                     f"steps (which ran {pace:.2f}x the replay's)")
    return f"{verdict}: " + ("; ".join(parts) or "no single part is off by more than 10%: the sum of small ones")


def prediction_gap(point: Point, metrics: dict, costs: CostProbe | None) -> str | None:
    """Why a point with rounds has no predicted speedup (None when it has one, or when it has no rounds: the
    no-rounds note says so)."""
    if metrics.get("predicted_speedup") is not None or metrics.get("acceptance_rate") is None:
        return None
    if not caps_of(point.method).times_forwards:
        return ENGINE_TEXTS[REGISTRY[point.method].engine].no_prediction
    if tree_of(point) is not None:
        return tree_prediction_gap(point, metrics, costs)
    if not metrics.get("constant_draft_length"):
        if point.gamma and (metrics.get("max_drafted") or 0) < point.gamma:
            return (f"no round drafted gamma (at most {metrics.get('max_drafted')}: the max_new_tokens budget or the "
                    "drafter cut every round), and Leviathan's model at gamma would price a verification that never ran")
        return ("their draft length varied from round to round (a schedule, prompt lookup without a match, a stop "
                "mid-round), and Leviathan's model assumes a constant gamma")
    if point.draft is None:
        return "no draft model: no draft cost c was measured for this drafter"
    if costs is None:
        return "no cost probe ran at this batch size in the process(es) that ran them"
    if metrics.get("draft_cost_ratio_c") is None:
        return "no c was measured for this draft"
    return "no v was measured for this gamma"


def tree_prediction_gap(point: Point, metrics: dict, costs: CostProbe | None) -> str:
    if costs is None:
        return "no cost probe ran at this batch size in the process(es) that ran them"
    if tree_draft_cost(point, costs) is None:
        return ("no c was measured for this draft" if point.draft is not None else
                "no draft cost c is measured for an early-exit drafter (its forward is the target's first layers)")
    measured = max(costs.v, default=0)
    return (f"no v was measured at {metrics.get('max_drafted')} tree nodes (a {(metrics.get('max_drafted') or 0) + 1}"
            f"-token target forward; measured up to {measured} nodes), and the tree prediction prices every round")


def per_request_times(samples: list[dict], keys: tuple[str | None, str]) -> tuple[list[float], list[float]] | None:
    """An engine's own latency and TTFT per request (its request metrics, queueing included; keys: their names in
    the records' extra, EngineText.request_times; a latency key None: the records' latency_s, the client's clock),
    where every record has them."""
    latency, ttft = keys
    extra = [s.get("extra") or {} for s in samples]
    if not samples or any((latency is not None and e.get(latency) is None) or e.get(ttft) is None for e in extra):
        return None
    return ([e[latency] for e in extra] if latency is not None else [s["latency_s"] for s in samples],
            [e[ttft] for e in extra])


def compares_outputs(point: Point) -> bool:
    """Whether a point's output is held to its reference's (exact_match): greedy, not the reference itself, and not
    synthetic (accepted at a set alpha, its output is not the target's); fixed batches and load points alike."""
    return point.temperature is None and not REGISTRY[point.method].is_reference and point.synthetic_acceptance is None


def sample_count(inputs) -> dict:
    return {"samples": len(inputs.samples)}


def new_tokens(inputs) -> dict:
    return {"new_tokens": sum(s["new_tokens"] for s in inputs.samples)}


def throughputs(inputs) -> dict:
    """Throughput overall and per repeat, and the repeats' standard deviation."""
    samples = inputs.samples
    repeats = sorted({s.get("repeat", 0) for s in samples})
    per_repeat = [throughput([s for s in samples if s.get("repeat", 0) == r]) for r in repeats]
    return {"throughput_tok_s": throughput(samples), "throughput_tok_s_repeats": per_repeat,
            "throughput_tok_s_std": statistics.stdev(per_repeat) if len(per_repeat) > 1 and None not in per_repeat
            else None}


def request_times(inputs) -> tuple[list[float], list[float] | None]:
    """Each record's latency and TTFT: an engine's own request times where it records them (per_request_times),
    else the records' latency and prefill (None: a record has no prefill time)."""
    samples = inputs.samples
    text = ENGINE_TEXTS.get(REGISTRY[inputs.point.method].engine)
    per_request = per_request_times(samples, text.request_times) if text and text.request_times else None
    if per_request:
        return per_request
    return [s["latency_s"] for s in samples], None


def latency(inputs) -> dict:
    return {"latency_s": distribution(request_times(inputs)[0])}


def time_per_output_token(inputs) -> dict:
    latencies = request_times(inputs)[0]
    return {"tpot_s": distribution([lat / s["new_tokens"] for s, lat in zip(inputs.samples, latencies)
                                    if s["new_tokens"]])}


def time_to_first_token(inputs) -> dict:
    ttfts = request_times(inputs)[1]
    return {"ttft_s": distribution(ttfts if ttfts is not None else
                                   [s["prefill_s"] for s in inputs.samples if s.get("prefill_s") is not None])}


def prefill_share(inputs) -> dict:
    samples = inputs.samples
    if not samples or any(s.get("prefill_s") is None for s in samples):
        return {"prefill_share": None}
    # a row that ended at its first token carries the batch's draft prefill it never waited for
    return {"prefill_share": ratio(sum(min(s["prefill_s"] + (s.get("draft_prefill_s") or 0.0), s["latency_s"])
                                       for s in samples), sum(s["latency_s"] for s in samples))}


def tokens_per_target_call(inputs) -> dict:
    return {"block_efficiency": block_efficiency(inputs.samples)}


def reference_accepted_tokens(inputs) -> dict:
    """MAT 1.0 for the reference where its forwards are counted (tau: a reference's 1 token a step is a count there,
    not where they are not); a method with rounds has its own (speculation_figures), None meanwhile."""
    counted = REGISTRY[inputs.point.method].is_reference and inputs.metrics.get("block_efficiency") is not None
    return {"mean_accepted_tokens": 1.0 if counted else None}


def draft_time_share(inputs) -> dict:
    """Time drafting / latency; None for an engine that does not time its drafter apart."""
    samples = inputs.samples
    share = ratio(sum(s.get("draft_s") or 0.0 for s in samples), sum(s["latency_s"] for s in samples)) \
        if caps_of(inputs.point.method).times_forwards else None
    return {"draft_time_share": share}


def round_figures(inputs) -> dict:
    """speculation_figures of a fixed-batch point."""
    point = inputs.point
    return speculation_figures(inputs.samples, point.gamma, tree_of(point), REGISTRY[point.method].draft_sources)


def speedups(inputs) -> dict:
    """Each ratio of the point's pairing (fixed batches: the speedup and the decode speedup over the batches both
    finished; a load point: the throughput and TPOT speedups over the requests both served) with its paired
    interval (none for the reference against itself, 1 by definition); None without a baseline."""
    pairing, samples, baseline = inputs.pairing, inputs.samples, inputs.baseline
    reference = REGISTRY[inputs.point.method].is_reference
    out = {}
    for ratio_of in pairing.ratios:
        clusters = paired_clusters(samples, baseline, pairing, ratio_of) if baseline else []
        out[ratio_of.name] = ratio_of_totals(clusters) if clusters else None
        out[ratio_of.name + "_ci95"] = None if reference or not baseline else bootstrap_ci(clusters)
    return out


def outputs_match(inputs) -> dict:
    """exact_match over the units both finished (compares_outputs); the greedy reference is its own (1) where the
    pairing gives it."""
    point, samples, baseline, pairing = inputs.point, inputs.samples, inputs.baseline, inputs.pairing
    if pairing.reference_exact and point.temperature is None and REGISTRY[point.method].is_reference:
        return {"exact_match": 1.0, "mismatches": []}
    if not baseline or not compares_outputs(point):
        return {}
    return exact_match(samples, baseline, pairing) or {}


def batch_costs(inputs) -> dict:
    """cost_figures of a fixed-batch point."""
    return cost_figures(inputs.point, inputs.metrics, inputs.costs, inputs.samples, inputs.baseline, inputs.profile)


def synthetic(inputs) -> dict:
    """A synthetic point's figures (eval/synthetic_acceptance.py) in place of the exact match (accepted at a set alpha,
    its output is not the target's), and its test of the cost model against the throughput ratio."""
    point = inputs.point
    if point.synthetic_acceptance is None:
        return {}
    out = not_the_targets(point, inputs.samples, inputs.metrics)
    return {**out, **synthetic_prediction(point, {**inputs.metrics, **out}, speedup=inputs.pairing.ratios[0].name)}


def accuracy(inputs) -> dict:
    return gsm8k_figures(inputs.samples)
