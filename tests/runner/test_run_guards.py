"""One run a report folder (a second process refused while the first lives); SIGTERM from the first moment: 130 and
a line, never a silent death, and a folder made before the signal says it was interrupted; a load whose arrivals
alone take hours is warned of before it starts."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, base_config, save_tiny_pair, write_prompts
from utils.io import read_jsonl

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    root = tmp_path_factory.mktemp("lock")
    target, draft = save_tiny_pair(root)
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(base_config(target, draft, write_prompts(root / "prompts.jsonl", count=5),
                                               batch_size=[1], speculative={"gamma": [2]})))
    return path


def start(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "launch.py"), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM now (/proc's SigCgt mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (signal.SIGTERM - 1) & 1)


def wait_for(condition, process, seconds=120.0):
    """Until condition() holds; a run that ends or hangs first fails the test, and is killed (none is left behind)."""
    deadline = time.time() + seconds
    while not condition():
        if process.poll() is not None or time.time() > deadline:
            process.kill()
            raise AssertionError("the run ended (or hung) before the moment came")
        time.sleep(0.005)


def test_two_runs_started_at_once_on_one_folder(config, tmp_path):
    """Both at the same moment: one runs, the other is refused in one line (exit 2); each record is on disk once."""
    out = tmp_path / "run"
    first, second = start("--config", config, "--output-dir", out), start("--config", config, "--output-dir", out)
    results = [(p.wait(timeout=300), p.stderr.read()) for p in (first, second)]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2).strip().splitlines()
    assert len(refused) == 1 and refused[0].startswith("error: "), refused
    # refused by the lock while the other lives, or (on a slow start, the other already done) by its records
    assert "in use by another run" in refused[0] or "already holds a run" in refused[0], refused
    keys = [(s["method"], s["gamma"], s["repeat"], s["sample_id"]) for s in read_jsonl(out / "samples.jsonl")]
    assert len(keys) == len(set(keys)) == 2 * 5
    assert json.loads((out / "progress.json").read_text())["status"] == "finished"


def test_a_live_run_refuses_a_second_and_a_resume_then_frees_the_folder(config, tmp_path):
    out = tmp_path / "run"
    first = start("--config", config, "--output-dir", out)
    wait_for(lambda: (out / ".lock").is_file() and (out / ".lock").read_text() and (out / "config.yaml").is_file(),
             first)
    first.send_signal(signal.SIGSTOP)  # alive, holding the folder, for as long as the others take to start
    try:
        for args in (["--config", config, "--output-dir", out], ["--resume", out]):
            second = subprocess.run([sys.executable, str(ROOT / "launch.py"), *map(str, args)], capture_output=True,
                                    text=True, timeout=120)
            lines = second.stderr.strip().splitlines()
            assert second.returncode == 2 and len(lines) == 1, (second.returncode, second.stderr)
            assert "in use by another run" in lines[0] and f"pid {first.pid}" in lines[0], lines[0]
    except BaseException:
        first.kill()
        raise
    first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=300) == 0, first.stderr.read()
    again = subprocess.run([sys.executable, str(ROOT / "launch.py"), "--resume", str(out)], capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr  # its holder gone, the folder is free (nothing left to run)
    assert len(read_jsonl(out / "samples.jsonl")) == 2 * 5


def test_sigterm_during_the_imports(config, tmp_path):
    process = start("--config", config, "--output-dir", tmp_path / "run")
    wait_for(lambda: catches_sigterm(process.pid), process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, (process.returncode, err)
    assert err.strip().splitlines() == ["interrupted before any measurement"], err


def test_sigterm_once_the_folder_is_made(config, tmp_path):
    out = tmp_path / "run"
    process = start("--config", config, "--output-dir", out)
    wait_for(lambda: (out / "config.yaml").is_file(), process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, (process.returncode, err)
    assert "Traceback" not in err and "interrupted" in err, err
    assert json.loads((out / "progress.json").read_text())["status"] == "interrupted"
    assert not (out / "samples.jsonl").exists() or not read_jsonl(out / "samples.jsonl")


def test_a_load_whose_arrivals_take_hours_is_warned_of_and_sigterm_keeps_its_folder(config, tmp_path):
    """5 requests at 0.002/s: 2,500 s of arrivals per load point, for the baseline and the method: 1.4 h."""
    raw = yaml.safe_load(config.read_text())
    del raw["batch_size"]
    raw["load"] = {"concurrency": 1, "request_rate": 0.002}
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump(raw))
    out = tmp_path / "run"
    process = start("--config", slow, "--output-dir", out)

    def warned() -> bool:
        try:
            return any("waiting alone takes 1.4 h" in note
                       for note in json.loads((out / "progress.json").read_text())["notes"])
        except (OSError, ValueError):
            return False

    wait_for(warned, process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, (process.returncode, err)
    assert "warning: load: waiting alone takes 1.4 h" in " ".join(err.split()), err
    assert json.loads((out / "progress.json").read_text())["status"] == "interrupted"


def test_an_interrupt_while_the_models_load_reports_nothing_measured(config, tmp_path, monkeypatch, capsys):
    """Ctrl-C or SIGTERM once the folder is open, before the first batch (loading the models, the warmup, the probes):
    "interrupted before any measurement", the folder marked so, and no report of nothing (no summary, no plots)."""
    import launch
    from runner.experiment import Experiment

    def loaded_then_interrupted(self, engine):
        raise KeyboardInterrupt

    monkeypatch.setattr(Experiment, "describe", loaded_then_interrupted)  # right after the home engine loads
    out = tmp_path / "run"
    assert launch.main(["--config", str(config), "--output-dir", str(out)]) == 130
    stdout, stderr = capsys.readouterr()
    assert stderr.strip().splitlines() == ["interrupted before any measurement"] and not stdout.strip()
    progress = json.loads((out / "progress.json").read_text())
    assert progress["status"] == "interrupted" and "interrupted before any measurement" in progress["notes"]
    assert not (out / "summary.json").exists() and not list(out.glob("*.png"))


@pytest.mark.parametrize("place", ["lock-is-a-folder", "output-dir-is-a-file", "output-dir-under-a-file"])
def test_a_folder_that_cannot_be_made_or_locked_is_one_line(config, tmp_path, place):
    out = tmp_path / "run"
    if place == "lock-is-a-folder":
        (out / ".lock").mkdir(parents=True)
    else:
        out.write_text("x")
        out = out / "sub" if place == "output-dir-under-a-file" else out
    result = subprocess.run([sys.executable, str(ROOT / "launch.py"), "--config", str(config), "--output-dir",
                             str(out)], capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"error: --output-dir {out}: cannot make the report folder"), lines[0]


def test_python_m_eval_refuses_a_live_runs_folder(tmp_path, capsys):
    """A run rewrites its summary as it goes: a rebuild beside it is refused while another process holds the lock."""
    from eval.__main__ import main

    (tmp_path / "samples.jsonl").write_text("")
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1])\n"
                               "from utils.io import folder_lock\nwith folder_lock(sys.argv[2], 'test'):\n"
                               "    print('held', flush=True); sys.stdin.readline()", str(ROOT), str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main([str(tmp_path)]) == 2
        assert f"is in use by a live run (pid {holder.pid} on " in capsys.readouterr().err
    finally:
        holder.communicate("\n", timeout=30)
