"""Every figure of the report, computed from the raw records of samples.jsonl (see ../shared/METRICS.md)."""
from __future__ import annotations

import math
import statistics
from collections import defaultdict

from utils.data import extract_gsm8k_answer

LEGEND = {
    "new_tokens": "N: generated tokens up to and including EOS, no prompt, no padding; counted alike for every method",
    "acceptance_rate": "sum(accepted a_r) / sum(drafted gamma_r) over all rounds of all sequences",
    "alpha": "the alpha solving tau = (1 - alpha^(gamma+1)) / (1 - alpha) at fixed gamma, tau = block_efficiency",
    "block_efficiency": "tau = N / target forwards, prefill forward and its token included (baseline: 1.0)",
    "mean_accepted_tokens": "sum(emitted e_r) / rounds R, bonus token included (Spec-Bench #MAT; baseline 1.0)",
    "per_position_acceptance": "P(draft i accepted) = rounds with a_r >= i / rounds (unconditional)",
    "latency_s": "per sequence: wall time from its batch's start to its last token, device synchronised",
    "tpot_s": "time per output token: latency / N per sequence",
    "ttft_s": "time to first token: the prefill",
    "throughput_tok_s": "sum(N) / sum(batch wall times)",
    "speedup": "throughput(method) / throughput(baseline), same prompts, batch size and run",
    "decode_speedup": "decode throughput(method) / decode throughput(baseline): sum(N - 1) / sum(batch wall - target "
                      "prefill - draft prefill), the part speculation can speed up",
    "prefill_share": "(target prefill + draft prefill) / latency, summed over samples: the part speculation cannot speed up",
    "exact_match": "share of greedy samples whose tokens equal the baseline's; first_mismatch lists where others differ",
    "accuracy": "GSM8K: share of answers (after the last '####', else the last number) equal to the reference",
    "draft_cost_ratio_c": "one 1-token draft forward / one 1-token target forward, measured in the run",
    "verify_cost_ratio_v": "one (gamma+1)-token target forward / one 1-token target forward, measured in the run",
    "predicted_speedup": "(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma*c + v)); predicted_speedup_v1 uses v = 1 (Leviathan Thm 3.8)",
    "efficiency": "measured speedup / predicted speedup",
    "decode_efficiency": "decode speedup / predicted speedup: the same, with both prefills (outside the formula) left out",
}


def run_key(sample: dict) -> tuple:
    return sample["method"], sample.get("gamma"), sample["batch_size"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "p50": percentile(values, .5), "p90": percentile(values, .9),
            "p99": percentile(values, .99)} if values else {}


def solve_alpha(tau: float, gamma: int) -> float:
    """The alpha in [0, 1] with (1 - alpha^(gamma+1)) / (1 - alpha) = tau (bisection; the left side grows with alpha)."""
    if tau <= 1.0:
        return 0.0
    if tau >= gamma + 1:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(100):
        mid = (low + high) / 2
        if sum(mid ** i for i in range(gamma + 1)) < tau:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def predicted_speedup(alpha: float, gamma: int, c: float, v: float) -> float:
    expected_tokens = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return expected_tokens / (gamma * c + v)


def batch_wall_time(samples: list[dict], elapsed) -> float:
    """Sum over batches of the batch's wall time: its slowest row's elapsed(sample)."""
    walls: dict[tuple, float] = {}
    for s in samples:
        key = (s.get("repeat", 0), s["batch_index"])
        walls[key] = max(walls.get(key, 0.0), elapsed(s))
    return sum(walls.values())


def throughput(samples: list[dict]) -> float:
    """sum(N) / sum(batch wall times)."""
    total = batch_wall_time(samples, lambda s: s["latency_s"])
    return sum(s["new_tokens"] for s in samples) / total if total > 0 else float("nan")


def decode_throughput(samples: list[dict]) -> float | None:
    """Tokens after the first / batch time after both prefills; None where a method has no prefill time."""
    if any(s.get("prefill_s") is None for s in samples):
        return None
    total = batch_wall_time(samples, lambda s: s["latency_s"] - s["prefill_s"] - s.get("draft_prefill_s", 0.0))
    return sum(max(s["new_tokens"] - 1, 0) for s in samples) / total if total > 0 else None


def block_efficiency(samples: list[dict]) -> float | None:
    forwards = sum(s["target_forwards"] for s in samples)
    return sum(s["new_tokens"] for s in samples) / forwards if forwards else None  # hf_* methods do not count them


def speculation_figures(samples: list[dict], gamma: int) -> dict:
    rounds = [r for s in samples for r in s.get("rounds") or []]
    if not rounds:
        return {}
    drafted = sum(r["drafted"] for r in rounds)
    accepted = [r["accepted"] for r in rounds]
    tau = block_efficiency(samples)
    histogram = [0] * (gamma + 1)
    for a in accepted:
        histogram[min(a, gamma)] += 1
    return {
        "rounds": len(rounds),
        "acceptance_rate": sum(accepted) / drafted if drafted else float("nan"),
        "mean_accepted_tokens": sum(r["emitted"] for r in rounds) / len(rounds),
        "alpha": solve_alpha(tau, gamma),
        "per_position_acceptance": [sum(a >= i for a in accepted) / len(rounds) for i in range(1, gamma + 1)],
        "accepted_histogram": histogram,
    }


def gsm8k_accuracy(samples: list[dict]) -> float | None:
    graded = [s for s in samples if s.get("reference") is not None and s.get("preset") == "gsm8k"]
    if not graded:
        return None
    right = sum(extract_gsm8k_answer(s.get("output_text", "")) == extract_gsm8k_answer(s["reference"]) for s in graded)
    return right / len(graded)


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
            mismatches.append({"sample_id": s["sample_id"], "first_mismatch": first})
    return {"exact_match": 1 - len(mismatches) / len(pairs), "mismatches": mismatches}


