"""hybrid and suffix against prompt lookup and the draft model's best chain and tree, per category, in one run.

    python benchmarks/hybrid_bench.py [--set KEY=VALUE ...] [--out DIR] [--from DIR]

Builds a prompt file from configs/data/heldout_prompts.jsonl (every prompt: several per task family) and the first
`--mt-bench` questions of two MT-Bench categories, runs benchmarks/hybrid.yaml on it (benchmarks/methods_bench.py
run_on), and writes HYBRID.md: the speedup table (rows = points, columns = categories and overall), acceptance per
draft source of the points that draw from several, and the done-when check: hybrid's worst category against the
better of prompt lookup and the best draft-model point there, and its overall speedup against 1.1 x the better of
the two.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

MT_BENCH = ("extraction", "coding")


def build_prompts(path: Path, mt_bench: int, categories=MT_BENCH, heldout: bool = True, gsm8k: int = 0) -> int:
    """The prompt file: the held-out prompts (several per task family), the first `mt_bench` questions of each MT-Bench
    category named, and the first `gsm8k` GSM8K test questions (category gsm8k)."""
    data = ROOT / "configs" / "data"
    rows = [json.loads(line) for line in (data / "heldout_prompts.jsonl").read_text().splitlines()
            if line.strip()] if heldout else []
    counts: dict[str, int] = {}
    for line in (data / "mt_bench_question.jsonl").read_text().splitlines():
        question = json.loads(line)
        if question["category"] in categories and counts.get(question["category"], 0) < mt_bench:
            counts[question["category"]] = counts.get(question["category"], 0) + 1
            rows.append({"prompt": question["turns"][0], "category": question["category"]})
    for line in (data / "gsm8k_test_50.jsonl").read_text().splitlines()[:gsm8k]:
        rows.append({"prompt": json.loads(line)["question"], "category": "gsm8k"})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def speedups(summary: dict) -> dict[tuple, float]:
    return {(r["label"], r.get("group")): r["metrics"].get("speedup") for r in summary["runs"]
            if r.get("status") in ("ok", "partial") and r.get("metrics")}


def verdict(summary: dict) -> list[str]:
    """The done-when check, from the run's own figures."""
    by = speedups(summary)
    labels = {r["label"]: r["method"] for r in summary["runs"]}
    hybrid = next((label for label, method in labels.items() if method == "hybrid"), None)
    lookup = next((label for label, method in labels.items() if method == "prompt_lookup"), None)
    drafts = [label for label, method in labels.items() if method == "speculative"]
    if hybrid is None or lookup is None or not drafts:
        return ["(the run lacks hybrid, prompt_lookup or a speculative point: no check)"]
    groups = sorted({g for _, g in by if g is not None}) + [None]
    lines = ["| category | hybrid | prompt_lookup | best draft-model point | better of the two | hybrid - better |",
             "|---|---|---|---|---|---|"]
    worst_gap, overall = None, None
    for group in groups:
        h, p = by.get((hybrid, group)), by.get((lookup, group))
        best = max(((by.get((d, group)), d) for d in drafts if by.get((d, group)) is not None), default=(None, None))
        if h is None or p is None or best[0] is None:
            continue
        better = max(p, best[0])
        lines.append(f"| {group or 'overall'} | {h:.2f} | {p:.2f} | {best[0]:.2f} ({best[1]}) | {better:.2f} | "
                     f"{h - better:+.2f} |")
        if group is None:
            overall = (h, better)
        else:
            worst_gap = h - better if worst_gap is None else min(worst_gap, h - better)
    if worst_gap is not None:
        lines += ["", f"- worst category: hybrid - better = {worst_gap:+.2f} (target >= -0.05): "
                      f"{'met' if worst_gap >= -0.05 else 'not met'}"]
    if overall:
        lines.append(f"- overall: hybrid {overall[0]:.2f} vs 1.1 x better = {1.1 * overall[1]:.2f}: "
                     f"{'met' if overall[0] >= 1.1 * overall[1] else 'not met'}")
    return lines


def sources(summary: dict) -> list[str]:
    from eval.sources import source_text

    lines = []
    for r in summary["runs"]:
        table = (r.get("metrics") or {}).get("acceptance_by_source")
        if table and r.get("status") in ("ok", "partial"):
            lines.append(f"- {r['label']} [{r.get('group') or 'overall'}]: {source_text(table)}")
    return lines


def main() -> int:
    from methods_bench import bench_parser, measured, table

    parser = bench_parser(__doc__, "hybrid")
    parser.add_argument("--mt-bench", type=int, default=2, help="questions of each of the two MT-Bench categories")
    parser.add_argument("--categories", default=",".join(MT_BENCH), help="MT-Bench categories, comma-separated")
    parser.add_argument("--no-heldout", action="store_true", help="leave out configs/data/heldout_prompts.jsonl")
    parser.add_argument("--gsm8k", type=int, default=0, help="the first N GSM8K test questions (category gsm8k)")
    args = parser.parse_args()
    out = measured(args, "hybrid", lambda data: build_prompts(data, args.mt_bench, tuple(args.categories.split(",")),
                                                               not args.no_heldout, args.gsm8k))
    summary = json.loads((out / "summary.json").read_text())
    text = ("Speedup vs the baseline, 95% paired bootstrap CI over prompts ((n=k): k prompts, too few for an interval); "
            "! = flagged (see summary.md)\n\n" + table(summary) +
            "\nAcceptance per draft source (accepted tokens from a source / tokens it drafted, pooled over rounds):\n\n" +
            "\n".join(sources(summary)) + "\n\nDone-when check (speedups):\n\n" + "\n".join(verdict(summary)) + "\n")
    (out / "HYBRID.md").write_text(text)
    print(text)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
