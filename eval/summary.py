"""The summary: every run's figures, flags and notes from the raw records and progress.json, and the best points.

A figure that does not exist is None (null in JSON), never NaN, and the notes say why. Every ratio pairs the same
samples: a point's batches with the baseline's runs of the same batches. Eval never times or decodes; it asks the
method registry what a method is, never its name.
"""
from __future__ import annotations

from collections import defaultdict

from decode.methods import ENGINES, ENGINE_CAPS, FIXED, REGISTRY, caps_of, is_home, reference_method
from eval.groups import TURN, group_text, groups_of, in_group, natural
from eval.figures import exact_match, prediction_gap
from eval.flags import CI_WIDE, baseline_repeat_drift, flags_of, probe_drift, run_notes, target_numerics
from eval.leviathan import predicted_speedup
from eval.figure_table import group_metrics, legend, measured_in, run_metrics, serving_metrics
from eval.axes import comparison_axes, point_axes, sort_key
from eval.costs import run_costs
from eval.replay import beyond_note
from eval.records import EARLIER_PROCESS, OLD_COST_KEYS, Comparison, CostProbe, Point, per_process
from eval.served_figures import serving_section, slo_of
from eval.stats import MIN_PROMPTS, bootstrap_ci, ratio, ratio_of_totals, strict
from eval.totals import blocks_apart, clusters_of, cross_process_pairs, paired_clusters, processes_of, units
from eval.trees import tree_of


# ---- the summary --------------------------------------------------------------------------------------

def point_order(point: Point) -> tuple:
    """Comparison by comparison (the last comparison axis outermost, as the plan runs them), the reference first,
    methods in registry order, then by each point axis in table order (the tree before the schedule: at each gamma a
    method's chains, tree None, before its trees, which have no schedule, as the plan runs them)."""
    values = point.values()
    return (sort_key(values, comparison_axes()[::-1]), not REGISTRY[point.method].is_reference,
            list(REGISTRY).index(point.method), sort_key(values, point_axes()))


def costs_of(progress: dict, point: Point, samples: list[dict]) -> CostProbe | None:
    """The cost probe behind a point's c, v and prediction: each process (a Ray worker, a resumed run) measures
    its own at each batch size; a point takes those of the processes that ran its samples, their median where
    there are several (CostProbe.across_workers keeps each, for the cost_unstable flag)."""
    entry = costs_entry(progress, point.batch_size)
    # only the processes that ran the point: one whose probe failed gets no other process's costs
    chosen = {name: CostProbe.from_json(row) for name, row in entry.items() if row and name in processes_of(samples)}
    names = display_names(progress, set(entry) | processes_of(samples))
    return CostProbe.across_workers({names[name]: probe for name, probe in chosen.items()})


def costs_entry(progress: dict, batch_size: int) -> dict:
    """process -> its cost probe (json) at this batch size. A folder from before probes were kept per process has
    one probe (the earlier process's); an older Ray folder kept each worker's under workers, by worker name."""
    entry = per_process((progress.get("costs") or {}).get(str(batch_size)), OLD_COST_KEYS)
    workers = {w: ((info or {}).get("costs") or {}).get(str(batch_size)) for w, info in (progress.get("workers") or {}).items()}
    if set(entry) <= {EARLIER_PROCESS} and any(workers.values()):
        return {w: probe for w, probe in workers.items() if probe}
    return entry


def display_names(progress: dict, processes) -> dict[str, str]:
    """Each process's name in the notes, unique: its Ray worker (a restarted or resumed worker w0 is w0#2), else
    its place among the run's processes."""
    known = progress.get("processes") or {}
    names, used = {}, {}
    for index, process in enumerate(list(known) + sorted(p for p in processes if p not in known)):
        base = (known.get(process) or {}).get("name") or ("earlier process" if process == EARLIER_PROCESS else
                                                         f"process {index + 1}")
        used[base] = used.get(base, 0) + 1
        names[process] = base if used[base] == 1 else f"{base}#{used[base]}"
    return names


