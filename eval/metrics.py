"""Every figure of the report, computed from the raw records of samples.jsonl (see ../shared/METRICS.md).

A figure that does not exist is None (null in JSON), never NaN, and the notes say why. Every ratio
pairs the same samples: a point's batches with the baseline's runs of the same batches. Eval never
times or decodes; it asks the method registry what a method is, never its name.
"""
from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict

from decode.methods import REGISTRY
from eval.records import AXES, Point
from utils.data import extract_gsm8k_answer

BOOTSTRAP_RESAMPLES = 2000
CI_WIDE = 0.10  # a CI reaching further than +-10% of its figure is flagged
DRIFT_LIMIT = 0.10  # the same probe forward (or the baseline on the same batches) moving by > 10%: drift
COST_SPREAD_LIMIT = 0.25  # (max - min) / median of a cost probe's repetitions
# a verification forward that differs from token-by-token decoding by more than this (max |logit diff|)
# can flip a greedy near-tie: fp32 rounding is ~1e-5, bf16 ~1e-2
NUMERICS_DRIFT = 1e-4

LEGEND = {
    "new_tokens": "N: generated tokens up to and including EOS, no prompt, no padding; counted alike for every method",
    "acceptance_rate": "sum(accepted a_r) / sum(drafted gamma_r) over all rounds of all sequences (rounds drafting 0 add nothing)",
    "alpha": "constant schedule: the alpha solving tau = (1 - alpha^(gamma+1)) / (1 - alpha), tau = block_efficiency; "
             "variable draft lengths: the alpha with sum_r E[a_r | gamma_r] = sum_r a_r, E[a | g] = alpha (1 - alpha^g) / (1 - alpha)",
    "block_efficiency": "tau = N / target forwards, prefill forward and its token included (baseline: 1.0)",
    "mean_accepted_tokens": "MAT = sum(emitted e_r) / rounds R, bonus token included: Spec-Bench's #MAT, what vLLM and "
                            "SGLang call acceptance length (baseline 1.0)",
    "per_position_acceptance": "P(draft i accepted) = rounds with a_r >= i / rounds that drafted at least i",
    "drafted_per_round": "mean drafted tokens per round; zero_draft_rounds: share of rounds that drafted nothing (a plain target step)",
    "latency_s": "per sequence: wall time from its batch's start to its last token, device synchronised",
    "tpot_s": "time per output token: latency / N per sequence",
    "ttft_s": "time to first token: the prefill",
    "throughput_tok_s": "sum(N) / sum(batch wall times)",
    "speedup": "throughput(point) / throughput(baseline) over the batches both finished: same prompts, batch size, "
               "temperature and run",
    "speedup_ci95": "95% paired bootstrap CI over batches: resample the paired batches with replacement, recompute the "
                    "ratio of totals, 2.5th and 97.5th percentiles (2000 resamples, seed 0); null with one batch",
    "decode_speedup": "the same over decode throughput = sum(N - 1) / sum(batch wall - target prefill - draft prefill), "
                      "the part speculation can speed up; decode_speedup_ci95 likewise",
    "prefill_share": "(target prefill + draft prefill) / latency, summed over samples: the part speculation cannot speed up",
    "exact_match": "share of greedy samples whose tokens equal the baseline's; mismatches list where each starts",
    "accuracy": "GSM8K: share of answers (after the last '####', else the last number) equal to the reference; "
                "accuracy_cut: answers cut at max_new_tokens before '####'",
    "draft_cost_ratio_c": "one 1-token draft forward / one 1-token target forward, measured in the run",
    "verify_cost_ratio_v": "one (gamma+1)-token target forward / one 1-token target forward, measured in the run",
    "predicted_speedup": "(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma*c + v)); predicted_speedup_v1 uses v = 1 "
                         "(Leviathan Thm 3.8); constant schedules with measured costs only",
    "efficiency": "measured speedup / predicted speedup; decode_efficiency: decode speedup / predicted speedup",
    "status": "ok; partial: fewer batches than planned (a failure or an interruption): its ratios pair only the batches "
              "it has, and it takes no part in best gamma; failed; skipped",
    "flags": f"a figure that cannot be trusted as it is: ci_wide (CI beyond +-{CI_WIDE:.0%} of the speedup), drift (the "
             f"same 1-token target forward, timed before every batch, or the baseline on the same batches, moved by > "
             f"{DRIFT_LIMIT:.0%}), cost_unstable (a cost probe's repetitions spread > {COST_SPREAD_LIMIT:.0%} of their "
             f"median), cost_implausible (v < 1 or c > 1), possible_bug (greedy mismatch while the numerics probe shows "
             f"no drift above {NUMERICS_DRIFT:g}); marked '!' in the tables",
    "group": "dataset.group_by's value (null: overall); at batch size > 1 a group's batch wall is its slowest row of "
             "that group in the batch",
}


