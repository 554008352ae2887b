"""The worker side of runner/engines/process.py: a process that runs one engine and answers JSON-lines jobs.

An engine's worker.py subclasses ProcessWorker with what is its engine's (start, check, its sampling parameters, adding
a request, stepping the engine, a row's answer). It runs with the interpreter of the engine's own environment, whose
packages may clash with this project's (an engine's build may pin another transformers): this file imports only the
standard library and decode/arrivals.py (standard library only too), each loaded by its path, not as a package of the
repository, so that no __init__ above them runs there. An engine's worker imports this file with runner/engines on
sys.path for that import alone (an engine's package there would shadow the engine's own modules of its name).

The protocol: one JSON job per line on stdin, one JSON result per line on stdout; every other byte (the engine's logs,
prints of the processes it spawns) goes to stderr. A job {"op": NAME, ...} calls the worker's method NAME ("start",
"check", "generate", "serve" and what a subclass adds); {"op": "stop"}, stdin EOF and SIGTERM shut the engine down and
exit 0. A job that fails answers {"ok": false, "error": "<Type>: <one line>"} and the worker goes on serving (unless
the engine died: the answer says "engine_dead": true, and the worker exits 1). A worker whose parent is gone (the run
SIGKILLed) gets SIGTERM: on Linux from PR_SET_PDEATHSIG, which its parent sets, elsewhere from watch_parent.

  {"op": "generate", "prompts": [[token ids], ...], "max_new_tokens": N, "temperature": null (greedy) or float,
   "top_k", "top_p", "seed", "stop_token_ids"}: a fixed batch, every prompt added at once
  {"op": "serve", ... a generate job's keys, and "arrivals": [seconds from the start, one per prompt, non-decreasing],
   "concurrency": C, optionally "follows": [null or an earlier request's index, one per prompt] and "think_s"}: the
        prompts as requests that arrive and leave, admitted by decode/arrivals.py's Queue (in arrival order, then
        index order, at most C in flight; a request that follows request j arrives think_s after j's last token)
        -> {"ok": true, "wall_s": seconds from the start to the last request's end, "rows": [the engine's row, with,
            in seconds from the start: "arrival_s", "admitted_s", "first_token_s", "finish_s" (the end of the engine
            steps that gave its first and last tokens) and "emits": [[time_s, tokens], ...]], "counters": the engine's
            own for this call, or null}
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load(path: Path, name: str):
    """A module of this repository by its file, without importing the packages above it."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


serving = load(ROOT / "decode" / "arrivals.py", "speculate_decode_arrivals")


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that the engine is shut down on the way out."""


def watch_parent(interval_s: float = 1.0) -> None:
    """SIGTERM to this process once its parent is gone (re-parented), so that it shuts its engine down where no
    PR_SET_PDEATHSIG reaches it."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)

    if parent != 1:
        threading.Thread(target=watch, daemon=True, name="watch_parent").start()


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or repr(error)
    return f"{type(error).__name__}: {text[:2000]}"


