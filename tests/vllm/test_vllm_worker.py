"""runner/engines/vllm/worker.py against the real CPU build of vLLM, on a tiny random Llama pair.

Skipped unless SPECULATE_VLLM_PYTHON names an interpreter that imports vllm (.ci/vllm-env DIR builds one):
    SPECULATE_VLLM_PYTHON=/path/to/vllm-venv/bin/python python -m pytest -q tests/vllm/test_vllm_worker.py
One worker process serves the whole file, one engine per configuration (each start takes 20-40 s on 2 cores).
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "runner" / "engines" / "vllm" / "worker.py"
from helpers import VLLM_PYTHON, WORD_PROMPTS, needs_vllm

PYTHON = VLLM_PYTHON
pytestmark = needs_vllm()

EOS = 2
PROMPTS = WORD_PROMPTS[:3]
MAX_NEW = 16
ENGINE = {"dtype": "float32", "max_model_len": 128, "enforce_eager": True, "seed": 0,
          "kv_cache_memory_bytes": 64 * 2**20}
SPECULATIVE = {
    "draft_model_k2": lambda draft: {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2},
    "draft_model_k4": lambda draft: {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 4},
    "ngram_k4": lambda draft: {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3,
                               "num_speculative_tokens": 4},
}


class Worker:
    def __init__(self, log: Path):
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.log = open(log, "w")
        self.proc = subprocess.Popen([PYTHON, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, env=env, cwd=ROOT)
        self.engine = False  # whether an engine is up

    def ask(self, job: dict, timeout: float = 240) -> dict:
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, f"no answer to {job.get('op')} in {timeout} s"
        line = self.proc.stdout.readline()
        assert line, f"the worker closed stdout (exit {self.proc.poll()})"
        return json.loads(line)  # stdout holds answers only: anything else fails here

    def start(self, **engine) -> dict:
        answer = self.ask({"op": "start", "engine": {**ENGINE, **engine}})
        self.engine = answer["ok"]
        return answer

    def generate(self, **extra) -> dict:
        job = {"op": "generate", "prompts": PROMPTS, "max_new_tokens": MAX_NEW, "temperature": None, "seed": 0,
               "stop_token_ids": [EOS], **extra}
        return self.ask(job)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _children(pid: int) -> dict[int, str]:
    """Every process below pid, from /proc: {pid: command line}."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                try:
                    found[child] = (Path("/proc") / str(child) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    found[child] = "?"
                frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from helpers import save_vllm_pair

    return save_vllm_pair(tmp_path_factory.mktemp("vllm-models"))


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-worker") / "stderr.log"
    handle = Worker(log)
    yield handle
    handle.close()


@pytest.fixture(scope="module")
def baseline(worker, models):
    answer = worker.start(model=str(models[0]))
    assert answer["ok"], answer
    result = worker.generate()
    assert result["ok"], result
    return result


def test_bad_model_is_one_line_and_the_worker_goes_on(worker, models):
    answer = worker.start(model=str(models[0].parent / "no-such-model"))
    assert answer["ok"] is False
    assert "\n" not in answer["error"] and ": " in answer["error"], answer
    answer = worker.ask({"op": "no-such-op"})
    assert answer["ok"] is False and "no-such-op" in answer["error"]
    answer = worker.ask({"op": "generate", "prompts": PROMPTS, "max_new_tokens": 4})
    assert answer["ok"] is False and "start" in answer["error"]  # no engine yet


def test_baseline_rows(baseline):
    assert baseline["counters"] is None
    assert baseline["wall_s"] > 0
    assert len(baseline["rows"]) == len(PROMPTS)
    for row in baseline["rows"]:
        assert row["new_tokens"] == len(row["output_ids"]) and 0 < row["new_tokens"] <= MAX_NEW
        assert row["stop_reason"] == ("eos" if row["output_ids"][-1] == EOS else "length")
        assert row["steps"] == [1] * row["new_tokens"]  # one token per engine step without speculation
        assert 0 < row["ttft_s"] <= row["latency_s"] <= baseline["wall_s"] + 1.0


@pytest.mark.parametrize("name", list(SPECULATIVE))
def test_greedy_speculation_equals_the_baseline(worker, models, baseline, name):
    answer = worker.start(model=str(models[0]), speculative_config=SPECULATIVE[name](models[1]))
    assert answer["ok"], answer
    assert answer["start_s"] > 0 and answer["speculative"] is True
    result = worker.generate()
    assert result["ok"], result
    k = SPECULATIVE[name](models[1])["num_speculative_tokens"]
    for row, base in zip(result["rows"], baseline["rows"]):
        assert row["output_ids"] == base["output_ids"]
        assert row["stop_reason"] == base["stop_reason"]
        assert sum(row["steps"]) == row["new_tokens"] and row["steps"][0] == 1 and max(row["steps"]) <= k + 1
        spec = row["spec"]  # detailed per-request counters: one entry per step that had drafts, never more
        assert len(spec.get("per_step_drafted") or []) <= len(row["steps"]) - 1
    counters = result["counters"]
    assert counters["num_drafts"] > 0
    assert 0 <= counters["num_accepted_tokens"] <= counters["num_draft_tokens"] <= k * counters["num_drafts"]
    per_pos = counters["accepted_per_pos"]
    assert len(per_pos) == k
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))
    assert sum(per_pos) == counters["num_accepted_tokens"]
    assert per_pos[0] <= counters["num_drafts"]
    if name.startswith("draft_model"):
        assert counters["num_accepted_tokens"] > 0  # the draft is the target's first layer


def test_sigterm_leaves_no_process(worker, models):
    if not worker.engine:  # run alone; otherwise the last test's engine serves
        assert worker.start(model=str(models[0]))["ok"]
    children = _children(worker.proc.pid)
    assert children, "vLLM's engine core runs in a process of its own"
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=60) == 0
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [cmd for pid, cmd in children.items() if _alive(pid)]
