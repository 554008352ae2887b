"""The report folder's tables and plots, and the terminal table, from a summary."""
from __future__ import annotations

import csv
import io
from pathlib import Path

from utils.io import write_atomic, write_json

COLUMNS = [  # (header, metric path, format)
    ("method", "method", "{}"), ("gamma", "gamma", "{}"), ("batch", "batch_size", "{}"),
    ("tok/s", "throughput_tok_s", "{:.2f}"), ("speedup", "speedup", "{:.3f}"), ("dec speedup", "decode_speedup", "{:.3f}"),
    ("accept", "acceptance_rate", "{:.3f}"), ("tau", "block_efficiency", "{:.3f}"),
    ("MAT", "mean_accepted_tokens", "{:.3f}"), ("alpha", "alpha", "{:.3f}"),
    ("c", "draft_cost_ratio_c", "{:.3f}"), ("v", "verify_cost_ratio_v", "{:.3f}"),
    ("pred", "predicted_speedup", "{:.3f}"), ("eff", "efficiency", "{:.3f}"), ("dec eff", "decode_efficiency", "{:.3f}"),
    ("lat p50 s", "latency_s.p50", "{:.3f}"), ("lat p90 s", "latency_s.p90", "{:.3f}"),
    ("TTFT s", "ttft_s.mean", "{:.3f}"), ("prefill %", "prefill_share", "{:.0%}"), ("TPOT ms", "tpot_s.mean", "{:.1f}"),
    ("exact", "exact_match", "{:.3f}"), ("acc", "accuracy", "{:.3f}"),
]


def _value(run: dict, path: str):
    if path in ("method", "gamma", "batch_size"):
        return run.get(path)
    node = run.get("metrics", {})
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def cell(run: dict, path: str, fmt: str) -> str:
    value = _value(run, path)
    if path == "tpot_s.mean" and value is not None:
        value *= 1000
    if run.get("status") != "ok" and path not in ("method", "gamma", "batch_size"):
        return run.get("status", "") if path == "throughput_tok_s" else ""
    return "-" if value is None else fmt.format(value)


def rows(summary: dict) -> list[list[str]]:
    return [[cell(run, path, fmt) for _, path, fmt in COLUMNS] for run in summary["runs"]]


def markdown(summary: dict, title: str = "") -> str:
    headers = [h for h, _, _ in COLUMNS]
    lines = [f"# {title}\n" if title else "", "| " + " | ".join(headers) + " |",
             "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(summary)]
    failed = [r for r in summary["runs"] if r["status"] != "ok"]
    if failed:
        lines += ["", "Not measured:"] + [f"- {r['method']} gamma={r['gamma']} batch={r['batch_size']}: "
                                          f"{r['status']}: {r['error']}" for r in failed]
    if summary.get("best"):
        lines.append("")
    for batch_size, best in summary.get("best", {}).items():
        text = f"- batch {batch_size}: best measured gamma {best['measured_best_gamma']} " \
               f"({best['measured_best_speedup']:.3f}x)"
        if "predicted_best_gamma" in best:
            text += f"; predicted best gamma {best['predicted_best_gamma']} ({best['predicted_best_speedup']:.3f}x " \
                    f"at alpha {best['alpha_used']:.3f})"
        lines.append(text)
    notes = list(summary.get("notes", []))
    if summary.get("order"):
        notes.append(f"order: {summary['order']}")
    prompts = summary.get("prompts") or {}
    if prompts:
        notes.append(f"prompts: {prompts.get('count')} from {prompts.get('source')}, mean {prompts.get('mean_tokens', 0):.0f} "
                     f"tokens; {prompts.get('truncated', 0)} truncated, {prompts.get('skipped_too_long', 0)} skipped as too long")
    if notes:
        lines += ["", "Notes:"] + [f"- {n}" for n in notes]
    lines += ["", "Legend:"] + [f"- {k}: {v}" for k, v in summary["legend"].items()]
    return "\n".join(line for line in lines) + "\n"


def csv_text(summary: dict) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    paths = [path for _, path, _ in COLUMNS]
    writer.writerow(paths + ["status", "error"])
    for run in summary["runs"]:
        writer.writerow([_value(run, p) for p in paths] + [run["status"], run.get("error", "")])
    return buffer.getvalue()


def plots(summary: dict, out_dir: Path) -> list[str]:
    """speedup, acceptance rate and block efficiency against gamma, one line per batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = [r for r in summary["runs"] if r["method"] == "speculative" and r["status"] == "ok"]
    written = []
    for metric, label in [("speedup", "speedup vs baseline"), ("acceptance_rate", "acceptance rate"),
                          ("block_efficiency", "block efficiency (tokens / target forward)")]:
        figure, axes = plt.subplots(figsize=(5, 3.5))
        for batch_size in sorted({r["batch_size"] for r in spec}):
            points = sorted((r["gamma"], r["metrics"].get(metric)) for r in spec if r["batch_size"] == batch_size)
            points = [(g, v) for g, v in points if v is not None]
            if points:
                axes.plot([g for g, _ in points], [v for _, v in points], marker="o", label=f"batch {batch_size}")
        if metric == "speedup":
            axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        axes.set_xlabel("gamma")
        axes.set_ylabel(label)
        axes.grid(alpha=0.3)
        if spec:
            axes.legend()
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=110)
        plt.close(figure)
        name = f"{metric}.png"
        write_atomic(out_dir / name, buffer.getvalue())
        written.append(name)
    return written


def write_report(out_dir: Path, summary: dict, title: str, summary_copy: str | None = None,
                 with_plots: bool = True) -> None:
    write_json(out_dir / "summary.json", summary)
    if summary_copy:
        write_json(out_dir / summary_copy, summary)
    write_atomic(out_dir / "summary.csv", csv_text(summary))
    write_atomic(out_dir / "summary.md", markdown(summary, title))
    if with_plots:
        plots(summary, out_dir)


TERMINAL = ["method", "gamma", "batch", "tok/s", "speedup", "dec speedup", "accept", "tau", "pred", "eff", "lat p50 s", "exact", "acc"]


def print_table(summary: dict, console) -> None:
    """The headline columns (summary.md has them all)."""
    from rich.table import Table

    table = Table(title="speculate (all columns in summary.md)")
    chosen = [(h, p, f) for h, p, f in COLUMNS if h in TERMINAL]
    for header, _, _ in chosen:
        table.add_column(header, justify="right", no_wrap=True)
    for run in summary["runs"]:
        table.add_row(*[cell(run, path, fmt).replace("speculative", "spec") for _, path, fmt in chosen])
    console.print(table)
