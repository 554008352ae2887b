"""Every figure of the report, computed from the raw records of samples.jsonl (see ../shared/METRICS.md).

A figure that does not exist is None (null in JSON), never NaN, and the notes say why. Every ratio
pairs the same samples: a point's batches with the baseline's runs of the same batches. Eval never
times or decodes; it asks the method registry what a method is, never its name.

Read top to bottom: small pieces, Leviathan's model, batches and throughput, pairing and the bootstrap,
the figures of one run, flags, notes, the summary, the best points.
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
BOOTSTRAP_SEED = 0
# a speedup whose 95% CI reaches further than +-10% of it is flagged: at that width two points a few
# percent apart cannot be ranked, and the best gamma is a guess
CI_WIDE = 0.10
# the same 1-token target forward (the drift probe), or the baseline on the same batches, moving by more than
# 10%: the machine changed speed (thermal throttling, clocks, another process) by more than most effects measured
DRIFT_LIMIT = 0.10
# (max - min) / median of a cost probe's repetitions. c and v are medians of interleaved repetitions, so one
# slow repetition does not move them; repetitions spread over a quarter of their median mean the machine was
# not steady while the probe ran (each repetition is the same forward), and then the medians are not either
COST_SPREAD_LIMIT = 0.25
# the numerics probe: max |logit diff| of a multi-token (or ragged batched) target forward against token-by-
# token decoding. fp32 reduction-order noise measures ~1e-5 (docs/sample-report: 3e-5); bf16/fp16 or TF32
# kernels measure 1e-3..1e-1. Above this, a greedy near-tie can flip without any bug
NUMERICS_DRIFT = 1e-4
# GSM8K: the accuracy means nothing when more than half the answers were cut before '####'
CUT_MAJORITY = 0.5

LEGEND = {
    "status": "ok: every planned batch measured; partial: fewer batches than planned (a failure or an interruption): "
              "marked 'partial done/planned' in the tables and hollow in the plots, its ratios pair only the batches "
              "it has, and it takes no part in best; failed / skipped: not measured (the error says why)",
    "batches": "a batch is one (repeat, batch_index) of a point; done: measured, paired: also measured by the "
               "baseline (every ratio uses only these), planned: what the sweep planned",
    "samples": "sequences measured (rows of samples.jsonl)",
    "new_tokens": "N: generated tokens up to and including EOS, no prompt, no padding; counted alike for every method",
    "throughput_tok_s": "sum(N) / sum(batch wall times), a batch's wall time being its slowest row's latency; "
                        "throughput_tok_s_repeats: the same per repeat, throughput_tok_s_std their standard deviation",
    "speedup": "throughput(point) / throughput(baseline) over the batches both finished: same prompts, batch size, "
               "temperature and run (the ratio of total tokens over total wall, not a mean of ratios)",
    "speedup_ci95": f"95% paired bootstrap CI: resample the paired batches with replacement (each carries the point's "
                    f"and the baseline's tokens and wall, measured back to back), recompute the ratio of totals, take "
                    f"the 2.5th and 97.5th percentiles ({BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED}: a "
                    "rebuild gives the same numbers); null with one paired batch: there is no interval. Tables print "
                    "'speedup [lo, hi]', plots draw it as error bars",
    "decode_speedup": "the same over decode throughput = sum(N - 1) / sum(batch wall - target prefill - draft prefill), "
                      "the part speculation can speed up; decode_speedup_ci95 likewise; null for methods timed per "
                      "batch only (no prefill time)",
    "latency_s": "per sequence: wall time from its batch's start to its last token, device synchronised; mean, p50, "
                 "p90, p99",
    "tpot_s": "time per output token: latency / N per sequence",
    "ttft_s": "time to first token: the prefill",
    "prefill_share": "(target prefill + draft prefill) / latency, summed over samples: the part speculation cannot "
                     "speed up",
    "draft_time_share": "time spent drafting / latency, summed over samples",
    "block_efficiency": "tau = N / target forwards, the prefill forward and its token included: mean tokens per "
                        "target call (baseline 1.0)",
    "mean_accepted_tokens": "MAT = sum(emitted e_r) / rounds R, the correction or bonus token included: what vLLM and "
                            "SGLang call acceptance length, Spec-Bench's #MAT (baseline 1.0)",
    "rounds": "R: speculation rounds (target verification forwards after the prefill), all sequences",
    "acceptance_rate": "sum(accepted a_r) / sum(drafted gamma_r) over all rounds of all sequences; rounds that "
                       "drafted nothing add nothing; null when no round drafted a token",
    "per_position_acceptance": "P(draft i accepted) = rounds with a_r >= i / rounds that drafted at least i; "
                               "unconditional (not given that draft i-1 was accepted). With a constant draft length "
                               "and no round cut by max_new_tokens it is count_i / rounds",
    "accepted_histogram": "rounds with a_r = 0, 1, ..., gamma, over the rounds that drafted at least one token",
    "constant_draft_length": "true when every round drafted gamma, but for rounds cut by the max_new_tokens budget "
                             "(the engine drafts at most max_new_tokens - generated - 1): then Leviathan's model applies",
    "drafted_per_round": "mean drafted tokens per round; zero_draft_rounds: share of rounds that drafted nothing (a "
                         "plain target step)",
    "alpha": "constant draft length (every round drafted gamma, but for rounds cut by the max_new_tokens budget): "
             "the alpha solving tau = (1 - alpha^(gamma+1)) / (1 - alpha), tau = block_efficiency (METRICS.md); "
             "variable draft lengths (a schedule, prompt lookup without a match): the alpha with sum_r E[a_r | "
             "gamma_r, alpha] = sum_r a_r, E[a | g, alpha] = alpha (1 - alpha^g) / (1 - alpha), which is Leviathan's "
             "expectation round by round; null when no round drafted a token",
    "draft_cost_ratio_c": "one 1-token draft forward / one 1-token target forward, medians of interleaved "
                          "repetitions measured in the run at this batch size",
    "verify_cost_ratio_v": "one (gamma+1)-token target forward / one 1-token target forward, measured likewise",
    "predicted_speedup": "(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma*c + v)); predicted_speedup_v1 uses v = 1 "
                         "(Leviathan et al. 2023, Thm 3.8). Only where the model applies: a constant draft length, a "
                         "draft model, c and v measured; else null and the notes say why",
    "efficiency": "measured speedup / predicted speedup: how close the implementation comes to the algorithm's limit; "
                  "decode_efficiency: decode speedup / predicted speedup",
    "exact_match": "greedy only: share of samples whose tokens equal the baseline's on the same prompt and repeat; "
                   "mismatches list where each starts (first_mismatch, a token index)",
    "accuracy": "GSM8K: share of answers (after the last '####', else the last number) equal to the reference; "
                "accuracy_cut: answers cut at max_new_tokens before '####' (of accuracy_graded); when more than half "
                "are cut the notes say the accuracy is not meaningful",
    "flags": f"a figure that cannot be trusted as it is, kept and marked '!' in the tables and plots, the notes say "
             f"why: ci_wide: the speedup's CI reaches beyond +-{CI_WIDE:.0%} of it; drift: the same 1-token target "
             f"forward (timed by the same probe through the batch size's points) or the baseline's tok/s on the same "
             f"batches in different repeats moved by more than {DRIFT_LIMIT:.0%} (max / min - 1); cost_unstable: a "
             f"cost probe this point uses has repetitions spread over (max - min) / median > {COST_SPREAD_LIMIT:.0%}; "
             f"cost_implausible: v < 1 or c > 1; possible_bug: greedy output differs from the baseline while the "
             f"target's numerics probe shows no drift above {NUMERICS_DRIFT:g} in max |logit diff| (fp32 rounding is "
             f"~1e-5); a mismatch above it is explained in the notes instead",
    "group": "dataset.group_by's value; null: the overall run. At batch size 1 a group's figures are exact; at batch "
             "size > 1 rows of different groups share a batch, and a group's batch wall time is its slowest row of "
             "that group in the batch",
    "best": "per batch size and temperature: each method's point with the highest measured speedup among status ok "
            "points (flagged ones included and marked), and for a constant draft length with measured costs the "
            "gamma that the measured alpha, c and v predict best among the gammas swept",
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
    """Linear interpolation between the closest ranks (numpy's default)."""
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


def strict(obj, where: str = "", replaced: list[str] | None = None):
    """A copy of obj with every NaN or infinity replaced by None (strict JSON); their paths go to `replaced`."""
    if isinstance(obj, float) and not math.isfinite(obj):
        if replaced is not None:
            replaced.append(where or "(top)")
        return None
    if isinstance(obj, dict):
        return {k: strict(v, f"{where}.{k}" if where else str(k), replaced) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v, f"{where}[{i}]", replaced) for i, v in enumerate(obj)]
    return obj


