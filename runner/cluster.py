"""The same units of work on a Ray cluster.

Each worker is a Ray actor holding one Session on one device (its own models, its own cost, drift and
numerics probes); a unit (one batch, every point of its comparison back to back) runs on one worker, so
the pairing of methods and the order they run in are the single-process run's. Records stream
back to the driver as units finish, and the driver alone writes the report folder (Experiment.accept:
atomic writes, a batch already on disk is never written twice), so the folder looks exactly like a
single-process run's, with each record's `worker` filled in.

Faults: a worker that dies mid-unit is restarted by Ray (max_restarts) and its unit retried on it
(max_task_retries): Ray's own actor fault tolerance, so a lost node or a killed process needs no
bookkeeping here; records reach the driver only with a finished unit, so nothing is half-written.
A driver killed at any moment is continued with --resume, which submits only units not on disk.
"""
from __future__ import annotations

import math
import os
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

from decode.methods import HOME_ENGINE
from utils import UserError

ROOT = Path(__file__).resolve().parents[1]


def check_ray(config) -> None:
    """What can be refused before anything starts."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise UserError("cluster.backend: ray needs the ray package, which is not installed here; "
                        "pip install ray (or set cluster.backend: none)") from None
    if config.cluster.num_gpus > 0 and not config.device.startswith("cuda"):
        raise UserError(f"cluster.num_gpus: {config.cluster.num_gpus} GPUs per worker but device is {config.device}; "
                        "set device: cuda, or cluster.num_gpus: 0")
    if config.cluster.num_gpus == 0 and config.device.startswith("cuda"):
        raise UserError("cluster.num_gpus: 0 with device cuda would put every worker on the same GPU; "
                        "set cluster.num_gpus: 1 (one GPU per worker)")


def _kill_hook(label: str) -> None:
    """Fault injection for the tests: die in the middle of a unit, once (a marker file says it happened)."""
    if os.environ.get("SPECULATE_KILL_WORKER_AT") != label:
        return
    marker = Path(os.environ.get("SPECULATE_KILL_MARKER", "/tmp/speculate-kill-marker"))
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        os._exit(1)


class _Worker:
    """A Ray actor: one Session on one device."""

    def __init__(self, raw_config: dict, device: str, worker_id: str):
        import torch

        from runner.session import Session
        from utils.config import validate

        if os.environ.get("SPECULATE_WORKER_THREADS"):
            torch.set_num_threads(int(os.environ["SPECULATE_WORKER_THREADS"]))
        self.worker_id = worker_id
        self.session = Session(validate(raw_config), torch.device(device), worker=worker_id)
        self.session.load()

    def info(self) -> dict:
        from runner.probes import PROCESS, device_name, environment

        session = self.session
        return {"worker": self.worker_id, "hostname": socket.gethostname(), "device": str(session.device),
                "device_name": device_name(session.device), "prompt_set": session.prompt_set,
                "notes": session.notes, "numerics": session.numerics, "process": PROCESS,
                "env": {**environment(session.device), "worker": self.worker_id, "hostname": socket.gethostname()}}

    def run_unit(self, unit, done: set):
        return self.session.run_unit(unit, done, on_point=lambda point, outcome: _kill_hook(point.label))


def local_ray_resources(cluster, cpus_here: int, gpus_here: int) -> tuple[int, int]:
    """(num_cpus, num_gpus) for a local ray.init. num_workers given: what they take. Unset: the whole machine,
    for workers_that_fit to fill (a cluster sized for one worker fits one), yet at least one worker's worth, so a
    worker asking for more than the machine has still starts rather than waiting forever."""
    if cluster.num_workers is not None:
        return (max(1, math.ceil(cluster.num_workers * cluster.num_cpus)),
                math.ceil(cluster.num_workers * cluster.num_gpus))
    gpus = max(gpus_here, math.ceil(cluster.num_gpus)) if cluster.num_gpus > 0 else 0
    return max(cpus_here, math.ceil(cluster.num_cpus)), gpus


def workers_that_fit(resources: dict, cluster) -> int:
    """Workers of cluster.num_cpus / num_gpus each that a cluster of these resources holds (at least one)."""
    fits = [resources.get("CPU", 1) // cluster.num_cpus]
    if cluster.num_gpus:
        fits.append(resources.get("GPU", 0) // cluster.num_gpus)
    return max(1, int(min(fits)))


def _cpus_here() -> int:
    """The CPUs this process may run on (a container's or taskset's share, not the host's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _gpus_here(cluster) -> int:
    if cluster.num_gpus <= 0:
        return 0  # no CUDA initialisation for a CPU cluster
    import torch

    return torch.cuda.device_count()


class RayExecutor:
    """Runs units on Ray workers, as many at once as there are workers, and yields each one as it finishes."""

    def __init__(self, config, device, raw_config: dict, status=None):
        self.config, self.device, self.raw_config = config, device, raw_config
        self.cluster = config.cluster
        self._status = status

    def __enter__(self):
        import ray

        cluster = self.cluster
        workers = cluster.num_workers or 1
        # the workers import this project: locally through PYTHONPATH, on a remote cluster as Ray's working_dir
        env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "TOKENIZERS_PARALLELISM": "false"}
        for key in ("SPECULATE_KILL_WORKER_AT", "SPECULATE_KILL_MARKER", "SPECULATE_INJECT_FAILURE",
                    "SPECULATE_WORKER_THREADS", "SPECULATE_CACHE", "HF_HUB_OFFLINE"):
            if key in os.environ:
                env[key] = os.environ[key]
        if cluster.address == "local":
            runtime_env = {"env_vars": env}
            num_cpus, num_gpus = local_ray_resources(cluster, _cpus_here(), _gpus_here(cluster))
            ray.init(num_cpus=num_cpus, num_gpus=num_gpus,
                     include_dashboard=False, log_to_driver=False, runtime_env=runtime_env, configure_logging=False)
        else:
            runtime_env = {"env_vars": {k: v for k, v in env.items() if k != "PYTHONPATH"},
                           "working_dir": str(ROOT), "excludes": [".venv", ".git", "results", "docs"]}
            ray.init(address=cluster.address, runtime_env=runtime_env, log_to_driver=False, configure_logging=False)
        if cluster.num_workers is None:  # as many as the cluster's resources fit
            workers = workers_that_fit(ray.cluster_resources(), cluster)
        actor = ray.remote(_Worker).options(num_cpus=cluster.num_cpus, num_gpus=cluster.num_gpus,
                                            max_restarts=cluster.max_retries, max_task_retries=cluster.max_retries)
        device = "cuda:0" if self.device.type == "cuda" else "cpu"  # Ray gives each worker its own GPU as cuda:0
        self.workers = {f"w{i}": actor.remote(self.raw_config, device, f"w{i}") for i in range(workers)}
        import contextlib

        starting = f"starting {workers} Ray worker(s) (each loads the models)"
        with self._status(starting) if self._status else contextlib.nullcontext():
            infos = ray.get([w.info.remote() for w in self.workers.values()])
        self._describe(infos)
        self.num_prompts = len(infos[0]["prompt_set"].prompts)
        return self

    def _describe(self, infos: list[dict]) -> None:
        """What the experiment records of the workers (Experiment.describe): the first one's prompts, models and
        numerics, every worker's machine for env.json, and notes."""
        if infos[0]["prompt_set"].conversations:  # each worker wrote its own answers to the earlier turns
            from utils.data import prompts_digest

            digests = {info["worker"]: prompts_digest(info["prompt_set"]) for info in infos}
            if len(set(digests.values())) > 1:
                raise UserError("dataset.turns: the workers' conversations differ (their targets answered the earlier "
                                f"turns otherwise: {', '.join(f'{w} {d}' for w, d in digests.items())}); run "
                                "conversations on workers of one kind of device, or in one process")
        self.loaded = SimpleNamespace(**{k: infos[0][k] for k in ("prompt_set", "notes", "numerics")})
        self.environments = [(info["env"], info["process"]) for info in infos]
        self.workers_info = {info["worker"]: {k: info[k] for k in ("hostname", "device", "device_name", "numerics")}
                             for info in infos}
        names = sorted({info["device_name"] for info in infos})
        self.notes = [f"ran on a Ray cluster: {len(infos)} workers ({self.cluster.num_cpus} CPU, "
                      f"{self.cluster.num_gpus} GPU each) on {', '.join(names)}"]
        if len(names) > 1:
            self.notes.append("workers ran on different hardware (" + "; ".join(
                f"{i['worker']}: {i['device_name']}" for i in infos) + "): a ratio pairs each batch with its own "
                "baseline on one worker, but throughputs mix machines (each point's c and v are its workers' own)")

    def __exit__(self, *exc):
        import ray

        ray.shutdown()
        return False

    def run(self, units: list, done: set):
        import ray

        from runner.plan import points_of

        queue = list(units)
        idle = list(self.workers)
        running = {}  # object ref -> (worker id, unit)
        while queue or running:
            while queue and idle:
                worker, unit = idle.pop(0), queue.pop(0)
                keys = {p.key + (unit.repeat, unit.batch_index) for p in points_of(self.config, unit.comparison,
                                                                                   engine=HOME_ENGINE)}
                ref = self.workers[worker].run_unit.remote(unit, done & keys)
                running[ref] = (worker, unit)
            ready, _ = ray.wait(list(running), num_returns=1)
            worker, unit = running.pop(ready[0])
            idle.append(worker)
            yield unit, ray.get(ready[0])  # a worker that died is restarted and the unit retried by Ray


if __name__ == "__main__":  # pragma: no cover
    sys.exit("runner/cluster.py is used by launch.py (cluster.backend: ray)")
