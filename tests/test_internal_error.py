"""launch.py on an internal error (a bug, not bad input): one line naming where the traceback went, the run's report
folder where there is one, the working directory only where there is none yet."""
from __future__ import annotations

from pathlib import Path

import pytest

import launch


def crash(*args, **kwargs):
    raise RuntimeError("a bug")


def internal_error(capsys, argv) -> str:
    assert launch.main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("internal error: RuntimeError: a bug"), lines
    return lines[0]


def test_a_crash_in_the_run_leaves_its_traceback_in_the_report_folder(tmp_path, monkeypatch, capsys):
    import runner

    def made_then_crash(self):
        self.out_dir.mkdir(parents=True)
        crash()

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner.Experiment, "run", made_then_crash)
    line = internal_error(capsys, ["--config", str(Path(launch.__file__).parent / "configs/default.yaml"),
                                   "--output-dir", "out"])
    log = tmp_path / "out" / "error.log"
    assert "a bug" in log.read_text() and not (tmp_path / "error.log").exists()
    assert f"traceback in {log};" in line  # the absolute path: the working directory may be another


def test_a_crash_before_a_resumed_folder_reopens_leaves_it_there(tmp_path, monkeypatch, capsys):
    import utils.config

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.yaml").write_text("name: x\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(utils.config, "load_config", crash)
    line = internal_error(capsys, ["--resume", "run"])
    assert (folder / "error.log").is_file() and not (tmp_path / "error.log").exists()
    assert f"traceback in {folder / 'error.log'};" in line


def test_with_no_report_folder_yet_the_traceback_goes_to_the_working_directory(tmp_path, monkeypatch, capsys):
    import utils.config

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(utils.config, "load_config", crash)
    line = internal_error(capsys, ["--config", "any.yaml", "--output-dir", "not-made"])
    assert f"traceback in {tmp_path / 'error.log'};" in line and not (tmp_path / "not-made").exists()


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() == 0,
                    reason="root writes into a read-only folder")
def test_an_unwritable_report_folder_falls_back_to_the_working_directory(tmp_path, monkeypatch, capsys):
    import utils.config

    folder = tmp_path / "run"
    folder.mkdir()
    folder.chmod(0o500)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(utils.config, "load_config", crash)
    try:
        line = internal_error(capsys, ["--resume", str(folder)])
    finally:
        folder.chmod(0o700)
    assert f"traceback in {work / 'error.log'};" in line
