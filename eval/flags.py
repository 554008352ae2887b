"""What makes a figure doubtful (flags) and why a figure is null, partial or explained (notes)."""
from __future__ import annotations

from collections import defaultdict

from decode.methods import ENGINE_TEXTS, FIXED, PRICED, REGISTRY, is_home
from decode.tree_layout import tree_nodes
from eval.records import OLD_DRIFT_KEYS, CostProbe, Point, per_process, probe_engine
from eval.stats import MIN_PROMPTS, spread
from eval.totals import throughput
from eval.trees import tree_of

# a speedup whose 95% CI reaches further than +-10% of it is flagged: at that width two points a few percent apart
# cannot be ranked, and the best gamma is a guess. config.ci_target changes it (repeats: auto stops on the same rule)
CI_WIDE = 0.10
# the same 1-token target forward (the drift probe), or the baseline on the same batches, moving by more than
# 10%: the machine changed speed (thermal throttling, clocks, another process) by more than most effects measured
DRIFT_LIMIT = 0.10
# (max - min) / median of a cost probe's repetitions. c and v are medians of interleaved repetitions, so one
# slow repetition does not move them; repetitions spread over a quarter of their median mean the machine was
# not steady while the probe ran (each repetition is the same forward), and then the medians are not either.
# The same limit holds for the workers of a Ray run measuring c and v on alike hardware
COST_SPREAD_LIMIT = 0.25
# the numerics probe: max |logit diff| of a multi-token (or ragged batched) target forward against token-by-
# token decoding. fp32 reduction-order noise measures ~1e-5 (docs/sample-report: 3e-5); bf16/fp16 or TF32
# kernels measure 1e-3..1e-1. Above this, a greedy near-tie can flip without any bug
NUMERICS_DRIFT = 1e-4
# a greedy mismatch at token k is a rounding flip only if the baseline's top-1 and top-2 logits at k were within reach:
# each logit moves by up to the probe's max |logit diff|, so their gap by up to twice it
FLIP_REACH = 2.0
# GSM8K: the accuracy means nothing when more than half the answers were cut before '####'
CUT_MAJORITY = 0.5
# host_bound: the forwards measured Python dispatching kernels, not the models. Decoding at a small batch is memory
# bound: a forward reads every weight once, so it costs about its weight bytes, and c comes near the draft's weight
# bytes over the target's (the offline CPU pair, Qwen2.5-Coder 0.5B -> 1.5B in fp32: c 0.371, bytes ratio 0.355).
# An eager transformers forward launches ~2,000 kernels one by one from Python; where a launch costs more than its
# kernel's work, a forward costs about its kernel count whatever the model's width, and c drifts to the ratio of the
# layer counts (Qwen3 0.6B -> 4B on an H100: c 0.78, about their 28/36 layers, where the bytes ratio is 0.15).
# The rule where no busy times exist: c at least HOST_BOUND_EXCESS times the bytes ratio (then at least half the
# draft's forward is not reading its weights; a small draft's smaller kernels reach less of the memory bandwidth,
# which alone puts c somewhat above the ratio, not twice), and c at least HOST_BOUND_MIN_C (there the excess is a
# large part of every round: 4 drafts at c 0.3 cost 1.2 target forwards; a tiny draft at c 0.1 costs little whatever
# its cause). Where CUDA busy times exist (the profiler's kernel time in the draft's 1-token forward / its wall time)
# they measure it directly and decide instead: a GPU idle over half the draft's forward waited for the host
HOST_BOUND_EXCESS = 2.0
HOST_BOUND_MIN_C = 0.3
HOST_BOUND_BUSY = 0.5
# int8_batch: bitsandbytes 8-bit (LLM.int8) picks its outlier columns (|x| > 6, computed in fp16) over every row of a
# batch's activations, so a row's logits depend on the rows beside it, finished (dead) rows and verification widths
# included: at batch > 1 greedy output need not equal the baseline's, and no rounding probe bounds how far it moves
INT8_OUTLIER_THRESHOLD = 6.0


def ci_verdict(speedup: float | None, interval: list | None, prompts: int, ci_target: float = CI_WIDE) -> str | None:
    """The one rule for a speedup's interval, used by the flags and by `repeats: auto`'s stop: few_samples (fewer
    than MIN_PROMPTS prompt batches: no interval; repeats cannot help, more prompts can), ci_wide (an end beyond
    +-ci_target of the speedup), or None (settled)."""
    if speedup is None:
        return None
    if prompts < MIN_PROMPTS or not interval:
        return "few_samples"
    if interval[0] < speedup * (1 - ci_target) or interval[1] > speedup * (1 + ci_target):
        return "ci_wide"
    return None


