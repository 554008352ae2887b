"""Joules per output token (eval/energy.py, the figure table's energy_j_per_token) on hand-made records whose
energy_j a fake counter gave, worked out by hand: per batch of 8 tokens the baseline spent 2.0 J (0.25 J/token), the
speculative point 1.0 J on even batches and 1.5 J on odd ones; records written before the field: null, and the
report as it was."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eval.report import csv_text, markdown
from eval.summary import summarize
from sample_records import record, run

ROOT = Path(__file__).resolve().parents[2]


def batches(base_j=2.0, spec_j=(1.0, 1.5), units=8, group=None):
    """Batch size 2, 4 tokens a row: 8 tokens a batch; every row of a batch carries its batch's joules."""
    rows = []
    for i in range(units):
        for method, joules in (("baseline", base_j), ("speculative", spec_j[i % 2])):
            for row in range(2):
                extra = {} if joules is None else {"energy_j": joules}
                rows.append(record(method, 2 * i + row, i, batch_size=2, tokens=4, latency=1.0,
                                   group=group[row] if group else None,
                                   rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}] if method != "baseline" else None,
                                   **extra))
    return rows


def test_joules_per_token_its_interval_and_the_ratio_by_hand():
    summary = summarize(batches(), {})
    base, spec = run(summary, "baseline")["metrics"], run(summary, "speculative")["metrics"]
    assert base["energy_j_per_token"] == pytest.approx(0.25)  # 16 J / 64 tokens
    assert base["energy_j_per_token_ci95"] == pytest.approx([0.25, 0.25])  # every batch alike
    assert base["energy_ratio"] == pytest.approx(1.0) and base["energy_ratio_ci95"] is None  # the reference
    # 4 x 1.0 + 4 x 1.5 = 10 J over 64 tokens = 0.15625 J/token; / 0.25 = 0.625
    assert spec["energy_j_per_token"] == pytest.approx(0.15625)
    assert spec["energy_ratio"] == pytest.approx(0.625)
    lo, hi = spec["energy_j_per_token_ci95"]  # over the 8 prompt batches: between all-1.0 (0.125) and all-1.5
    assert 0.125 <= lo < 0.15625 < hi <= 0.1875
    lo, hi = spec["energy_ratio_ci95"]
    assert 0.5 <= lo < 0.625 < hi <= 0.75
    table = markdown(summary, "t")
    assert "J/tok [95% CI]" in table and "energy ratio [95% CI]" in table and "- energy_j_per_token: " in table
    assert "| 0.2500 [0.2500, 0.2500] |" in table and "| 0.62 [" in table
    header, *rows = csv_text(summary).splitlines()
    assert "energy_j_per_token" in header.split(",") and "energy_ratio_ci95" in header.split(",")


def test_a_group_has_no_joules_and_unmeasured_batches_none():
    # a batch's rows in two groups: either group's rows spent only part of the batch's joules, which no one measured
    summary = summarize(batches(group=("a", "b")), {"group_by": "category"})
    assert run(summary, "speculative")["metrics"]["energy_j_per_token"] == pytest.approx(0.15625)
    assert run(summary, "speculative", group="a")["metrics"]["energy_j_per_token"] is None
    # a batch without a reading: no figure (the rest would read as the whole point's)
    rows = batches()
    rows[-1].pop("energy_j")
    metrics = run(summarize(rows, {}), "speculative")["metrics"]
    assert metrics["energy_j_per_token"] is None and metrics["energy_ratio"] is None


def test_records_before_the_field_rebuild_as_they_were(tmp_path):
    rows = batches(base_j=None, spec_j=(None, None))
    assert all("energy_j" not in r for r in rows)
    summary = summarize(rows, {})
    metrics = run(summary, "speculative")["metrics"]
    assert metrics["energy_j_per_token"] is None and metrics["energy_ratio"] is None
    text = markdown(summary, "t")
    assert "J/tok [95% CI]" not in text and "energy: not measured" not in text  # no column, no note
    assert "energy_j_per_token" not in summary["legend"] and "energy" not in csv_text(summary)  # nor legend, CSV
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in rows))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"name": "old"}))
    result = subprocess.run([sys.executable, "-m", "eval", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "energy.png").exists() and (tmp_path / "speedup.png").exists()


def test_a_load_point_per_repeat_and_its_plot(tmp_path):
    """Two repeats of 8 requests of 10 tokens at concurrency 2: the baseline spent 8.0 J in each span (0.1 J/token),
    the method 4.0 J and 6.0 J: 10 J / 160 tokens = 0.0625 J/token, 0.625 of the baseline's; no interval (one reading
    a span)."""
    from test_serving_figures import request, serving_run

    rows = []
    for repeat, spec_j in ((0, 4.0), (1, 6.0)):
        for method, joules in (("baseline", 8.0), ("speculative", spec_j)):
            for i in range(8):
                start = (i // 2) * 0.5
                rows.append(request(method, i, concurrency=2, admitted=start, first=start + 0.1, finish=start + 0.5,
                                    tokens=10, repeat=repeat, energy_j=joules,
                                    rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}] * 3
                                    if method == "speculative" else None))
    summary = summarize(rows, {})
    base, spec = serving_run(summary, "baseline")["metrics"], serving_run(summary, "speculative")["metrics"]
    assert base["energy_j_per_token"] == pytest.approx(0.1)
    assert spec["energy_j_per_token"] == pytest.approx(0.0625) and spec["energy_j_per_token_ci95"] is None
    assert spec["energy_ratio"] == pytest.approx(0.625) and spec["energy_ratio_ci95"] is None
    header, *lines = csv_text(summary, served=True).splitlines()
    assert {"energy_j_per_token", "energy_ratio"} <= set(header.split(","))
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in rows))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"name": "served", "load": {"concurrency": [2]}}))
    result = subprocess.run([sys.executable, "-m", "eval", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "energy.png").read_bytes()[:4] == b"\x89PNG"
    assert "| 0.0625 | 0.62 |" in (tmp_path / "summary.md").read_text()