# ---- Leviathan's model ------------------------------------------------------------------------------

def solve_alpha(tau: float, gamma: int) -> float:
    """The alpha in [0, 1] with (1 - alpha^(gamma+1)) / (1 - alpha) = 1 + alpha + ... + alpha^gamma = tau."""
    if tau <= 1.0:
        return 0.0
    if tau >= gamma + 1:
        return 1.0
    return _bisect(lambda a: sum(a ** i for i in range(gamma + 1)) - tau)


def expected_accepted(alpha: float, drafted: int) -> float:
    """E[accepted prefix length] of `drafted` drafts, each accepted with probability alpha given the ones before:
    alpha + alpha^2 + ... + alpha^drafted = alpha (1 - alpha^drafted) / (1 - alpha)."""
    return sum(alpha ** i for i in range(1, drafted + 1))


def solve_alpha_rounds(rounds: list[dict]) -> float | None:
    """Variable draft lengths: the alpha with sum_r E[a_r | gamma_r, alpha] = sum_r a_r (rounds drafting 0 add 0 = 0)."""
    drafted = [r["drafted"] for r in rounds if r["drafted"] > 0]
    accepted = sum(r["accepted"] for r in rounds if r["drafted"] > 0)
    if not drafted:
        return None
    if accepted <= 0:
        return 0.0
    if accepted >= sum(drafted):
        return 1.0
    return _bisect(lambda a: sum(expected_accepted(a, g) for g in drafted) - accepted)