def probe_drift(progress: dict, batch_size: int, engine: str | None = None) -> float | None:
    """How far the drift probe (a 1-token target forward, the same work every time) moved during this batch size's
    points, within each process that ran them (a resumed run's processes, a Ray run's workers: each its own
    machine and its own readings): the largest max / min - 1. Another engine's probe processes (each its own probe,
    e.g. the first prompt and one new token at each of its engines' start and end) are read for that engine's points
    only (eval/records.py probe_engine); engine None: the home engine's."""
    entry = per_process((progress.get("drift") or {}).get(str(batch_size)), OLD_DRIFT_KEYS)
    moved = []
    for process, readings in entry.items():
        if probe_engine(progress, process) != (None if engine is None or is_home(engine) else engine):
            continue
        readings = [r for r in old_readings(readings) if r > 0]
        if len(readings) >= 2:
            moved.append(max(readings) / min(readings) - 1)
    return max(moved) if moved else None


def old_readings(readings) -> list[float]:
    """A process's drift readings; an entry of the older format ({start_s, end_s, probes_s}) gives its probes."""
    if isinstance(readings, dict):
        readings = readings.get("probes_s") or [readings.get("start_s"), readings.get("end_s")]
    return [r for r in readings or [] if r is not None]


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


def target_numerics(numerics: dict | None) -> dict:
    """The target's numerics probe. Greedy output is the target's argmax whatever drafts, so only its
    numerics can make a method's greedy tokens differ from the baseline's."""
    return (numerics or {}).get("target") or {}


def numerics_drift(probe: dict) -> float | None:
    values = [probe.get(key) for key in ("verify_vs_stepwise_max_logit_diff", "batched_vs_single_max_logit_diff",
                                         "single_stepwise_max_logit_diff") if probe.get(key) is not None]
    return max(values) if values else None


def rounding_explains(mismatch: dict, drift: float | None) -> bool:
    """Can the target's rounding (the numerics probe's max |logit diff|, drift) explain this greedy mismatch? With the
    baseline's top-2 gap at the first mismatching token (baseline_gap): only if the gap is within FLIP_REACH x the
    drift (an output that differs in length only has none: no). Without (records written before the gaps were, or
    another engine's reference): whenever the drift is above fp32 rounding (NUMERICS_DRIFT)."""
    if drift is None:
        return False
    if "baseline_gap" not in mismatch:
        return drift > NUMERICS_DRIFT
    gap = mismatch["baseline_gap"]
    return gap is not None and gap <= FLIP_REACH * drift


def possible_bug(metrics: dict, drift: float | None) -> dict | None:
    """The possible_bug flag: greedy mismatches that the target's rounding cannot explain (rounding_explains)."""
    mismatches = metrics.get("mismatches") or []
    unexplained = [m for m in mismatches if not rounding_explains(m, drift)]
    if not unexplained:
        return None
    probe = "no numerics probe ran" if drift is None else f"the numerics probe's max |logit diff| is {drift:.2g}"
    first = unexplained[0]
    where = f"sample {first['sample_id']} (repeat {first['repeat']}) first differs at token {first['first_mismatch']}"
    if "baseline_gap" not in first:  # records without gaps: the rule of the drift alone
        why = (f"no drift above {NUMERICS_DRIFT:g}: an exact tie can still flip a token, but check the first "
               f"mismatch ({where})")
    elif first["baseline_gap"] is None:
        why = f"{where}, and only in length (the tokens agree up to where one output ends): no rounding flip does that"
    else:
        reach = "" if drift is None else f", more than {FLIP_REACH:g} x the drift"
        why = (f"{where}, where the baseline's top-1 logit led its top-2 by {first['baseline_gap']:.3g}{reach}: "
               "no rounding flip; check the engine at that token")
    return {"code": "possible_bug", "message": f"greedy output differs from the baseline in {len(unexplained)} "
            f"sample(s) that rounding cannot explain (of {len(mismatches)} that differ); {probe}; {why}"}