# ---- small pieces ---------------------------------------------------------------------------------

def finite(value):
    """None for a figure that does not exist (NaN, inf, None)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value


def ratio(numerator, denominator):
    if numerator is None or not denominator:
        return None
    return finite(numerator / denominator)


def percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"mean": statistics.fmean(values), "p50": percentile(values, .5), "p90": percentile(values, .9),
            "p99": percentile(values, .99)}


def solve_alpha(tau: float, gamma: int) -> float:
    """The alpha in [0, 1] with (1 - alpha^(gamma+1)) / (1 - alpha) = tau (bisection; the left side grows with alpha)."""
    if tau <= 1.0:
        return 0.0
    if tau >= gamma + 1:
        return 1.0
    return _bisect(lambda a: sum(a ** i for i in range(gamma + 1)) - tau)


def expected_accepted(alpha: float, drafted: int) -> float:
    """E[accepted prefix length] of `drafted` drafts, each accepted with probability alpha given the ones before."""
    return sum(alpha ** i for i in range(1, drafted + 1))


def solve_alpha_rounds(rounds: list[dict]) -> float | None:
    """Variable draft lengths: the alpha with sum_r E[a_r | gamma_r, alpha] = sum_r a_r."""
    drafted = [r["drafted"] for r in rounds if r["drafted"] > 0]
    accepted = sum(r["accepted"] for r in rounds if r["drafted"] > 0)
    if not drafted:
        return None
    if accepted <= 0:
        return 0.0
    if accepted >= sum(drafted):
        return 1.0
    return _bisect(lambda a: sum(expected_accepted(a, g) for g in drafted) - accepted)


def _bisect(f) -> float:
    low, high = 0.0, 1.0
    for _ in range(100):
        mid = (low + high) / 2
        if f(mid) < 0:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def predicted_speedup(alpha: float, gamma: int, c: float, v: float) -> float:
    expected_tokens = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return expected_tokens / (gamma * c + v)


def unit_of(sample: dict) -> tuple:
    """A point's batch: (repeat, batch_index)."""
    return sample.get("repeat", 0), sample["batch_index"]


def units(samples: list[dict]) -> dict[tuple, list[dict]]:
    by_unit: dict[tuple, list[dict]] = defaultdict(list)
    for s in samples:
        by_unit[unit_of(s)].append(s)
    return by_unit


def decode_elapsed(s: dict) -> float | None:
    if s.get("prefill_s") is None:
        return None
    return s["latency_s"] - s["prefill_s"] - (s.get("draft_prefill_s") or 0.0)


def unit_totals(batch: list[dict]) -> dict:
    """One batch: tokens and wall (its slowest row), and the same after both prefills (None where unmeasured)."""
    decode = [decode_elapsed(s) for s in batch]
    return {"tokens": sum(s["new_tokens"] for s in batch), "wall": max(s["latency_s"] for s in batch),
            "decode_tokens": sum(max(s["new_tokens"] - 1, 0) for s in batch),
            "decode_wall": None if any(d is None for d in decode) else max(decode)}


def throughput(samples: list[dict]) -> float | None:
    """sum(N) / sum(batch wall times), a batch's wall being its slowest row's latency."""
    totals = [unit_totals(b) for b in units(samples).values()]
    return ratio(sum(t["tokens"] for t in totals), sum(t["wall"] for t in totals))