def _bisect(increasing) -> float:
    """The root in [0, 1] of a function that grows with its argument."""
    low, high = 0.0, 1.0
    for _ in range(100):
        mid = (low + high) / 2
        if increasing(mid) < 0:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def predicted_speedup(alpha: float, gamma: int, c: float, v: float) -> float | None:
    """Expected tokens per round over the cost of a round in 1-token target forwards."""
    expected_tokens = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return ratio(expected_tokens, gamma * c + v)


# ---- batches and throughput ---------------------------------------------------------------------------

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
    if not samples or any(s.get("target_forwards") is None for s in samples):
        return None  # the peers do not count their forwards
    return ratio(sum(s["new_tokens"] for s in samples), sum(s["target_forwards"] for s in samples))


# ---- pairing and the bootstrap --------------------------------------------------------------------

def paired_totals(samples: list[dict], baseline: list[dict], decode: bool = False) -> list[tuple]:
    """Per batch both finished, in (repeat, batch_index) order: (point tokens, point wall, baseline tokens,
    baseline wall). Empty when decode=True and either side has no prefill time."""
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
    """(sum tokens / sum wall of the point) / (sum tokens / sum wall of the baseline)."""
    tokens, wall, base_tokens, base_wall = (sum(p[i] for p in pairs) for i in range(4))
    return ratio(ratio(tokens, wall), ratio(base_tokens, base_wall))


def bootstrap_ci(pairs: list[tuple], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
                 ) -> list[float] | None:
    """95% paired bootstrap CI of the ratio of totals over batches; None with fewer than two batches.

    Each resample draws len(pairs) batches with replacement; a batch carries both sides, so the pairing holds.
    Seeded: the same pairs give the same interval on every rebuild."""
    if len(pairs) < 2:
        return None
    rng = random.Random(seed)
    values = []
    for _ in range(resamples):
        value = ratio_of_totals(rng.choices(pairs, k=len(pairs)))
        if value is not None:
            values.append(value)
    if not values:
        return None
    return [percentile(values, 0.025), percentile(values, 0.975)]


# ---- the figures of one run -----------------------------------------------------------------------------

def constant_draft_length(samples: list[dict], gamma: int | None) -> bool:
    """Whether every round drafted gamma, but for rounds cut by the max_new_tokens budget.

    The engine drafts min(gamma, max_new_tokens - generated - 1) at most, generated counting the prefill's
    token. A round drafting g < gamma after `generated` tokens is such a cut only if max_new_tokens =
    generated + g + 1: every short round of the point must imply the same max_new_tokens, which no row exceeds
    (and which a row stopped at "length" reached). Anything else is a variable draft length."""
    if not gamma:
        return False
    implied = set()
    for s in samples:
        generated = 1  # the prefill's token
        for r in s.get("rounds") or []:
            if r["drafted"] != gamma:
                implied.add(generated + r["drafted"] + 1)
            generated += r["emitted"]
    if not implied:
        return True
    if len(implied) > 1:
        return False
    budget = implied.pop()
    reached = {s["new_tokens"] for s in samples if s.get("stop_reason") == "length"}
    return all(s["new_tokens"] <= budget for s in samples) and reached <= {budget}


def speculation_figures(samples: list[dict], gamma: int | None) -> dict:
    """Acceptance figures from the rounds; those of drafted tokens None when no round drafted one."""
    rounds = [r for s in samples for r in s.get("rounds") or []]
    figures = dict.fromkeys(["rounds", "acceptance_rate", "mean_accepted_tokens", "alpha", "per_position_acceptance",
                             "accepted_histogram", "drafted_per_round", "zero_draft_rounds", "constant_draft_length"])
    figures["rounds"] = len(rounds)
    if not rounds:
        return figures
    drafted = [r["drafted"] for r in rounds]
    accepted = [r["accepted"] for r in rounds]
    figures.update(
        mean_accepted_tokens=sum(r["emitted"] for r in rounds) / len(rounds),
        drafted_per_round=sum(drafted) / len(rounds),
        zero_draft_rounds=sum(d == 0 for d in drafted) / len(rounds),
    )
    if not sum(drafted):
        return figures
    longest = max(max(drafted), gamma or 0)
    constant = constant_draft_length(samples, gamma)
    figures["constant_draft_length"] = constant
    figures["acceptance_rate"] = sum(accepted) / sum(drafted)
    figures["per_position_acceptance"] = [
        ratio(sum(a >= i for a, d in zip(accepted, drafted) if d >= i), sum(d >= i for d in drafted))
        for i in range(1, longest + 1)]
    figures["accepted_histogram"] = [sum(a == k for a, d in zip(accepted, drafted) if d > 0) for k in range(longest + 1)]
    tau = block_efficiency(samples)
    figures["alpha"] = solve_alpha(tau, gamma) if constant and tau is not None else solve_alpha_rounds(rounds)
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