def missing_costs(progress: dict, point: Point, samples: list[dict], costs: CostProbe | None) -> str | None:
    """A note where some processes that ran a point measured no costs (their probe failed) and others did."""
    entry = costs_entry(progress, point.batch_size)
    if costs is None or not REGISTRY[point.method].has_rounds or (point.gamma is None and tree_of(point) is None):
        return None
    ran = processes_of(samples)
    without = sorted(ran - {name for name, row in entry.items() if row})
    if not without:
        return None
    names = display_names(progress, set(entry) | ran)
    return (f"{point.label}: c, v and the prediction come from {', '.join(costs.workers)}; "
            f"{', '.join(names[p] for p in without)} also ran it and measured no costs")


def point_runs(point: Point, samples: list[dict], failures: list[dict], expected: int | None,
               baseline: list[dict] | None, costs: CostProbe | None, machine: dict, group_by: str | None) -> list[dict]:
    """The runs of one point: overall (group None), then one per group (groups_of: group_by's values, and a
    conversation's turns). Every group run shares the point's status: a partial point is partial in every group."""
    error = "; ".join(dict.fromkeys(f.get("error") or f.get("status") for f in failures)) or None
    if not samples:
        status = "failed" if any(f.get("status") == "failed" for f in failures) else "skipped"
        return [{**_axes(point), "group": None, "label": point.label, "status": status, "error": error,
                 "batches": {"done": 0, "paired": 0, "planned": expected, "prompts": 0, "cross_process": 0},
                 "flags": [], "metrics": {}}]
    status = "partial" if failures or (expected is not None and len(units(samples)) < expected) else "ok"
    runs = []
    for group, field in [(None, None)] + groups_of(samples, group_by):
        mine = [s for s in samples if group is None or in_group(s, group, field)]
        theirs = None if baseline is None else [s for s in baseline if group is None or in_group(s, group, field)]
        # a group's rows shared their batches with other groups' rows: its own replay would be a schedule that never
        # ran, so the replay is the overall run's only
        # each run's c and v at its own rows' cache, where the probe timed several (CostProbe.at_cache)
        cache = decoding_cache(mine)
        own = costs.at_cache(cache) if costs is not None else None
        metrics = run_metrics(point, mine, theirs, own, machine.get("profile") if group is None else None)
        paired = set(units(mine)) & set(units(theirs or []))
        cluster = clusters_of(mine)  # a conversation's turns count once: they are resampled together
        batches = {"done": len(units(mine)), "paired": len(paired), "planned": expected if group is None else None,
                   "prompts": len({cluster[index] for _, index in paired}),
                   "cross_process": cross_process_pairs(mine, theirs or [])}
        apart = blocks_apart(mine, theirs or [])
        if apart is not None:  # an engine whose points run in server blocks of their own (eval/totals.py)
            batches["blocks_apart"] = apart
        flags = flags_of(point, metrics, batches, {**machine, "costs": own})
        if metrics.get("prediction_off"):
            flags.append({"code": "prediction_off", "message": metrics["prediction_off"]})
        run = {**_axes(point), "group": group, "label": point.label, "status": status, "batches": batches,
               "flags": flags, "metrics": metrics}
        if field is not None:
            run["group_field"] = field
        uses_costs = metrics.get("draft_cost_ratio_c") is not None or metrics.get("verify_cost_ratio_v") is not None
        if own is not None and own.context_tokens and cache and uses_costs:
            run["cost_context"] = {"probed": own.context_tokens, "decoding": cache}
        if error:
            run["error"] = error
        runs.append(run)
    return runs


def decoding_cache(samples: list[dict]) -> float | None:
    """The mean cache a run's rows decode at: its prompt plus half its new tokens, over the rows (None where a
    record lacks its prompt's length)."""
    if not samples or any(s.get("prompt_tokens") is None for s in samples):
        return None
    return sum(s["prompt_tokens"] + s["new_tokens"] / 2 for s in samples) / len(samples)


