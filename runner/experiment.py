"""The experiment: refuse bad input early, open the report folder, run the sweep unit by unit on the engines of
its methods (runner/engines: ours here or on a Ray cluster, and the others), keep every finished batch on disk, and
rebuild the report from the raw records."""
from __future__ import annotations

import signal
import time
from pathlib import Path

import torch

from decode.methods import REGISTRY
from eval.records import Comparison, Point
from eval.report import print_table
from runner.display import Display
from runner.engines import ENGINES, HOME, Engine
from runner.plan import Unit, comparisons, num_units, points_of, units_of
from runner.load import follows_of, request_count, requests_of
from runner.probes import PROCESS, environment
from runner.records import UnitResult
from runner.storage import ReportFolder
from utils import UserError, raise_interrupt, signals_held
from utils.config import Config
from utils.data import prompts_digest, resolve_path
from utils.memory import PeakSampler
from utils.models import check_model_config, resolve_device

EXIT_OK, EXIT_BAD_INPUT, EXIT_POINTS_FAILED, EXIT_INTERRUPTED = 0, 2, 3, 130
SUMMARY_EVERY_S = 30.0
WARN_WAITED_S = 3600.0  # a run whose load points' arrivals and think times alone take longer is warned of


def preflight(config: Config) -> torch.device:
    """Everything that can be refused before a model loads."""
    device = resolve_device(config.device)
    check_model_config(config.target, "target")
    for index, draft in enumerate(config.draft):
        role = "draft" if len(config.draft) == 1 else f"draft[{index}]"
        check_model_config(draft, role)
        if draft.kind != "model" and draft.model.startswith("synthetic:"):
            from decode.head_models import HeadFormatError, parse_synthetic_head

            try:
                parse_synthetic_head(draft.model)
            except HeadFormatError as error:
                raise UserError(f"{role}.model: {error}") from None
    resolve_path(config.dataset.path)
    if config.engine.cpu_linear == "onednn_packed":
        for role, cfg in [("target", config.target)] + [("draft", d) for d in config.draft]:
            if device.type != "cpu" or cfg.dtype not in ("auto", "float32") or cfg.quantization != "none":
                raise UserError(f"engine.cpu_linear: onednn_packed needs device cpu, float32 and no quantization "
                                f"({role} is {config.device}, {cfg.dtype}, quantization {cfg.quantization}); use auto")
    if config.cluster.backend == "ray":
        from runner.cluster import check_ray

        check_ray(config)
    return device


# Ctrl-C and SIGTERM are held off while a report is written (signals_held(deliver=False): dropped, not delivered
# after): a second interrupt in the middle of writing would leave a stale summary, plots missing and no folder printed