def exact_match(samples: list[dict], baseline: list[dict]) -> dict | None:
    """Greedy outputs against the baseline's on the same (repeat, sample_id)."""
    reference = {(s.get("repeat", 0), s["sample_id"]): s["output_ids"] for s in baseline}
    pairs = [(s, reference.get((s.get("repeat", 0), s["sample_id"]))) for s in samples]
    pairs = [(s, ref) for s, ref in pairs if ref is not None]
    if not pairs:
        return None
    mismatches = []
    for s, ref in sorted(pairs, key=lambda p: (p[0].get("repeat", 0), p[0]["sample_id"])):
        first = first_mismatch(s["output_ids"], ref)
        if first is not None:
            mismatches.append({"sample_id": s["sample_id"], "repeat": s.get("repeat", 0), "first_mismatch": first})
    return {"exact_match": 1 - len(mismatches) / len(pairs), "mismatches": mismatches}


def draft_cost(point: Point, costs: dict) -> float | None:
    """c of the point's draft model (None without one: prompt lookup and early exit have no c probe)."""
    if point.draft is None:
        return None
    return (costs.get("c_by_draft") or {}).get(point.draft, costs.get("c"))


def cost_figures(point: Point, metrics: dict, costs: dict | None) -> dict:
    """c, v and the predicted speedup, where Leviathan's model applies: a constant draft length, measured costs."""
    out = dict.fromkeys(["draft_cost_ratio_c", "verify_cost_ratio_v", "predicted_speedup", "predicted_speedup_v1",
                         "efficiency", "decode_efficiency"])
    if not REGISTRY[point.method].has_rounds or not costs or point.gamma is None:
        return out
    c, v = draft_cost(point, costs), (costs.get("v") or {}).get(str(point.gamma))
    out["draft_cost_ratio_c"], out["verify_cost_ratio_v"] = c, v
    alpha = metrics.get("alpha")
    if c is None or v is None or alpha is None or not metrics.get("constant_draft_length"):
        return out
    out["predicted_speedup"] = predicted_speedup(alpha, point.gamma, c, v)
    out["predicted_speedup_v1"] = predicted_speedup(alpha, point.gamma, c, 1.0)
    out["efficiency"] = ratio(metrics.get("speedup"), out["predicted_speedup"])
    out["decode_efficiency"] = ratio(metrics.get("decode_speedup"), out["predicted_speedup"])
    return out


def prediction_gap(point: Point, metrics: dict, costs: dict | None) -> str | None:
    """Why a point with rounds has no predicted speedup (None when it has one, or when it has no rounds: the
    no-rounds note says so)."""
    if metrics.get("predicted_speedup") is not None or metrics.get("acceptance_rate") is None:
        return None
    if not metrics.get("constant_draft_length"):
        return ("their draft length varied from round to round (a schedule, prompt lookup without a match, a stop "
                "mid-round), and Leviathan's model assumes a constant gamma")
    if point.draft is None:
        return "no draft model: no draft cost c was measured for this drafter"
    if not costs:
        return "no cost probe ran at this batch size"
    if metrics.get("draft_cost_ratio_c") is None:
        return "no c was measured for this draft"
    return "no v was measured for this gamma"