# c and v probed at a cache this far (a ratio, either way) from a run's own are said in a note
CONTEXT_OFF = 2.0


def context_notes(runs: list[dict]) -> list[str]:
    """Where a run's c and v were probed at a cache more than CONTEXT_OFF times shorter or longer than its rows'
    mean decoding cache: one note per (group, probed, decoding), naming its points."""
    off: dict[tuple, list[str]] = {}
    for run in runs:
        context = run.get("cost_context")
        if not context or not context["probed"] or not context["decoding"]:
            continue
        if max(context["probed"], context["decoding"]) / min(context["probed"], context["decoding"]) > CONTEXT_OFF:
            scope = "overall" if run["group"] is None else group_text(run["group"], run.get("group_field"))
            off.setdefault((scope, context["probed"], round(context["decoding"])), []).append(run["label"])
    return [f"{'; '.join(labels)} [{scope}]: c and v were probed at a cache of {probed} tokens, its rows decode at a "
            f"mean cache of {decoding} (prompt + half the new tokens, {decoding / probed:.1f}x): c, v and the "
            "prediction are those of another context (a run probes each length bin of its prompts' where they "
            "differ widely: runner/probes.py context_bins)"
            for (scope, probed, decoding), labels in off.items()]


def summarize(samples: list[dict], progress: dict | None = None, config: dict | None = None) -> dict:
    """All figures per run (a point, overall and per group) from the raw records and progress.json (its keys:
    runner/storage.py's Progress). Serving points (config load:) go to summary["serving"] (eval/served_figures.py), their SLO
    from config (config.yaml as saved). Pure: the same inputs give the same summary, NaN-free."""
    progress = progress or {}
    unknown = sorted({s["method"] for s in samples} - set(REGISTRY))  # a folder from another version of the tool
    # a draft counts as accepted only where it was emitted (records written before the engine said so counted the
    # drafts past an EOS)
    samples = [{**s, "rounds": [{**r, "accepted": min(r["accepted"], r["emitted"])} if "emitted" in r else r
                                for r in s["rounds"]]} if s.get("rounds") else s for s in samples]
    by_point: dict[Point, list[dict]] = defaultdict(list)
    for s in samples:
        if s["method"] in REGISTRY:
            by_point[Point.of(s)].append(s)
    failures: dict[Point, list[dict]] = defaultdict(list)
    for f in progress.get("failures") or []:
        if f.get("method") in REGISTRY:
            failures[Point.of(f)].append(f)
    # a serving point's records are requests, not batches: their figures are eval/served_figures.py's
    serving_points = {p: by_point.pop(p) for p in [p for p in by_point if p.serving]}
    serving_failures = {p: failures.pop(p) for p in [p for p in failures if p.serving]}
    # each engine's points pair with its own reference (ours: baseline; another's: its own), never across engines
    baselines = {(REGISTRY[p.method].engine, p.comparison): rows for p, rows in by_point.items()
                 if REGISTRY[p.method].is_reference}
    planned = progress.get("planned") or {}
    group_by = progress.get("group_by")
    numerics = target_numerics(progress.get("numerics"))
    notes = list(progress.get("notes") or [])
    if unknown:
        notes.append(f"records of methods this version does not know were left out: {', '.join(unknown)}")
    gaps: dict[str, list[str]] = defaultdict(list)  # why a prediction is null -> labels
    unreplayed: dict[str, list[str]] = defaultdict(list)  # why the replay is null -> labels
    beyond: dict[str, list[int]] = {}  # label -> the caches its replay priced beyond the profiled ones
    flagged: dict[tuple, list[str]] = {}  # (code, message) -> labels of the overall runs: one note for all of them
    costs_by_label: dict[str, CostProbe | None] = {}
    profile = run_costs(progress, {}, config)  # the run's probes as a cost profile: what the replay prices with
    few: dict[tuple, list[str]] = {}  # (group, prompt batches) -> labels of its runs with too few for an interval
    runs = []
    for point in sorted(set(by_point) | set(failures), key=point_order):
        engine = REGISTRY[point.method].engine
        baseline = baselines.get((engine, point.comparison))
        # c and v are timed forwards of our engine's models: nothing times another engine's forward alone
        costs = costs_by_label[point.label] = costs_of(progress, point, by_point.get(point, [])) \
            if ENGINE_CAPS[engine].times_forwards else None
        missing = missing_costs(progress, point, by_point.get(point, []), costs)
        if missing:
            notes.append(missing)
        machine = {"costs": costs, "profile": profile, "probe_drift": probe_drift(progress, point.batch_size, engine),
                   "baseline_drift": baseline_repeat_drift(baseline) if baseline else None,
                   "numerics": numerics if ENGINE_CAPS[engine].probes_numerics else {},
                   "ci_target": progress.get("ci_target") or CI_WIDE}
        overall, *per_group = point_runs(point, by_point.get(point, []), failures.get(point, []),
                                         planned.get(point.label), baseline, costs, machine, group_by)
        runs += [overall, *per_group]
        if overall["status"] in ("failed", "skipped"):
            continue
        notes.extend(run_notes(overall, point, overall["metrics"], numerics if ENGINE_CAPS[engine].probes_numerics else {},
                               reference_method(engine)))
        for flag in overall["flags"]:
            flagged.setdefault((flag["code"], flag["message"]), []).append(point.label)
        gap = prediction_gap(point, overall["metrics"], costs) if REGISTRY[point.method].has_rounds else None
        if gap:
            gaps[gap].append(point.label)
        if overall["metrics"].get("replay_missing"):
            unreplayed[overall["metrics"]["replay_missing"]].append(point.label)
        if (overall["metrics"].get("replay") or {}).get("caches_priced_beyond"):
            beyond[point.label] = overall["metrics"]["replay"]["caches_priced_beyond"]
        said = {f["code"] for f in overall["flags"]}  # a group's flag already explained overall is not said again
        for run in per_group:
            for flag in run["flags"]:
                if flag["code"] == "few_samples":  # one note for every group run it concerns
                    few.setdefault((group_text(run["group"], run["group_field"]), run["batches"]["prompts"]),
                                   []).append(point.label)
                elif flag["code"] not in said or flag["code"] == "ci_wide":  # a group's own interval
                    notes.append(f"{point.label} [{group_text(run['group'], run['group_field'])}]: flagged "
                                 f"{flag['code']}: {flag['message']}")
    for (code, message), labels in flagged.items():
        notes.append(f"{'; '.join(labels)}: flagged {code}: {message}")
    if few:
        grouped = {r["label"] for r in runs if r["group"] is not None and r["status"] in ("ok", "partial")
                   and not REGISTRY[r["method"]].is_reference}
        everyone = all(set(labels) == grouped for labels in few.values())
        shown = "; ".join(f"{group} ({prompts} prompt batch{'es' if prompts != 1 else ''})"
                          + ("" if everyone else f": {', '.join(labels)}") for (group, prompts), labels in few.items())
        notes.append(f"flagged few_samples, no interval, fewer than {MIN_PROMPTS} prompt batches behind the ratio"
                     + (f" (every point: {', '.join(next(iter(few.values())))})" if everyone else "")
                     + f": {shown}. A group's ratio from so few prompt batches is a reading, not an estimate")
    notes.extend(context_notes(runs))
    for reason, labels in gaps.items():
        notes.append(f"predicted speedup and efficiency are null for {'; '.join(labels)}: {reason}")
    for reason, labels in unreplayed.items():
        notes.append(f"no replayed prediction for {'; '.join(labels)}: {reason}")
    if beyond:
        notes.append(f"{'; '.join(beyond)}: the replay's {beyond_note(list(beyond.values()), profile.caches())}")
    serving = None
    if serving_points or serving_failures:
        serving, serving_notes = serving_section(
            serving_points, serving_failures, progress, slo_of(config), costs_of, point_order,
            lambda point, costs: {"costs": costs, "probe_drift": probe_drift(progress, point.batch_size,
                                                                             REGISTRY[point.method].engine),
                                  "numerics": numerics if caps_of(point.method).probes_numerics else {},
                                  "ci_target": progress.get("ci_target") or CI_WIDE},
            serving_metrics, group_metrics)
        notes.extend(serving_notes)
    measured = {r["label"] for r in runs + (serving["runs"] if serving else [])}
    missing = [label for label in planned if label not in measured]
    if missing:
        notes.append(f"planned but not measured (the run stopped first): {'; '.join(missing)}")
    engines = engine_comparison(by_point, baselines, runs)
    fields = {r["group"]: r["group_field"] for r in runs if r["group"] is not None}
    summary = {"runs": runs, "best": best_points(runs, costs_by_label),
               "best_method": best_methods(runs, by_point), "legend": legend(measured=measured_in(runs)), "notes": notes,
               "groups": sorted({r["group"] for r in runs if r["group"] is not None},
                                key=lambda g: (fields[g] == TURN, natural(g))),
               "group_fields": fields}
    if engines:
        summary["engines"] = engines
    if serving:
        summary["serving"] = serving
        summary["legend"] = legend(served=True, measured=measured_in(runs + serving["runs"]))
    for key in ("numerics", "memory", "workers", "processes", "prompts", "order", "status", "group_by", "ci_target"):
        if progress.get(key) is not None and progress.get(key) != {}:
            summary[key] = progress[key]
    if engines_of(progress):
        summary["engine_info"] = engines_of(progress)
    replaced: list[str] = []
    summary = strict(summary, replaced=replaced)
    if replaced:  # eval's own figures go through ratio(); a NaN can only come in from progress.json
        summary["notes"].append(f"not a number, written as null: {', '.join(replaced[:10])}"
                                + (f" and {len(replaced) - 10} more" if len(replaced) > 10 else ""))
    return summary


