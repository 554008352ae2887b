"""The energy counter (runner/energy.py) on a fake RAPL tree, wraps included, and where there is none; and a run whose
meter is a fake counter advancing 1.0 J a batch: energy_j on every row of its batch, the figure from it, and where the
counter is missing, null with a note saying why."""
import json

import pytest
from rich.console import Console

from helpers import base_config, save_tiny_pair, write_prompts
from runner.energy import EnergyMeter
from utils.config import validate
from utils.io import read_jsonl


def zone(root, name, uj, range_uj=1_000_000):
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "energy_uj").write_text(f"{uj}\n")
    (folder / "max_energy_range_uj").write_text(f"{range_uj}\n")
    return folder


def test_rapl_packages_summed_and_a_wrap_undone(tmp_path):
    first = zone(tmp_path, "intel-rapl:0", 900_000)
    zone(tmp_path, "intel-rapl:0:0", 500_000)  # a subzone: inside its package, not counted again
    zone(tmp_path, "intel-rapl:1", 250_000, range_uj=10_000_000)
    meter = EnergyMeter("cpu", powercap=str(tmp_path))
    assert meter.available and meter.read() == pytest.approx(0.9 + 0.25)
    before = meter.read()
    (first / "energy_uj").write_text("100000\n")  # wrapped at 1 J: 0.1 J past it, 0.2 J after 0.9
    assert meter.spent(before) == pytest.approx(0.2)


def test_no_counter_reads_none_and_says_why(tmp_path):
    meter = EnergyMeter("cpu", powercap=str(tmp_path / "absent"))
    assert meter.read() is None and meter.spent(None) is None and "no RAPL energy counter" in meter.why
    folder = zone(tmp_path, "intel-rapl:0", 1)
    (folder / "energy_uj").unlink()
    (folder / "energy_uj").mkdir()  # unreadable (as a root-only file is to others)
    meter = EnergyMeter("cpu", powercap=str(tmp_path))
    assert meter.read() is None and "not readable" in meter.why
    assert EnergyMeter("mps").why.startswith("no energy counter is read on a mps device")


class OneJouleABatch:
    """A counter that advances 1.0 J a reading: each batch (a reading before, one after) spends 1.0 J."""
    available, why = True, None

    def __init__(self, device=None):
        self.total = 0.0

    def read(self):
        self.total += 1.0
        return self.total

    def spent(self, before):
        return self.read() - before


class NoCounter:
    available, why = False, "this kernel exposes no RAPL energy counter (test)"

    def __init__(self, device=None):
        pass

    def read(self):
        return None

    def spent(self, before):
        return None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("energy")
    target, draft = save_tiny_pair(root)
    return target, draft, write_prompts(root / "prompts.jsonl", count=2)


def measure(tiny, out, meter, **extra):
    import runner.session as session
    from runner.experiment import Experiment

    target, draft, data = tiny
    raw = base_config(target, draft, data, batch_size=1, methods=["baseline", "speculative"], warmup=0,
                      speculative={"gamma": [2]}, generation={"max_new_tokens": 4}, report={"plots": False}, **extra)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(session, "EnergyMeter", meter)
        assert Experiment(validate(raw), raw, out, Console(file=open("/dev/null", "w"))).run() == 0
    return read_jsonl(out / "samples.jsonl"), json.loads((out / "summary.json").read_text())


def test_a_run_records_each_batchs_joules(tiny, tmp_path):
    rows, summary = measure(tiny, tmp_path / "out", OneJouleABatch)
    assert [r["energy_j"] for r in rows] == [pytest.approx(1.0)] * len(rows)  # batch size 1: a row, a batch
    for run in summary["runs"]:
        mine = [r for r in rows if r["method"] == run["method"]]
        # 2 batches of 1.0 J over their tokens
        assert run["metrics"]["energy_j_per_token"] == pytest.approx(2.0 / sum(r["new_tokens"] for r in mine))
    assert not any(note.startswith("energy:") for note in summary["notes"])


def test_without_a_counter_the_figure_is_null_and_a_note_says_why(tiny, tmp_path):
    rows, summary = measure(tiny, tmp_path / "out", NoCounter, load={"concurrency": [2]})
    assert rows and all(r["energy_j"] is None for r in rows)
    assert all(run["metrics"]["energy_j_per_token"] is None for run in summary["serving"]["runs"])
    assert summary["notes"].count("energy: not measured, so energy_j_per_token is null: this kernel exposes no RAPL "
                                  "energy counter (test)") == 1