def run_metrics(point: Point, samples: list[dict], baseline: list[dict] | None, costs: dict | None) -> dict:
    """Every figure of one run (a point, overall or one group) against its baseline's samples (None: none ran)."""
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
    if samples and all(s.get("prefill_s") is not None for s in samples):
        metrics["prefill_share"] = ratio(sum(s["prefill_s"] + (s.get("draft_prefill_s") or 0.0) for s in samples),
                                         sum(latencies))
    if spec.has_rounds:
        metrics.update(speculation_figures(samples, point.gamma))
        metrics["draft_time_share"] = ratio(sum(s.get("draft_s") or 0.0 for s in samples), sum(latencies))
    metrics.update(dict.fromkeys(["speedup", "decode_speedup", "speedup_ci95", "decode_speedup_ci95"]))
    if baseline:
        pairs = paired_totals(samples, baseline)
        decode_pairs = paired_totals(samples, baseline, decode=True)
        metrics["speedup"] = ratio_of_totals(pairs) if pairs else None
        metrics["decode_speedup"] = ratio_of_totals(decode_pairs) if decode_pairs else None
        # the baseline against itself is 1 by definition: no interval to claim
        metrics["speedup_ci95"] = None if spec.is_reference else bootstrap_ci(pairs)
        metrics["decode_speedup_ci95"] = None if spec.is_reference else bootstrap_ci(decode_pairs)
        if point.temperature is None and not spec.is_reference:
            paired_keys = set(units(samples)) & set(units(baseline))
            match = exact_match([s for s in samples if unit_of(s) in paired_keys], baseline)
            if match is not None:
                metrics.update(match)
    if point.temperature is None and spec.is_reference:
        metrics["exact_match"], metrics["mismatches"] = 1.0, []
    metrics.update(gsm8k_figures(samples))
    metrics.update(cost_figures(point, metrics, costs))
    return metrics


# ---- flags ------------------------------------------------------------------------------------------

def spread(values: list[float]) -> float | None:
    """(max - min) / median: how far repetitions of the same measurement disagree."""
    if len(values) < 2:
        return None
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else None


def probe_drift(progress: dict, batch_size: int) -> float | None:
    """How far the drift probe (a 1-token target forward, the same work every time) moved during this batch
    size's points: max / min - 1 over its readings (every reading, else start and end)."""
    entry = (progress.get("drift") or {}).get(str(batch_size)) or {}
    readings = entry.get("probes_s") or [entry.get("start_s"), entry.get("end_s")]
    readings = [r for r in readings if r is not None and r > 0]
    if len(readings) < 2:
        return None
    return max(readings) / min(readings) - 1


def baseline_repeat_drift(baseline: list[dict]) -> float | None:
    """The baseline's tok/s per repeat over the batches every repeat measured (the same work): max / min - 1."""
    by_repeat: dict[int, list[dict]] = defaultdict(list)
    for s in baseline:
        by_repeat[s.get("repeat", 0)].append(s)
    if len(by_repeat) < 2:
        return None
    common = set.intersection(*({s["batch_index"] for s in rows} for rows in by_repeat.values()))
    rates = [throughput([s for s in rows if s["batch_index"] in common]) for rows in by_repeat.values()]
    if not common or any(not r for r in rates):
        return None
    return max(rates) / min(rates) - 1


def cost_probes_of(point: Point, costs: dict) -> dict[str, list[float]]:
    """The repetitions of the cost probes behind this point's c and v (runner/probes.py names them)."""
    reps = costs.get("reps_s") or {}
    names = ["target_1", f"target_{point.gamma + 1}"]
    if point.draft is not None:
        first = next(iter(costs.get("c_by_draft") or {}), point.draft)
        names.append("draft_1" if point.draft == first else f"draft_{point.draft}_1")
    return {name: reps[name] for name in names if reps.get(name)}


def target_numerics(numerics: dict | None) -> dict:
    """The target's numerics probe. Greedy output is the target's argmax whatever drafts, so only its
    numerics can make a method's greedy tokens differ from the baseline's."""
    return (numerics or {}).get("target") or {}


def numerics_drift(probe: dict) -> float | None:
    values = [probe.get(key) for key in ("verify_vs_stepwise_max_logit_diff", "batched_vs_single_max_logit_diff")
              if probe.get(key) is not None]
    return max(values) if values else None


