"""The report folder's tables and plots, and the terminal table, from a summary."""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from decode.methods import ENGINE_TEXTS, REGISTRY, is_home, reference_method
from eval.axes import AXES, label_of, names as axis_names
from eval.groups import group_text
from eval.figure_table import (Column, Format, columns, csv_fields, column_of, group_columns, measured_in,
                               served_csv_fields)
from eval.records import Comparison, Point
from eval.served_figures import crossing_text, line_label, line_of, load_label, load_text, load_value
from eval.sources import source_lines
from utils.io import write_atomic, write_json



def run_keys() -> tuple[str, ...]:
    """A summary run's own keys, not metrics: its label, status, every axis (eval/axes.py) and its group."""
    return ("label", "status", *axis_names(), "group")


def _value(run: dict, path: str):
    if path in run_keys():
        return run.get(path)
    node = run.get("metrics", {})
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def flagged(run: dict) -> bool:
    """Whether a run's measured speedup is marked '!': it has a flag, and it is no reference (whose speedup is 1 by
    definition: a flag of its batch size, drift say, is the notes', not a doubt about that 1)."""
    return bool(run.get("flags")) and not (run.get("method") in REGISTRY and REGISTRY[run["method"]].is_reference)


def decorated(run: dict, path: str, text: str, kind: Format) -> str:
    """A cell's text with what its format kind adds: the interval, how few pairs back a ratio without one, a flag."""
    interval = _value(run, path + "_ci95") if kind.interval else None
    if interval:
        text += f" [{kind.interval.format(interval[0])}, {kind.interval.format(interval[1])}]"
    elif kind.count and any(f["code"] == "few_samples" for f in run.get("flags") or []):  # too few for one: how many
        text += f" (n={run['batches']['prompts'] if 'batches' in run else run['metrics']['requests_paired']})"
    if kind.flagged and flagged(run):
        text += " !"  # the notes say why
    return text


def cell(run: dict, column: Column) -> str:
    """A table cell of either kind of point (a fixed batch's run, a load point's): its values joined by ' / ', each
    in the column's format and units, the first with what its kind adds (decorated); a failed or skipped run shows
    its own keys only."""
    paths, fmt = column.paths, column.fmt
    if paths == ("line",):  # a load point's row: its line, the load being its table's
        return line_label(run)
    if paths == ("status",):
        if run.get("status") == "partial":
            done = run.get("batches") or run.get("repeats") or {}  # a load point's unit is a repeat
            return f"partial {done.get('done')}/{done.get('planned')}" if done.get("planned") else \
                f"partial {done.get('done')}"
        return run.get("status") or ""
    if run.get("status") in ("failed", "skipped") and paths[0] not in run_keys():
        return ""
    values = [_value(run, path) for path in paths]
    text = " / ".join(_fmt(None if value is None else column.kind.shown(value), fmt) for value in values)
    return text if values[0] is None else decorated(run, paths[0], text, column.kind)


def columns_for(runs: list[dict], served: bool = False, terminal: bool = False) -> list[Column]:
    """A table's columns for these runs (served: a load point's; terminal: the terminal's headline ones): a column
    declared only_with a key where a run has it; in the fixed batches' summary.md, after the label and status, each
    axis that declares a column (eval/axes.py) where a run has a value on it (a load point's row is its line)."""
    table = [c for c in columns(served) if (c.terminal or not terminal)
             and (c.only_with is None or any(_value(run, c.only_with) is not None for run in runs))]
    if served or terminal:
        return table
    shown = [Column(axis.column, (axis.name,), "{}") for axis in AXES
             if axis.column and any(run.get(axis.name) is not None for run in runs)]
    return table[:2] + shown + table[2:]


def md_cell(text: str) -> str:
    """A Markdown table cell: a '|' in a label (a draft named 'a|b') would end the cell."""
    return str(text).replace("|", "\\|")


def _table(runs: list[dict], columns: list[Column]) -> list[str]:
    """A Markdown table: a row per run."""
    return ["| " + " | ".join(c.header for c in columns) + " |", "|" + "---|" * len(columns)] + [
        "| " + " | ".join(md_cell(cell(run, column)) for column in columns) + " |" for run in runs]


