"""python -m eval DIR: rebuild a report folder's summary, tables and plots from its samples.jsonl."""
from __future__ import annotations

import sys
from pathlib import Path

from eval.costs import read_config, read_progress, run_costs, write_run_costs
from eval.summary import summarize
from eval.report import write_report
from utils import UserError
from utils.io import lock_holder, read_jsonl


def rebuild(folder: Path) -> dict:
    """Every figure again from the raw records and progress.json: the same function the run used. Bad input (a
    progress.json or config.yaml that does not parse, a probe's time that is no time, a broken line of
    samples.jsonl before its last): UserError, naming the file."""
    progress, config = read_progress(folder), read_config(folder)
    run_costs(progress, {}, config, where=str(folder / "progress.json"))  # its probes, refused naming the file
    summary = summarize(read_jsonl(folder / "samples.jsonl"), progress, config)
    report = config.get("report") or {}
    write_report(folder, summary, config.get("name", folder.name), report.get("summary_file_name"),
                 with_plots=report.get("plots", True))  # the run's own choice: report.plots: false writes none
    write_run_costs(folder, progress, config)
    return summary


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not (Path(argv[0]) / "samples.jsonl").exists():
        print("usage: python -m eval REPORT_DIR (a folder with samples.jsonl)", file=sys.stderr)
        return 2
    holder = lock_holder(Path(argv[0]))
    if holder:  # its run rewrites these files as it goes: a rebuild beside it would be overwritten, or overwrite
        print(f"error: {argv[0]} is in use by a live run ({holder}); rebuild it once that run has ended",
              file=sys.stderr)
        return 2
    try:
        rebuild(Path(argv[0]))
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
