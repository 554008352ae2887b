"""The report folder: config.yaml, env.json, samples.jsonl (raw records, grown by whole batches),
progress.json, and the summary files rebuilt from them (costs.json: the probes' cost profile, eval/costs.py). Only
this module writes the folder."""
from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from eval.summary import engines_of, summarize
from eval.flags import old_readings
from eval.records import OLD_COST_KEYS, OLD_DRIFT_KEYS, batch_key, per_process
from eval.costs import read_config, read_progress, run_costs, write_run_costs
from eval.report import write_report
from utils import UserError, signals_held
from utils.io import append_jsonl, folder_lock, read_jsonl, write_atomic, write_json


@dataclass
class Progress:
    """progress.json: what the samples cannot say by themselves."""
    status: str = "running"
    failures: list[dict] = field(default_factory=list)  # {point axes..., status, error}
    planned: dict = field(default_factory=dict)  # point label -> (repeat, batch) units planned
    costs: dict = field(default_factory=dict)  # str(batch_size) -> process -> CostProbe.to_json() (runner/probes.py)
    drift: dict = field(default_factory=dict)  # str(batch_size) -> process -> drift probe readings (s), in order
    processes: dict = field(default_factory=dict)  # process id -> {"name": a Ray worker or "process k", "worker"}
    ci_target: float | None = None  # config.ci_target: the ci_wide flag's rule, and repeats: auto's
    numerics: dict = field(default_factory=dict)  # {"target": {...}, "drafts": {label: {...}}}
    memory: dict = field(default_factory=dict)  # peak host (and GPU) memory of the run
    workers: dict = field(default_factory=dict)  # worker id -> its device and hardware (a Ray run)
    group_by: str | None = None
    notes: list[str] = field(default_factory=list)
    prompts: dict = field(default_factory=dict)
    order: str = ("per batch, every point of a comparison (its batch size or load point, and temperature) runs on the "
                  "same prompts back to back, in an order that changes from batch to batch and repeat to repeat (a "
                  "Williams design: over a cycle each point runs in each position, and right after each other point, "
                  "equally often)")
    engine_info: dict = field(default_factory=dict)  # engine name -> its info (Engine.info: version, pairing, order ...)