def decode_throughput(samples: list[dict]) -> float | None:
    totals = [unit_totals(b) for b in units(samples).values()]
    if not totals or any(t["decode_wall"] is None for t in totals):
        return None
    return ratio(sum(t["decode_tokens"] for t in totals), sum(t["decode_wall"] for t in totals))


def block_efficiency(samples: list[dict]) -> float | None:
    if any(s.get("target_forwards") is None for s in samples):
        return None  # the peers do not count their forwards
    return ratio(sum(s["new_tokens"] for s in samples), sum(s["target_forwards"] for s in samples))


# ---- pairing and the bootstrap --------------------------------------------------------------------

def paired_totals(samples: list[dict], baseline: list[dict], decode: bool = False) -> list[tuple]:
    """Per batch both finished: (point tokens, point wall, baseline tokens, baseline wall)."""
    mine, theirs = units(samples), units(baseline)
    pairs = []
    for key in sorted(set(mine) & set(theirs)):
        a, b = unit_totals(mine[key]), unit_totals(theirs[key])
        if decode:
            if a["decode_wall"] is None or b["decode_wall"] is None:
                return []
            pairs.append((a["decode_tokens"], a["decode_wall"], b["decode_tokens"], b["decode_wall"]))
        else:
            pairs.append((a["tokens"], a["wall"], b["tokens"], b["wall"]))
    return pairs


def ratio_of_totals(pairs: list[tuple]) -> float | None:
    tokens, wall, base_tokens, base_wall = (sum(p[i] for p in pairs) for i in range(4))
    return ratio(ratio(tokens, wall), ratio(base_tokens, base_wall))