def engines_of(progress: dict) -> dict:
    """progress.json's engine_info: engine name -> what it kept (Engine.info); a folder written before engines were
    plugins kept it under the engine's own name."""
    return progress.get("engine_info") or {e: progress[e] for e in ENGINES if isinstance(progress.get(e), dict)
                                           and progress[e]}


def engine_comparison(by_point: dict, baselines: dict, runs: list[dict]) -> list[dict]:
    """How the engines compare on the same prompts, per other engine (engine) and comparison (batch size,
    temperature): its reference against ours in tok/s (paired by batch, the same bootstrap over prompts as every
    speedup) and, greedy, whether their tokens agree; and each of its points ("theirs") beside our engine's point of
    the same method, draft and gamma (constant schedule), each with its speedup against its own engine's reference."""
    overall = {r["label"]: r for r in runs if r["group"] is None and r["status"] in ("ok", "partial")}
    rows = []
    for (engine, comparison), theirs in sorted(baselines.items(), key=lambda item: (  # engine, then as the runs
            item[0][0], sort_key(item[0][1].values(), comparison_axes()[::-1]))):
        ours = next((b for (e, c), b in baselines.items() if c == comparison and is_home(e)), None)
        if is_home(engine) or not ours:
            continue
        clusters = paired_clusters(theirs, ours)
        their_ref = next(p for p in by_point if by_point[p] is theirs)
        ours_ref = next(p for p in by_point if by_point[p] is ours)
        flags = sorted({f["code"] for p in (their_ref, ours_ref) for f in (overall.get(p.label) or {}).get("flags", [])})
        row = {"engine": engine, **comparison.values(),
               "reference": {"theirs": their_ref.label, "ours": ours_ref.label,
                             # both over the batches both measured, as the ratio
                             "theirs_tok_s": ratio(sum(c[0] for c in clusters), sum(c[1] for c in clusters)),
                             "ours_tok_s": ratio(sum(c[2] for c in clusters), sum(c[3] for c in clusters)),
                             "tok_s_ratio": ratio_of_totals(clusters) if clusters else None,
                             "tok_s_ratio_ci95": bootstrap_ci(clusters) if clusters else None,
                             "prompt_batches": len(clusters),
                             "flags": flags},
               "points": []}
        if comparison.temperature is None:
            match = exact_match(theirs, ours)
            row["reference"]["exact_match"] = None if match is None else match["exact_match"]
        for point in sorted(by_point, key=point_order):
            spec = REGISTRY[point.method]
            if spec.engine != engine or spec.is_reference or point.comparison != comparison or not spec.counterpart:
                continue
            twin = Point(**{**point.values(), "method": spec.counterpart,
                            "schedule": FIXED if "schedule" in REGISTRY[spec.counterpart].axes else None})
            mine, other = overall.get(point.label), overall.get(twin.label)
            if mine is None or other is None:
                continue
            keys = ("speedup", "speedup_ci95", "acceptance_rate", "mean_accepted_tokens", "throughput_tok_s")
            row["points"].append({"theirs": point.label, "ours": twin.label,
                                  **{f"theirs_{k}": mine["metrics"].get(k) for k in keys},
                                  **{f"ours_{k}": other["metrics"].get(k) for k in keys},
                                  "theirs_prompt_batches": mine["batches"]["prompts"],
                                  "ours_prompt_batches": other["batches"]["prompts"],
                                  "theirs_status": mine["status"], "ours_status": other["status"],
                                  "theirs_flags": sorted({f["code"] for f in mine["flags"]}),
                                  "ours_flags": sorted({f["code"] for f in other["flags"]})})
        rows.append(row)
    return rows