def flags_of(point: Point, metrics: dict, machine: dict) -> list[dict]:
    """What makes a run's figures doubtful. machine: costs, probe_drift and baseline_drift of the point's
    comparison, and the target's numerics probe."""
    flags = []
    spec = REGISTRY[point.method]
    speedup, interval = metrics.get("speedup"), metrics.get("speedup_ci95")
    if speedup and interval and (interval[0] < speedup * (1 - CI_WIDE) or interval[1] > speedup * (1 + CI_WIDE)):
        flags.append({"code": "ci_wide", "message": f"the speedup's 95% CI [{interval[0]:.3f}, {interval[1]:.3f}] reaches "
                      f"beyond +-{CI_WIDE:.0%} of {speedup:.3f}: more prompts or repeats would narrow it"})
    moved = machine.get("probe_drift")
    if moved is not None and moved > DRIFT_LIMIT:
        flags.append({"code": "drift", "message": f"the machine changed speed during this batch size's points: the same "
                      f"1-token target forward, timed by the same probe, moved by {moved:.0%} (max / min), so batches "
                      "measured at different times are not alike"})
    moved = machine.get("baseline_drift")
    if moved is not None and moved > DRIFT_LIMIT:
        flags.append({"code": "drift", "message": f"the baseline's tok/s on the same batches moved by {moved:.0%} "
                      "between repeats: the machine changed speed during the run"})
    costs = machine.get("costs")
    if spec.has_rounds and costs and point.gamma is not None:
        for name, values in cost_probes_of(point, costs).items():
            value = spread(values)
            if value is not None and value > COST_SPREAD_LIMIT:
                flags.append({"code": "cost_unstable", "message": f"cost probe {name}: its {len(values)} repetitions "
                              f"spread over {value:.0%} of their median (max - min), the same forward each time: the "
                              "machine was not steady while c and v were measured, so they and the prediction are "
                              "uncertain"})
                break
        c, v = metrics.get("draft_cost_ratio_c"), metrics.get("verify_cost_ratio_v")
        if (v is not None and v < 1) or (c is not None and c > 1):
            shown = ", ".join(f"{name} = {value:.3f}" for name, value in (("c", c), ("v", v)) if value is not None)
            flags.append({"code": "cost_implausible", "message": f"{shown}: a (gamma+1)-token target forward cheaper "
                          "than a 1-token one (v < 1), or a draft dearer than the target (c > 1), is implausible; check "
                          "the 1-token forward's kernel path first: the baseline decodes at M = 1, so a slow M = 1 path "
                          "slows the baseline too and inflates every speedup"})
    exact = metrics.get("exact_match")
    drift = numerics_drift(machine.get("numerics") or {})
    if exact is not None and exact < 1.0 and (drift is None or drift <= NUMERICS_DRIFT):
        probe = "no numerics probe ran" if drift is None else f"the numerics probe's max |logit diff| is {drift:.2g}"
        flags.append({"code": "possible_bug", "message": f"greedy output differs from the baseline in "
                      f"{len(metrics.get('mismatches') or [])} sample(s) while {probe} (no drift above "
                      f"{NUMERICS_DRIFT:g}): an exact tie can still flip a token, but check the first mismatch"})
    return flags


# ---- notes ------------------------------------------------------------------------------------------

def run_notes(run: dict, point: Point, metrics: dict, numerics: dict, reference: str) -> list[str]:
    """Why a figure of an overall run is null, partial or doubtful."""
    notes, label, spec = [], point.label, REGISTRY[point.method]
    if spec.has_rounds and not metrics.get("rounds"):
        notes.append(f"{label}: no speculation rounds (every row ended at its first token): acceptance figures, "
                     "alpha and the prediction are null")
    elif spec.has_rounds and metrics.get("acceptance_rate") is None:
        notes.append(f"{label}: no round drafted a token (the max_new_tokens budget left none): acceptance figures, "
                     "alpha and the prediction are null")
    if metrics.get("speedup") is None and not spec.is_reference:
        notes.append(f"{label}: no {reference} batch at batch={point.batch_size} "
                     f"{'greedy' if point.temperature is None else f'T={point.temperature}'} to pair with: no ratios")
    elif not spec.is_reference and metrics.get("speedup_ci95") is None:
        notes.append(f"{label}: one paired batch only: no confidence interval (more prompts or repeats give one)")
    batches = run["batches"]
    if run["status"] == "partial":
        measured = f"{batches['done']} of {batches['planned']} batches" if batches["planned"] else \
            f"{batches['done']} batches"
        why = f" ({run['error']})" if run.get("error") else " (the run stopped first)"
        notes.append(f"{label}: partial, {measured}{why}: its ratios pair only the batches it has, and it takes no "
                     "part in best")
    if not spec.is_reference and 0 < batches["paired"] < batches["done"]:
        notes.append(f"{label}: the baseline finished {batches['paired']} of its {batches['done']} batches: every "
                     "ratio pairs only those")
    exact, drift = metrics.get("exact_match"), numerics_drift(numerics)
    if exact is not None and exact < 1.0 and drift is not None and drift > NUMERICS_DRIFT:
        first = sorted(m["first_mismatch"] for m in metrics.get("mismatches") or [])
        values = ", ".join(f"{name} {numerics[key]:.2g}" for name, key in (
            ("multi-token vs token by token", "verify_vs_stepwise_max_logit_diff"),
            ("ragged batch vs alone", "batched_vs_single_max_logit_diff")) if numerics.get(key) is not None)
        notes.append(f"{label}: exact match {exact:.3f} (mismatches start at tokens {first}) is explained by the "
                     f"numerics probe: the target's max |logit diff| {values} ({numerics.get('dtype')}, quantization "
                     f"{numerics.get('quantization')}), above fp32 rounding ({NUMERICS_DRIFT:g}), is enough to flip a "
                     "greedy near-tie: the method verifies several tokens in one forward, the baseline one at a time")
    cut, graded = metrics.get("accuracy_cut"), metrics.get("accuracy_graded")
    if cut and graded and cut > CUT_MAJORITY * graded:
        notes.append(f"{label}: {cut} of {graded} GSM8K answers were cut at max_new_tokens before '####': the accuracy "
                     f"{metrics['accuracy']:.3f} is not meaningful (it grades cut-off answers, not the model); raise "
                     "generation.max_new_tokens")
    return notes