def markdown(summary: dict, title: str = "") -> str:
    overall = [r for r in summary["runs"] if r.get("group") is None]
    # a serving run's tables are its own (serving_lines); a run of fixed batches has no serving section
    lines = [f"# {title}\n" if title else ""] + (_table(overall, columns_for(overall))
                                                 if overall or not summary.get("serving") else [])
    failed = [r for r in overall if r["status"] in ("failed", "skipped")]
    if failed:
        lines += ["", "Not measured:"] + [f"- {r['label']}: {r['status']}: {r['error']}" for r in failed]
    for group in summary.get("groups") or []:
        field = (summary.get("group_fields") or {}).get(group) or summary.get("group_by") or "group"
        lines += ["", f"## {group}" if field == "turn" else f"## {field}: {group}", ""]
        runs = [r for r in summary["runs"] if r.get("group") == group]
        lines += _table(runs, columns_for(runs))
    if any(flagged(r) for r in summary["runs"]):
        lines += ["", "! = flagged: the notes say why (legend: flags)."]
    lines += tree_lines(overall)
    lines += synthetic_lines(overall)
    lines += source_lines(overall)
    lines += best_method_lines(summary.get("best_method") or [], summary.get("best") or {}, overall)
    lines += engine_lines(summary.get("engines") or [])
    lines += serving_lines(summary)
    notes = list(summary.get("notes", []))
    if summary.get("order"):
        notes.append(f"order: {summary['order']}")
    for engine, v in (summary.get("engine_info") or {}).items():
        for role, graphs in (v.get("compiled") or {}).items():
            notes.append(compiled_note(role, graphs))
        if v.get("order"):
            title = ENGINE_TEXTS[engine].title if engine in ENGINE_TEXTS else engine
            where = v.get("python") or v.get("server")  # the interpreter or binary that ran it
            notes.append(f"order of the {title} points ({title} {v.get('version')}, {where}): {v['order']}")
    prompts = summary.get("prompts") or {}
    if prompts:
        notes.append(f"prompts: {prompts.get('count')} from {prompts.get('source')}, mean {prompts.get('mean_tokens', 0):.0f} "
                     f"tokens; {prompts.get('truncated', 0)} truncated, {prompts.get('skipped_too_long', 0)} skipped as too long"
                     + (f", {prompts['skipped_empty']} skipped as empty" if "skipped_empty" in prompts else ""))
    memory = summary.get("memory") or {}
    if memory.get("peak_rss_bytes"):
        gib = 1024 ** 3
        text = (f"memory: peak resident {memory['peak_rss_bytes'] / gib:.2f} GiB, peak anonymous "
                f"{(memory.get('peak_anon_bytes') or 0) / gib:.2f} GiB on the host")
        if memory.get("gpu_peak_allocated_bytes"):
            text += f"; GPU peak allocated {memory['gpu_peak_allocated_bytes'] / gib:.2f} GiB"
        notes.append(text)
    numerics = summary.get("numerics") or {}
    for role, probe in [("target", numerics.get("target"))] + list((numerics.get("drafts") or {}).items()):
        if probe and probe.get("verify_vs_stepwise_max_logit_diff") is not None:
            batched = probe.get("batched_vs_single_max_logit_diff")
            notes.append(f"numerics {role} ({probe.get('dtype')}, quantization {probe.get('quantization')}): max |logit diff| "
                         f"multi-token vs token by token {probe['verify_vs_stepwise_max_logit_diff']:.2g}, ragged batch vs "
                         f"alone {'not measured' if batched is None else format(batched, '.2g')}")
    if notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in notes]
    lines += ["", "Legend:"] + [f"- {k}: {v}" for k, v in summary["legend"].items()]
    return "\n".join(lines) + "\n"


def depth_rank_text(table: list[dict]) -> str:
    """acceptance_by_depth_rank, compact: 'd1: r0 0.667 (3), r1 0.000 (1); d2: ...' (trials in parentheses)."""
    return "; ".join(f"d{row['depth']}: " + ", ".join(f"r{rank} {_fmt(p, '{:.3f}')} ({trials})" for rank, (p, trials)
                                                     in enumerate(zip(row["p"], row["trials"]))) for row in table)


def _margin_text(entry: dict) -> str:
    """The best method's margin over its runner-up: the paired ratio, its interval and what it says, or how few
    prompt batches it rests on."""
    if entry.get("runner_up") is None:
        return "; no other method to set it against"
    margin, interval = entry.get("margin"), entry.get("margin_ci95")
    text = f"; over the runner-up {entry['runner_up_method']} ({entry['runner_up']}): {_fmt(margin, '{:.3f}')}x"
    if interval:
        verdict = {"above": "above 1", "below": "below 1: the runner-up is faster on the prompts both ran",
                   "tied": "tied: the interval holds 1"}[entry["verdict"]]
        return text + f" [{interval[0]:.3f}, {interval[1]:.3f}] paired over {entry['margin_prompts']} prompt batches ({verdict})"
    return text + f" (n={entry.get('margin_prompts')}: too few prompt batches for an interval, a reading)"


def best_method_lines(entries: list[dict], per_method: dict, runs: list[dict]) -> list[str]:
    """The best method of each comparison, overall and per group, with its paired margin over the runner-up
    (summary best_method); then each method's best point where the method ran more than one (summary best)."""
    lines = []
    for entry in entries:
        where = entry["comparison"] + ("" if is_home(entry["engine"]) else
                                       f" ({ENGINE_TEXTS[entry['engine']].title if entry['engine'] in ENGINE_TEXTS else entry['engine']})")
        scope = "overall" if entry["group"] is None else group_text(entry["group"], entry.get("group_field"))
        interval = entry.get("speedup_ci95")
        # a best method slower than the target alone is not a method to deploy: the line says the reference wins;
        # one whose interval holds 1 is not known to be faster than it: the line says so
        below = interval[1] < 1 if interval else entry["speedup"] < 1
        head = (f"no method above the target alone; the fastest, {entry['method']} ({entry['label']}), reads"
                if below else f"best method {entry['method']} ({entry['label']}) at")
        tied = not below and interval and interval[0] <= 1
        lines.append(f"- {where}, {scope}: {head} {entry['speedup']:.2f}x"
                     + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")
                     + (", tied with the target alone (the interval holds 1)" if tied else "")
                     + (f" (flagged: {', '.join(entry['flags'])})" if entry["flags"] else "") + _margin_text(entry))
    points = {}
    for r in runs:
        if r.get("group") is None and r["status"] == "ok" and r["method"] in REGISTRY \
                and not REGISTRY[r["method"]].is_reference:
            points.setdefault((Comparison.of(r).label, r["method"]), []).append(r)
    for comparison, methods in per_method.items():
        for method, best in methods.items():
            if len(points.get((comparison, method), [])) < 2:  # its only point: the table has it already
                continue
            interval = best.get("speedup_ci95")
            text = f"- {comparison}, {method}: {best['label']} at {best['speedup']:.2f}x" + (
                f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "") + (
                f" (flagged: {', '.join(best.get('flags') or [])})" if best["flagged"] else " (unflagged)")
            if "predicted_best_gamma" in best and best.get("alpha_used") is None:
                text += (f"; the replay of each gamma's schedule predicts gamma {best['predicted_best_gamma']} "
                         f"best ({best['predicted_best_speedup']:.2f}x)")
            elif "predicted_best_gamma" in best:
                text += (f"; the measured alpha {best['alpha_used']:.3f}, c and v predict gamma {best['predicted_best_gamma']} "
                         f"best ({best['predicted_best_speedup']:.2f}x)")
            lines.append(text)
    return ["", "Best:"] + lines if lines else []