def summarize(samples: list[dict], failures: list[dict] = (), costs: dict | None = None,
              greedy: bool = True) -> dict:
    """All figures per run (method, gamma, batch size) from the raw records.

    costs: {"batch_size": {"c": .., "v": {gamma: ..}}} measured cost ratios, for the predicted speedup.
    """
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for s in samples:
        groups[run_key(s)].append(s)
    runs = []
    baselines = {k[2]: v for k, v in groups.items() if k[0] == "baseline"}
    for (method, gamma, batch_size), group in sorted(groups.items(), key=lambda kv: (kv[0][2], kv[0][0] != "baseline",
                                                                                     kv[0][0], kv[0][1] or 0)):
        latencies = [s["latency_s"] for s in group]
        metrics = {
            "samples": len(group),
            "new_tokens": sum(s["new_tokens"] for s in group),
            "latency_s": distribution(latencies),
            "tpot_s": distribution([s["latency_s"] / s["new_tokens"] for s in group if s["new_tokens"]]),
            "ttft_s": distribution([s["prefill_s"] for s in group if s.get("prefill_s") is not None]),
            "throughput_tok_s": throughput(group),
            "block_efficiency": block_efficiency(group),
            "mean_accepted_tokens": 1.0 if method == "baseline" else None,
            "target_time_share": sum(s["target_s"] for s in group) / max(sum(latencies), 1e-12),
        }
        repeats = sorted({s.get("repeat", 0) for s in group})
        per_repeat = [throughput([s for s in group if s.get("repeat", 0) == r]) for r in repeats]
        metrics["throughput_tok_s_repeats"] = per_repeat
        metrics["throughput_tok_s_std"] = statistics.stdev(per_repeat) if len(per_repeat) > 1 else 0.0
        if all(s.get("prefill_s") is not None for s in group):
            metrics["prefill_share"] = sum(s["prefill_s"] + s.get("draft_prefill_s", 0.0) for s in group) / max(sum(latencies), 1e-12)
        if method == "speculative":
            metrics.update(speculation_figures(group, gamma))
            metrics["draft_time_share"] = sum(s["draft_s"] for s in group) / max(sum(latencies), 1e-12)
        base = baselines.get(batch_size)
        if base is not None:
            metrics["speedup"] = metrics["throughput_tok_s"] / throughput(base)
            decode, base_decode = decode_throughput(group), decode_throughput(base)
            if decode and base_decode:
                metrics["decode_speedup"] = decode / base_decode
            if len(per_repeat) > 1:
                base_repeats = [throughput([s for s in base if s.get("repeat", 0) == r]) for r in repeats]
                ratios = [a / b for a, b in zip(per_repeat, base_repeats) if b]
                metrics["speedup_std"] = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
            if greedy and method != "baseline":
                match = exact_match(group, base)
                if match is not None:
                    metrics.update(match)
        if greedy and method == "baseline":
            metrics["exact_match"] = 1.0
        accuracy = gsm8k_accuracy(group)
        if accuracy is not None:
            metrics["accuracy"] = accuracy
        cost = (costs or {}).get(str(batch_size))
        if method == "speculative" and cost and gamma is not None and str(gamma) in cost.get("v", {}):
            c, v = cost["c"], cost["v"][str(gamma)]
            metrics["draft_cost_ratio_c"], metrics["verify_cost_ratio_v"] = c, v
            metrics["predicted_speedup"] = predicted_speedup(metrics["alpha"], gamma, c, v)
            metrics["predicted_speedup_v1"] = predicted_speedup(metrics["alpha"], gamma, c, 1.0)
            if "speedup" in metrics:
                metrics["efficiency"] = metrics["speedup"] / metrics["predicted_speedup"]
            if "decode_speedup" in metrics:
                metrics["decode_efficiency"] = metrics["decode_speedup"] / metrics["predicted_speedup"]
        runs.append({"method": method, "gamma": gamma, "batch_size": batch_size, "status": "ok", "metrics": metrics})
    for failure in failures:
        runs.append({"method": failure["method"], "gamma": failure.get("gamma"), "batch_size": failure["batch_size"],
                     "status": failure.get("status", "failed"), "error": failure["error"], "metrics": {}})
    return {"runs": runs, "best": best_gamma(runs, costs), "legend": LEGEND}


def best_gamma(runs: list[dict], costs: dict | None) -> dict:
    """Per batch size: the best measured gamma and the gamma the measured alpha and c, v predict best."""
    best = {}
    for batch_size in sorted({r["batch_size"] for r in runs}):
        spec = [r for r in runs if r["batch_size"] == batch_size and r["method"] == "speculative" and r["status"] == "ok"
                and "speedup" in r["metrics"]]
        if not spec:
            continue
        measured = max(spec, key=lambda r: r["metrics"]["speedup"])
        entry = {"measured_best_gamma": measured["gamma"], "measured_best_speedup": measured["metrics"]["speedup"]}
        cost = (costs or {}).get(str(batch_size))
        if cost and cost.get("v"):
            # alpha measured at the best gamma; v interpolated as the measured per-gamma costs allow
            alpha = measured["metrics"]["alpha"]
            candidates = {int(g): predicted_speedup(alpha, int(g), cost["c"], v) for g, v in cost["v"].items()}
            g_best = max(candidates, key=candidates.get)
            entry.update({"predicted_best_gamma": g_best, "predicted_best_speedup": candidates[g_best],
                          "alpha_used": alpha})
        best[str(batch_size)] = entry
    return best
