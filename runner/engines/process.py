"""The base of an engine that runs in processes of its own (a module, not a package: the registry lists packages only).

A worker (runner/engines/process_worker.py's ProcessWorker, subclassed by the engine's worker.py) runs one engine
per process, started with an interpreter the engine names, in its own process group; jobs go to it as JSON lines
and each answers one line. ProcessExecutor drives those workers as the local and Ray executors drive theirs: it
yields each finished unit (and each drift reading) and this process alone writes the report. What an engine adds
(a subclass in its package): the keyword arguments of a point's engine, the environment of its workers, the
bytes an engine holds, its records from a worker's answer and how the notes say its pairing.

Pairing (the engine's config section's `pairing`, said in progress.order and the notes):
- batch: every engine of a comparison is resident, one worker each, and each batch runs every point back to back in
  the Williams order of our own units (runner/plan.py order_of): the pairing our engine has.
- engine: one engine at a time (build, warm up, every pending batch, tear down), the points' order rotating from
  repeat to repeat; a drift probe (the first prompt, one new token) at each engine's start and end. A point's batch
  and its reference's are then minutes apart, not back to back: each record says so (extra: pairing, back_to_back,
  block: the engine's place in its repeat's order, block_started_unix_s), and the probe's readings are pooled over
  the engines whose probe does the same work (probe_group), so that the drift figure spans the blocks.
- auto: batch where the weights of every engine fit in the memory there is (on a GPU its free memory, on a CPU the
  host's available memory, each with room for KV caches and activations), else engine.

A serving run (config load:): each load point's requests go to the worker as one serve job, on the load point's
arrival schedule with at most its concurrency in flight; every engine starts with room for the run's largest
concurrency, so that one engine serves every load point (with pairing engine too: each engine is up once for every
load point of a repeat). Its warmup and drift probe run a fixed batch of the first min(concurrency, requests)
requests.
"""
from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

from decode.methods import REGISTRY
from eval.axes import AXES, POINT, label_of
from eval.records import Comparison, Point, probe_process
from runner.engines.base import Engine
from runner.load import request_fields
from runner.plan import Unit, comparisons, order_of, points_of, skipped_reason, williams_order
from runner.probes import PROCESS
from runner.records import UnitResult, failure, record_of
from utils import UserError, hold_signals, release_signals

GENERATE_TIMEOUT_S = 3600.0
# a resident engine holds its weights and a KV cache: the weights of all engines of a comparison, times this, must
# fit in the memory free for `pairing: auto` to keep them resident together
RESIDENT_HEADROOM = 1.5


class WorkerDead(RuntimeError):
    """The worker process exited or stopped answering."""