def tree_lines(runs: list[dict]) -> list[str]:
    """Per tree point its acceptance by depth and rank; the costs: v(n) per batch size, as the tree predictions use."""
    trees = [r for r in runs if r.get("tree") is not None and r["status"] in ("ok", "partial")]
    if not trees:
        return []
    lines = ["", "Trees, acceptance by depth d and sibling rank r (p = hits / trials, trials in parentheses; legend: "
             "acceptance_by_depth_rank):"]
    lines += [f"- {r['label']}: {depth_rank_text(r['metrics'].get('acceptance_by_depth_rank') or []) or 'no round drafted'}"
              for r in trees]
    tables: dict[int, dict[tuple, list[str]]] = {}
    for r in trees:
        measured = tuple((r["metrics"].get("verify_cost_by_nodes") or {}).items())
        if measured:
            tables.setdefault(r["batch_size"], {}).setdefault(measured, []).append(r["label"])
    if tables:
        lines += ["", "Costs of the trees (legend: verify_cost_by_nodes):"]
    for batch_size, by_table in tables.items():
        for measured, labels in by_table.items():
            which = f" ({'; '.join(labels)})" if len(by_table) > 1 else ""
            lines.append(f"- v(n) at batch={batch_size}{which}: " + ", ".join(f"n={n} {v:.3f}" if v is not None else
                                                                               f"n={n} -" for n, v in measured))
    return lines


def synthetic_cells(r: dict, speedup: str) -> str:
    """A synthetic point's row after its label: set alpha | alpha [CI] (or its n) | speedup | predicted [at alpha's
    CI] | c | v | measured / predicted [at the speedup's CI]."""
    m = r["metrics"]
    alpha, interval = m.get("alpha"), m.get("alpha_ci95")
    alpha_text = _fmt(alpha, "{:.3f}") + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if alpha is not None and
                                          interval else f" (n={m.get('alpha_prompts')})" if alpha is not None else "")
    return " | ".join([f"{r['synthetic_acceptance']:g}", alpha_text, speedup,
                       _with_ci(m.get("predicted_speedup"), m.get("predicted_speedup_ci95")),
                       _fmt(m.get("draft_cost_ratio_c"), "{:.3f}"), _fmt(m.get("verify_cost_ratio_v"), "{:.3f}"),
                       _with_ci(m.get("efficiency"), m.get("efficiency_ci95"))])


def synthetic_lines(runs: list[dict]) -> list[str]:
    """Per synthetic-acceptance point: the set alpha against the estimated one, and measured against predicted
    speedup (the cost model's own test; legend: synthetic_acceptance)."""
    chosen = [r for r in runs if r.get("synthetic_acceptance") is not None and r["status"] in ("ok", "partial")]
    if not chosen:
        return []
    lines = ["", "Synthetic acceptance (each draft accepted by a seeded Bernoulli(alpha) chain at the set alpha, not by "
             "the target: outputs are not the target's, no exact match; legend: synthetic_acceptance):", "",
             "| point | set alpha | alpha [95% CI] | speedup [95% CI] | predicted [alpha's CI] | c | v | "
             "measured / predicted [speedup's CI] |", "|---|---|---|---|---|---|---|---|"]
    for r in chosen:
        lines.append(f"| {md_cell(r['label'])} | {synthetic_cells(r, cell(r, column_of('speedup')))} |")
    return lines


def reference_name(summary: dict) -> str:
    """What the speedups of a plot are against: the baseline, or each engine's own reference where another ran."""
    if any(not is_home(REGISTRY[r["method"]].engine) for r in summary["runs"] if r["method"] in REGISTRY):
        return "each engine's reference (baseline; " + "; ".join(
            f"{reference_method(e)} for {t.methods}" for e, t in ENGINE_TEXTS.items()) + ")"
    return "baseline"


def _fmt(value, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _with_ci(value, interval) -> str:
    return _fmt(value) + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if value is not None and interval else "")


def _engine_cell(value, interval, status: str, prompts: int, flags: list[str]) -> str:
    """A speedup in the engine tables, marked as the main table marks it: (n=k) without an interval, ! flagged."""
    text = _fmt(value)
    if value is not None and interval:
        text += f" [{interval[0]:.2f}, {interval[1]:.2f}]"
    elif value is not None and "few_samples" in flags:
        text += f" (n={prompts})"
    if status == "partial":
        text += " partial"
    return text + (" !" if flags and value is not None else "")