def flag_notes(run: dict, name: str, said: set[str] = frozenset()) -> list[str]:
    """Why each flag was raised, but for codes already explained for the overall run (a group run shares its
    machine, its cost probes and its mismatches; its own figures are in its table)."""
    return [f"{name}: flagged {flag['code']}: {flag['message']}" for flag in run["flags"] if flag["code"] not in said]


# ---- the summary --------------------------------------------------------------------------------------

def point_order(point: Point) -> tuple:
    methods = list(REGISTRY)
    return (point.temperature is not None, point.temperature or 0, point.batch_size,
            not REGISTRY[point.method].is_reference, methods.index(point.method), point.draft or "",
            point.gamma or 0, point.schedule or "", point.exit_layer or 0)


def costs_of(progress: dict, point: Point, samples: list[dict]) -> dict | None:
    """The cost probe of the point's batch size; in a Ray run, the probe of the one worker that ran it."""
    costs = (progress.get("costs") or {}).get(str(point.batch_size))
    if costs:
        return costs
    workers = {s.get("worker") for s in samples}
    if len(workers) == 1 and None not in workers:
        return (((progress.get("workers") or {}).get(workers.pop()) or {}).get("costs") or {}).get(str(point.batch_size))
    return None


def point_runs(point: Point, samples: list[dict], failures: list[dict], expected: int | None,
               baseline: list[dict] | None, costs: dict | None, machine: dict, group_by: str | None) -> list[dict]:
    """The runs of one point: overall (group None), then one per group when group_by is set. Every group run
    shares the point's status: a partial point is partial in every group."""
    error = "; ".join(dict.fromkeys(f.get("error") or f.get("status") for f in failures)) or None
    if not samples:
        status = "failed" if any(f.get("status") == "failed" for f in failures) else "skipped"
        return [{**_axes(point), "group": None, "label": point.label, "status": status, "error": error,
                 "batches": {"done": 0, "paired": 0, "planned": expected}, "flags": [], "metrics": {}}]
    status = "partial" if failures or (expected is not None and len(units(samples)) < expected) else "ok"
    groups = [None] + (sorted({s["group"] for s in samples if s.get("group") is not None}) if group_by else [])
    runs = []
    for group in groups:
        mine = [s for s in samples if group is None or s.get("group") == group]
        theirs = None if baseline is None else [s for s in baseline if group is None or s.get("group") == group]
        metrics = run_metrics(point, mine, theirs, costs)
        run = {**_axes(point), "group": group, "label": point.label, "status": status,
               "batches": {"done": len(units(mine)), "paired": len(set(units(mine)) & set(units(theirs or []))),
                           "planned": expected if group is None else None},
               "flags": flags_of(point, metrics, machine), "metrics": metrics}
        if error:
            run["error"] = error
        runs.append(run)
    return runs