def bootstrap_ci(pairs: list[tuple], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> list[float] | None:
    """95% paired bootstrap CI of the ratio of totals over batches; None with fewer than two batches."""
    if len(pairs) < 2:
        return None
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        value = ratio_of_totals([pairs[rng.randrange(len(pairs))] for _ in pairs])
        if value is not None:
            values.append(value)
    if not values:
        return None
    return [percentile(values, 0.025), percentile(values, 0.975)]


# ---- figures of one run -----------------------------------------------------------------------------

def speculation_figures(samples: list[dict], gamma: int | None, constant: bool) -> dict:
    """Acceptance figures from the rounds; every one None when there were no rounds (or none drafted)."""
    rounds = [r for s in samples for r in s.get("rounds") or []]
    figures = dict.fromkeys(["rounds", "acceptance_rate", "mean_accepted_tokens", "alpha", "per_position_acceptance",
                             "accepted_histogram", "drafted_per_round", "zero_draft_rounds"])
    if not rounds:
        figures["rounds"] = 0
        return figures
    drafted = [r["drafted"] for r in rounds]
    accepted = [r["accepted"] for r in rounds]
    longest = max(max(drafted), gamma or 0)
    figures.update(
        rounds=len(rounds),
        mean_accepted_tokens=sum(r["emitted"] for r in rounds) / len(rounds),
        drafted_per_round=sum(drafted) / len(rounds),
        zero_draft_rounds=sum(d == 0 for d in drafted) / len(rounds),
        accepted_histogram=[sum(a == k for a in accepted) for k in range(longest + 1)],
    )
    if sum(drafted):
        figures["acceptance_rate"] = sum(accepted) / sum(drafted)
        figures["per_position_acceptance"] = [
            ratio(sum(a >= i for a, d in zip(accepted, drafted) if d >= i), sum(d >= i for d in drafted))
            for i in range(1, longest + 1)]
        if constant and gamma:
            tau = block_efficiency(samples)
            figures["alpha"] = None if tau is None else solve_alpha(tau, gamma)
        else:
            figures["alpha"] = solve_alpha_rounds(rounds)
    return figures


def gsm8k_figures(samples: list[dict]) -> dict:
    graded = [s for s in samples if s.get("reference") is not None and s.get("preset") == "gsm8k"]
    if not graded:
        return {}
    right = sum(extract_gsm8k_answer(s.get("output_text", "")) == extract_gsm8k_answer(s["reference"]) for s in graded)
    cut = sum(s.get("stop_reason") == "length" and "####" not in (s.get("output_text") or "") for s in graded)
    return {"accuracy": right / len(graded), "accuracy_cut": cut, "accuracy_graded": len(graded)}


def exact_match(samples: list[dict], baseline: list[dict]) -> dict | None:
    reference = {(s.get("repeat", 0), s["sample_id"]): s["output_ids"] for s in baseline}
    pairs = [(s, reference.get((s.get("repeat", 0), s["sample_id"]))) for s in samples]
    pairs = [(s, ref) for s, ref in pairs if ref is not None]
    if not pairs:
        return None
    mismatches = []
    for s, ref in pairs:
        if s["output_ids"] != ref:
            first = next((i for i, (a, b) in enumerate(zip(s["output_ids"], ref)) if a != b),
                         min(len(s["output_ids"]), len(ref)))
            mismatches.append({"sample_id": s["sample_id"], "repeat": s.get("repeat", 0), "first_mismatch": first})
    return {"exact_match": 1 - len(mismatches) / len(pairs), "mismatches": mismatches}


def run_metrics(point: Point, samples: list[dict], baseline: list[dict] | None, costs: dict | None) -> dict:
    spec = REGISTRY[point.method]
    latencies = [s["latency_s"] for s in samples]
    metrics = {
        "samples": len(samples),
        "new_tokens": sum(s["new_tokens"] for s in samples),
        "latency_s": distribution(latencies),
        "tpot_s": distribution([s["latency_s"] / s["new_tokens"] for s in samples if s["new_tokens"]]),
        "ttft_s": distribution([s["prefill_s"] for s in samples if s.get("prefill_s") is not None]),
        "throughput_tok_s": throughput(samples),
        "block_efficiency": block_efficiency(samples),
        "mean_accepted_tokens": 1.0 if spec.is_reference else None,
        "prefill_share": None,
    }
    repeats = sorted({s.get("repeat", 0) for s in samples})
    per_repeat = [throughput([s for s in samples if s.get("repeat", 0) == r]) for r in repeats]
    metrics["throughput_tok_s_repeats"] = per_repeat
    metrics["throughput_tok_s_std"] = statistics.stdev(per_repeat) if len(per_repeat) > 1 and None not in per_repeat else None
    if all(s.get("prefill_s") is not None for s in samples):
        metrics["prefill_share"] = ratio(sum(s["prefill_s"] + (s.get("draft_prefill_s") or 0.0) for s in samples),
                                         sum(latencies))
    if spec.has_rounds:
        metrics.update(speculation_figures(samples, point.gamma, (point.schedule or "constant") == "constant"))
        metrics["draft_time_share"] = ratio(sum(s.get("draft_s") or 0.0 for s in samples), sum(latencies))
    if baseline is not None:
        pairs = paired_totals(samples, baseline)
        decode_pairs = paired_totals(samples, baseline, decode=True)
        metrics["speedup"] = ratio_of_totals(pairs) if pairs else None
        metrics["decode_speedup"] = ratio_of_totals(decode_pairs) if decode_pairs else None
        # the baseline against itself is 1 by definition: no interval to claim
        metrics["speedup_ci95"] = None if spec.is_reference else bootstrap_ci(pairs)
        metrics["decode_speedup_ci95"] = None if spec.is_reference else bootstrap_ci(decode_pairs)
        if point.temperature is None and not spec.is_reference:
            paired_keys = {k for k in units(samples)} & {k for k in units(baseline)}
            match = exact_match([s for s in samples if unit_of(s) in paired_keys], baseline)
            if match is not None:
                metrics.update(match)
    if point.temperature is None and spec.is_reference:
        metrics["exact_match"], metrics["mismatches"] = 1.0, []
    metrics.update(gsm8k_figures(samples))
    metrics.update(cost_figures(point, metrics, costs))
    return metrics


def cost_figures(point: Point, metrics: dict, costs: dict | None) -> dict:
    """c, v and the predicted speedup, where Leviathan's model applies: a constant schedule, measured costs."""
    out = dict.fromkeys(["draft_cost_ratio_c", "verify_cost_ratio_v", "predicted_speedup", "predicted_speedup_v1",
                         "efficiency", "decode_efficiency"])
    if not REGISTRY[point.method].has_rounds or not costs or point.gamma is None:
        return out
    c = (costs.get("c_by_draft") or {}).get(point.draft, costs.get("c") if point.draft else None)
    v = (costs.get("v") or {}).get(str(point.gamma))
    out["draft_cost_ratio_c"], out["verify_cost_ratio_v"] = c, v
    alpha = metrics.get("alpha")
    if c is None or v is None or alpha is None or (point.schedule or "constant") != "constant":
        return out
    out["predicted_speedup"] = predicted_speedup(alpha, point.gamma, c, v)
    out["predicted_speedup_v1"] = predicted_speedup(alpha, point.gamma, c, 1.0)
    out["efficiency"] = ratio(metrics.get("speedup"), out["predicted_speedup"])
    out["decode_efficiency"] = ratio(metrics.get("decode_speedup"), out["predicted_speedup"])
    return out


# ---- flags ------------------------------------------------------------------------------------------

def spread(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else None


def drift_of(progress: dict, batch_size: int) -> float | None:
    """How far the drift probe moved during this batch size's runs: max / min - 1 over its readings."""
    probes = ((progress.get("drift") or {}).get(str(batch_size)) or {}).get("probes_s") or []
    probes = [p for p in probes if p and p > 0]
    if len(probes) < 2:
        return None
    return max(probes) / min(probes) - 1


def flags_of(point: Point, metrics: dict, baseline: list[dict] | None, costs: dict | None, progress: dict,
             numerics_drift: float | None) -> list[dict]:
    flags = []
    spec = REGISTRY[point.method]
    speedup, interval = metrics.get("speedup"), metrics.get("speedup_ci95")
    if speedup and interval and (interval[0] < speedup * (1 - CI_WIDE) or interval[1] > speedup * (1 + CI_WIDE)):
        flags.append({"code": "ci_wide", "message": f"the speedup's 95% CI [{interval[0]:.3f}, {interval[1]:.3f}] reaches "
                      f"beyond +-{CI_WIDE:.0%} of {speedup:.3f}: more prompts or repeats (repeats: auto) would narrow it"})
    moved = drift_of(progress, point.batch_size)
    if moved is not None and moved > DRIFT_LIMIT:
        flags.append({"code": "drift", "message": f"the machine changed speed during the run: the same 1-token target "
                      f"forward, timed before every batch, varied by {moved:.0%}"})
    if spec.is_reference and baseline is not None:
        repeats = metrics.get("throughput_tok_s_repeats") or []
        if len(repeats) > 1 and None not in repeats and min(repeats) > 0 and max(repeats) / min(repeats) - 1 > DRIFT_LIMIT:
            flags.append({"code": "drift", "message": f"the baseline's tok/s on the same batches moved by "
                          f"{max(repeats) / min(repeats) - 1:.0%} between repeats"})
    if spec.has_rounds and costs:
        for name, values in (costs.get("reps_s") or {}).items():
            value = spread(values)
            if value is not None and value > COST_SPREAD_LIMIT:
                flags.append({"code": "cost_unstable", "message": f"cost probe {name}: its repetitions spread over "
                              f"{value:.0%} of their median, so c and v (and the prediction) are uncertain"})
                break
        c, v = metrics.get("draft_cost_ratio_c"), metrics.get("verify_cost_ratio_v")
        if (v is not None and v < 1) or (c is not None and c > 1):
            flags.append({"code": "cost_implausible", "message": f"c = {c if c is None else round(c, 3)}, v = "
                          f"{v if v is None else round(v, 3)}: a (gamma+1)-token forward cheaper than a 1-token one, or a "
                          "draft dearer than the target, is implausible on these shapes; check the 1-token forward's "
                          "kernel path first (the baseline decodes at M = 1)"})
    exact = metrics.get("exact_match")
    if exact is not None and exact < 1.0 and (numerics_drift is None or numerics_drift <= NUMERICS_DRIFT):
        flags.append({"code": "possible_bug", "message": f"greedy output differs from the baseline in "
                      f"{len(metrics.get('mismatches') or [])} sample(s) while the numerics probe shows no drift above "
                      f"{NUMERICS_DRIFT:g} ({numerics_drift}): a near-tie can still flip a token, but check the first "
                      "mismatch"})
    return flags


def numerics_drift(numerics: dict | None, point: Point) -> float | None:
    """The largest drift the numerics probe measured for the models this point uses."""
    if not numerics:
        return None
    probes = [numerics.get("target") or {}]
    if point.draft is not None:
        probes.append((numerics.get("drafts") or {}).get(point.draft) or {})
    values = [p.get(key) for p in probes for key in ("verify_vs_stepwise_max_logit_diff", "batched_vs_single_max_logit_diff")
              if p.get(key) is not None]
    return max(values) if values else None


# ---- the summary --------------------------------------------------------------------------------------

def point_order(point: Point) -> tuple:
    methods = list(REGISTRY)
    return (point.temperature is not None, point.temperature or 0, point.batch_size,
            not REGISTRY[point.method].is_reference, methods.index(point.method), point.draft or "",
            point.gamma or 0, point.schedule or "", point.exit_layer or 0)


def summarize(samples: list[dict], progress: dict | None = None) -> dict:
    """All figures per run (a point, overall and per group) from the raw records and progress.json."""
    progress = progress or {}
    by_point: dict[Point, list[dict]] = defaultdict(list)
    for s in samples:
        by_point[Point.of(s)].append(s)
    failures = {Point.of(f): f for f in progress.get("failures") or []}
    reference = next(name for name, spec in REGISTRY.items() if spec.is_reference)
    baselines = {p.comparison: group for p, group in by_point.items() if p.method == reference}
    planned = progress.get("planned") or {}
    group_by = progress.get("group_by")
    notes = list(progress.get("notes") or [])
    runs = []
    for point in sorted(set(by_point) | set(failures), key=point_order):
        group_samples = by_point.get(point, [])
        failure = failures.get(point)
        if not group_samples:
            runs.append({**_axes(point), "group": None, "label": point.label, "status": failure["status"],
                         "error": failure["error"], "batches": {"done": 0, "paired": 0, "planned": planned.get(point.label)},
                         "flags": [], "metrics": {}})
            continue
        baseline = baselines.get(point.comparison)
        costs = (progress.get("costs") or {}).get(str(point.batch_size))
        drift = numerics_drift(progress.get("numerics"), point)
        groups = [None] + (sorted({s.get("group") for s in group_samples if s.get("group") is not None})
                           if group_by else [])
        for group in groups:
            mine = [s for s in group_samples if group is None or s.get("group") == group]
            theirs = None if baseline is None else [s for s in baseline if group is None or s.get("group") == group]
            metrics = run_metrics(point, mine, theirs, costs)
            done = len(units(mine))
            paired = len(set(units(mine)) & set(units(theirs or [])))
            expected = planned.get(point.label)
            status = "ok"
            if failure is not None or (expected is not None and group is None and done < expected):
                status = "partial"
            run = {**_axes(point), "group": group, "label": point.label, "status": status,
                   "batches": {"done": done, "paired": paired, "planned": expected if group is None else None},
                   "flags": flags_of(point, metrics, theirs, costs, progress, drift), "metrics": metrics}
            if failure is not None:
                run["error"] = failure["error"]
            runs.append(run)
            if group is None:
                notes.extend(_notes_for(run, point, metrics, drift))
    summary = {"runs": runs, "best": best_points(runs, progress.get("costs") or {}), "legend": LEGEND, "notes": notes,
               "groups": sorted({r["group"] for r in runs if r["group"] is not None})}
    for key in ("numerics", "memory", "workers", "prompts", "order", "status", "group_by"):
        if key in progress:
            summary[key] = progress[key]
    return summary


def _axes(point: Point) -> dict:
    return {axis: getattr(point, axis) for axis in AXES}


def _notes_for(run: dict, point: Point, metrics: dict, drift: float | None) -> list[str]:
    notes = []
    label = point.label
    if REGISTRY[point.method].has_rounds and not metrics.get("rounds"):
        notes.append(f"{label}: no speculation rounds (every row ended at its first token): acceptance, alpha and the "
                     "prediction are null")
    elif REGISTRY[point.method].has_rounds and metrics.get("acceptance_rate") is None:
        notes.append(f"{label}: no round drafted a token: acceptance, alpha and the prediction are null")
    if "speedup" in metrics and metrics["speedup"] is not None and metrics.get("speedup_ci95") is None \
            and not REGISTRY[point.method].is_reference:
        notes.append(f"{label}: one batch only: no confidence interval (more prompts or repeats give one)")
    if run["status"] == "partial":
        b = run["batches"]
        notes.append(f"{label}: partial ({b['done']} of {b['planned']} batches): its ratios pair only those batches")
    exact = metrics.get("exact_match")
    if exact is not None and exact < 1.0 and drift is not None and drift > NUMERICS_DRIFT:
        first = sorted(m["first_mismatch"] for m in metrics.get("mismatches") or [])
        notes.append(f"{label}: exact match {exact:.3f} (mismatches start at tokens {first}) is explained by the numerics "
                     f"probe: a multi-token forward differs from token-by-token decoding by up to {drift:.2g} in the "
                     "logits for these models (dtype, quantization or kernels), enough to flip a greedy near-tie")
    cut, graded = metrics.get("accuracy_cut"), metrics.get("accuracy_graded")
    if cut and graded and cut * 2 >= graded:
        notes.append(f"{label}: {cut} of {graded} GSM8K answers were cut at max_new_tokens before '####': the accuracy "
                     f"{metrics['accuracy']:.3f} measures cut-off answers, not the model; raise generation.max_new_tokens")
    for flag in run["flags"]:
        notes.append(f"{label}: flagged {flag['code']}: {flag['message']}")
    return notes


def best_points(runs: list[dict], costs: dict) -> dict:
    """Per comparison (batch size, temperature): the best measured point of each method (status ok only), and for
    constant-schedule draft-model points the gamma the measured alpha, c and v predict best."""
    best: dict[str, dict] = {}
    for run in runs:
        if run["status"] != "ok" or run["group"] is not None or REGISTRY[run["method"]].is_reference:
            continue
        if run["metrics"].get("speedup") is None:
            continue
        key = f"batch={run['batch_size']} " + ("greedy" if run["temperature"] is None else f"T={run['temperature']}")
        entry = best.setdefault(key, {})
        current = entry.get(run["method"])
        if current is None or run["metrics"]["speedup"] > current["speedup"]:
            entry[run["method"]] = {"label": run["label"], "gamma": run["gamma"], "speedup": run["metrics"]["speedup"],
                                    "speedup_ci95": run["metrics"].get("speedup_ci95"), "flagged": bool(run["flags"])}
    for key, entry in best.items():
        for method, chosen in entry.items():
            run = next(r for r in runs if r["label"] == chosen["label"] and r["group"] is None)
            cost = costs.get(str(run["batch_size"])) or {}
            alpha = run["metrics"].get("alpha")
            if (run["schedule"] or "constant") != "constant" or not cost.get("v") or alpha is None or run["gamma"] is None:
                continue
            c = (cost.get("c_by_draft") or {}).get(run["draft"], cost.get("c"))
            if c is None:
                continue
            swept = {r["gamma"] for r in runs if r["method"] == method and r["draft"] == run["draft"]
                     and r["batch_size"] == run["batch_size"] and r["group"] is None}
            candidates = {g: predicted_speedup(alpha, g, c, cost["v"][str(g)]) for g in swept if str(g) in cost["v"]}
            if candidates:
                g_best = max(candidates, key=candidates.get)
                chosen.update(predicted_best_gamma=g_best, predicted_best_speedup=candidates[g_best], alpha_used=alpha)
    return best