def cost_flags(point: Point, metrics: dict, costs: CostProbe, compiled: bool = False) -> list[dict]:
    """cost_unstable: one probe's repetitions (each worker's), or the workers' c or v, disagree; cost_implausible;
    host_bound."""
    flags = []
    nodes = tree_nodes(tree_of(point), point.gamma)  # the verification's width less one (a chain: gamma)
    for worker, probe in (costs.per_worker or {"": costs}).items():
        where = f" on worker {worker}" if len(costs.per_worker) > 1 else ""
        for name, values in probe.repetitions(point.draft, nodes).items():
            value = spread(values)
            if value is not None and value > COST_SPREAD_LIMIT:
                flags.append({"code": "cost_unstable", "message": f"cost probe {name}{where}: its {len(values)} "
                              f"repetitions spread over {value:.0%} of their median (max - min), the same forward each "
                              "time: the machine was not steady while c and v were measured, so they and the prediction "
                              "are uncertain"})
                return flags + implausible(metrics) + host_bound(metrics, compiled)
    if len(costs.per_worker) > 1:
        for name, values in (("c", [p.c_for(point.draft) for p in costs.per_worker.values()]),
                             ("v", [p.v_for(nodes) for p in costs.per_worker.values()])):
            value = spread([v for v in values if v is not None])
            if value is not None and value > COST_SPREAD_LIMIT:
                shown = ", ".join(f"{w} {x:.3f}" for w, x in zip(costs.per_worker, values) if x is not None)
                flags.append({"code": "cost_unstable", "message": f"the processes whose probes this point uses "
                              f"(the workers or runs that measured it) measured {name} "
                              f"apart by {value:.0%} of their median ({shown}): the prediction uses their median, "
                              "which describes none of them well"})
                break
    return flags + implausible(metrics) + host_bound(metrics, compiled)


def implausible(metrics: dict) -> list[dict]:
    c, v = metrics.get("draft_cost_ratio_c"), metrics.get("verify_cost_ratio_v")
    if not ((v is not None and v < 1) or (c is not None and c > 1)):
        return []
    shown = ", ".join(f"{name} = {value:.3f}" for name, value in (("c", c), ("v", v)) if value is not None)
    return [{"code": "cost_implausible", "message": f"{shown}: a (gamma+1)-token target forward cheaper than a 1-token "
             "one (v < 1), or a draft dearer than the target (c > 1), is implausible; check the 1-token forward's "
             "kernel path first: the baseline decodes at M = 1, so a slow M = 1 path slows the baseline too and "
             "inflates every speedup"}]


def host_bound(metrics: dict, compiled: bool = False) -> list[dict]:
    """host_bound by the rule above (HOST_BOUND_*): the draft's forward waits on the host more than it computes.
    compiled (engine.compile): the wait is the engine's own host work around its graphs, not eager dispatch."""
    c, bytes_ratio = metrics.get("draft_cost_ratio_c"), metrics.get("weight_bytes_ratio")
    busy, target_busy = metrics.get("draft_busy_share"), metrics.get("target_busy_share")
    if busy is not None:
        # a draft whose c is small costs little whatever keeps it waiting: the same floor as without busy times
        if busy >= HOST_BOUND_BUSY or (c is not None and c < HOST_BOUND_MIN_C):
            return []
        target = f", the target's {target_busy:.0%}" if target_busy is not None else ""
        why = (f"the GPU was busy {busy:.0%} of the draft's 1-token forward{target} (kernel time / wall time): the "
               "rest it waited for the host to launch the next kernel")
    elif c is not None and bytes_ratio and c >= HOST_BOUND_EXCESS * bytes_ratio and c >= HOST_BOUND_MIN_C:
        why = (f"c = {c:.3f} is {c / bytes_ratio:.1f}x the draft's weight bytes over the target's "
               f"({bytes_ratio:.3f}), while a forward that reads its weights, as decoding does, costs about its "
               "bytes: most of the draft's forward is the host dispatching kernels one by one")
    else:
        return []
    others = "".join(f" or {t.title} (the {t.methods} methods)" for t in ENGINE_TEXTS.values())
    if compiled:  # CUDA graphs launch a forward at once: what waits is the engine's Python around them
        return [{"code": "host_bound", "message": why + ", though compiled (engine.compile): the host work around each "
                 "step's graphs (inputs, the token's choice, its read back) costs as much as the models' kernels, so "
                 "the speedups measure this engine's per-step overhead as well as the models; for the models alone, "
                 "an engine with less of it" + others.replace(" or ", ": ", 1)}]
    return [{"code": "host_bound", "message": why + ". The speedups then measure Python and kernel-launch overhead "
             "(how many dispatches speculation saves), not the memory-bound decoding that speculative decoding "
             "exploits; for figures of the models, run the compiled engine (engine.compile: true)" + others}]


