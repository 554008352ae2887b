"""vLLM as a second engine in the same run: the vllm_* points run in vLLM worker processes (runner/engines/vllm/worker.py),
each started with the interpreter of an environment that has vLLM (config vllm.python), one engine per process (vLLM's
metrics registry is global to a process). Records come back over a pipe; this process alone writes the report.

Pairing (config vllm.pairing), said in progress.order and the notes:
- batch: every vLLM engine of a comparison is resident, one worker each, and each batch runs every vLLM point back to
  back in the Williams order of our own units (runner/plan.py order_of): the pairing our engine has.
- engine: one engine at a time (build, warm up, every pending batch, tear down), the points' order rotating from
  repeat to repeat; a drift probe (the first prompt, one new token) at each engine's start and end.
- auto: batch where the weights of every engine fit in the memory there is (on a GPU its free memory, on a CPU the
  host's available memory, each with room for KV caches and activations), else engine.

A vLLM point's ratios are against vllm_generate on the same prompts (eval pairs each engine with its own reference).

A serving run (config load:): each load point's requests go to the worker as one serve job, on the load point's
arrival schedule with at most its concurrency in flight; every engine starts with max_num_seqs the run's largest
concurrency, so that one engine serves every load point (with pairing engine too: each engine is up once for every
load point of a repeat). Its warmup and drift probe run a fixed batch of the first min(concurrency, requests) requests.
"""
from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from decode.methods import REGISTRY
from eval.axes import AXES, POINT, label_of
from eval.records import Comparison, Point
from runner.load import request_fields
from runner.plan import Unit, comparisons, order_of, points_of, skipped_reason, williams_order
from runner.probes import PROCESS
from runner.session import UnitResult, failure, record_of
from utils import UserError

WORKER = Path(__file__).with_name("worker.py")
CHECK_TIMEOUT_S = 300.0
GENERATE_TIMEOUT_S = 3600.0
# a resident engine holds its weights and a KV cache: the weights of all engines of a comparison, times this, must
# fit in the memory free for `pairing: auto` to keep them resident together
RESIDENT_HEADROOM = 1.5
CPU_KV_BYTES = 256 * 2**20  # runner/engines/vllm/worker.py's default KV cache on a CPU
ENGINE_OVERHEAD_BYTES = 2 * 2**30  # a worker, its front end and engine-core processes (Python, torch, vLLM)


class VllmDead(RuntimeError):
    """The worker process exited or stopped answering."""


def vllm_python(config) -> str:
    """The interpreter of the vLLM environment: vllm.python (a path, or a name on PATH), else this one."""
    python = config.vllm.python
    if not python:
        return sys.executable
    if "/" not in python:
        return shutil.which(python) or python
    return str(Path(python).expanduser().absolute())