class ReportFolder:
    def __init__(self, path: Path, raw_config: dict, title: str, summary_copy: str | None, plots: bool):
        self.path = Path(path)
        self.raw_config, self.title, self.summary_copy, self.plots = raw_config, title, summary_copy, plots
        self.samples_path = self.path / "samples.jsonl"
        self.samples: list[dict] = []  # what samples.jsonl holds, in memory to rebuild the summary per batch
        self.progress = Progress()

    # -- opening ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def held(self, resume: bool = False):
        """The folder for this process alone while the run lives (utils/io.py folder_lock), taken before anything is
        written there: a second run on it (--output-dir or --resume) is refused in one line."""
        if resume and not self.path.is_dir():
            yield  # reopen() says the folder is not a report folder
            return
        with folder_lock(self.path, "--resume" if resume else "--output-dir"):
            yield

    def create(self) -> None:
        if self.samples_path.exists():
            raise UserError(f"--output-dir {self.path} already holds a run; use --resume {self.path} "
                            "to continue it, or another folder")
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path / "config.yaml", yaml.safe_dump(self.raw_config, sort_keys=False))

    def reopen(self) -> None:
        """--resume: the same config, every finished batch kept, a torn last write dropped."""
        saved = self.path / "config.yaml"
        if not saved.is_file():
            raise UserError(f"--resume {self.path}: no config.yaml there; is it a report folder of this tool?")
        if not self._same_config(read_config(self.path)):
            raise UserError(f"--resume {self.path}: the config differs from the one this run started with; "
                            "resume with the same config and --set values (or none: the saved one is used)")
        progress = self.path / "progress.json"
        if progress.is_file():
            saved_progress = read_progress(self.path)
            run_costs(saved_progress, {}, None, where=str(progress))  # its probes as strict as a profile's, or refused
            for key in ("costs", "drift", "numerics", "workers", "processes", "prompts"):
                setattr(self.progress, key, saved_progress.get(key) or {})
            self.progress.engine_info = engines_of(saved_progress)
            # a folder from before probes were kept per process: its entries become the earlier process's
            self.progress.costs = {b: per_process(e, OLD_COST_KEYS) for b, e in self.progress.costs.items()}
            self.progress.drift = {b: {p: old_readings(r) for p, r in per_process(e, OLD_DRIFT_KEYS).items()}
                                   for b, e in self.progress.drift.items()}
        self._drop_incomplete_batches()

    def _same_config(self, saved) -> bool:
        """The saved config is this run's, once the defaults of keys added since are filled in (a folder written before
        speculative.tree existed has no such key; its value then was the default)."""
        if saved == self.raw_config:
            return True
        from utils.config import validate

        try:
            return validate(saved).model_dump(mode="json") == self.raw_config
        except UserError:
            return False

    def _drop_incomplete_batches(self) -> None:
        """A kill can tear the write of a batch: keep only batches whose every row is on disk (once)."""
        samples = read_jsonl(self.samples_path, repair=True)
        older = False
        for s in samples:
            # a serving point's batch size is the most requests that can be in flight, min(concurrency, requests); a
            # folder written before stored its concurrency there: read as now, so that --resume keeps its load points
            if s.get("concurrency") is not None and s.get("batch_rows") and s.get("batch_size", 0) > s["batch_rows"]:
                s["batch_size"], older = s["batch_rows"], True
        rows: dict[tuple, dict] = {}
        for s in samples:
            # a row written twice counts once; a serving point's requests cycle through the prompts: the request tells them apart
            rows.setdefault(batch_key(s), {})[(s["sample_id"], s.get("request"))] = s
        kept = [s for key, by_id in rows.items() for s in by_id.values()
                if len(by_id) == next(iter(by_id.values()))["batch_rows"]]
        order = {id(s): i for i, s in enumerate(samples)}
        self.samples = sorted(kept, key=lambda s: order[id(s)])
        if len(self.samples) < len(samples) or older:
            write_atomic(self.samples_path, "".join(json.dumps(s, separators=(",", ":")) + "\n" for s in self.samples))

    def done_batches(self) -> set[tuple]:
        return {batch_key(s) for s in self.samples}

    # -- writing ----------------------------------------------------------------------------------
    def append(self, rows: list[dict]) -> list[dict]:
        """Append a batch's records unless that batch is already on disk (a retried unit); returns what was written.
        Ctrl-C and SIGTERM wait until the records are both on disk and in memory: an interrupt between the two left
        records on disk that the interrupted report did not hold (it said "interrupted before any measurement")."""
        done = self.done_batches()
        fresh = [r for r in rows if batch_key(r) not in done]
        with signals_held():
            append_jsonl(self.samples_path, fresh)
            self.samples.extend(fresh)
        return fresh

    def write_env(self, env: dict, process: str) -> None:
        """env.json: the first process's machine at the top, and every process's under "processes" (a resumed run
        adds its own: the machine that measured each batch stays on record)."""
        path = self.path / "env.json"
        saved = json.loads(path.read_text()) if path.is_file() else None
        entry = {"process": process, **env}
        if saved is None:
            write_json(path, {**env, "processes": [entry]})
        else:
            processes = saved.get("processes") or [{k: v for k, v in saved.items() if k != "processes"}]
            write_json(path, {**saved, "processes": processes + [entry]})

    def save_progress(self) -> None:
        write_json(self.path / "progress.json", asdict(self.progress))

    def summary(self) -> dict:
        return summarize(self.samples, asdict(self.progress), self.raw_config)

    def write_summary(self, plots: bool = False) -> dict:
        summary = self.summary()
        write_report(self.path, summary, self.title, self.summary_copy, with_plots=plots and self.plots)
        write_run_costs(self.path, asdict(self.progress), self.raw_config)
        return summary