def engine_lines(engines: list[dict]) -> list[str]:
    """The engine comparison, per other engine: its reference against ours, and each of its points beside ours."""
    lines = []
    for engine in dict.fromkeys(row.get("engine", "") for row in engines):
        rows = [row for row in engines if row.get("engine", "") == engine]
        title = ENGINE_TEXTS[engine].title if engine in ENGINE_TEXTS else engine
        lines += ["", f"Engines (the same prompts, not back to back: in each repeat our points ran, then {title}'s; "
                  "each engine's speedups are against its own reference):", "",
                  f"| comparison | {title} reference tok/s | ours tok/s | {title} / ours tok/s [95% CI] | "
                  "greedy tokens equal |", "|---|---|---|---|---|"]
        for row in rows:
            ref = row["reference"]
            comparison = Comparison.of(row).label
            ratio_text = _engine_cell(ref["tok_s_ratio"], ref["tok_s_ratio_ci95"], "ok", ref["prompt_batches"],
                                      ref["flags"] + ([] if ref["tok_s_ratio_ci95"] else ["few_samples"]))
            lines.append(f"| {comparison} | {_fmt(ref['theirs_tok_s'])} | {_fmt(ref['ours_tok_s'])} | {ratio_text} | "
                         f"{_fmt(ref.get('exact_match'), '{:.3f}')} |")
        points = [p for row in rows for p in row["points"]]
        if points:
            lines += ["", f"| {title} point | speedup [95% CI] | accept | MAT | our point | speedup [95% CI] | accept "
                      "| MAT |", "|---|---|---|---|---|---|---|---|"]
            for p in points:
                mine = _engine_cell(p["theirs_speedup"], p["theirs_speedup_ci95"], p["theirs_status"],
                                    p["theirs_prompt_batches"], p["theirs_flags"])
                other = _engine_cell(p["ours_speedup"], p["ours_speedup_ci95"], p["ours_status"],
                                     p["ours_prompt_batches"], p["ours_flags"])
                lines.append(f"| {md_cell(p['theirs'])} | {mine} | {_fmt(p['theirs_acceptance_rate'], '{:.3f}')} | "
                             f"{_fmt(p['theirs_mean_accepted_tokens'], '{:.2f}')} | {md_cell(p['ours'])} | {other} | "
                             f"{_fmt(p['ours_acceptance_rate'], '{:.3f}')} | "
                             f"{_fmt(p['ours_mean_accepted_tokens'], '{:.2f}')} |")
    return lines


