"""vLLM as a second engine in the same run: the vllm_* points run in vLLM worker processes (runner/engines/vllm/worker.py),
each started with the interpreter of an environment that has vLLM (config vllm.python), one engine per process (vLLM's
metrics registry is global to a process). runner/engines/process.py runs the workers, their pairing, warmup and drift
probes (vllm.pairing); what is vLLM's is here: the check of its environment, an engine's vllm.LLM arguments
(speculative_config, memory), its workers' environment and the records from its answers.

A vLLM point's ratios are against vllm_generate on the same prompts (eval pairs each engine with its own reference).
A serving run's engines start with max_num_seqs the run's largest concurrency.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from decode.methods import REGISTRY
from eval.records import Point
from runner.engines.process import (ProcessExecutor, WorkerDead, WorkerProcess, checking_worker, max_concurrency,
                                    resident_bytes)
from utils import UserError

WORKER = Path(__file__).with_name("worker.py")
CHECK_TIMEOUT_S = 300.0
CPU_KV_BYTES = 256 * 2**20  # runner/engines/vllm/worker.py's default KV cache on a CPU
ENGINE_OVERHEAD_BYTES = 2 * 2**30  # a worker, its front end and engine-core processes (Python, torch, vLLM)


VllmDead = WorkerDead  # the worker process exited or stopped answering


def vllm_python(config) -> str:
    """The interpreter of the vLLM environment: vllm.python (a path, or a name on PATH), else this one."""
    python = config.vllm.python
    if not python:
        return sys.executable
    if "/" not in python:
        return shutil.which(python) or python
    return str(Path(python).expanduser().absolute())


class VllmProcess(WorkerProcess):
    """A vLLM worker (runner/engines/vllm/worker.py). Its cwd is "/" (WorkerProcess): vLLM runs `python -m vllm....`
    subprocesses (its model inspection, cached in ~/.cache/vllm), and from runner/engines this package's folder,
    named vllm, would shadow vLLM (a cold cache failed every engine start)."""
    script, title = WORKER, "the vLLM worker"
    cannot_run = ("vllm.python: {python} cannot run ({error}); give the interpreter of an environment with vLLM "
                  "(.ci/vllm-env DIR builds one)")


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

    return str(resolve_dtype(config.target.dtype, torch.device(config.device), config.target.quantization)
               ).removeprefix("torch.")


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
    with checking_worker(VllmProcess, python, log, "vllm.python") as worker:
        answer = worker.ask({"op": "check", "models": dirs, "packages": packages}, CHECK_TIMEOUT_S)
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


class VllmExecutor(ProcessExecutor):
    """The vllm_* points of the units it is given, in vLLM workers (runner/engines/process.py ProcessExecutor).
    checked: check_vllm's answer (the interpreter, vLLM's version, what each model is loaded from)."""
    name, title, process, kept = "vllm", "vLLM", VllmProcess, ("python",)
    check = staticmethod(check_vllm)

    def __init__(self, config, session, checked: dict, out_dir: Path):
        super().__init__(config, session, checked, out_dir)
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
        speculative = REGISTRY[point.method].engine_config(point, self._drafts,
                                                               config.method_options.get(point.method))
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

    def engine_bytes(self, kwargs: dict) -> int | None:
        """The target's weights and the draft's its speculative_config loads (None: a hub id among the models)."""
        models = self.checked["models"]
        sizes = {role: resident_bytes(path, self.dtype()) for role, path in models.items()}
        if any(size is None for size in sizes.values()):
            return None
        drafted = (kwargs.get("speculative_config") or {}).get("model")
        return sizes["target"] + next((sizes[r] for r, path in models.items() if r != "target" and path == drafted), 0)

    def overhead_bytes(self) -> int:
        """A worker's processes, and on a CPU its KV cache (vllm.kv_cache_memory_bytes, VLLM_CPU_KVCACHE_SPACE, else
        the worker's default)."""
        if self.config.device.startswith("cuda"):
            return ENGINE_OVERHEAD_BYTES
        v = self.config.vllm
        return ENGINE_OVERHEAD_BYTES + (v.kv_cache_memory_bytes or
                                        int(float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", 0)) * 2**30) or CPU_KV_BYTES)

    def prepare(self, kwargs: dict, sharing: int) -> dict:
        """On a GPU without a set budget, each engine takes 0.9 of the memory free / sharing (vLLM's
        gpu_memory_utilization is a share of the whole GPU, and a resident engine's is taken)."""
        if self.config.device.startswith("cuda") and "gpu_memory_utilization" not in kwargs \
                and "kv_cache_memory_bytes" not in kwargs:
            import torch

            free, total = torch.cuda.mem_get_info(torch.device(self.config.device))
            kwargs["gpu_memory_utilization"] = round(max(0.02, 0.9 * free / total / max(1, sharing)), 3)
        return kwargs

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

    def measured(self, spec, row: dict, answer: dict | None) -> tuple[dict, dict]:
        """vLLM schedules a batch as one (the wall of the generate call for every row: timing_of), its own TTFT and
        latency per request go to extra, the rounds come from its per-request speculative counters, and the batch's
        differenced Prometheus counters are kept in its first record."""
        extra = {"vllm_ttft_s": row.get("ttft_s"), "vllm_latency_s": row.get("latency_s")}
        if answer is not None and answer.get("counters") is not None:
            extra["vllm_batch_counters"] = answer["counters"]
        return dict(
            output_ids=row["output_ids"], new_tokens=row["new_tokens"],
            stop_reason=row["stop_reason"] if row["stop_reason"] in ("eos", "length") else "eos",
            target_forwards=len(row["steps"]) if row.get("steps") else None,  # one target forward per engine step
            rounds=rounds_of(row.get("spec"), row["new_tokens"], row.get("steps")) if spec.has_rounds else None), extra

    def how_paired(self) -> str:
        if self.config.load is None:
            return super().how_paired()
        return super().how_paired() + ("; under load each engine served every load point (max_num_seqs the largest "
                                       "concurrency, at most the requests), and a load point's warmup and drift probe "
                                       "ran its first min(concurrency, requests) requests as a fixed batch")

    def own_info(self) -> dict:
        return {"cpu_reserved_cores": None if self.config.device.startswith("cuda") else
                int(self.worker_env().get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"))}


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