def summarize(samples: list[dict], progress: dict | None = None) -> dict:
    """All figures per run (a point, overall and per group) from the raw records and progress.json (its keys:
    runner/storage.py's Progress). Pure: the same inputs give the same summary, NaN-free."""
    progress = progress or {}
    unknown = sorted({s["method"] for s in samples} - set(REGISTRY))  # a folder from another version of the tool
    by_point: dict[Point, list[dict]] = defaultdict(list)
    for s in samples:
        if s["method"] in REGISTRY:
            by_point[Point.of(s)].append(s)
    failures: dict[Point, list[dict]] = defaultdict(list)
    for f in progress.get("failures") or []:
        if f.get("method") in REGISTRY:
            failures[Point.of(f)].append(f)
    reference = next(name for name, spec in REGISTRY.items() if spec.is_reference)
    baselines = {p.comparison: rows for p, rows in by_point.items() if REGISTRY[p.method].is_reference}
    planned = progress.get("planned") or {}
    group_by = progress.get("group_by")
    numerics = target_numerics(progress.get("numerics"))
    notes = list(progress.get("notes") or [])
    if unknown:
        notes.append(f"records of methods this version does not know were left out: {', '.join(unknown)}")
    gaps: dict[str, list[str]] = defaultdict(list)  # why a prediction is null -> labels
    flagged: dict[tuple, list[str]] = {}  # (code, message) -> labels of the overall runs: one note for all of them
    costs_by_label: dict[str, dict | None] = {}
    runs = []
    for point in sorted(set(by_point) | set(failures), key=point_order):
        baseline = baselines.get(point.comparison)
        costs = costs_by_label[point.label] = costs_of(progress, point, by_point.get(point, []))
        machine = {"costs": costs, "probe_drift": probe_drift(progress, point.batch_size),
                   "baseline_drift": baseline_repeat_drift(baseline) if baseline else None, "numerics": numerics}
        overall, *per_group = point_runs(point, by_point.get(point, []), failures.get(point, []),
                                         planned.get(point.label), baseline, costs, machine, group_by)
        runs += [overall, *per_group]
        if overall["status"] in ("failed", "skipped"):
            continue
        notes.extend(run_notes(overall, point, overall["metrics"], numerics, reference))
        for flag in overall["flags"]:
            flagged.setdefault((flag["code"], flag["message"]), []).append(point.label)
        gap = prediction_gap(point, overall["metrics"], costs) if REGISTRY[point.method].has_rounds else None
        if gap:
            gaps[gap].append(point.label)
        said = {f["code"] for f in overall["flags"]}  # a group's flag already explained overall is not said again
        for run in per_group:
            notes.extend(flag_notes(run, f"{point.label} [{group_by}={run['group']}]", said))
    for (code, message), labels in flagged.items():
        notes.append(f"{'; '.join(labels)}: flagged {code}: {message}")
    for reason, labels in gaps.items():
        notes.append(f"predicted speedup and efficiency are null for {'; '.join(labels)}: {reason}")
    measured = {r["label"] for r in runs}
    missing = [label for label in planned if label not in measured]
    if missing:
        notes.append(f"planned but not measured (the run stopped first): {'; '.join(missing)}")
    summary = {"runs": runs, "best": best_points(runs, costs_by_label), "legend": LEGEND, "notes": notes,
               "groups": sorted({r["group"] for r in runs if r["group"] is not None})}
    for key in ("numerics", "memory", "workers", "prompts", "order", "status", "group_by"):
        if key in progress:
            summary[key] = progress[key]
    replaced: list[str] = []
    summary = strict(summary, replaced=replaced)
    if replaced:  # eval's own figures go through ratio(); a NaN can only come in from progress.json
        summary["notes"].append(f"not a number, written as null: {', '.join(replaced[:10])}"
                                + (f" and {len(replaced) - 10} more" if len(replaced) > 10 else ""))
    return summary


def _axes(point: Point) -> dict:
    return {axis: getattr(point, axis) for axis in AXES}


# ---- the best points ------------------------------------------------------------------------------------

def comparison_name(run: dict) -> str:
    return f"batch={run['batch_size']} " + ("greedy" if run["temperature"] is None else f"T={run['temperature']}")


def best_points(runs: list[dict], costs_by_label: dict[str, dict | None]) -> dict:
    """Per comparison (batch size, temperature): each method's best measured point (status ok only; flagged ones
    are kept and marked), and, where Leviathan's model applies (a constant draft length, a draft model, c and v
    measured), the gamma the measured alpha, c and v predict best among the gammas swept."""
    eligible = [r for r in runs if r["status"] == "ok" and r["group"] is None and not REGISTRY[r["method"]].is_reference
                and r["metrics"].get("speedup") is not None]
    best: dict[str, dict] = {}
    for run in eligible:
        entry = best.setdefault(comparison_name(run), {})
        current = entry.get(run["method"])
        if current is None or run["metrics"]["speedup"] > current["speedup"]:
            entry[run["method"]] = {"label": run["label"], "gamma": run["gamma"], "speedup": run["metrics"]["speedup"],
                                    "speedup_ci95": run["metrics"].get("speedup_ci95"), "flagged": bool(run["flags"]),
                                    "flags": list(dict.fromkeys(f["code"] for f in run["flags"]))}
    for comparison, entry in best.items():
        for method, chosen in entry.items():
            modelled = [r for r in eligible if r["method"] == method and comparison_name(r) == comparison
                        and r["metrics"].get("predicted_speedup") is not None]
            if not modelled:
                continue
            # the best point's own alpha where the model applies to it, else the best modelled point's
            source = next((r for r in modelled if r["label"] == chosen["label"]),
                          max(modelled, key=lambda r: r["metrics"]["speedup"]))
            costs = costs_by_label.get(source["label"]) or {}
            alpha, c = source["metrics"]["alpha"], source["metrics"]["draft_cost_ratio_c"]
            line = ("method", "draft", "schedule", "exit_layer", "batch_size", "temperature")
            swept = {r["gamma"] for r in runs if r["group"] is None and r["gamma"] is not None
                     and all(r[axis] == source[axis] for axis in line)}
            candidates = {g: predicted_speedup(alpha, g, c, costs["v"][str(g)]) for g in sorted(swept)
                          if str(g) in (costs.get("v") or {})}
            candidates = {g: value for g, value in candidates.items() if value is not None}
            if candidates:
                g_best = max(candidates, key=candidates.get)
                chosen.update(predicted_best_gamma=g_best, predicted_best_speedup=candidates[g_best], alpha_used=alpha,
                              predicted_from=source["label"])
    return best