class WorkerProcess:
    """One worker process: JSON jobs in, one JSON line out per job. Its own session (process group), so a Ctrl-C at
    the terminal reaches this process only, and close() takes the worker and every process it spawned down."""
    script: Path  # the worker's file, run as `python script`
    title = "the worker"  # how its errors name it
    cannot_run = "{python} cannot run ({error})"  # the one line when the interpreter does not start

    def __init__(self, python: str, log: Path, name: str, env: dict | None = None):
        self.name, self.log_path = name, log
        self.busy = False  # a job is in flight: the worker reads stdin only between jobs
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "a")
        self._log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} worker for {name}\n")
        self._log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        try:
            # cwd "/": an engine may run `python -m ...` subprocesses, which put their cwd first on sys.path, where a
            # folder of this repository named as the engine's package would shadow it. Model paths are absolute
            self.proc = subprocess.Popen([python, str(self.script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._log, env=env, cwd="/", start_new_session=True,
                                         preexec_fn=die_with_parent)
        except OSError as error:
            self._log.close()
            raise UserError(self.cannot_run.format(python=python, error=error.strerror)) from None
        self._buffer = b""

    def ask(self, job: dict, timeout: float) -> dict:
        if self.proc.poll() is not None:
            raise WorkerDead(f"{self.title} exited (code {self.proc.returncode}); its log: {self.log_path}")
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDead(f"{self.title} exited; its log: {self.log_path}") from None
        deadline = time.monotonic() + timeout
        self.busy = True
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.close(force=True)
                    raise WorkerDead(f"{self.title} did not answer {job.get('op')} within {timeout:.0f} s; "
                                     f"its log: {self.log_path}")
                if not selector.select(min(left, 5.0)):
                    if self.proc.poll() is not None:
                        break
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    break
                self._buffer += chunk
        if b"\n" not in self._buffer:
            code = self.proc.wait(timeout=30)
            raise WorkerDead(f"{self.title} exited (code {code}) during {job.get('op')}; its log: {self.log_path}")
        line, self._buffer = self._buffer.split(b"\n", 1)
        self.busy = False
        return json.loads(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, force: bool = False) -> None:
        """Stop the engine and the worker: a stop job (a clean shutdown; not while a job is in flight, which the
        worker would finish first), else SIGTERM (the worker shuts its engine down), else SIGKILL of the whole process
        group (the processes the engine spawned included). Ctrl-C and SIGTERM are held off meanwhile: a second one
        must not leave an engine behind."""
        if self.proc.stdin.closed:  # closed before: its process group may be gone, and its pid reused
            return
        held = hold_signals()
        try:
            self._close(force)
        finally:
            release_signals(held)

    def _close(self, force: bool) -> None:
        try:
            if self.alive() and not force and not self.busy:
                try:
                    self.proc.stdin.write(b'{"op": "stop"}\n')
                    self.proc.stdin.flush()
                    self.proc.wait(timeout=60)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
                if not self.alive():
                    break
                try:
                    os.killpg(self.proc.pid, sig)
                    self.proc.wait(timeout=wait)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
            try:  # engine processes left in the group after the worker exited
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        finally:
            for stream in (self.proc.stdin, self.proc.stdout):
                try:
                    stream.close()
                except OSError:
                    pass
            self._log.close()


def die_with_parent() -> None:
    """In the worker, before it runs: SIGTERM when this process dies (even by SIGKILL), so a worker never outlives
    the run that started it (Linux; elsewhere the worker ends at stdin EOF after its job)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def max_concurrency(config, num_prompts: int) -> int | None:
    """A serving run's largest concurrency over its load points (config load:; no cap: every request), which an
    engine that serves every load point must admit; None without load."""
    load = getattr(config, "load", None)
    if load is None:
        return None
    requests = load.requests or num_prompts
    return max(min(c, requests) for c, _ in load.points(requests))  # no more than the requests are ever in flight


def resident_bytes(path: str, dtype: str) -> int | None:
    """The weights a model holds in memory at dtype: its folder's safetensors (else .bin) files, scaled from the
    checkpoint's dtype (config.json torch_dtype) to the run's; None for a hub id."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    files = [f for f in folder.iterdir() if f.suffix == ".safetensors"] or \
        [f for f in folder.iterdir() if f.suffix in (".bin", ".pt")]  # both kinds: the same weights twice
    size = sum(f.stat().st_size for f in files)
    width = {"float32": 4, "float16": 2, "bfloat16": 2}
    try:
        stored = json.loads((folder / "config.json").read_text()).get("torch_dtype") or "float32"
    except (OSError, ValueError):
        stored = "float32"
    return int(size * width.get(dtype, 4) / width.get(str(stored), 4))


def timing_of(unit: Unit, answer: dict, row: dict, index: int) -> dict:
    """A row's times for its record. A fixed batch: the wall time of the job for every row (the engine schedules the
    batch as one). A served request: its arrival, admission, first token, finish and emits, latency_s = finish -
    arrival, prefill_s = first token - arrival (TTFT, the queue's wait included) and target_s its time in the engine
    (finish - admission: the engine runs the target and the drafter in one step). ValueError: a time is missing."""
    if not unit.serving:
        return {"latency_s": answer["wall_s"], "prefill_s": None, "target_s": answer["wall_s"], "arrival_s": None}
    served = {key: row[key] for key in ("arrival_s", "admitted_s", "first_token_s", "finish_s")}
    if None in served.values() or not row.get("emits"):
        missing = next((k for k, v in served.items() if v is None), "emits")
        raise ValueError(f"request {index} has no {missing}")
    served["emits"] = [[float(t), int(n)] for t, n in row["emits"]]
    return {"latency_s": served["finish_s"] - served["arrival_s"], "prefill_s": served["first_token_s"] - served["arrival_s"],
            "target_s": served["finish_s"] - served["admitted_s"], **served}


def free_memory(device: str) -> int | None:
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass
class WorkerEngine:
    """One engine (one set of engine arguments: the points of several comparisons share it) and its worker."""
    name: str  # the first point's label without its comparison
    kwargs: dict
    process: WorkerProcess | None = None
    failed: str | None = None
    start_s: float | None = None
    warmed: set = field(default_factory=set)  # the points warmed up on this process's engine


@contextlib.contextmanager
def checking_worker(process: type[WorkerProcess], python: str, log: Path, setting: str):
    """A worker for an engine's check before any model loads, closed after it; one that dies or hangs is one line
    naming the setting that chose what it ran."""
    worker = process(python, log, "check")
    try:
        yield worker
    except WorkerDead as error:
        raise UserError(f"{setting}: {process.title} failed its check ({error})") from None
    finally:
        worker.close()


class ProcessExecutor:
    """Runs the points of one engine's methods (MethodSpec.engine == name) in worker processes and yields each
    finished unit (and each drift reading), as the local and Ray executors do; the experiment keeps what they bring.
    session: the loaded prompts and tokenizer. A subclass names its worker (process: a WorkerProcess subclass) and
    says what is its engine's (the methods marked so below)."""
    name: str  # the engine's name: its methods' MethodSpec.engine, its config section, its log's name
    title: str  # how errors and notes name it
    process: type[WorkerProcess]
    kept: ClassVar[tuple[str, ...]] = ()  # what env.json and engine_info keep of the check's answer beside the version

    def __init__(self, config, session, checked: dict, out_dir: Path):
        """checked: check()'s answer (the engine's version under its name; "python": the workers' interpreter, else
        this one; what the engine found of its models)."""
        self.session, self.config, self.checked = session, config, checked
        self.python = checked.get("python") or sys.executable
        self.log = Path(out_dir) / f"{self.name}-worker.log"
        self.info: dict = {}  # version, interpreter, pairing and order, for progress.json's engine_info
        self.engines: dict[str, WorkerEngine] = {}  # json of the engine's arguments -> the engine
        self.failed: dict[Point, str] = {}
        self.blocks: dict[Point, tuple[int, float]] = {}  # engine pairing: a point's block (its place, its start)
        self._reported: set[str] = set()  # failed points whose failure went to a unit result
        # decided in run(), once our engine's models are released (runner/experiment.py sweep): the free memory that
        # `pairing: auto` weighs is then the memory the workers get
        self.pairing: str | None = None

    # -- what the engine says ---------------------------------------------------------------------------
    @classmethod
    def check(cls, config, log: Path) -> dict:
        """Before any model loads: refuse (UserError, one line) what the engine cannot run; its answer has the engine's
        version under its name and what the executor needs of its environment."""
        return {cls.name: None}

    @classmethod
    def environment(cls, checked: dict) -> dict:
        """What env.json records of the engine's environment."""
        return {"version": checked.get(cls.name), **{key: checked[key] for key in cls.kept}}

    @property
    def settings(self):
        """The engine's config section (its pairing, start_timeout_s)."""
        return getattr(self.config, self.name)

    def engine_kwargs(self, point: Point) -> dict:
        """The worker's start job's engine arguments for a point: points with the same ones share an engine."""
        raise NotImplementedError

    def worker_env(self) -> dict:
        """Environment variables of the worker processes."""
        return {}

    def prepare(self, kwargs: dict, sharing: int) -> dict:
        """The engine arguments of a start, fitted to the memory there is now; sharing: engines still to start that
        must fit beside it (batch pairing)."""
        return kwargs

    def engine_bytes(self, kwargs: dict) -> int | None:
        """The bytes of weights an engine with these arguments holds (None: not known before it starts)."""
        return None

    def overhead_bytes(self) -> int:
        """What each resident engine holds beside its weights' headroom: its processes, a KV cache it sets apart."""
        return 0

    def records_of(self, point: Point, unit: Unit, batch: list, answer: dict, load) -> list[dict]:
        """A worker's answer to a batch's job as the point's records (KeyError, TypeError, ValueError: unreadable): each
        row's times from the answer (timing_of), the rest from the engine's measured()."""
        spec = REGISTRY[point.method]
        rows = []
        for index, (prompt, row) in enumerate(zip(batch, answer["rows"])):
            measured, extra = self.measured(spec, row, answer if index == 0 else None)
            record = SimpleNamespace(draft_forwards=None, draft_s=0.0, draft_prefill_s=0.0, **measured,
                                     **timing_of(unit, answer, row, index))
            rows.append(record_of(point, unit, prompt, record, self.session.tokenizer, self.config.dataset.preset,
                                  spec.has_rounds, len(batch), extra={"engine": self.name, **extra},
                                  **request_fields(load if unit.serving else None, index)))
        return rows

    def measured(self, spec, row: dict, answer: dict | None) -> tuple[dict, dict]:
        """A worker's row as what the record takes (output_ids, new_tokens, stop_reason, target_forwards, rounds: None
        where the method has none) and the engine's own readings for the record's extra; answer: the job's whole
        answer, given with the batch's first row only (what the batch measured once)."""
        raise NotImplementedError

    def order_text(self) -> str:
        """progress.order: how the pairing ran its points (self.pairing decided)."""
        auto = f" ({self.name}.pairing: auto)" if self.settings.pairing == "auto" else ""
        how = self.how_paired()
        return f"pairing {self.pairing}{auto}" + (f": {how}" if how else "")

    def how_paired(self) -> str:
        """What the decided pairing meant for this engine's points, for order_text (an engine adds its own)."""
        if self.pairing == "batch":
            return (f"every {self.title} engine of a comparison resident, one worker each; each batch runs every point "
                    "back to back in the units' order, as our engine's points")
        return (f"one {self.title} engine at a time, over every batch, then the next, so a point's batches are paired "
                "with the reference's measured in another block, minutes apart, not back to back (each record's "
                "extra.back_to_back, block, block_started_unix_s); the blocks' order rotates from repeat to repeat (a "
                "Williams design: with one repeat the reference's block is first); the drift probe (the first "
                "prompt, 1 new token) ran at each engine's start and end")

    def engine_info(self) -> dict:
        """What progress.json keeps of the engine (engine_info[name]) once its pairing is decided."""
        return {**self.environment(self.checked), "pairing": self.pairing, "order": self.order_text(),
                **self.own_info()}

    def own_info(self) -> dict:
        """The engine's own settings that engine_info keeps beside its version, pairing and order."""
        return {}

    def probe_group(self, engine: WorkerEngine) -> str:
        """The engines whose drift probe does the same work share a group, and their readings are compared with one
        another (across blocks, under engine pairing). Default: each engine its own."""
        return f"engine {engine.name}"

    # -- engines ----------------------------------------------------------------------------------
    def _pairing(self) -> str:
        if self.settings.pairing != "auto":
            return self.settings.pairing
        engines: dict[str, int | None] = {}  # distinct engines of a comparison -> the bytes they hold
        for point in self.points(comparisons(self.config)[0]):
            kwargs = self.engine_kwargs(point)
            engines[json.dumps(kwargs, sort_keys=True, default=str)] = self.engine_bytes(kwargs)
        if any(size is None for size in engines.values()):
            return "engine"  # a hub id: its size is not known before it downloads
        need = RESIDENT_HEADROOM * sum(engines.values()) + len(engines) * self.overhead_bytes()
        free = free_memory(self.config.device)
        return "batch" if free is not None and need <= free else "engine"

    def points(self, comparison: Comparison) -> list[Point]:
        return points_of(self.config, comparison, engine=self.name)

    def engine_of(self, point: Point) -> WorkerEngine:
        kwargs = self.engine_kwargs(point)
        key = json.dumps(kwargs, sort_keys=True, default=str)
        if key not in self.engines:
            name = label_of(point.values(), [axis for axis in AXES if axis.splits == POINT])  # its point axes
            self.engines[key] = WorkerEngine(name, kwargs)
        return self.engines[key]

    def start(self, point: Point, sharing: int = 1) -> WorkerEngine:
        """The point's engine, up (started here if it is not)."""
        engine = self.engine_of(point)
        if engine.failed or (engine.process is not None and engine.process.alive()):
            return engine
        kwargs = self.prepare(dict(engine.kwargs), sharing)
        engine.process = self.process(self.python, self.log, engine.name, self.worker_env())
        engine.warmed = set()  # a new engine: its first calls are slow again
        try:
            answer = engine.process.ask({"op": "start", "engine": kwargs}, self.settings.start_timeout_s)
        except WorkerDead as error:
            answer = {"ok": False, "error": str(error)}
        if not answer.get("ok"):
            engine.failed = f"{self.title} engine did not start: {answer.get('error')}"
            self.stop(engine)
        else:
            engine.start_s = answer.get("start_s")
        return engine

    def stop(self, engine: WorkerEngine) -> None:
        if engine.process is not None:
            process, engine.process = engine.process, None
            process.close()

    def close(self) -> None:
        """Every engine down, whatever fails or interrupts one of them."""
        held = hold_signals()
        try:
            for engine in self.engines.values():
                try:
                    self.stop(engine)
                except Exception:  # noqa: BLE001 - the others must still be stopped
                    pass
        finally:
            release_signals(held)

    # -- jobs -------------------------------------------------------------------------------------
    def _job(self, batch, temperature, max_new_tokens: int, seed: int, load=None) -> dict:
        """A generate job of a fixed batch; with load (decode/arrivals.py Load), a serve job of its requests."""
        g = self.config.generation
        job = {"op": "generate", "prompts": [p.token_ids for p in batch], "max_new_tokens": max_new_tokens,
               "temperature": temperature, "top_k": g.top_k, "top_p": g.top_p, "seed": seed,
               "stop_token_ids": list(self.session.eos)}
        if load is not None:
            job.update(op="serve", arrivals=list(load.arrivals), concurrency=load.concurrency)
            if getattr(load, "follows", None):  # conversations: a later turn arrives think_s after its previous turn's last token
                job.update(follows=list(load.follows), think_s=load.think_s)
        return job

    def fixed_batch(self, unit: Unit) -> list:
        """The unit's first batch as a fixed batch (the warmup's and a serving unit's drift probe's): a serving unit's
        first min(concurrency, requests) requests (its batch size)."""
        if unit.serving:
            return self.session.prompts_of(unit)[:unit.batch_size]
        return self.session.batches(unit.batch_size)[0]

    def generate(self, engine: WorkerEngine, job: dict) -> dict:
        """One job; a dead worker or engine fails the engine (every point on it), a job's own error only the caller's
        point."""
        try:
            answer = engine.process.ask(job, GENERATE_TIMEOUT_S)
        except WorkerDead as error:
            answer = {"ok": False, "error": str(error)}
        if not answer.get("ok") and (answer.get("engine_dead") or engine.process is None or
                                     not engine.process.alive()):
            engine.failed = f"{self.title}: {answer.get('error')}"
            self.stop(engine)
        return answer

    def drift_probe(self, engine: WorkerEngine, point: Point, unit: Unit):
        """The first prompt, one new token, greedy, through the point's engine: the same work at each of its starts
        and ends. Kept per engine (each is its own process), so the drift flag compares like with like. Yields the
        reading as a unit result without records (unit: the comparison it belongs to). A serving unit's probe: its
        first min(concurrency, requests) requests as a fixed batch, one new token each (kept per concurrency, as every probe is
        kept per batch size)."""
        if engine.failed:
            return
        first = self.fixed_batch(unit) if unit.serving else self.session.prompt_set.prompts[:1]
        walls = []
        for _ in range(4):  # the median of three after a discarded one, as our engine's probe
            answer = self.generate(engine, self._job(first, None, 1, 0))
            if not answer.get("ok"):
                yield unit, self._result(notes=[f"{self.title} engine {engine.name}: its drift probe failed "
                                                f"({answer.get('error')}); no reading"])
                return
            walls.append(answer["wall_s"])
        group = self.probe_group(engine)
        yield unit, self._result(drift_probe_s=sorted(walls[1:])[1], probe_name=f"{self.title} {group}",
                                 probe_process=probe_process(PROCESS, self.name, group), probe_engine=self.name)

    def warm_up(self, engine: WorkerEngine, point: Point, unit: Unit) -> None:
        """Each point's first batch with a short budget, untimed."""
        if engine.failed or point in engine.warmed or not self.config.warmup:
            return
        batch = self.fixed_batch(unit)
        short = min(self.config.generation.max_new_tokens, 2 * max(self.config.speculative.gamma) + 2)
        for _ in range(self.config.warmup):
            answer = self.generate(engine, self._job(batch, unit.temperature, short, 0))
            if not answer.get("ok"):
                self.failed.setdefault(point, f"{self.title}, in the warmup: {answer.get('error')}")
                return
        engine.warmed.add(point)

    def run_batch(self, engine: WorkerEngine, point: Point, unit: Unit) -> list[dict] | str:
        """The point's records of one batch (a serving unit's: of its load point's requests), or why there are none:
        a load point served in part (an error, a dead engine) has none."""
        batch = self.session.prompts_of(unit)
        seed = (self.config.seed * 1_000_003 + unit.batch_index * 101 + unit.repeat) % 2**63
        load = self.session.load_of(unit)
        answer = self.generate(engine, self._job(batch, unit.temperature, self.config.generation.max_new_tokens, seed,
                                                 load))
        if not answer.get("ok"):
            return f"{self.title}: {answer.get('error')}"
        rows = answer.get("rows") or []
        odd = [r.get("finish_reason") for r in rows if r.get("stop_reason") not in ("eos", "length")]
        if len(rows) != len(batch) or odd:
            return (f"{self.title} answered {len(rows)} rows for a batch of {len(batch)}" if len(rows) != len(batch)
                    else f"{self.title} ended a row with finish_reason {odd[0]!r} (not a stop or the length)")
        try:
            return self.records_of(point, unit, batch, answer, load)
        except (KeyError, TypeError, ValueError) as error:
            return f"{self.title}'s answer could not be read ({type(error).__name__}: {error})"

    # -- the units ----------------------------------------------------------------------------------
    def run(self, units: list[Unit], done: set):
        if self.pairing is None:  # after our models left memory (the sweep releases them before this engine's units)
            self.pairing = self._pairing()
        by_comparison: dict[Comparison, list[Unit]] = {}
        for unit in units:
            by_comparison.setdefault(unit.comparison, []).append(unit)
        try:
            if self.pairing == "engine" and self.config.load is not None:
                if any(self.points(comparison) for comparison in by_comparison):
                    self._note_pairing()
                    yield from self._serving_by_engine(by_comparison, done)
                return
            for comparison, mine in by_comparison.items():
                points = self.points(comparison)
                if not points:
                    continue
                self._note_pairing()
                if self.pairing == "batch":
                    yield from self._by_batch(points, mine, done)
                else:
                    yield from self._by_engine(points, mine, done)
        finally:
            # no engine stays resident while our engine's units run (the next repeat): an idle engine holds memory,
            # and its threads would share the cores our timings use
            self.close()

    def _pending(self, point: Point, units: list[Unit], done: set) -> list[Unit]:
        return [u for u in units if point.key + (u.repeat, u.batch_index) not in done]

    def _by_batch(self, points: list[Point], units: list[Unit], done: set):
        live = [p for p in points if p not in self.failed and not skipped_reason(p) and self._pending(p, units, done)]
        for index, point in enumerate(live):  # every engine up before the first batch, each in its own process
            engine = self.start(point, sharing=len(live) - index)
            self.warm_up(engine, point, units[0])  # the first calls of an engine are slow: the probe comes after
            yield from self.drift_probe(engine, point, units[0])
        for unit in units:
            result, ran = self._result(), False
            for point in order_of(points, unit):
                if point in live and point.key + (unit.repeat, unit.batch_index) not in done:
                    self._run(point, unit, result)
                    ran = True
            if ran:
                yield unit, result
        for point in live:
            yield from self.drift_probe(self.engine_of(point), point, units[-1])

    def _by_engine(self, points: list[Point], units: list[Unit], done: set):
        repeat = units[0].repeat if units else 0
        order = [points[i] for i in williams_order(len(points), repeat)]
        for position, point in enumerate(order):
            pending = self._pending(point, units, done)
            if not pending or point in self.failed or skipped_reason(point):
                continue
            self.blocks[point] = (position, time.time())
            try:
                yield from self._on_engine(point, pending)
            finally:
                self.stop(self.engine_of(point))

    def _serving_by_engine(self, by_comparison: dict[Comparison, list[Unit]], done: set):
        """Engine pairing in a serving run: each engine up once for every load point (room for the largest
        concurrency), then down before the next; the engines in the Williams order of the first load point's
        points, each going through the load points in order."""
        plans = [(self.points(comparison), mine) for comparison, mine in by_comparison.items()]
        plans = [(points, mine) for points, mine in plans if points and mine]
        engines: list[WorkerEngine] = []
        for points, mine in plans:
            for index in williams_order(len(points), mine[0].repeat):
                engine = self.engine_of(points[index])
                if not any(engine is e for e in engines):
                    engines.append(engine)
        for position, engine in enumerate(engines):
            started = time.time()
            try:
                for points, mine in plans:
                    for index in williams_order(len(points), mine[0].repeat):
                        point = points[index]
                        pending = self._pending(point, mine, done)
                        if self.engine_of(point) is not engine or not pending or point in self.failed \
                                or skipped_reason(point):
                            continue
                        self.blocks[point] = (position, started)
                        yield from self._on_engine(point, pending)
            finally:
                self.stop(engine)

    def _on_engine(self, point: Point, pending: list[Unit]):
        """The point's pending units on its engine (started here if it is not up): its warmup, a drift probe before
        and after."""
        engine = self.start(point)
        self.warm_up(engine, point, pending[0])  # the first calls of an engine are slow: the probe after
        yield from self.drift_probe(engine, point, pending[0])
        for unit in pending:
            result = self._result()
            self._run(point, unit, result)
            yield unit, result
            if point in self.failed:
                break
        yield from self.drift_probe(engine, point, pending[-1])

    def _result(self, **fields):
        return UnitResult(worker=None, process=PROCESS, **fields)

    def _run(self, point: Point, unit: Unit, result) -> None:
        if skipped_reason(point) or point.label in self._reported:  # a failure is said once
            return
        engine = self.engine_of(point)
        rows = engine.failed or self.failed.get(point) or self.run_batch(engine, point, unit)
        if isinstance(rows, str):
            self.failed[point] = rows
            self._reported.add(point.label)
            result.failures.append(failure(point, "failed", rows))
        else:
            for row in rows:
                row["extra"] = {**(row.get("extra") or {}), **self.pairing_fields(point)}
            result.rows.extend(rows)
            # a fixed batch's wall is every row's latency; a load point's runs from its start to its last finish
            wall = (max(r["finish_s"] for r in rows) if unit.serving else rows[0]["latency_s"]) if rows else 0.0
            result.rates[point.label] = sum(r["new_tokens"] for r in rows) / wall if wall > 0 else 0.0

    def pairing_fields(self, point: Point) -> dict:
        """What a record says of its pairing: back to back with its reference's batch (batch pairing), or in a block of
        its own (engine pairing: its place in the repeat's order of blocks and the block's start, so that the gap to the
        reference's block can be told)."""
        if point not in self.blocks:
            return {"pairing": self.pairing, "back_to_back": True}
        block, started = self.blocks[point]
        return {"pairing": self.pairing, "back_to_back": False, "block": block,
                "block_started_unix_s": round(started, 3)}

    def _note_pairing(self) -> None:
        self.info = self.engine_info()


class ProcessEngine(Engine):
    """An engine (runner/engines/base.py) whose points run in worker processes: its ProcessExecutor made at start,
    given the loaded prompts and tokenizer; every process down at close (and after each run: none stays resident
    while another engine's units run)."""
    exclusive = True  # its workers load their own copies of the models
    executor_class: ClassVar[type[ProcessExecutor]]  # the engine's: its name and title are the engine's
    checking: ClassVar[str] = "checking the engine"  # the status line while its check runs
    executor: ProcessExecutor | None = None
    checked: dict | None = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "executor_class" in cls.__dict__:
            cls.name, cls.title = cls.executor_class.name, cls.executor_class.title

    def check(self) -> dict:
        with self.status(self.checking) if self.status else contextlib.nullcontext():
            self.checked = self.executor_class.check(self.config, self.out_dir / f"{self.name}-worker.log")
        return self.executor_class.environment(self.checked)

    def start(self, session) -> None:
        self.session = session
        self.executor = self.executor_class(self.config, session, self.checked or {}, self.out_dir)

    def run(self, units: list[Unit], done: set):
        yield from self.executor.run(units, done)

    def info(self) -> dict:
        return self.executor.info if self.executor is not None else {}

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