class Experiment:
    def __init__(self, config: Config, raw: dict, out_dir: Path, console, resume: bool = False):
        self.config, self.console, self.resume = config, console, resume
        self.folder = ReportFolder(out_dir, raw, config.name, config.report.summary_file_name, config.report.plots)
        self.out_dir = Path(out_dir)
        self.display: Display | None = None
        self._summary_at = float("-inf")

    @property
    def progress(self):
        return self.folder.progress

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> int:
        device = preflight(self.config)
        with self.folder.held(self.resume):  # one run a folder: a second is refused before it writes anything
            return self._run_held(device)

    def _open(self, device: torch.device) -> None:
        """The folder opened (new or resumed) and the engines checked, before any model loads."""
        self.folder.reopen() if self.resume else self.folder.create()
        # the home engine always (it loads the prompts), the others where the config has their methods
        self.engines: dict[str, Engine] = {
            name: engine(self.config, device, self.out_dir, self.folder.raw_config, self.console.status)
            for name, engine in ENGINES.items() if name == HOME or engine.used_by(self.config)}
        env = environment(device)
        for name, engine in self.engines.items():  # before any model loads: each engine's environment and models
            found = engine.check()
            if found:
                env[name] = found
        self.folder.write_env(env, PROCESS)
        self.progress.status = "running"
        self.progress.group_by = self.config.dataset.group_by
        self.progress.ci_target = self.config.ci_target
        self.folder.save_progress()

    def _nothing_measured(self, device: torch.device | None = None) -> None:
        """An interrupt before the first batch: the folder says so (with the run's memory, where it was sampled), and
        holds no report of nothing; launch.py says "interrupted before any measurement"."""
        with signals_held(deliver=False):
            if device is not None:
                self.record_memory(device)
            self.progress.status = "interrupted"
            self.progress.notes.append("interrupted before any measurement")
            self.folder.save_progress()

    def _run_held(self, device: torch.device) -> int:
        try:
            self._open(device)
            previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, raise_interrupt)}
            self.memory = PeakSampler().start()
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (launch.py) before the run started: a new folder says so
            if not self.resume and (self.out_dir / "config.yaml").is_file():
                self._nothing_measured()
            raise
        try:
            self._run(device)
        except KeyboardInterrupt:
            if not self.folder.samples:  # nothing measured (loading the models, the warmup, the probes): nothing to report
                self._nothing_measured(device)
                raise
            # the report of what finished is written as at the normal finish below: with interrupts held off
            with signals_held(deliver=False):
                self.record_memory(device)
                self.progress.status = "interrupted"
                self.folder.save_progress()
                self.folder.write_summary(plots=True)
                self.console.print(f"[yellow]interrupted: the report holds every batch that finished; "
                                   f"continue with --resume {self.out_dir}[/yellow]")
            return EXIT_INTERRUPTED
        except UserError as error:  # refused after the folder was made (a model that cannot load, ...): say so there
            self.progress.status = "refused"
            self.progress.notes.append(f"refused: {error}")
            self.folder.save_progress()
            raise
        except Exception as error:  # a bug: the folder says the run stopped, not that it is still running
            self.progress.status = "crashed"
            self.progress.notes.append(f"crashed: {type(error).__name__}: {' '.join(str(error).split())[:300]}")
            self.folder.save_progress()
            raise
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        # every point is measured: a Ctrl-C now would only leave a stale summary, so the final report is
        # written with interrupts held off (it takes a moment)
        with signals_held(deliver=False):
            self.record_memory(device)
            failed = any(f.get("status") == "failed" for f in self.progress.failures)
            self.progress.status = "finished with failures" if failed else "finished"
            self.folder.save_progress()
            summary = self.folder.write_summary(plots=True)
            print_table(summary, self.console)  # held too: a Ctrl-C here would report a finished run as interrupted
        return EXIT_POINTS_FAILED if failed else EXIT_OK

    def _run(self, device: torch.device) -> None:
        """The engines run units and yield them finished; this process alone keeps what they bring (accept)."""
        self.progress.failures = []  # failed points are retried on resume
        started: list[Engine] = []
        try:
            home = self.engines[HOME]
            home.start(None)
            started.append(home)
            self.describe(home)
            for name, engine in self.engines.items():
                if name != HOME:
                    engine.start(home.session)
                    started.append(engine)
            self.sweep(self.engines)
        finally:  # Ctrl-C, SIGTERM or a failure: no engine's worker or process is left behind
            for engine in reversed(started):
                engine.close()

    def record_memory(self, device: torch.device) -> None:
        """The run's peak host memory (resident and anonymous), next to the GPU's peak."""
        memory = self.memory.stop()
        peaks = [s["peak_memory_bytes"] for s in self.folder.samples if s.get("peak_memory_bytes") is not None]
        if device.type == "cuda":  # the stats are reset per batch: the run's peak is the largest batch peak
            memory["gpu_peak_allocated_bytes"] = max(peaks, default=None)
        self.progress.memory = memory

    def describe(self, engine: Engine) -> None:
        """What the home engine found as it started: its processes' machines (env.json), Ray workers, and the notes."""
        self.describe_load(engine.session)
        for env, process in engine.environments:
            self.folder.write_env(env, process)
        self.progress.workers.update(engine.workers_info)
        self.progress.notes.extend(engine.notes)
        self.folder.save_progress()

    def describe_load(self, session) -> None:
        """What the loaded session tells the report: prompts, models, numerics."""
        prompts = session.prompt_set
        digest = prompts_digest(prompts) if prompts.conversations else None
        earlier = (self.progress.prompts or {}).get("digest")
        if digest and earlier and digest != earlier:
            raise UserError("--resume: the conversations' later turns came out otherwise than in the run being "
                            "resumed (the target's answers to the earlier turns differ: another device, dtype or "
                            "attention kernel); their records cannot be paired: start a new run")
        self.progress.prompts = {"digest": digest, "source": prompts.source, "count": len(prompts.prompts),
                                 "truncated": prompts.truncated, "skipped_too_long": prompts.skipped_too_long, "skipped_empty": prompts.skipped_empty,
                                 "prompt_field": prompts.field_name,
                                 "mean_tokens": sum(len(p.token_ids) for p in prompts.prompts) / len(prompts.prompts)}
        self.progress.notes = list(session.notes)
        self.progress.numerics = session.numerics
        if self.config.load:
            self.check_load(prompts.prompts)
        self.folder.save_progress()

    def check_load(self, prompts: list) -> None:
        """A load bounded as load.requests is (utils/config.py check_scale), now that its requests and their first turns
        are known; and a warning where waiting alone (the arrivals at load.request_rate, and a conversation's think
        times), in real time for every method, load point and repeat, takes over an hour."""
        config = self.config
        requests = requests_of(prompts, request_count(config, len(prompts)))
        starts = sum(f is None for f in follows_of(requests))  # the requests that arrive at the rate
        try:
            config.load.check_scale(len(requests), starts, given="load.requests" if config.load.requests else
                                    f"one per prompt of the dataset, {len(prompts)}")
        except ValueError as error:
            raise UserError(f"load: {error}") from None
        # the turns after a conversation's first wait think_s each after the previous answer (turns count from 1)
        thinking = config.load.think_s * max(((getattr(r, "turn", None) or 1) - 1 for r in requests), default=0)
        waited = config.max_repeats_planned * sum(
            ((starts / c.request_rate if c.request_rate else 0.0) + thinking) * len(points_of(config, c))
            for c in comparisons(config, len(requests)))
        if waited > WARN_WAITED_S:
            note = (f"load: waiting alone takes {waited / 3600:.1f} h ({starts} arrivals per load point at "
                    f"load.request_rate{' and the turns think_s apart' if thinking else ''}, for every method and "
                    "repeat), before any decoding; raise load.request_rate (or lower load.think_s) or lower "
                    "load.requests for a shorter run")
            self.console.print(f"[yellow]warning: {note}[/yellow]")
            self.progress.notes.append(note)

    # -- the sweep ----------------------------------------------------------------------------------
    def sweep(self, engines: dict[str, Engine]) -> None:
        """Repeat by repeat, every unit not yet on disk, engine by engine (engines: by name, the home engine first);
        `repeats: auto` stops a comparison once every speedup CI in it is narrow enough (or at max_repeats, or past
        time_budget_s)."""
        config = self.config
        num_prompts = self.num_prompts = engines[HOME].num_prompts
        pending = comparisons(config, request_count(config, num_prompts) if config.load else None)
        started = time.monotonic()
        done = self.folder.done_batches()
        total = sum(len(points_of(config, c)) * num_units(c, num_prompts) for c in pending) * config.max_repeats_planned
        with Display(self.console, total) as display:
            self.display = display
            for repeat in range(config.max_repeats_planned):
                units: dict[str, list[Unit]] = {name: [] for name in engines}
                planned_repeats = config.repeats if config.repeats != "auto" else repeat + 1
                for comparison in pending:
                    for point in points_of(config, comparison):
                        self.progress.planned[point.label] = num_units(comparison, num_prompts) * planned_repeats
                    for unit in units_of(comparison, num_prompts, repeat):
                        for engine, mine in units.items():
                            points = points_of(config, comparison, engine=engine)
                            if not points:
                                continue
                            finished = sum(p.key + (repeat, unit.batch_index) in done for p in points)
                            display.skip(finished)  # the engine runs only the points not done: these count now
                            if finished < len(points):
                                mine.append(unit)
                self.folder.save_progress()
                for name, engine in engines.items():
                    if not units[name]:
                        continue
                    if engine.exclusive:  # it loads its own copies of the models: the others leave memory meanwhile
                        for other in engines.values():
                            note = other.release(engine) if other is not engine else None
                            if note and note not in self.progress.notes:
                                self.progress.notes.append(note)
                    for unit, result in engine.run(units[name], done):
                        self.accept(unit, result)
                    if engine.info():
                        self._keep_engine(name, engine.info())
                if config.repeats != "auto":
                    continue
                # a resumed run goes on to the repeats already on disk before it judges anything
                resumed_to = max((key[-2] for key in done), default=-1)
                if repeat < resumed_to:
                    continue
                pending = self._settle(pending, repeat, time.monotonic() - started)
                if not pending:
                    break

    def _settle(self, pending: list[Comparison], repeat: int, elapsed: float) -> list[Comparison]:
        """repeats: auto after a repeat: the comparisons that go on (a speedup CI flagged ci_wide, repeats and time
        left); each one that stops gets a note saying when and why."""
        config = self.config
        last = repeat + 1 == config.max_repeats_planned
        over_budget = config.time_budget_s is not None and elapsed > config.time_budget_s
        going_on = []
        for comparison in pending:
            verdicts = self._verdicts(comparison)
            wide, few, failed = (verdicts.get(k, []) for k in ("ci_wide", "few_samples", "failed"))
            if wide and not (last or over_budget):
                going_on.append(comparison)
                continue
            if wide:
                reason = (f"{'the time budget is spent' if over_budget else f'max_repeats ({repeat + 1}) reached'}, "
                          f"{len(wide)} point(s) still ci_wide")
            elif verdicts.get("settled"):
                reason = "no speedup CI reaches beyond ci_target (the ci_wide flag's rule)"
            else:
                reason = "no point has a speedup interval that repeats could settle"
            if failed:
                reason += f"; {len(failed)} point(s) failed, which repeats cannot measure"
            if few:
                reason += (f"; {len(few)} point(s) rest on too few prompts for an interval (few_samples), which "
                           "repeats cannot change: more prompts can")
            self.progress.notes.append(f"repeats: auto stopped after {repeat + 1} repeat(s) for {comparison.label}: "
                                       f"{reason}")
        return going_on

    def _verdicts(self, comparison: Comparison) -> dict[str, list[str]]:
        """The labels of a comparison's overall runs by their interval's verdict (eval.flags.ci_verdict, the rule
        the ci_wide and few_samples flags use): ci_wide ones need more repeats, few_samples ones cannot use them."""
        from eval.flags import ci_verdict

        verdicts: dict[str, list[str]] = {}
        for run in self.folder.summary()["runs"]:
            if Comparison.of(run) != comparison or run.get("group") is not None:
                continue
            if REGISTRY[run["method"]].is_reference:
                continue
            if run["status"] not in ("ok", "partial") or run.get("error"):  # failed: this session runs it no more
                verdicts.setdefault("failed", []).append(run["label"])
                continue
            verdict = ci_verdict(run["metrics"].get("speedup"), run["metrics"].get("speedup_ci95"),
                                 run["batches"]["prompts"], self.config.ci_target)
            if run["metrics"].get("speedup") is not None:
                verdicts.setdefault(verdict or "settled", []).append(run["label"])
        return verdicts

    # -- what a unit brings back ----------------------------------------------------------------------
    def _keep_engine(self, name: str, info: dict) -> None:
        """An engine's info (version, interpreter, pairing ...), per process (a resumed run may pair otherwise)."""
        processes = dict((self.progress.engine_info.get(name) or {}).get("processes") or {})
        processes[PROCESS] = info
        self.progress.engine_info[name] = {**info, "processes": processes}
        self.folder.save_progress()

    def _keep_probes(self, unit: Unit, result: UnitResult) -> None:
        """The process's cost probe of this batch size (once) and its drift probe readings, kept per process: a
        resumed run and each Ray worker measure their own, and eval takes each point's from the processes that ran it."""
        key, process = str(unit.batch_size), result.probe_process or result.process
        if process not in self.progress.processes:
            drivers = sum(1 for p in self.progress.processes.values() if not p.get("worker") and not p.get("probe"))
            self.progress.processes[process] = {"name": result.probe_name or result.worker or f"process {drivers + 1}",
                                                "worker": result.worker}
            if result.probe_process:  # another engine's probe process, not a driver
                self.progress.processes[process].update(probe=True, engine=result.probe_engine)
        if result.costs is not None:
            self.progress.costs.setdefault(key, {}).setdefault(process, result.costs.to_json())
        for rows, probe in result.fewer_rows.items():  # a load point's probe at fewer rows, kept as that size's
            self.progress.costs.setdefault(str(rows), {}).setdefault(process, probe.to_json())
        if result.drift_readings:  # a load point's: one as it starts and one after each point it ran
            self.progress.drift.setdefault(key, {}).setdefault(process, []).extend(result.drift_readings)

    def accept(self, unit: Unit, result: UnitResult) -> None:
        """Keep a finished unit: its records (a batch already on disk is not written twice), its failures,
        the comparison's costs and the drift probe; then rebuild the summary."""
        self.folder.append(result.rows)
        known = {(tuple(Point.of(f).key), f["status"]) for f in self.progress.failures}
        where = (f"load point repeat {unit.repeat}" if unit.serving else
                 f"batch {unit.batch_index + 1}/{-(-getattr(self, 'num_prompts', 0) // unit.batch_size)} repeat {unit.repeat}")
        for label in result.rates:
            if self.display:
                self.display.point_done(label, [r for r in result.rows if Point.of(r).label == label], where,
                                        result.worker)
        for entry in result.failures:
            if (Point.of(entry).key, entry["status"]) not in known:
                self.progress.failures.append(entry)
                known.add((Point.of(entry).key, entry["status"]))
                if entry["status"] == "failed":
                    self.console.print(f"[red]{Point.of(entry).label} failed: {entry['error']}; the sweep goes on[/red]")
                    if self.display:
                        self.display.point_done(Point.of(entry).label, None, where, result.worker)
        for note in result.notes:
            if note not in self.progress.notes:
                self.progress.notes.append(note)
        self._keep_probes(unit, result)
        self.folder.save_progress()
        # samples.jsonl is what resume and `python -m eval` read; the summary in between is for a person
        # watching the folder, so it is rebuilt at most every SUMMARY_EVERY_S (and always at the end)
        if time.monotonic() - self._summary_at > SUMMARY_EVERY_S:
            self.folder.write_summary()
            self._summary_at = time.monotonic()
        if self.display and (result.rows or result.failures):
            self.display.unit_done(result.worker or "local")

