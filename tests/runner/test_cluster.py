"""The sweep on a local Ray cluster (2 workers, tiny models, a CPU): the same points and greedy outputs as
one process, a worker killed mid-unit retried with nothing lost or doubled, a killed driver resumed."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import base_config, save_tiny_pair, write_prompts
from utils.io import read_jsonl

pytest.importorskip("ray")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
RAY = ["--set", "cluster.backend=ray", "--set", "cluster.num_workers=2", "--set", "cluster.num_cpus=1"]
ENV = {"SPECULATE_WORKER_THREADS": "1"}


def launch(*args, env=None, timeout=400):
    return subprocess.run([sys.executable, str(ROOT / "launch.py"), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **ENV, **(env or {})})


def records(folder: Path) -> dict:
    samples = read_jsonl(folder / "samples.jsonl")
    keys = [(s["method"], s["gamma"], s["batch_size"], s["repeat"], s["sample_id"]) for s in samples]
    assert len(keys) == len(set(keys)), "a record was written twice"
    return {k: s for k, s in zip(keys, samples)}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster")
    target, draft = save_tiny_pair(root)
    data = write_prompts(root / "prompts.jsonl", count=6)
    config = base_config(target, draft, data, batch_size=[1, 2], speculative={"gamma": [2]},
                         generation={"max_new_tokens": 10})
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    single = root / "single"
    result = launch("--config", path, "--output-dir", single)
    assert result.returncode == 0, result.stderr[-2000:]
    return root, path, single


@pytest.fixture(scope="module")
def cluster_run(setup):
    root, path, _ = setup
    out = root / "ray"
    result = launch("--config", path, "--output-dir", out, *RAY)
    return result, out


def test_cluster_run_equals_the_single_process_run(setup, cluster_run):
    _, _, single = setup
    result, out = cluster_run
    assert result.returncode == 0, result.stderr[-3000:]
    ours, reference = records(out), records(single)
    assert set(ours) == set(reference)
    assert all(ours[k]["output_ids"] == reference[k]["output_ids"] for k in ours)  # greedy: the same tokens
    assert {s["worker"] for s in ours.values()} == {"w0", "w1"}  # both workers did units
    for s in ours.values():  # a unit runs whole on one worker: a batch's points never mix workers
        assert all(t["worker"] == s["worker"] for t in ours.values()
                   if (t["batch_size"], t["repeat"], t["batch_index"]) == (s["batch_size"], s["repeat"], s["batch_index"]))
    summary, reference_summary = (json.loads((f / "summary.json").read_text()) for f in (out, single))
    assert {r["label"] for r in summary["runs"]} == {r["label"] for r in reference_summary["runs"]}
    progress = json.loads((out / "progress.json").read_text())
    assert set(progress["workers"]) == {"w0", "w1"}
    assert all(w["device"] == "cpu" and w["numerics"]["target"] for w in progress["workers"].values())
    assert any("Ray cluster: 2 workers" in n for n in summary["notes"])
    by_process = {s["process"]: s["worker"] for s in ours.values()}
    env = json.loads((out / "env.json").read_text())  # the driver's machine, then each worker's
    assert [p.get("worker") for p in env["processes"]] == [None, "w0", "w1"]
    assert {p["process"] for p in env["processes"][1:]} == set(by_process)
    # each worker's own probes reach eval: a cost probe and drift readings per worker process and batch size
    assert sorted(by_process.values()) == ["w0", "w1"] and {p["name"] for p in progress["processes"].values()} == {"w0", "w1"}
    for batch in {str(s["batch_size"]) for s in ours.values()}:
        ran = {s["process"] for s in ours.values() if str(s["batch_size"]) == batch}
        assert set(progress["costs"][batch]) == ran and set(progress["drift"][batch]) == ran
    # the folder rebuilds from its records like any other
    rebuilt = subprocess.run([sys.executable, "-m", "eval", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert json.loads((out / "summary.json").read_text())["runs"] == summary["runs"]


def test_a_worker_killed_mid_unit_is_retried(setup, tmp_path):
    _, path, single = setup
    out = tmp_path / "killed"
    marker = tmp_path / "killed-once"
    label = "speculative draft=llama-draft gamma=2 constant batch=1 greedy"
    result = launch("--config", path, "--output-dir", out, *RAY,
                    env={"SPECULATE_KILL_WORKER_AT": label, "SPECULATE_KILL_MARKER": str(marker)})
    assert marker.exists(), "the worker was never killed: this test checks nothing"
    assert result.returncode == 0, result.stderr[-3000:]
    ours, reference = records(out), records(single)  # records() fails on a duplicate
    assert set(ours) == set(reference)
    assert all(ours[k]["output_ids"] == reference[k]["output_ids"] for k in ours)


def test_a_killed_driver_resumes(setup, tmp_path):
    _, path, single = setup
    out = tmp_path / "driver"
    process = subprocess.Popen([sys.executable, str(ROOT / "launch.py"), "--config", str(path), "--output-dir", str(out),
                                *RAY], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **ENV}, start_new_session=True)
    samples = out / "samples.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        if samples.exists() and samples.read_bytes().count(b"\n") >= 6:
            break
        time.sleep(0.1)
    assert process.poll() is None, "the run ended before the driver could be killed"
    os.killpg(process.pid, signal.SIGKILL)  # the driver and the local cluster it started
    process.communicate(timeout=60)
    result = launch("--resume", out)
    assert result.returncode == 0, result.stderr[-3000:]
    ours, reference = records(out), records(single)
    assert set(ours) == set(reference)


def test_ray_missing_is_one_clear_line(monkeypatch):
    import builtins

    from runner.cluster import check_ray
    from utils import UserError
    from utils.config import validate

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    config = validate({"target": {"model": "t"}, "draft": {"model": "d"}, "dataset": {"path": "x.jsonl", "prompt_field": "p"},
                       "cluster": {"backend": "ray"}})
    with pytest.raises(UserError, match="cluster.backend: ray needs the ray package"):
        check_ray(config)
