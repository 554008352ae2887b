"""python -m eval DIR: rebuild a report folder's summary, tables and plots from its samples.jsonl."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from eval.costs import write_run_costs
from eval.summary import summarize
from eval.report import write_report
from utils.io import read_jsonl


def rebuild(folder: Path) -> dict:
    """Every figure again from the raw records and progress.json: the same function the run used."""
    progress = json.loads((folder / "progress.json").read_text()) if (folder / "progress.json").exists() else {}
    config = yaml.safe_load((folder / "config.yaml").read_text()) if (folder / "config.yaml").exists() else {}
    summary = summarize(read_jsonl(folder / "samples.jsonl"), progress, config)
    report = config.get("report") or {}
    write_report(folder, summary, config.get("name", folder.name), report.get("summary_file_name"),
                 with_plots=report.get("plots", True))  # the run's own choice: report.plots: false writes none
    write_run_costs(folder, progress, config)
    return summary


if __name__ == "__main__":
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / "samples.jsonl").exists():
        print("usage: python -m eval REPORT_DIR (a folder with samples.jsonl)", file=sys.stderr)
        sys.exit(2)
    rebuild(Path(sys.argv[1]))
    print(sys.argv[1])