def flags_of(point: Point, metrics: dict, batches: dict, machine: dict) -> list[dict]:
    """What makes a run's figures doubtful. batches: the run's batch counts (prompts: the prompt batches its ratios
    pair; cross_process). machine: costs (a CostProbe), probe_drift and baseline_drift of the point's comparison,
    the target's numerics probe, ci_target."""
    flags, prompts = [], batches.get("prompts", 0)
    spec = REGISTRY[point.method]
    speedup, interval = metrics.get("speedup"), metrics.get("speedup_ci95")
    verdict = None if spec.is_reference else ci_verdict(speedup, interval, prompts,
                                                        machine.get("ci_target") or CI_WIDE)
    if verdict == "few_samples":
        flags.append({"code": "few_samples", "message": f"{prompts} prompt batch(es) back this ratio, fewer than "
                      f"{MIN_PROMPTS}: no interval is given (a bootstrap over so few prompts is not a 95% interval; "
                      "repeats do not add prompts), so the figure is a reading, not an estimate: run more prompts"})
    elif verdict == "ci_wide":
        target = machine.get("ci_target") or CI_WIDE
        flags.append({"code": "ci_wide", "message": f"the speedup's 95% CI [{interval[0]:.3f}, {interval[1]:.3f}] "
                      f"reaches beyond +-{target * 100:g}% of {speedup:.3f}: the prompts disagree more than that (more "
                      "prompts narrow it; repeats only average each prompt's timing noise)"})
    crossed = batches.get("cross_process") or 0
    if crossed and not spec.is_reference:
        flags.append({"code": "cross_process", "message": f"{crossed} of its {batches['paired']} paired batches were "
                      "paired with a baseline measured by another process (a resumed run or a restarted worker; "
                      "env.json lists the machines of the processes that started or resumed the run): not back to "
                      "back, so a change of the machine in between enters the ratio"})
    apart = batches.get("blocks_apart")
    if apart and not spec.is_reference:
        flags.append({"code": "not_back_to_back", "message": f"{apart['batches']} of its paired batches were paired "
                      f"with its reference's measured in another server block, a median of "
                      f"{apart['median_minutes']:.1f} min apart: a change of the machine between blocks enters the "
                      "ratio (the drift flag's probe spans the blocks)"})
    moved = machine.get("probe_drift")
    if moved is not None and moved > DRIFT_LIMIT:
        engine = REGISTRY[point.method].engine
        probe = ENGINE_TEXTS[engine].drift_probe if engine in ENGINE_TEXTS else "1-token target forward"
        flags.append({"code": "drift", "message": f"the machine changed speed during this batch size's points: the same "
                      f"{probe}, timed by the same probe, moved by {moved:.0%} (max / min), so batches "
                      "measured at different times are not alike"})
    moved = machine.get("baseline_drift")
    if moved is not None and moved > DRIFT_LIMIT:
        flags.append({"code": "drift", "message": f"the baseline's tok/s on the same batches moved by {moved:.0%} "
                      "between repeats: the machine changed speed during the run"})
    costs = machine.get("costs")
    if spec.has_rounds and costs is not None and (point.gamma is not None or tree_of(point)):
        profile = machine.get("profile")
        compiled = bool(profile is not None and profile.meta.get("compile"))
        flags += cost_flags(point, metrics, costs, compiled)
    int8 = int8_batch(point, metrics, machine.get("numerics") or {})
    bug = None if int8 else possible_bug(metrics, numerics_drift(machine.get("numerics") or {}))
    flags += [flag for flag in (int8, bug) if flag]
    return flags