class ProcessWorker:
    """One engine behind the pipe. A subclass implements start (and check) and the hooks of run."""

    def __init__(self):
        self.batches = 0

    # -- what the engine says ---------------------------------------------------------------------------
    def ready(self) -> bool:
        """An engine is up (a start job ran)."""
        raise NotImplementedError

    def shutdown(self) -> None:
        """The engine down (nothing when none is up)."""

    def engine_dead(self) -> bool:
        """The engine cannot serve another job: the worker exits after answering the error."""
        return False

    def check_concurrency(self, concurrency: int) -> None:
        """ValueError (one line) where the engine cannot run `concurrency` requests at once."""

    def sampling(self, job: dict):
        """The engine's sampling parameters of a job."""
        return job

    def add(self, request: str, prompt: list[int], params) -> None:
        """Request `request` (its prompt's token ids) into the engine."""
        raise NotImplementedError

    def in_flight(self) -> bool:
        """The engine has requests not finished."""
        raise NotImplementedError

    def step(self) -> list[tuple[str, list[int], bool, object]]:
        """One engine step: (request, the tokens it gave it, finished, the engine's final output when finished)."""
        raise NotImplementedError

    def abort(self, requests: list[str]) -> None:
        """The requests out of the engine (a run that failed)."""

    def counters(self):
        """The engine's counters now (None: it has none); counter_delta makes a run's from two readings."""
        return None

    def counter_delta(self, before, after):
        return None

    def row(self, final, ids: list[int], steps: list[int], times: dict) -> dict:
        """One request's answer: ids every token it generated, steps the tokens each step gave it, times its
        arrival, admission, first token, finish and emits."""
        return {"output_ids": ids, "new_tokens": len(ids), "steps": steps, **times}

    # -- the jobs ---------------------------------------------------------------------------------------
    def generate(self, job: dict) -> dict:
        """A fixed batch: every prompt added at once, the engine stepped until all finish."""
        prompts = self._prompts(job)
        return self.run(prompts, self.sampling(job), [0.0] * len(prompts), len(prompts))

    def serve(self, job: dict) -> dict:
        """The prompts as requests arriving at job["arrivals"], at most job["concurrency"] in flight."""
        prompts = self._prompts(job)
        arrivals, concurrency = job.get("arrivals"), job.get("concurrency")
        if not isinstance(arrivals, list) or len(arrivals) != len(prompts) or not all(
                isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a < float("inf") for a in arrivals):
            raise ValueError("arrivals must list one time >= 0 (seconds from the start) per prompt")
        follows = job.get("follows") or [None] * len(prompts)
        if len(follows) != len(prompts) or any(j is not None and (isinstance(j, bool) or not isinstance(j, int) or
                                                                  not 0 <= j < i) for i, j in enumerate(follows)):
            raise ValueError("follows must list, per prompt, null or an earlier request's index")
        think = job.get("think_s") or 0.0
        if isinstance(think, bool) or not isinstance(think, (int, float)) or not 0 <= think < float("inf"):
            raise ValueError(f"think_s must be a number of seconds >= 0, got {think!r}")
        scheduled = [a for a, j in zip(arrivals, follows) if j is None]
        if any(b < a for a, b in zip(scheduled, scheduled[1:])):
            raise ValueError("arrivals must be non-decreasing (request i arrives no earlier than request i - 1)")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        self.check_concurrency(concurrency)
        return self.run(prompts, self.sampling(job), [float(a) for a in arrivals], concurrency, follows, float(think))

    def _prompts(self, job: dict) -> list[list[int]]:
        if not self.ready():
            raise RuntimeError("no engine: send a start job first")
        prompts = job.get("prompts")
        if not isinstance(prompts, list) or not prompts:
            raise ValueError("prompts must be a non-empty list of token id lists")
        return [[int(t) for t in ids] for ids in prompts]

    def run(self, prompts: list[list[int]], params, arrivals: list[float], concurrency: int,
            follows: list | None = None, think_s: float = 0.0) -> dict:
        """The requests admitted by decode/arrivals.py's Queue (arrivals[i] seconds from the start; one that follows
        request j: think_s after j's last token) while fewer than `concurrency` are in flight; the engine stepped while
        any is in flight, a sleep until the next arrival while none is. A token's time is the end of the step that
        gave it."""
        self.batches += 1
        order = [f"speculate-{self.batches}-{i}" for i in range(len(prompts))]
        index_of = {rid: i for i, rid in enumerate(order)}
        got = {rid: {"ids": [], "steps": [], "final": None, "done": False, "times": {
            "arrival_s": arrivals[i], "admitted_s": None, "first_token_s": None, "finish_s": None, "emits": []}}
            for i, rid in enumerate(order)}
        before = self.counters()
        queue = serving.Queue(serving.Load(arrivals, concurrency, follows, think_s))
        for i, j in enumerate(follows or []):
            if j is not None:
                got[order[i]]["times"]["arrival_s"] = None  # known once request j finishes
        flying: set[str] = set()
        began = time.perf_counter()
        clock = lambda: time.perf_counter() - began  # noqa: E731
        try:
            while queue.left or flying:
                now = clock()
                for index in queue.admit(now, concurrency - len(flying)):
                    rid = order[index]
                    self.add(rid, prompts[index], params)
                    got[rid]["times"]["admitted_s"] = clock()
                    flying.add(rid)
                if not flying:
                    if queue.next_arrival() is None:
                        raise RuntimeError("a request follows one that never finished")
                    time.sleep(max(0.0, queue.next_arrival() - now))
                    continue
                if not self.in_flight():
                    raise RuntimeError(f"the engine has no unfinished request, but {len(flying)} did not finish")
                outputs = self.step()
                now = clock()
                for rid, new, finished, final in outputs:
                    entry = got.get(rid)
                    if entry is None:
                        continue
                    times = entry["times"]
                    if new:
                        entry["ids"] += new
                        entry["steps"].append(len(new))
                        times["emits"].append([now, len(new)])
                        if times["first_token_s"] is None:
                            times["first_token_s"] = now
                    if finished:
                        entry["final"], entry["done"] = final, True
                        times["finish_s"] = now
                        flying.discard(rid)
                        for i in queue.finished(index_of[rid], now):  # the conversation's next turn arrives
                            got[order[i]]["times"]["arrival_s"] = queue.arrival[i]
        except BaseException:
            try:
                self.abort([rid for rid in order if not got[rid]["done"] and
                            got[rid]["times"]["admitted_s"] is not None])
            except Exception:  # noqa: BLE001 - the engine may be dead; the error that matters is raised below
                pass
            raise
        wall = clock()
        missing = [rid for rid in order if not got[rid]["done"]]
        if missing:
            raise RuntimeError(f"{len(missing)} request(s) did not finish")
        counters = self.counter_delta(before, self.counters()) if before is not None else None
        rows = [self.row(got[rid]["final"], got[rid]["ids"], got[rid]["steps"], got[rid]["times"]) for rid in order]
        return {"ok": True, "wall_s": wall, "rows": rows, "counters": counters}

    # -- the loop ---------------------------------------------------------------------------------------
    def main(self) -> int:
        # results go to a private copy of the original stdout; fd 1 (and so every print, of this process and of the
        # engine processes it spawns) goes to stderr. os.dup's copy is not inherited by child processes.
        out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr

        def on_sigterm(signum, frame):
            raise Terminated()

        signal.signal(signal.SIGTERM, on_sigterm)
        watch_parent()

        def answer(result: dict):
            out.write(json.dumps(result) + "\n")
            out.flush()

        code = 0
        try:
            for line in sys.stdin:
                if not line.strip():
                    continue
                try:
                    job = json.loads(line)
                    op = job.get("op") if isinstance(job, dict) else None
                    if op == "stop":
                        self.shutdown()
                        answer({"ok": True})
                        break
                    if op not in self.OPS:
                        raise ValueError(f"unknown op {op!r}")
                    answer(getattr(self, op)(job))
                except Terminated:
                    raise
                except Exception as error:  # noqa: BLE001 - every failure is an answer
                    dead = self.ready() and self.engine_dead()
                    answer({"ok": False, "error": one_line(error), **({"engine_dead": True} if dead else {})})
                    if dead:
                        code = 1
                        break
        except (Terminated, KeyboardInterrupt):
            code = 0
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the shutdown short
            try:
                self.shutdown()
            finally:
                out.close()
        return code

    OPS = ("start", "check", "generate", "serve")  # the jobs a worker answers (a subclass may add its own)
