"""Nothing lost: failed points, Ctrl-C, SIGKILL, and --resume giving the uninterrupted run's report."""
import collections
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

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    target, draft = save_tiny_pair(root)
    data = write_prompts(root / "prompts.jsonl", count=8)
    config = base_config(target, draft, data, batch_size=[1, 2], speculative={"gamma": [1, 3]},
                         generation={"max_new_tokens": 16})
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    reference = root / "reference"
    result = launch(["--config", path, "--output-dir", reference])
    assert result.returncode == 0, result.stderr
    return root, path, reference


def launch(args, env=None, **kwargs):
    return subprocess.run([sys.executable, str(ROOT / "launch.py"), *map(str, args)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})}, **kwargs)


def outputs(folder: Path) -> dict:
    samples = read_jsonl(folder / "samples.jsonl")
    keys = [(s["method"], s["gamma"], s["batch_size"], s["repeat"], s["sample_id"]) for s in samples]
    assert len(keys) == len(set(keys)), "a sample appears twice"
    return {k: s["output_ids"] for k, s in zip(keys, samples)}


def points(folder: Path) -> set:
    summary = json.loads((folder / "summary.json").read_text())
    return {(r["method"], r["gamma"], r["batch_size"], r["status"]) for r in summary["runs"]}


def start_and_kill(config: Path, out: Path, sig: int, after_lines: int) -> int:
    process = subprocess.Popen([sys.executable, str(ROOT / "launch.py"), "--config", str(config), "--output-dir", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples = out / "samples.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        if samples.exists() and samples.read_bytes().count(b"\n") >= after_lines:
            break
        time.sleep(0.02)
    assert process.poll() is None, "the run ended before it could be interrupted"
    process.send_signal(sig)
    process.communicate(timeout=60)
    return process.returncode


# Ctrl-C as the first records land and as the last do (the final report may be being written), a kill mid-sweep
@pytest.mark.parametrize("sig, after_lines", [(signal.SIGINT, 0), (signal.SIGKILL, 7), (signal.SIGINT, 45)])
def test_interrupt_then_resume_equals_uninterrupted(setup, tmp_path, sig, after_lines):
    _, config, reference = setup
    out = tmp_path / "run"
    code = start_and_kill(config, out, sig, after_lines)
    if sig == signal.SIGINT:
        status = json.loads((out / "summary.json").read_text())["status"]
        # 130 and an interrupted report; or, when the signal lands while the final report is written (every
        # point measured), it is held off and the run ends normally
        assert (code, status) in ((130, "interrupted"), (0, "finished")), (code, status)
    else:
        assert code == -signal.SIGKILL
    # whatever is on disk is valid: complete JSON lines, valid JSON files
    kept = read_jsonl(out / "samples.jsonl")
    for name in ["config.yaml", "progress.json", "summary.json"]:
        if (out / name).exists():
            (yaml.safe_load if name.endswith("yaml") else json.loads)((out / name).read_text())
    result = launch(["--resume", out])
    assert result.returncode == 0, result.stderr
    assert outputs(out) == outputs(reference)
    assert points(out) == points(reference)
    resumed = read_jsonl(out / "samples.jsonl")
    complete_before = [s for s in kept if sum(1 for t in kept if t["batch_index"] == s["batch_index"] and
                                              t["method"] == s["method"] and t["gamma"] == s["gamma"] and
                                              t["batch_size"] == s["batch_size"]) == s["batch_rows"]]
    # finished batches were kept as they were, not rerun
    assert resumed[:len(complete_before)] == complete_before


def test_resume_refuses_a_different_config(setup, tmp_path):
    _, config, reference = setup
    out = tmp_path / "run"
    start_and_kill(config, out, signal.SIGINT, 2)
    result = launch(["--resume", out, "--config", config, "--set", "generation.max_new_tokens=7"])
    assert result.returncode == 2 and "config differs" in result.stderr


def test_existing_output_dir_is_not_overwritten(setup):
    _, config, reference = setup
    result = launch(["--config", config, "--output-dir", reference])
    assert result.returncode == 2 and "--resume" in result.stderr


def test_failed_point_is_reported_and_the_sweep_goes_on(setup, tmp_path):
    _, config, reference = setup
    out = tmp_path / "run"
    result = launch(["--config", config, "--output-dir", out],
                    env={"SPECULATE_INJECT_FAILURE": "speculative draft=llama-draft gamma=3 constant batch=1 greedy"})
    assert result.returncode == 3, result.stderr
    summary = json.loads((out / "summary.json").read_text())
    failed = [r for r in summary["runs"] if r["status"] == "failed"]
    assert [(r["method"], r["gamma"], r["batch_size"]) for r in failed] == [("speculative", 3, 1)]
    assert "injected failure" in failed[0]["error"]
    ok = {(r["method"], r["gamma"], r["batch_size"]) for r in summary["runs"] if r["status"] == "ok"}
    assert ok == {("baseline", None, 1), ("speculative", 1, 1), ("baseline", None, 2), ("speculative", 1, 2),
                  ("speculative", 3, 2)}
    assert "failed" in (out / "summary.md").read_text()


def test_nan_model_fails_its_points_not_the_process(setup, tmp_path):
    root, config, _ = setup
    import torch
    from transformers import AutoModelForCausalLM
    broken = tmp_path / "broken-target"
    model = AutoModelForCausalLM.from_pretrained(yaml.safe_load(config.read_text())["target"]["model"])
    with torch.no_grad():
        model.model.norm.weight.fill_(float("nan"))
    model.save_pretrained(broken)
    for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        source = Path(yaml.safe_load(config.read_text())["target"]["model"]) / name
        if source.exists():
            (broken / name).write_bytes(source.read_bytes())
    result = launch(["--config", config, "--output-dir", tmp_path / "out", "--set", f"target.model={broken}",
                     "--set", "batch_size=1"])
    assert result.returncode == 3, result.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["runs"] and all(r["status"] == "failed" and "NaN" in r["error"] for r in summary["runs"])
    assert "Traceback" not in result.stderr


def test_a_serving_run_interrupted_mid_load_point_resumes_to_the_same_records(tmp_path):
    """Under load a unit is a whole load point of every method: Ctrl-C keeps the points it finished, a point cut
    half-way writes nothing, and --resume serves only what is missing. Requests cycle through fewer prompts (10
    requests, 8 prompts): a load point's rows are told apart by their request index."""
    target, draft = save_tiny_pair(tmp_path)
    data = write_prompts(tmp_path / "prompts.jsonl", count=8)
    config = base_config(target, draft, data, speculative={"gamma": [1, 3]}, generation={"max_new_tokens": 12},
                         batch_size=1, load={"concurrency": [1, 2], "requests": 10}, warmup=0)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    reference, out = tmp_path / "reference", tmp_path / "run"
    assert launch(["--config", path, "--output-dir", reference]).returncode == 0

    def served(folder: Path) -> dict:
        samples = read_jsonl(folder / "samples.jsonl")
        keys = [(s["method"], s["gamma"], s["concurrency"], s["repeat"], s["request"]) for s in samples]
        assert len(keys) == len(set(keys)), "a request appears twice"
        return {k: s["output_ids"] for k, s in zip(keys, samples)}

    start_and_kill(path, out, signal.SIGINT, 11)  # past the first point of the first load point
    kept = read_jsonl(out / "samples.jsonl")
    per_point = collections.Counter((s["method"], s["gamma"], s["concurrency"]) for s in kept)
    assert per_point and set(per_point.values()) == {10}, per_point  # whole load points only
    assert launch(["--resume", out]).returncode == 0
    assert served(out) == served(reference) and len(served(out)) == 3 * 2 * 10
    assert read_jsonl(out / "samples.jsonl")[:len(kept)] == kept


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A run of 4 one-prompt batches of two points, for interrupts delivered in this process."""
    root = tmp_path_factory.mktemp("second-interrupt")
    target, draft = save_tiny_pair(root)
    data = write_prompts(root / "prompts.jsonl", count=4)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(base_config(target, draft, data, batch_size=[1], speculative={"gamma": [1]},
                                               generation={"max_new_tokens": 8}, warmup=0)))
    return path


def _signal_self(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.2)  # the handler runs here, in the main thread (an ignored signal does nothing)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_interrupt_while_the_interrupted_run_writes_its_report_is_held(small, tmp_path, monkeypatch, capsys,
                                                                                sig):
    """The first Ctrl-C (or SIGTERM) after a batch is saved; a second one as the interrupted run writes its report:
    the report is written whole all the same (summary, plots), the folder is the last line printed, and the exit is
    130; signals are handled as before once it returns."""
    import launch
    from runner.experiment import Experiment
    from runner.storage import ReportFolder

    accept, write_summary, second = Experiment.accept, ReportFolder.write_summary, []

    def accept_then_interrupt(self, unit, result):
        accept(self, unit, result)
        _signal_self(sig)

    def write_summary_interrupted(self, plots=False):
        if self.progress.status == "interrupted" and not second:
            second.append(sig)
            _signal_self(sig)
        return write_summary(self, plots)

    monkeypatch.setattr(Experiment, "accept", accept_then_interrupt)
    monkeypatch.setattr(ReportFolder, "write_summary", write_summary_interrupted)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    out = tmp_path / "run"
    code = launch.main(["--config", str(small), "--output-dir", str(out)])
    stdout, stderr = capsys.readouterr()
    assert second, "the interrupted run wrote no report"
    assert code == 130, stderr
    assert stdout.strip().splitlines()[-1] == str(out), stdout
    assert "before any measurement" not in stderr and "--resume" in stderr
    saved = read_jsonl(out / "samples.jsonl")
    summary = json.loads((out / "summary.json").read_text())
    assert saved and summary["status"] == "interrupted"
    assert json.loads((out / "progress.json").read_text())["status"] == "interrupted"
    assert sum(r["batches"]["done"] for r in summary["runs"]) == 2  # the batch saved, of both points
    assert (out / "summary.md").exists() and list(out.glob("*.png"))
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def test_an_interrupt_before_a_resumed_run_starts_keeps_the_saved_records(small, tmp_path, monkeypatch, capsys):
    """A Ctrl-C outside the run's own handling (here as a resumed run reopens its folder): launch.py says the
    records on disk are kept, names the folder, and exits 130; it does not claim nothing was measured."""
    import launch
    from runner.experiment import Experiment
    from runner.storage import ReportFolder

    accept = Experiment.accept

    def accept_then_interrupt(self, unit, result):
        accept(self, unit, result)
        raise KeyboardInterrupt

    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(Experiment, "accept", accept_then_interrupt)
        assert launch.main(["--config", str(small), "--output-dir", str(out)]) == 130
    saved = len(read_jsonl(out / "samples.jsonl"))
    capsys.readouterr()

    def reopen_then_interrupt(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(ReportFolder, "reopen", reopen_then_interrupt)
    assert launch.main(["--resume", str(out)]) == 130
    stdout, stderr = capsys.readouterr()
    assert "before any measurement" not in stderr
    assert f"the {saved} records saved in {out} are kept" in stderr and f"--resume {out}" in stderr
    assert stdout.strip().splitlines()[-1] == str(out)


def test_an_interrupt_as_records_are_written_waits_until_the_report_holds_them(tmp_path, monkeypatch):
    # Ctrl-C right after a batch's records reach the disk (the test above sends it as samples.jsonl appears): the
    # records are in the folder's memory too before it stops, so the interrupted report holds them
    import runner.storage as storage

    written = storage.append_jsonl

    def write_then_interrupt(path, rows):
        written(path, rows)
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(storage, "append_jsonl", write_then_interrupt)
    folder = storage.ReportFolder(tmp_path, {"name": "t"}, "t", None, False)
    folder.create()
    rows = [{"method": "baseline", "gamma": None, "batch_size": 1, "batch_index": 0, "repeat": 0, "sample_id": 0}]
    with pytest.raises(KeyboardInterrupt):
        folder.append(rows)
    assert folder.samples == read_jsonl(tmp_path / "samples.jsonl") == rows