def int8_batch(point: Point, metrics: dict, numerics: dict) -> dict | None:
    """The int8_batch flag: a greedy point at batch > 1 of an 8-bit target is not exact by construction (LLM.int8 is
    not batch-invariant, INT8_OUTLIER_THRESHOLD), unless this point measured every sample equal to the baseline. It
    stands in for possible_bug there: the mismatches have a cause that is not the engine."""
    if numerics.get("quantization") != "8bit" or point.batch_size <= 1 or point.temperature is not None \
            or REGISTRY[point.method].is_reference or metrics.get("exact_match") == 1.0:
        return None
    mismatches = metrics.get("mismatches") or []
    measured = f"{len(mismatches)} sample(s) differ from the baseline" if metrics.get("exact_match") is not None \
        else "no exact match measured"
    return {"code": "int8_batch", "message": f"an 8-bit target (bitsandbytes LLM.int8) at batch {point.batch_size}: "
            f"its outlier columns (|activation| > {INT8_OUTLIER_THRESHOLD:g}) are chosen over every row of the batch, so "
            "a row's logits depend on the rows beside it and on the verification's width; greedy tokens need not equal "
            f"the baseline's ({measured}), and exact_match does not test the method here: batch 1, or 4-bit, does"}


def run_notes(run: dict, point: Point, metrics: dict, numerics: dict, reference: str) -> list[str]:
    """Why a figure of an overall run is null, partial or doubtful."""
    notes, label, spec = [], point.label, REGISTRY[point.method]
    if spec.has_rounds and not metrics.get("rounds"):
        notes.append(f"{label}: no speculation rounds (every row ended at its first token): acceptance figures, "
                     "alpha and the prediction are null")
    elif spec.has_rounds and metrics.get("acceptance_rate") is None:
        schedule = getattr(point, "schedule", None)
        # a schedule that picks K per round drafting none is its choice, not the budget's
        why = ("the max_new_tokens budget left none" if schedule in (None, FIXED) else
               f"the {schedule} schedule chose K 0 in every round: by its prices the drafts do not pay at these loads"
               if schedule in PRICED else f"the {schedule} schedule chose K 0 in every round")
        notes.append(f"{label}: no round drafted a token ({why}): acceptance figures, alpha and the prediction are "
                     "null")
    batches = run["batches"]
    if metrics.get("speedup") is None and not spec.is_reference:
        notes.append(f"{label}: no {reference} batch at {point.comparison.label} to pair with: no ratios" if not batches["paired"]
                     else f"{label}: {batches['paired']} batches paired with the {reference}, but a side's total wall "
                          "time or tokens are 0: no ratio")
    if run["status"] == "partial":
        measured = f"{batches['done']} of {batches['planned']} batches" if batches["planned"] else \
            f"{batches['done']} batches"
        why = f" ({run['error']})" if run.get("error") else " (the run stopped first)"
        notes.append(f"{label}: partial, {measured}{why}: its ratios pair only the batches it has, and it takes no "
                     "part in best")
    if not spec.is_reference and 0 < batches["paired"] < batches["done"]:
        notes.append(f"{label}: the baseline finished {batches['paired']} of this point's {batches['done']} batches: "
                     "every ratio pairs only those")
    drift = numerics_drift(numerics)
    explained = [m for m in metrics.get("mismatches") or [] if rounding_explains(m, drift)]
    if explained:
        first = sorted(m["first_mismatch"] for m in explained)
        values = ", ".join(f"{name} {numerics[key]:.2g}" for name, key in (
            ("multi-token vs token by token", "verify_vs_stepwise_max_logit_diff"),
            ("ragged batch vs alone", "batched_vs_single_max_logit_diff")) if numerics.get(key) is not None)
        gaps = [m["baseline_gap"] for m in explained if "baseline_gap" in m]
        reach = (f"within {FLIP_REACH:g} x of it, the baseline's top-1 logit led its top-2 by at most {max(gaps):.2g} "
                 "at those tokens" if gaps else f"above fp32 rounding ({NUMERICS_DRIFT:g})")
        notes.append(f"{label}: exact match {metrics['exact_match']:.3f}: {len(explained)} mismatch(es) (starting at "
                     f"tokens {first}) explained by the numerics probe: the target's max |logit diff| {values} "
                     f"({numerics.get('dtype')}, quantization {numerics.get('quantization')}), {reach}, is enough to "
                     "flip a greedy near-tie: the method verifies several tokens in one forward, the baseline one at a "
                     "time")
    cut, graded = metrics.get("accuracy_cut"), metrics.get("accuracy_graded")
    if cut and graded and cut > CUT_MAJORITY * graded:
        notes.append(f"{label}: {cut} of {graded} GSM8K answers were cut at max_new_tokens before '####': the accuracy "
                     f"{metrics['accuracy']:.3f} is not meaningful (it grades cut-off answers, not the model); raise "
                     "generation.max_new_tokens")
    return notes
