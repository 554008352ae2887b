"""A toy engine in its own process on runner/engines/process.py's base: this file is also its worker (run as a
script), which "generates" by counting on from the prompt's last token ([5, 6, 7] -> 8, 9, 10, ...), one token per
request per step. What the base gives it: the worker in its own process group, started and killed with the group on
close and on a timeout, Ctrl-C held while it closes, the points paired batch by batch, the serve job's arrivals."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "speculate_process_worker", Path(__file__).resolve().parents[2] / "runner" / "engines" / "process_worker.py")
process_worker = sys.modules.setdefault("speculate_process_worker", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(process_worker)


class ToyWorker(process_worker.ProcessWorker):
    flying: dict | None = None

    def start(self, job: dict) -> dict:
        self.flying, engine = {}, job["engine"]
        helper = subprocess.Popen(["sleep", "300"])  # a process the engine spawned: in the worker's group
        Path(os.environ["TOY_PIDS"]).open("a").write(f"{os.getpid()} {helper.pid}\n")
        time.sleep(engine.get("hang", 0))
        return {"ok": True, "start_s": 0.0}

    def shutdown(self) -> None:
        if self.flying is not None:
            time.sleep(0.5)  # a slow shutdown, that a Ctrl-C must not cut
        self.flying = None

    def ready(self) -> bool:
        return self.flying is not None

    def sampling(self, job: dict) -> int:
        return job["max_new_tokens"]

    def add(self, request, prompt, params) -> None:
        self.flying[request] = (prompt[-1], params, [])

    def in_flight(self) -> bool:
        return bool(self.flying)

    def step(self) -> list:
        out = []
        for request, (last, budget, ids) in list(self.flying.items()):
            ids.append(last + len(ids) + 1)
            if len(ids) == budget:
                del self.flying[request]
            out.append((request, ids[-1:], len(ids) == budget, None))
        return out

    def row(self, final, ids, steps, times) -> dict:
        return {**super().row(final, ids, steps, times), "stop_reason": "length"}


if __name__ == "__main__":
    sys.exit(ToyWorker().main())

import signal  # noqa: E402 - the test's side, which the worker never runs
import threading  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402

from runner.engines.process import ProcessEngine, ProcessExecutor, WorkerProcess  # noqa: E402
from runner.plan import comparisons, points_of, units_of  # noqa: E402
from utils.config import validate  # noqa: E402

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [3, 4]]


class ToyProcess(WorkerProcess):
    script, title = Path(__file__), "the toy worker"


class ToyExecutor(ProcessExecutor):
    name, title, process = "toy", "toy", ToyProcess
    settings = SimpleNamespace(pairing="batch", start_timeout_s=1.0)
    hang = 0  # seconds the worker takes to start

    def points(self, comparison):  # the toy runs the config's points (of our methods: it has none of its own)
        return points_of(self.config, comparison)

    def engine_kwargs(self, point) -> dict:
        return {"method": point.method, "gamma": point.gamma, "hang": self.hang}

    def records_of(self, point, unit, batch, answer, load) -> list[dict]:
        return [{"method": point.method, "output_ids": row["output_ids"], "new_tokens": row["new_tokens"],
                 "latency_s": answer["wall_s"]} for row in answer["rows"]]


class ToyEngine(ProcessEngine):
    executor_class = ToyExecutor


@pytest.fixture
def toy(tmp_path, monkeypatch):
    monkeypatch.setenv("TOY_PIDS", str(tmp_path / "pids"))
    config = validate({"target": {"model": "t"}, "dataset": {"path": "x.jsonl"}, "methods": ["baseline", "speculative"],
                       "draft": [{"model": "d", "label": "d"}], "speculative": {"gamma": [2]},
                       "generation": {"max_new_tokens": 3}, "batch_size": [2]})
    prompts = [SimpleNamespace(token_ids=ids) for ids in PROMPTS]
    batches = lambda size: [prompts[i:i + size] for i in range(0, len(prompts), size)]  # noqa: E731
    session = SimpleNamespace(prompt_set=SimpleNamespace(prompts=prompts), eos=(2,), batches=batches,
                              prompts_of=lambda unit: batches(unit.batch_size)[unit.batch_index],
                              load_of=lambda unit: None)
    engine = ToyEngine(config, None, tmp_path, {})
    engine.start(session)
    units = units_of(comparisons(config)[0], len(PROMPTS), 0)
    yield engine, units, lambda: [[int(p) for p in line.split()] for line in (tmp_path / "pids").read_text().splitlines()]
    engine.close()


def gone(pid: int) -> bool:
    """The process exited (a zombie left to be reaped counts), within 5 s."""
    for _ in range(50):
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_the_points_run_paired_batch_by_batch_and_every_process_goes_with_its_group(toy):
    engine, units, pids = toy
    results = list(engine.run(units, set()))
    rows = [[(r["method"], r["output_ids"]) for r in result.rows] for _, result in results if result.rows]
    # the Williams order: batch 0 runs baseline then speculative, batch 1 the other way round; 3 tokens counted on
    assert rows == [[("baseline", [8, 9, 10]), ("baseline", [10, 11, 12]),
                     ("speculative", [8, 9, 10]), ("speculative", [10, 11, 12])],
                    [("speculative", [14, 15, 16]), ("speculative", [5, 6, 7]),
                     ("baseline", [14, 15, 16]), ("baseline", [5, 6, 7])]]
    probes = [result.probe_name for _, result in results if result.drift_probe_s is not None]
    assert probes == ["toy engine baseline", "toy engine speculative draft=d gamma=2 constant"] * 2  # at each engine's start and end
    assert engine.info()["pairing"] == "batch"
    assert len(pids()) == 2 and all(gone(pid) for pair in pids() for pid in pair)  # run() leaves nothing resident


def test_a_worker_past_its_start_timeout_is_killed_with_its_group(toy):
    engine, units, pids = toy
    engine.executor.hang = 60
    began = time.monotonic()
    results = list(engine.run(units[:1], set()))
    assert time.monotonic() - began < 30  # two starts of 1 s each, not 60 s
    failures = [f for _, result in results for f in result.failures]
    assert [f["method"] for f in failures] == ["baseline", "speculative"]
    assert all("the toy worker did not answer start within 1 s" in f["error"] for f in failures)
    assert len(pids()) == 2 and all(gone(pid) for pair in pids() for pid in pair)


def test_a_ctrl_c_while_the_worker_closes_is_held_until_it_is_gone(toy):
    engine, units, pids = toy
    point = engine.executor.points(units[0].comparison)[0]
    engine.executor.start(point)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()  # during the worker's 0.5 s shutdown
        with pytest.raises(KeyboardInterrupt):
            engine.close()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert all(gone(pid) for pid in pids()[0])


def test_a_served_request_that_follows_another_arrives_its_think_time_after_that_ones_last_token(tmp_path, monkeypatch):
    monkeypatch.setenv("TOY_PIDS", str(tmp_path / "pids"))
    worker = ToyProcess(sys.executable, tmp_path / "log", "served")
    try:
        assert worker.ask({"op": "start", "engine": {}}, 30)["ok"]
        answer = worker.ask({"op": "serve", "prompts": [[5], [7], [9]], "max_new_tokens": 2, "arrivals": [0.0, 0.0, 0.1],
                             "concurrency": 1, "follows": [None, 0, None], "think_s": 0.3}, 30)
    finally:
        worker.close()
    first, follower, third = answer["rows"]
    assert [r["output_ids"] for r in answer["rows"]] == [[6, 7], [8, 9], [10, 11]]
    assert follower["arrival_s"] == pytest.approx(first["finish_s"] + 0.3)
    assert third["admitted_s"] < follower["admitted_s"]  # the third arrived first: admitted before the follower
    assert [len(r["emits"]) for r in answer["rows"]] == [2, 2, 2]


@pytest.mark.parametrize("engine", ["llama_cpp", "vllm"])
def test_an_engine_worker_takes_the_process_worker_base_and_leaves_sys_path_as_it_was(engine):
    """Each engine's worker imports runner/engines/process_worker.py (no copy of a loader of its own), in an
    interpreter that has none of this project's packages, and leaves runner/engines off sys.path (its vllm/ would
    shadow vLLM)."""
    import subprocess

    script = Path(__file__).resolve().parents[2] / "runner" / "engines" / engine / "worker.py"
    check = ("import runpy, sys; before = list(sys.path); names = runpy.run_path(sys.argv[1], run_name='worker'); "
             "assert names['ProcessWorker'] is sys.modules['process_worker'].ProcessWorker; assert sys.path == before; "
             "assert not any(m == 'decode' or m.startswith(('decode.', 'runner', 'eval')) for m in sys.modules)")
    result = subprocess.run([sys.executable, "-I", "-c", check, str(script)], capture_output=True, text=True,
                            cwd="/")
    assert result.returncode == 0, result.stderr[-2000:]