def _axes(point: Point) -> dict:
    return point.values()


# ---- the best points ------------------------------------------------------------------------------------

def comparison_name(run: dict) -> str:
    return Comparison.of(run).label


def best_methods(runs: list[dict], by_point: dict[Point, list[dict]]) -> list[dict]:
    """Per comparison and engine (each engine's speedups are against its own reference), overall and per group: the
    best method (its point of the highest measured speedup, among status ok points, flagged ones kept and marked),
    and its margin over the runner-up (the next method's best point): the ratio of the two points' throughputs over
    the prompt batches both finished, paired prompt batch by prompt batch, with its 95% paired bootstrap interval
    over prompts (eval/stats.py bootstrap_ci: the speedup's, with the runner-up in the baseline's place; none below
    MIN_PROMPTS prompt batches). verdict: 'above' or 'below' where the interval lies above or below 1, 'tied' where it
    holds 1, None without an interval or a runner-up."""
    eligible = [r for r in runs if r["status"] == "ok" and not REGISTRY[r["method"]].is_reference
                and r["metrics"].get("speedup") is not None and r.get("synthetic_acceptance") is None]
    scopes: dict[tuple, list[dict]] = defaultdict(list)
    for run in eligible:
        scopes[(comparison_name(run), REGISTRY[run["method"]].engine, run["group"], run.get("group_field"))].append(run)
    out = []
    for (comparison, engine, group, field), candidates in scopes.items():
        per_method: dict[str, dict] = {}
        for run in sorted(candidates, key=lambda r: -r["metrics"]["speedup"]):
            per_method.setdefault(run["method"], run)
        best, *others = per_method.values()
        entry = {"comparison": comparison, "engine": engine, "group": group, "group_field": field,
                 "method": best["method"], "label": best["label"], "speedup": best["metrics"]["speedup"],
                 "speedup_ci95": best["metrics"].get("speedup_ci95"),
                 "flags": list(dict.fromkeys(f["code"] for f in best["flags"])), "runner_up": None}
        if others:
            second = others[0]

            def rows(run):  # the run's records: its point's, in its group
                return [r for r in by_point[Point.of(run)] if group is None or in_group(r, group, field)]

            clusters = paired_clusters(rows(best), rows(second))
            interval = bootstrap_ci(clusters)
            entry.update(runner_up=second["label"], runner_up_method=second["method"],
                         runner_up_speedup=second["metrics"]["speedup"], margin=ratio_of_totals(clusters),
                         margin_ci95=interval, margin_prompts=len(clusters),
                         verdict=None if not interval else "above" if interval[0] > 1 else "below" if interval[1] < 1
                         else "tied")
        out.append(entry)
    order = list(dict.fromkeys(comparison_name(r) for r in eligible))  # the tables' order
    return sorted(out, key=lambda e: (order.index(e["comparison"]), not is_home(e["engine"]), e["group"] is not None,
                                      e["group_field"] == TURN, natural(e["group"] or "")))