def csv_text(summary: dict, served: bool = False) -> str:
    """summary.csv (served: serving.csv): a row per run (per method and load point: summary.json's serving.runs),
    its own keys (a load point's have no group), its figures' fields (eval/figure_table.py), its flags and error."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    keys = [k for k in run_keys() if not (served and k == "group")]
    measured = measured_in(summary["runs"] + ((summary.get("serving") or {}).get("runs") or []))
    paths = keys + [path for path in (served_csv_fields(measured) if served else csv_fields(measured)) if path not in keys]
    writer.writerow(paths + ["flags", "error"])
    for run in summary["serving"]["runs"] if served else summary["runs"]:
        writer.writerow([_value(run, p) for p in paths] + [";".join(f["code"] for f in run.get("flags") or []),
                                                          run.get("error", "")])
    return buffer.getvalue()


# ---- plots --------------------------------------------------------------------------------------------

def _errors(runs: list[dict], metric: str) -> list[list[float]] | None:
    """matplotlib's yerr of the runs' metric (_yerr)."""
    return _yerr([run["metrics"].get(metric) for run in runs], [run["metrics"].get(metric + "_ci95") for run in runs])


def _yerr(values: list, intervals: list) -> list[list[float]] | None:
    """matplotlib's yerr: distances below and above each value, NaN where it has no interval (few prompts: no bar
    is drawn, where a zero-width one would read as a precise figure); None when no value has an interval."""
    lows, highs, any_interval = [], [], False
    for value, interval in zip(values, intervals):
        if interval and value is not None:
            lows.append(max(value - interval[0], 0.0))
            highs.append(max(interval[1] - value, 0.0))
            any_interval = True
        else:
            lows.append(math.nan)
            highs.append(math.nan)
    return [lows, highs] if any_interval else None


def _curve(axes, xs: list, ys: list, label: str, intervals: list | None = None, hollow: list | None = None,
           marked: list | None = None, predicted: list[tuple] | None = None, predicted_label: str | None = None,
           color=None):
    """One line of a plot of either kind of point (fixed batches along gamma, a load point's line along its load):
    its values with their 95% intervals as error bars, hollow where partial, '!' where flagged; predicted, (x, value,
    interval) each, dashed in its colour with its 95% band where every predicted value has one. Its colour."""
    container = axes.errorbar(xs, ys, yerr=_yerr(ys, intervals) if intervals else None, capsize=3, label=label,
                              color=color)
    color = container.lines[0].get_color()
    for x, y, empty in zip(xs, ys, hollow or [False] * len(xs)):
        axes.plot([x], [y], marker="o", linestyle="none", markeredgecolor=color,
                  markerfacecolor="white" if empty else color, zorder=3)
    for x, y, mark in zip(xs, ys, marked or []):
        if mark:
            axes.annotate("!", (x, y), textcoords="offset points", xytext=(4, 4), color=color)
    shown = [(x, value, interval) for x, value, interval in predicted or [] if value is not None]
    if shown:
        pxs = [x for x, _, _ in shown]
        axes.plot(pxs, [value for _, value, _ in shown], linestyle="--", linewidth=1.0, color=color, alpha=0.8,
                  label=predicted_label)
        if len(shown) > 1 and all(interval for _, _, interval in shown):
            axes.fill_between(pxs, [i[0] for _, _, i in shown], [i[1] for _, _, i in shown], color=color, alpha=0.15,
                              linewidth=0)
    return color


def _line_key(run: dict) -> str:
    """A plot's line across gamma: the run's label without its gamma."""
    return label_of(Point.of(run).without("gamma"))


def _legend_outside(axes, fontsize: int) -> None:
    """The legend right of the axes, never over a bar or a line (labels are long: a point's whole label)."""
    axes.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def _save(plot, out_dir: Path, name: str, plt) -> str:
    import warnings

    with warnings.catch_warnings():  # labels too long to fit: bbox_inches below grows the image instead
        warnings.simplefilter("ignore", UserWarning)
        plot.tight_layout()
    buffer = io.BytesIO()
    # the image grows to hold every label and the legend beside the axes, which tight_layout alone does not fit
    plot.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(plot)
    write_atomic(out_dir / name, buffer.getvalue())
    return name


def plots(summary: dict, out_dir: Path) -> list[str]:
    """Against gamma (one line per method/draft/schedule/exit layer and batch size, CI error bars; methods without
    gamma as dotted horizontal lines on the speedup plot); every point side by side (methods.png); per group
    (speedup_by_group.png). Partial points are hollow, flagged ones marked '!'."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in summary["runs"] if r["status"] in ("ok", "partial") and r.get("group") is None]
    energy = energy_plot(summary, out_dir, plt)
    if summary.get("serving"):
        return serving_plots(summary, out_dir, plt) + (fixed_plots(summary, measured, out_dir, plt) if measured else []) \
            + energy
    return fixed_plots(summary, measured, out_dir, plt) + energy


def energy_plot(summary: dict, out_dir: Path, plt) -> list[str]:
    """energy.png, where a point's energy was measured (legend: energy_j_per_token): joules per output token per point,
    fixed batches and load points, and beside it J/token over the baseline's, each with its 95% interval where it
    has one; partial points hollow. None written where nothing was measured."""
    runs = [r for r in summary["runs"] + ((summary.get("serving") or {}).get("runs") or [])
            if r["status"] in ("ok", "partial") and r.get("group") is None
            and r["metrics"].get("energy_j_per_token") is not None]
    if not runs:
        return []
    plot, (left, right) = plt.subplots(1, 2, figsize=(11, 1.4 + 0.32 * len(runs)), sharey=True)
    ys = list(range(len(runs)))
    hollow = ["white" if r["status"] == "partial" else "tab:green" for r in runs]
    left.barh(ys, [r["metrics"]["energy_j_per_token"] for r in runs], xerr=_errors(runs, "energy_j_per_token"),
              color=hollow, edgecolor="tab:green", capsize=3)
    left.set_yticks(ys, [r["label"] + (" (partial)" if r["status"] == "partial" else "") for r in runs], fontsize=7)
    left.set_xlabel("joules per output token (95% CI over prompt batches)")
    ratios = [r["metrics"].get("energy_ratio") for r in runs]
    right.barh(ys, [math.nan if x is None else x for x in ratios], color=hollow, edgecolor="tab:green", capsize=3,
               xerr=_yerr(ratios, [r["metrics"].get("energy_ratio_ci95") for r in runs]))
    right.axvline(1.0, color="grey", linewidth=0.8, linestyle="--")
    right.set_xlabel(f"J/token / {reference_name(summary)}'s (95% CI)")
    for axes in (left, right):
        axes.grid(axis="x", alpha=0.3)
    plot.suptitle("energy per output token (the device's counter; a load point: over its span)", fontsize=9)
    return [_save(plot, out_dir, "energy.png", plt)]


def fixed_plots(summary: dict, measured: list[dict], out_dir: Path, plt) -> list[str]:
    """The plots of fixed batches (plots' docstring)."""
    swept = [r for r in measured if r.get("gamma") is not None]
    fixed = [r for r in measured if r.get("gamma") is None and not REGISTRY[r["method"]].is_reference
             and r["metrics"].get("speedup") is not None]
    written = []
    speedup_label = f"speedup vs {reference_name(summary)} (95% CI; dashed: the replay's prediction, band: its 95% CI)"
    for metric, label in [("speedup", speedup_label), ("acceptance_rate", "acceptance rate"),
                          ("block_efficiency", "block efficiency (tokens / target forward)")]:
        plot, axes = plt.subplots(figsize=(6, 4))
        lines: dict[str, list[dict]] = {}
        for run in swept:
            lines.setdefault(_line_key(run), []).append(run)
        drawn = 0
        for key, runs in lines.items():
            runs = sorted((r for r in runs if r["metrics"].get(metric) is not None), key=lambda r: r["gamma"])
            if not runs:
                continue
            speedup = metric == "speedup"
            _curve(axes, [r["gamma"] for r in runs], [r["metrics"][metric] for r in runs], key,
                   intervals=[r["metrics"].get("speedup_ci95") for r in runs] if speedup else None,
                   hollow=[r["status"] == "partial" for r in runs], marked=[flagged(r) for r in runs] if speedup else None,
                   predicted=[(r["gamma"], r["metrics"].get("predicted_speedup_replay"),
                               r["metrics"].get("predicted_speedup_replay_ci95")) for r in runs] if speedup else None)
            drawn += 1
        if metric == "speedup":
            axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
            for run in fixed:  # a method without gamma: one speedup per batch size, a reference line
                axes.axhline(run["metrics"]["speedup"], linewidth=1.0, linestyle=":", color=f"C{drawn % 10}",
                             label=_line_key(run) + (" (partial)" if run["status"] == "partial" else "")
                             + (" !" if flagged(run) else ""))
                drawn += 1
        gammas = sorted({r["gamma"] for r in swept})
        if gammas:
            axes.set_xticks(gammas)
        axes.set_xlabel("gamma (max draft tokens per round)")
        axes.set_ylabel(label)
        axes.grid(alpha=0.3)
        if drawn:
            _legend_outside(axes, 7)
        written.append(_save(plot, out_dir, f"{metric}.png", plt))
    written.append(_bars(measured, out_dir, plt, "methods.png",
                         "speedup per point (95% CI; hollow = partial, ! = flagged)"))
    groups = summary.get("groups") or []
    if groups:
        written.append(_group_bars(summary, groups, out_dir, plt))
    return written


def _bars(runs: list[dict], out_dir: Path, plt, name: str, title: str) -> str:
    """One horizontal bar per point (labels are long), best at the top, with the CI as error bars."""
    runs = [r for r in runs if r["metrics"].get("speedup") is not None and not REGISTRY[r["method"]].is_reference]
    runs = sorted(runs, key=lambda r: r["metrics"]["speedup"])
    plot, axes = plt.subplots(figsize=(9, 1.2 + 0.32 * max(1, len(runs))))
    if runs:
        ys = list(range(len(runs)))
        errors = _errors(runs, "speedup")
        colors = ["white" if r["status"] == "partial" else "tab:blue" for r in runs]
        axes.barh(ys, [r["metrics"]["speedup"] for r in runs], xerr=errors, color=colors, edgecolor="tab:blue",
                  capsize=3)
        axes.set_yticks(ys, [r["label"] + (" (partial)" if r["status"] == "partial" else "") + (" !" if flagged(r) else "")
                             for r in runs], fontsize=7)
    axes.axvline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xlabel(f"speedup vs {reference_name({'runs': runs})}")
    axes.set_title(title, fontsize=9)
    axes.grid(axis="x", alpha=0.3)
    return _save(plot, out_dir, name, plt)


def _group_bars(summary: dict, groups: list[str], out_dir: Path, plt) -> str:
    runs = [r for r in summary["runs"] if r["status"] in ("ok", "partial") and r.get("group") is not None
            and not REGISTRY[r["method"]].is_reference and r["metrics"].get("speedup") is not None]
    labels = list(dict.fromkeys(r["label"] for r in runs))
    plot, axes = plt.subplots(figsize=(max(6.0, 0.9 * len(groups) * max(1, len(labels)) / 3 + 2), 4))
    width = 0.8 / max(1, len(labels))
    for index, label in enumerate(labels):
        chosen = {r["group"]: r for r in runs if r["label"] == label}
        present = [g for g in groups if g in chosen]
        xs = [groups.index(g) + index * width for g in present]
        partial = any(chosen[g]["status"] == "partial" for g in present)
        bars = axes.bar(xs, [chosen[g]["metrics"]["speedup"] for g in present], width=width,
                        label=label + (" (partial)" if partial else ""),
                        yerr=_errors([chosen[g] for g in present], "speedup"), capsize=2)
        for bar, group in zip(bars, present):
            if chosen[group]["status"] == "partial":  # hollow, as in every plot
                bar.set_edgecolor(bar.get_facecolor())
                bar.set_facecolor("white")
            if flagged(chosen[group]):
                axes.annotate("!", (bar.get_x() + bar.get_width() / 2, bar.get_height()), textcoords="offset points",
                              xytext=(4, 2), fontsize=7)
    axes.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], groups, rotation=30, ha="right", fontsize=8)
    axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes.set_ylabel(f"speedup vs {reference_name(summary)} (95% CI)")
    fields = list(dict.fromkeys((summary.get("group_fields") or {}).get(g) or summary.get("group_by") or "group"
                                for g in groups))
    axes.set_title(f"speedup per {' and per '.join(fields)}", fontsize=9)
    if labels:
        _legend_outside(axes, 6)
    return _save(plot, out_dir, "speedup_by_group.png", plt)


def write_report(out_dir: Path, summary: dict, title: str, summary_copy: str | None = None,
                 with_plots: bool = True) -> None:
    write_json(out_dir / "summary.json", summary)
    if summary_copy:
        write_json(out_dir / summary_copy, summary)
    write_atomic(out_dir / "summary.csv", csv_text(summary))
    if summary.get("serving"):
        write_atomic(out_dir / "serving.csv", csv_text(summary, served=True))
    write_atomic(out_dir / "summary.md", markdown(summary, title))
    if with_plots:
        plots(summary, out_dir)


def print_table(summary: dict, console) -> None:
    """The headline columns: under load a table per load point, then the overall runs of fixed batches (summary.md
    has every column, the per-group tables and the crossover)."""
    if summary.get("serving"):
        console.print("[bold]speculate under load[/bold] (every column and the crossover in summary.md; ! = flagged)")
        runs = summary["serving"]["runs"]
        for load in dict.fromkeys(load_label(run) for run in runs):
            _print(console, load, [r for r in runs if load_label(r) == load],
                   columns_for(runs, served=True, terminal=True))
    overall = [r for r in summary["runs"] if r.get("group") is None]
    if overall or not summary.get("serving"):
        _print(console, "speculate (all columns and groups in summary.md; ! = flagged, see its notes)", overall,
               columns_for(overall, terminal=True))


def _print(console, title: str, runs: list[dict], columns: list[Column]) -> None:
    """One terminal table, a row per run."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for header in (c.header for c in columns):
        table.add_column(header, justify="left" if header == "point" else "right", overflow="fold",
                         min_width=24 if header == "point" else 6)
    for run in runs:
        table.add_row(*[cell(run, column) for column in columns])
    console.print(table)


# ---- serving runs (config load:, eval/served_figures.py) ------------------------------------------------------------------

def serving_synthetic_lines(runs: list[dict]) -> list[str]:
    """Under load, per synthetic-acceptance point: the set alpha against the estimated one, and the throughput
    speedup against the prediction (the cost model's test under load; legend: synthetic_acceptance)."""
    chosen = [r for r in runs if r.get("synthetic_acceptance") is not None and r["status"] in ("ok", "partial")]
    if not chosen:
        return []
    lines = ["", "Synthetic acceptance under load (each draft accepted by a seeded Bernoulli(alpha) chain at the set "
             "alpha, not by the target: outputs are not the target's, no exact match; kept out of the crossovers; "
             "legend: synthetic_acceptance):", "",
             "| point | load | set alpha | alpha [95% CI] | speedup tput [95% CI] | predicted [alpha's CI] | c | v | "
             "measured / predicted [speedup's CI] |", "|---|---|---|---|---|---|---|---|---|"]
    for r in chosen:
        lines.append(f"| {md_cell(line_label(r))} | {md_cell(load_label(r))} | "
                     f"{synthetic_cells(r, cell(r, column_of('speedup_tput', served=True)))} |")
    return lines


def serving_group_lines(runs: list[dict]) -> list[str]:
    """A load point's figures per group of its requests (legend: by_group; the table's group_columns), where it has
    groups: a speculative point's TPOT speedup without an interval says how many requests it rests on."""
    rows = [{"label": run["label"], "group": g["group"], "status": "ok", "metrics": g,
             "flags": [{"code": "few_samples"}] if "acceptance_pooled" in g else []}
            for run in runs for g in (run.get("metrics") or {}).get("by_group") or []]
    if not rows:
        return []
    own = [Column("point", ("label",), "{}"), Column("group", ("group",), "{}"), Column("requests", ("requests",), "{}")]
    return ["", "Per group of its requests (legend: by_group):", ""] + _table(rows, own + group_columns())


def serving_lines(summary: dict) -> list[str]:
    """A table per load point (its methods), then the crossovers, measured beside predicted."""
    serving = summary.get("serving")
    if not serving:
        return []
    slo = serving.get("slo")
    limits = ", ".join(f"{k} {v:g}" for k, v in (slo or {}).items()) or "none set (config load.slo): no goodput"
    reference = reference_name({"runs": serving["runs"]})
    lines = ["", "## Under load", "", f"Every method of a load point served the same requests on the same arrival "
             f"schedule; speedups are against the {reference} of the same load point (legend: speedup_tput, "
             f"speedup_tpot), 'tok/s ratio' is the measured system output tok/s over the reference's (a reading). "
             f"SLO: {limits}."]
    others = sorted({REGISTRY[r["method"]].engine for r in serving["runs"] if r["method"] in REGISTRY
                     and not is_home(REGISTRY[r["method"]].engine)})
    if others:  # said, since the fixed batches' Engines table would be looked for here
        titles = ", ".join(ENGINE_TEXTS[e].title if e in ENGINE_TEXTS else e for e in others)
        lines += ["", f"Engines: no table under load: the engine comparison (another engine's reference against our "
                  f"baseline, paired prompt batch by prompt batch) is built for fixed batches only; here {titles}'s "
                  "points and ours each read against their own reference, in the tables below, and no figure sets "
                  "one engine's tok/s against the other's."]
    columns = columns_for(serving["runs"], served=True)
    by_load: dict[str, list[dict]] = {}
    for run in serving["runs"]:
        by_load.setdefault(load_label(run), []).append(run)
    for load, runs in by_load.items():
        lines += ["", f"### {load} ({runs[0]['metrics'].get('requests', '-')} requests)", ""] + _table(runs, columns)
        failed = [r for r in runs if r["status"] in ("failed", "skipped")]
        lines += [f"- {r['label']}: {r['status']}: {r.get('error')}" for r in failed]
        lines += serving_group_lines(runs)
    lines += serving_synthetic_lines(serving["runs"])
    lines += source_lines([r for r in serving["runs"] if r["status"] in ("ok", "partial")])
    crossovers = serving.get("crossovers") or []
    if crossovers:
        lines += ["", "Crossover (where the speedup crosses 1 as the load grows; legend: crossovers):", "",
                  "| line | load axis | speedup tput (pred) by load | measured | interval above 1 up to | predicted | "
                  "TPOT speedup |", "|---|---|---|---|---|---|---|"]
        for c in crossovers:
            axis = c["axis"]
            held = "request_rate" if axis == "concurrency" else "concurrency"
            held_text = f"rate {load_text(c[held], held)}" if held == "request_rate" else f"conc {c[held]}"
            curve = "; ".join(f"{load_text(x, axis)}: {_fmt(s)} ({_fmt(p)})" for x, s, p in
                              zip(c["loads"], c["speedup_tput"], c["predicted_speedup"]))
            highest = c["measured"].get("highest_load_ci_above_1")
            lines.append(f"| {md_cell(c['line'])} | {axis} ({held_text}) | {curve} | "
                         f"{crossing_text(c['measured'], axis)} | "
                         f"{'no load' if highest is None else load_text(highest, axis)} | "
                         f"{crossing_text(c['predicted'], axis) + (' (replay)' if c.get('predicted_by') == 'replay' else ' (Leviathan)') if any(p is not None for p in c['predicted_speedup']) else '-'} | "
                         f"{crossing_text(c['tpot'], axis)} |")
    versus = serving.get("versus_fixed") or []
    if versus:
        lines += ["", "Schedules against the best fixed K (the constant schedule's highest throughput speedup at the same "
                  "load, over the same requests; legend: versus_fixed):", "",
                  "| load | schedule | best fixed K | tput ratio [95% CI] | verdict | tok/s ratio |", "|---|---|---|---|---|---|"]
        lines += [f"| {md_cell(v['load'])} | {md_cell(v['line'])} | {md_cell(v['best_fixed_line'])} | "
                  f"{_with_ci(v['tput_ratio'], v['tput_ratio_ci95'])} | {v['verdict']} (n={v['requests_paired']}) | "
                  f"{_fmt(v['output_tok_s_ratio'])} |" for v in versus]
    return lines


def _rate_positions(loads: list) -> tuple[list[float], dict]:
    """x positions of rates, 'all at once' (None) placed past the largest rate; and the tick labels."""
    finite = [x for x in loads if x is not None]
    beyond = (max(finite) * 1.5) if finite else 1.0
    return [beyond if x is None else x for x in loads], {beyond: "all at once"}


def serving_plots(summary: dict, out_dir: Path, plt) -> list[str]:
    """speedup_vs_<axis>.png: the throughput speedup against the load, one line per method line drawn as a fixed
    batch's against gamma (_curve: its 95% CIs, partial points hollow, flagged ones '!', its prediction dashed with the
    replay's band), the measured crossing marked x (on 1.0); tpot_vs_throughput.png: TPOT P50 (solid)
    and P99 (dashed) against output tok/s, baseline and methods, a point per load (cN rR: its concurrency and rate)."""
    serving = summary["serving"]
    by_label = {run["label"]: run for run in serving["runs"]}
    written = []
    for axis in ("concurrency", "request_rate"):
        chosen = [c for c in serving.get("crossovers") or [] if c["axis"] == axis]
        if not chosen:
            continue
        plot, axes = plt.subplots(figsize=(6.5, 4.2))
        ticks: dict = {}
        for index, c in enumerate(chosen):
            xs, named = _rate_positions(c["loads"]) if axis == "request_rate" else (c["loads"], {})
            ticks.update(named)
            held = "request_rate" if axis == "concurrency" else "concurrency"
            label = c["line"] + (f", conc {c[held]}" if held == "concurrency" else
                                 "" if c[held] is None else f", rate {c[held]:g}/s")
            runs = [by_label.get(name) or {} for name in c["labels"]]
            color = _curve(axes, xs, c["speedup_tput"], label, intervals=c["speedup_tput_ci95"],
                           hollow=[run.get("status") == "partial" for run in runs], marked=[flagged(run) for run in runs],
                           predicted=list(zip(xs, c["predicted_speedup"], c.get("predicted_speedup_ci95")
                                              or [None] * len(xs))),
                           predicted_label=f"{label} (predicted)", color=f"C{index % 10}")
            first = c["measured"].get("crossing")
            if first and first["load"] is not None:
                axes.plot([first["load"]], [1.0], marker="x", markersize=10, color=color, linestyle="none")
                axes.annotate(f"{first['load']:.3g}", (first["load"], 1.0), textcoords="offset points",
                              xytext=(4, 6), color=color, fontsize=8)
        axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        if axis == "concurrency":
            loads = sorted({x for c in chosen for x in c["loads"]})  # a linear axis: the crossing is linear between loads
            axes.set_xticks(loads, [f"{x:g}" for x in loads])
        elif ticks:
            positions = sorted({x for c in chosen for x in _rate_positions(c["loads"])[0]})
            axes.set_xticks(positions, [ticks.get(x, f"{x:g}") for x in positions])
        axes.set_xlabel("concurrency (requests in flight at most)" if axis == "concurrency" else "request rate (req/s)")
        axes.set_ylabel(f"throughput speedup vs {reference_name(summary)} (95% CI)")
        axes.set_title("speedup under load: x = measured crossing of 1, dashed = predicted", fontsize=9)
        axes.grid(alpha=0.3)
        _legend_outside(axes, 7)
        written.append(_save(plot, out_dir, f"speedup_vs_{'rate' if axis == 'request_rate' else axis}.png", plt))
    runs = [r for r in serving["runs"] if r["status"] in ("ok", "partial") and r["metrics"].get("output_tok_s")]
    if runs:
        plot, axes = plt.subplots(figsize=(6.5, 4.2))
        lines: dict[tuple, list[dict]] = {}
        for run in runs:
            lines.setdefault(line_of(run), []).append(run)
        for index, (_, rows) in enumerate(lines.items()):
            rows = sorted(rows, key=lambda r: (load_value(r, "request_rate"), r["concurrency"]))  # in load order
            color, xs = f"C{index % 10}", [r["metrics"]["output_tok_s"] for r in rows]
            for quantile, style, marker in (("p50", "-", "o"), ("p99", "--", "^")):
                ys = [(r["metrics"].get("tpot_s") or {}).get(quantile) for r in rows]
                shown = [(x, y * 1000) for x, y in zip(xs, ys) if y is not None]
                axes.plot([x for x, _ in shown], [y for _, y in shown], linestyle=style, marker=marker, color=color,
                          label=f"{line_label(rows[0])} TPOT {quantile.upper()}")
            for x, r in zip(xs, rows):  # which load point each is
                tag = f"c{r['concurrency']}" + ("" if r.get("request_rate") is None else f" r{r['request_rate']:g}")
                axes.annotate(tag, (x, (r["metrics"].get("tpot_s") or {}).get("p50", 0) * 1000), fontsize=6,
                              textcoords="offset points", xytext=(3, -8), color=color)
        axes.set_xlabel("output tok/s (system)")
        axes.set_ylabel("TPOT (ms per output token after the first)")
        axes.set_title("latency against throughput, a point per load point", fontsize=9)
        axes.grid(alpha=0.3)
        _legend_outside(axes, 6)
        written.append(_save(plot, out_dir, "tpot_vs_throughput.png", plt))
    return written


def compiled_note(role: str, graphs: dict) -> str:
    """One compiled model's counters (decode/static_kv.py CompiledModel.summary) in words: what a step's cost rests on
    (a second buffer set or a CUDA graph recorded after the warmup re-records graphs; a skip runs a step without one)."""
    sets = ", ".join(f"{n} at capacity {capacity}" for capacity, n in (graphs.get("buffer_sets") or {}).items())
    text = (f"engine.compile, {role}: {graphs.get('graphs')} graphs, {graphs.get('recompiles_after_warmup')} after the "
            f"warmup; buffer sets {sets or 'none'}")
    if graphs.get("cuda_graphs"):
        text += (f"; CUDA graphs recorded {graphs.get('recordings')}, {graphs.get('recordings_after_warmup')} after the "
                 f"warmup, skipped {graphs.get('skips')}")
    return text