class VllmProcess:
    """One worker process: JSON jobs in, one JSON line out per job. Its own session (process group), so a Ctrl-C at
    the terminal reaches this process only, and close() takes the worker and every engine process it spawned down."""

    def __init__(self, python: str, log: Path, name: str, env: dict | None = None):
        self.name, self.log_path = name, log
        self.busy = False  # a job is in flight: the worker reads stdin only between jobs
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "a")
        self._log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} worker for {name}\n")
        self._log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        try:
            # cwd "/", as the check's: vLLM runs `python -m vllm....` subprocesses (its model inspection, whose result it
            # caches in ~/.cache/vllm), which put their cwd first on sys.path; from runner/engines this package's
            # folder, named vllm, would shadow vLLM (a cold cache failed every engine start). Model paths are absolute
            self.proc = subprocess.Popen([python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=self._log, env=env, cwd="/", start_new_session=True,
                                         preexec_fn=_die_with_parent)
        except OSError as error:
            self._log.close()
            raise UserError(f"vllm.python: {python} cannot run ({error.strerror}); give the interpreter of an "
                            "environment with vLLM (.ci/vllm-env DIR builds one)") from None
        self._buffer = b""

    def ask(self, job: dict, timeout: float) -> dict:
        if self.proc.poll() is not None:
            raise VllmDead(f"the vLLM worker exited (code {self.proc.returncode}); its log: {self.log_path}")
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise VllmDead(f"the vLLM worker exited; its log: {self.log_path}") from None
        deadline = time.monotonic() + timeout
        self.busy = True
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.close(force=True)
                    raise VllmDead(f"the vLLM worker did not answer {job.get('op')} within {timeout:.0f} s; "
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
            raise VllmDead(f"the vLLM worker exited (code {code}) during {job.get('op')}; its log: {self.log_path}")
        line, self._buffer = self._buffer.split(b"\n", 1)
        self.busy = False
        return json.loads(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, force: bool = False) -> None:
        """Stop the engine and the worker: a stop job (a clean shutdown; not while a job is in flight, which the
        worker would finish first), else SIGTERM (the worker shuts its engine down), else SIGKILL of the whole process
        group (the engine processes vLLM spawned included). Ctrl-C and SIGTERM are held off meanwhile: a second one
        must not leave an engine behind."""
        if self.proc.stdin.closed:  # closed before: its process group may be gone, and its pid reused
            return
        held = _hold_signals()
        try:
            self._close(force)
        finally:
            _release_signals(held)

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


def _die_with_parent() -> None:
    """In the worker, before it runs: SIGTERM when this process dies (even by SIGKILL), so a worker never outlives
    the run that started it (Linux; elsewhere the worker ends at stdin EOF after its job)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _hold_signals() -> dict:
    """Ctrl-C and SIGTERM deferred: a handler that only records them, so that a shutdown is not cut short. Returns
    what _release_signals needs (nothing off the main thread, where signals cannot be handled)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    return {"previous": previous, "caught": caught}


def _release_signals(held: dict) -> None:
    """The handlers back, then each signal that came meanwhile delivered to them (a deferred Ctrl-C still stops)."""
    if not held:
        return
    for sig, handler in held["previous"].items():
        signal.signal(sig, handler)
    for sig in dict.fromkeys(held["caught"]):
        signal.raise_signal(sig)


def vllm_model(cfg: ModelConfig, role: str) -> str:
    """What vLLM is given for a model: a local transformers folder (an offline model's converted copy) or a hub id.
    A model that exists only in this process, or a GGUF file, is refused with one line."""
    if cfg.model.startswith("synthetic:"):
        raise UserError(f"{role}.model: {cfg.model} is built in this process and vLLM cannot load it; save it with "
                        "save_pretrained and give that folder, or drop the vllm_* methods")
    if cfg.quantization == "8bit":
        raise UserError(f"{role}.quantization: 8bit is bitsandbytes' LLM.int8, which vLLM does not load in flight; "
                        "use 4bit or none with the vllm_* methods")
    if cfg.device_map is not None:
        raise UserError(f"{role}.device_map does not apply to vLLM: drop it and set vllm.tensor_parallel_size")
    from utils.models import locate

    where, gguf_file, _ = locate(cfg)
    if gguf_file:
        raise UserError(f"{role}.model: a GGUF file ({gguf_file}); the vllm_* methods need a transformers folder or "
                        "a hub id (convert it with transformers' from_pretrained(..., gguf_file=...) and "
                        "save_pretrained)")
    return where


def max_concurrency(config, num_prompts: int) -> int | None:
    """A serving run's largest concurrency over its load points (config load:; no cap: every request), which the
    engines' max_num_seqs must reach; None without load."""
    load = getattr(config, "load", None)
    if load is None:
        return None
    requests = load.requests or num_prompts
    return max(min(c, requests) for c, _ in load.points(requests))  # no more than the requests are ever in flight


def model_dirs(config) -> dict[str, str]:
    """role -> what vLLM loads (vllm_model): the target, and each draft a vllm_* method uses."""
    dirs = {"target": vllm_model(config.target, "target")}
    used = {d for m in config.methods if REGISTRY[m].engine == "vllm" for d in REGISTRY[m].draft_kinds
            if REGISTRY[m].needs_draft}
    for index, draft in enumerate(config.draft):
        if draft.kind in used:
            dirs[draft.name] = vllm_model(draft, "draft" if len(config.draft) == 1 else f"draft[{index}]")
    return dirs


def engine_dtype(config) -> str:
    """The dtype vLLM runs the target (and a draft) in: vllm.dtype, else the dtype our engine runs the target in (auto
    resolved as ours is: float32 on a CPU), so the engines compare at one precision."""
    if config.vllm.dtype and config.vllm.dtype != "auto":
        return config.vllm.dtype
    import torch

    from utils.models import resolve_dtype

    return str(resolve_dtype(config.target.dtype, torch.device(config.device))).removeprefix("torch.")


def draft_dtype_problem(config) -> str | None:
    """A draft that a vllm_* method loads with a dtype other than the engine's: vLLM builds a draft model in the
    target's dtype (its speculative_config takes no dtype), so it would not run the draft the config names."""
    used = {d for m in config.methods if REGISTRY[m].engine == "vllm" and REGISTRY[m].needs_draft
            for d in REGISTRY[m].draft_kinds}
    engine = engine_dtype(config)
    for index, draft in enumerate(config.draft):
        if draft.kind in used and draft.dtype != "auto" and draft.dtype != engine:
            role = "draft" if len(config.draft) == 1 else f"draft[{index}]"
            return (f"{role}.dtype: {draft.dtype}, but vLLM runs a draft in the target's dtype ({engine}: vllm.dtype or "
                    f"the target's): set {role}.dtype to {engine} or auto, or drop the vllm_* methods that use it")
    return None


def check_vllm(config, log: Path) -> dict:
    """Before any model loads: the interpreter runs, imports vLLM, serves the target's and drafts' architectures
    and has the packages the methods need. One line and exit 2 otherwise."""
    dirs = model_dirs(config)  # what vLLM would load: refused here before the interpreter is asked
    problem = draft_dtype_problem(config)
    if problem:
        raise UserError(problem)
    python = vllm_python(config)
    if config.vllm.python and not (Path(python).is_file() and os.access(python, os.X_OK)):
        raise UserError(f"vllm.python: {python} is not an executable file; give the interpreter of an environment "
                        "with vLLM (.ci/vllm-env DIR builds one: DIR/bin/python)")
    try:
        probe = subprocess.run([python, "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
                               capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as error:
        raise UserError(f"vllm.python: {python} did not import vllm ({type(error).__name__}); check that environment "
                        "(.ci/vllm-env DIR builds one)") from None
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1][:200]
        where = "this environment" if not config.vllm.python else python
        raise UserError(f"vllm.python: {where} cannot import vllm ({last}); set vllm.python to the interpreter of an "
                        "environment with vLLM (.ci/vllm-env DIR builds one), or drop the vllm_* methods")
    packages = sorted({REGISTRY[m].engine_package for m in config.methods if REGISTRY[m].engine_package})
    worker = VllmProcess(python, log, "check")
    try:
        answer = worker.ask({"op": "check", "models": dirs, "packages": packages}, CHECK_TIMEOUT_S)
    except VllmDead as error:
        raise UserError(f"vllm.python: the vLLM worker failed its check ({error})") from None
    finally:
        worker.close()
    if not answer.get("ok"):
        raise UserError(f"vllm: the check in {python} failed: {answer.get('error')}")
    for role, why in answer["unsupported"].items():
        raise UserError(f"{'target' if role == 'target' else 'draft ' + role}.model: vLLM cannot serve it: {why}; "
                        "drop the vllm_* methods for this model")
    if answer["missing_packages"]:
        needs = [m for m in config.methods if REGISTRY[m].engine_package in answer["missing_packages"]]
        raise UserError(f"methods: {', '.join(needs)} need{'s' if len(needs) == 1 else ''} "
                        f"{', '.join(answer['missing_packages'])} in the vLLM environment ({python}); install it "
                        "there or drop the method")
    return {"python": python, "vllm": answer["vllm"], "models": dirs}


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
class Engine:
    """One vLLM engine (one set of vllm.LLM arguments: the points of several comparisons share it) and its worker."""
    name: str  # the first point's label without its comparison
    kwargs: dict
    process: VllmProcess | None = None
    failed: str | None = None
    start_s: float | None = None
    warmed: set = field(default_factory=set)  # the points warmed up on this process's engine


class VllmExecutor:
    """Runs the vLLM points of the units it is given and yields each finished unit (and each drift reading), as the
    local and Ray executors do; the experiment keeps what they bring. session: the loaded prompts and tokenizer."""

    def __init__(self, config, session, checked: dict, out_dir: Path):
        self.session, self.config = session, config
        self.checked = checked
        self.log = Path(out_dir) / "vllm-worker.log"
        self.info: dict = {}  # version, interpreter, pairing and order, for progress.json's vllm
        self.engines: dict[str, Engine] = {}  # json of the engine's arguments -> the engine
        self.failed: dict[Point, str] = {}
        self._reported: set[str] = set()  # failed points whose failure went to a unit result
        longest = max(len(p.token_ids) for p in session.prompt_set.prompts)
        if config.vllm.max_model_len and config.vllm.max_model_len < longest + config.generation.max_new_tokens:
            raise UserError(f"vllm.max_model_len: {config.vllm.max_model_len} is below the longest prompt ({longest} "
                            f"tokens) + max_new_tokens ({config.generation.max_new_tokens}): vLLM would cut rows short; "
                            "raise it or leave it unset")
        most = max_concurrency(config, len(session.prompt_set.prompts))
        seqs = config.vllm.engine_args.get("max_num_seqs")
        if most is not None and seqs is not None and (not isinstance(seqs, int) or seqs < most):
            raise UserError(f"vllm.engine_args.max_num_seqs: {seqs!r} is below the largest load.concurrency "
                            f"({most}): vLLM would queue requests the load point admits; raise it or leave it unset")
        drafts = {d.name: SimpleNamespace(kind=d.kind, vllm_model=checked["models"].get(d.name), revision=d.revision,
                                          quantization=d.quantization) for d in self.config.draft}
        self._drafts = drafts
        # decided in run(), once our engine's models are released (runner/experiment.py sweep): the free memory that
        # `pairing: auto` weighs is then the memory vLLM gets
        self.pairing: str | None = None

    # -- engines ----------------------------------------------------------------------------------
    def engine_kwargs(self, point: Point) -> dict:
        """vllm.LLM's keyword arguments for a point: the config's engine options and the point's speculative_config."""
        config, v = self.config, self.config.vllm
        prompts = self.session.prompt_set.prompts
        longest = max(len(p.token_ids) for p in prompts)
        kwargs = {"model": self.checked["models"]["target"], "dtype": self.dtype(),
                  "enable_prefix_caching": False,  # every prompt prefilled every time, as our engine does
                  "tensor_parallel_size": v.tensor_parallel_size, "seed": config.seed % 2**31,
                  "max_model_len": v.max_model_len or longest + config.generation.max_new_tokens + 16,
                  "skip_tokenizer_init": False}
        if config.target.revision:
            kwargs["revision"] = config.target.revision
        if config.target.quantization == "4bit":
            kwargs["quantization"] = "bitsandbytes"
        if v.enforce_eager is not None:
            kwargs["enforce_eager"] = v.enforce_eager
        if v.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = v.kv_cache_memory_bytes
        if v.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = v.gpu_memory_utilization
        most = max_concurrency(config, len(prompts))
        if most is not None:  # one engine serves every load point: room for the largest concurrency's requests
            kwargs["max_num_seqs"] = most
        speculative = REGISTRY[point.method].engine_config(point, self._drafts, config.speculative.model_dump())
        if speculative:
            kwargs["speculative_config"] = {**speculative, **self.draft_options(point, speculative)}
        kwargs.update(v.engine_args)
        return kwargs

    def draft_options(self, point: Point, speculative: dict) -> dict:
        """The point's draft as configured, for vLLM's speculative_config where it loads that draft: its revision, and
        4-bit as bitsandbytes (in flight, as the target's). Its dtype is the engine's: vLLM builds the draft in the
        target's dtype (speculative_config has no dtype of its own); check_vllm refuses a draft dtype that differs."""
        draft = self._drafts.get(getattr(point, "draft", None))
        if draft is None or speculative.get("model") is None or speculative.get("model") != draft.vllm_model:
            return {}
        options = {"revision": draft.revision} if draft.revision else {}
        if draft.quantization == "4bit":
            options["quantization"] = "bitsandbytes"
        return options

    def dtype(self) -> str:
        """vllm.dtype, else the dtype our engine runs the target in (auto resolved as ours is: float32 on a CPU), so
        the engines compare at one precision."""
        return engine_dtype(self.config)

    def _pairing(self) -> str:
        v = self.config.vllm
        if v.pairing != "auto":
            return v.pairing
        models = self.checked["models"]
        sizes = {role: resident_bytes(path, self.dtype()) for role, path in models.items()}
        if any(size is None for size in sizes.values()):
            return "engine"  # a hub id: its size is not known before it downloads
        engines: dict[str, int] = {}  # distinct engines of a comparison -> the bytes they hold
        for point in points_of(self.config, comparisons(self.config)[0], engine="vllm"):
            kwargs = self.engine_kwargs(point)
            drafted = (kwargs.get("speculative_config") or {}).get("model")
            draft = next((sizes[r] for r, path in models.items() if r != "target" and path == drafted), 0)
            engines[json.dumps(kwargs, sort_keys=True, default=str)] = sizes["target"] + draft
        need = RESIDENT_HEADROOM * sum(engines.values()) + len(engines) * ENGINE_OVERHEAD_BYTES
        if not self.config.device.startswith("cuda"):
            kv = v.kv_cache_memory_bytes or int(float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", 0)) * 2**30) or CPU_KV_BYTES
            need += len(engines) * kv
        free = free_memory(self.config.device)
        return "batch" if free is not None and need <= free else "engine"

    def engine_of(self, point: Point) -> Engine:
        kwargs = self.engine_kwargs(point)
        key = json.dumps(kwargs, sort_keys=True, default=str)
        if key not in self.engines:
            name = label_of(point.values(), [axis for axis in AXES if axis.splits == POINT])  # its point axes
            self.engines[key] = Engine(name, kwargs)
        return self.engines[key]

    def start(self, point: Point, sharing: int = 1) -> Engine:
        """The point's engine, up (started here if it is not). sharing: engines still to start that must fit beside
        it (batch pairing): on a GPU without a set budget, each takes 0.9 of the memory free / sharing (vLLM's
        gpu_memory_utilization is a share of the whole GPU, and a resident engine's is taken)."""
        engine = self.engine_of(point)
        if engine.failed or (engine.process is not None and engine.process.alive()):
            return engine
        kwargs = dict(engine.kwargs)
        if self.config.device.startswith("cuda") and "gpu_memory_utilization" not in kwargs \
                and "kv_cache_memory_bytes" not in kwargs:
            import torch

            free, total = torch.cuda.mem_get_info(torch.device(self.config.device))
            kwargs["gpu_memory_utilization"] = round(max(0.02, 0.9 * free / total / max(1, sharing)), 3)
        engine.process = VllmProcess(self.checked["python"], self.log, engine.name, self.worker_env())
        engine.warmed = set()  # a new engine: its first calls are slow again
        try:
            answer = engine.process.ask({"op": "start", "engine": kwargs}, self.config.vllm.start_timeout_s)
        except VllmDead as error:
            answer = {"ok": False, "error": str(error)}
        if not answer.get("ok"):
            engine.failed = f"vLLM engine did not start: {answer.get('error')}"
            self.stop(engine)
        else:
            engine.start_s = answer.get("start_s")
        return engine

    def worker_env(self) -> dict:
        """The devices vLLM may use: the run's GPU (cuda:N -> CUDA_VISIBLE_DEVICES=N, and N more for tensor
        parallelism), none on a CPU run; on a CPU, its compute threads on every core as ours (the CPU build keeps one
        core for its front end by default: on 2 cores it would compute on 1 while we compute on 2)."""
        env = {}
        device = self.config.device
        if device.startswith("cuda"):
            first = int(device.split(":")[1]) if ":" in device else 0
            if "CUDA_VISIBLE_DEVICES" not in os.environ:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(first + i) for i in range(self.config.vllm.tensor_parallel_size))
        else:
            env["CUDA_VISIBLE_DEVICES"] = ""
            env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"))
        return env

    def stop(self, engine: Engine) -> None:
        if engine.process is not None:
            process, engine.process = engine.process, None
            process.close()

    def close(self) -> None:
        """Every engine down, whatever fails or interrupts one of them."""
        held = _hold_signals()
        try:
            for engine in self.engines.values():
                try:
                    self.stop(engine)
                except Exception:  # noqa: BLE001 - the others must still be stopped
                    pass
        finally:
            _release_signals(held)

    # -- jobs -------------------------------------------------------------------------------------
    def _job(self, batch, temperature, max_new_tokens: int, seed: int, load=None) -> dict:
        """A generate job of a fixed batch; with load (decode/serving.py Load), a serve job of its requests."""
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

    def generate(self, engine: Engine, job: dict) -> dict:
        """One job; a dead worker or engine fails the engine (every point on it), a job's own error only the caller's
        point."""
        try:
            answer = engine.process.ask(job, GENERATE_TIMEOUT_S)
        except VllmDead as error:
            answer = {"ok": False, "error": str(error)}
        if not answer.get("ok") and (engine.process is None or not engine.process.alive()):
            engine.failed = f"vLLM: {answer.get('error')}"
            self.stop(engine)
        return answer

    def drift_probe(self, engine: Engine, point: Point, unit: Unit):
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
                yield unit, self._result(notes=[f"vLLM engine {engine.name}: its drift probe failed "
                                                f"({answer.get('error')}); no reading"])
                return
            walls.append(answer["wall_s"])
        yield unit, self._result(drift_probe_s=sorted(walls[1:])[1], probe_process=f"{PROCESS}/vllm {engine.name}",
                                 probe_name=f"vLLM engine {engine.name}")

    def warm_up(self, engine: Engine, point: Point, unit: Unit) -> None:
        """Each point's first batch with a short budget, untimed (vLLM warms its own kernels as it starts)."""
        if engine.failed or point in engine.warmed or not self.config.warmup:
            return
        batch = self.fixed_batch(unit)
        short = min(self.config.generation.max_new_tokens, 2 * max(self.config.speculative.gamma) + 2)
        for _ in range(self.config.warmup):
            answer = self.generate(engine, self._job(batch, unit.temperature, short, 0))
            if not answer.get("ok"):
                self.failed.setdefault(point, f"vLLM, in the warmup: {answer.get('error')}")
                return
        engine.warmed.add(point)

    def run_batch(self, engine: Engine, point: Point, unit: Unit) -> list[dict] | str:
        """The point's records of one batch (a serving unit's: of its load point's requests), or why there are none:
        a load point served in part (an error, a dead engine) has none."""
        batch = self.session.prompts_of(unit)
        seed = (self.config.seed * 1_000_003 + unit.batch_index * 101 + unit.repeat) % 2**63
        load = self.session.load_of(unit)
        answer = self.generate(engine, self._job(batch, unit.temperature, self.config.generation.max_new_tokens, seed,
                                                 load))
        if not answer.get("ok"):
            return f"vLLM: {answer.get('error')}"
        rows = answer.get("rows") or []
        odd = [r.get("finish_reason") for r in rows if r.get("stop_reason") not in ("eos", "length")]
        if len(rows) != len(batch) or odd:
            return (f"vLLM answered {len(rows)} rows for a batch of {len(batch)}" if len(rows) != len(batch) else
                    f"vLLM ended a row with finish_reason {odd[0]!r} (not a stop or the length)")
        try:
            return records_of(point, unit, batch, answer, self.session.tokenizer, self.config.dataset.preset, load)
        except (KeyError, TypeError, ValueError) as error:
            return f"vLLM's answer could not be read ({type(error).__name__}: {error})"

    # -- the units ----------------------------------------------------------------------------------
    def run(self, units: list[Unit], done: set):
        if self.pairing is None:  # after our models left memory (the sweep releases them before vLLM's units)
            self.pairing = self._pairing()
        by_comparison: dict[Comparison, list[Unit]] = {}
        for unit in units:
            by_comparison.setdefault(unit.comparison, []).append(unit)
        try:
            if self.pairing == "engine" and self.config.load is not None:
                if any(points_of(self.config, comparison, engine="vllm") for comparison in by_comparison):
                    self._note_pairing()
                    yield from self._serving_by_engine(by_comparison, done)
                return
            for comparison, mine in by_comparison.items():
                points = points_of(self.config, comparison, engine="vllm")
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
        for point in order:
            pending = self._pending(point, units, done)
            if not pending or point in self.failed or skipped_reason(point):
                continue
            try:
                yield from self._on_engine(point, pending)
            finally:
                self.stop(self.engine_of(point))

    def _serving_by_engine(self, by_comparison: dict[Comparison, list[Unit]], done: set):
        """Engine pairing in a serving run: each engine up once for every load point (its max_num_seqs is the
        largest concurrency), then down before the next; the engines in the Williams order of the first load point's
        points, each going through the load points in order."""
        plans = [(points_of(self.config, comparison, engine="vllm"), mine)
                 for comparison, mine in by_comparison.items()]
        plans = [(points, mine) for points, mine in plans if points and mine]
        engines: list[Engine] = []
        for points, mine in plans:
            for index in williams_order(len(points), mine[0].repeat):
                engine = self.engine_of(points[index])
                if not any(engine is e for e in engines):
                    engines.append(engine)
        for engine in engines:
            try:
                for points, mine in plans:
                    for index in williams_order(len(points), mine[0].repeat):
                        point = points[index]
                        pending = self._pending(point, mine, done)
                        if self.engine_of(point) is not engine or not pending or point in self.failed \
                                or skipped_reason(point):
                            continue
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
            result.rows.extend(rows)
            # a fixed batch's wall is every row's latency; a load point's runs from its start to its last finish
            wall = (max(r["finish_s"] for r in rows) if unit.serving else rows[0]["latency_s"]) if rows else 0.0
            result.rates[point.label] = sum(r["new_tokens"] for r in rows) / wall if wall > 0 else 0.0

    def _note_pairing(self) -> None:
        what = (f"pairing {self.pairing}" + (" (vllm.pairing: auto)" if self.config.vllm.pairing == "auto" else "")
                + ": " + ("every vLLM engine of a comparison resident, one worker process each; each batch runs every vllm_* "
                   "point back to back in the units' order, as our engine's points" if self.pairing == "batch" else
                   "one vLLM engine at a time, over every batch, then the next; the points' order rotates from repeat "
                   "to repeat (a Williams design); a vllm_* point and vllm_generate ran the same prompts minutes "
                   "apart, not back to back, and each engine's drift probe (the first prompt, 1 new token) ran at "
                   "its start and end"))
        if self.config.load is not None:
            what += ("; under load each engine served every load point (max_num_seqs the largest concurrency, at most "
                     "the requests), and a load point's warmup and drift probe ran its first min(concurrency, requests) "
                     "requests as a fixed batch")
        self.info = {"version": self.checked["vllm"], "python": self.checked["python"], "pairing": self.pairing,
                     "order": what, "cpu_reserved_cores": None if self.config.device.startswith("cuda") else
                     int(self.worker_env().get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"))}


def records_of(point: Point, unit: Unit, batch, answer: dict, tokenizer, preset: str, load=None) -> list[dict]:
    """A vLLM batch's answer as records: wall time of the generate call for every row (vLLM schedules the batch as
    one), vLLM's own TTFT and latency per request in extra, and rounds from its per-request speculative counters.
    A served request's (a serving unit's): its arrival, admission, first token, finish and emits, latency_s =
    finish - arrival, prefill_s = first token - arrival (TTFT, the queue's wait included) and target_s its time in the
    engine (finish - admission: vLLM runs the target and the drafter in one step)."""
    rows = []
    spec = REGISTRY[point.method]
    for index, (prompt, row) in enumerate(zip(batch, answer["rows"])):
        timing = {"latency_s": answer["wall_s"], "prefill_s": None, "target_s": answer["wall_s"], "arrival_s": None}
        if unit.serving:
            served = {key: row[key] for key in ("arrival_s", "admitted_s", "first_token_s", "finish_s")}
            if None in served.values() or not row.get("emits"):
                missing = next((k for k, v in served.items() if v is None), "emits")
                raise ValueError(f"request {index} has no {missing}")
            served["emits"] = [[float(t), int(n)] for t, n in row["emits"]]
            timing = {"latency_s": served["finish_s"] - served["arrival_s"],
                      "prefill_s": served["first_token_s"] - served["arrival_s"],
                      "target_s": served["finish_s"] - served["admitted_s"], **served}
        extra = {"engine": "vllm", "vllm_ttft_s": row.get("ttft_s"), "vllm_latency_s": row.get("latency_s")}
        if index == 0 and answer.get("counters") is not None:
            extra["vllm_batch_counters"] = answer["counters"]
        measured = SimpleNamespace(
            output_ids=row["output_ids"], new_tokens=row["new_tokens"],
            stop_reason=row["stop_reason"] if row["stop_reason"] in ("eos", "length") else "eos",
            target_forwards=len(row["steps"]) if row.get("steps") else None,  # one target forward per engine step
            draft_forwards=None, draft_s=0.0, draft_prefill_s=0.0,
            rounds=rounds_of(row.get("spec"), row["new_tokens"], row.get("steps")) if spec.has_rounds else None,
            **timing)
        rows.append(record_of(point, unit, prompt, measured, tokenizer, preset, spec.has_rounds, len(batch),
                              extra=extra, **request_fields(load if unit.serving else None, index)))
    return rows


def rounds_of(spec: dict | None, new_tokens: int, steps: list[int] | None) -> list[dict] | None:
    """Our rounds from vLLM's detailed per-request counters and the tokens each engine step gave the row.

    steps[0] is the prefill's step (one token); every later step is one target forward: a verification step that
    had drafts (vLLM's per_step_drafted/per_step_accepted, in order) or a plain step that drafted nothing (an n-gram
    miss; vLLM does not count those), which gives one token. So the rounds are the counted steps ({drafted,
    accepted, emitted = accepted + 1}) plus len(steps) - 1 - counted plain rounds of one token each; where the
    rounds explain more tokens than the row has, the stop (an eos, max_new_tokens) cut the last step, which is the
    last counted one (a plain step cannot be cut) and emitted what steps[-1] says (its accepted count stays the
    verifier's, as our engine records a round cut at an eos). None where the counters are missing, or disagree with
    the steps (then the note says so and no round figure is made up)."""
    if not spec or not steps or ("per_step_accepted" not in spec and spec.get("num_spec_steps")):
        return None
    accepted = [int(a) for a in spec.get("per_step_accepted") or []]
    drafted = [int(d) for d in spec.get("per_step_drafted") or []]
    plain = len(steps) - 1 - len(accepted)
    if len(accepted) != len(drafted) or plain < 0 or sum(steps) != new_tokens:
        return None
    rounds = [{"drafted": d, "accepted": a, "emitted": a + 1} for a, d in zip(accepted, drafted)]
    cut = 1 + sum(r["emitted"] for r in rounds) + plain - new_tokens
    if cut < 0:
        return None
    if cut:
        if not rounds or rounds[-1]["emitted"] - cut != steps[-1]:
            return None
        rounds[-1]["emitted"] -= cut
    return rounds + [{"drafted": 0, "accepted": 0, "emitted": 1} for _ in range(plain)]