def best_points(runs: list[dict], costs_by_label: dict[str, CostProbe | None]) -> dict:
    """Per comparison (eval/axes.py: batch size, load point, temperature): each method's best measured point (status ok only; flagged ones
    are kept and marked), and, where Leviathan's model applies (a constant draft length, a draft model, c and v
    measured), the gamma predicted best among the gammas swept: by the replay of each gamma's own schedule where
    every gamma of the line has one, else by Leviathan's model from one point's alpha, c and v. Synthetic-acceptance points
    take no part: their alpha is set, not the pair's."""
    eligible = [r for r in runs if r["status"] == "ok" and r["group"] is None and not REGISTRY[r["method"]].is_reference
                and r["metrics"].get("speedup") is not None
                and r.get("synthetic_acceptance") is None]  # a synthetic point's speedup is at a set alpha
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
            best_run = next(r for r in eligible if r["label"] == chosen["label"])
            line = Point.of(best_run).without("gamma")  # the best point's line across gamma
            swept = {r["gamma"] for r in runs if r["group"] is None and r["gamma"] is not None
                     and Point.of(r).without("gamma") == line}
            replayed = {r["gamma"]: r["metrics"]["predicted_speedup_replay"] for r in eligible
                        if comparison_name(r) == comparison and r.get("gamma") is not None
                        and r["metrics"].get("predicted_speedup_replay") is not None
                        and Point.of(r).without("gamma") == line}
            if replayed and set(replayed) == swept and len(swept) > 1:  # each gamma's own schedule replayed
                g_best = max(replayed, key=replayed.get)
                chosen.update(predicted_best_gamma=g_best, predicted_best_speedup=replayed[g_best], alpha_used=None,
                              predicted_from="the replay of each gamma's own schedule")
                continue
            modelled = [r for r in eligible if r["method"] == method and comparison_name(r) == comparison
                        and r["metrics"].get("predicted_speedup") is not None and r.get("tree") is None]
            if not modelled:
                continue
            # the best point's own alpha where the model applies to it, else the best modelled point's
            source = next((r for r in modelled if r["label"] == chosen["label"]),
                          max(modelled, key=lambda r: r["metrics"]["speedup"]))
            costs = costs_by_label.get(source["label"]) or CostProbe()
            alpha, c = source["metrics"]["alpha"], source["metrics"]["draft_cost_ratio_c"]
            line = Point.of(source).without("gamma")  # the source's line across gamma
            swept = {r["gamma"] for r in runs if r["group"] is None and r["gamma"] is not None
                     and Point.of(r).without("gamma") == line}
            candidates = {g: predicted_speedup(alpha, g, c, costs.v_for(g)) for g in sorted(swept)
                          if costs.v_for(g) is not None}
            candidates = {g: value for g, value in candidates.items() if value is not None}
            if candidates:
                g_best = max(candidates, key=candidates.get)
                chosen.update(predicted_best_gamma=g_best, predicted_best_speedup=candidates[g_best], alpha_used=alpha,
                              predicted_from=source["label"])
    return best
