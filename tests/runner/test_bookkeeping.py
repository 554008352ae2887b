"""The experiment's bookkeeping without models: what is planned, what `repeats: auto` stops on, where each process's
probes go, and env.json keeping every process's machine. A fake executor hands back constructed units."""
import json

import pytest
from rich.console import Console

from eval.records import Comparison, CostProbe
from runner.experiment import Experiment
from runner.plan import points_of
from runner.records import UnitResult
from sample_records import record
from utils.config import validate

LABEL = "speculative draft=draft gamma=2 constant batch=1 greedy"


def experiment(tmp_path, **extra) -> Experiment:
    raw = {"name": "t", "device": "cpu", "target": {"model": "/nowhere/target"}, "draft": {"model": "/nowhere/draft"},
           "dataset": {"path": "/nowhere/data.jsonl", "prompt_field": "text"}, "speculative": {"gamma": [2]},
           "batch_size": 1, **extra}
    config = validate(raw)
    exp = Experiment(config, raw, tmp_path / "out", Console(file=open("/dev/null", "w")))
    exp.folder.create()
    return exp


class FakeExecutor:
    """Runs `stop_after` units (baseline 2 s, speculative `speed(i)` x faster per prompt i), then a Ctrl-C."""
    exclusive = False
    released_for = None

    def release(self, by):
        self.released_for = by
        return "released for the other engine"

    def info(self):
        return {}

    def __init__(self, exp, num_prompts, speed=lambda i: 2.0, stop_after=None, process="p1"):
        self.exp, self.num_prompts, self.speed, self.stop_after, self.process = exp, num_prompts, speed, stop_after, process
        self.ran = []

    def run(self, units, done):
        for unit in units:
            if self.stop_after is not None and len(self.ran) == self.stop_after:
                raise KeyboardInterrupt
            rows = []
            for point in points_of(self.exp.config, unit.comparison):
                i, size = unit.batch_index, unit.batch_size
                latency = 2.0 if point.method == "baseline" else 2.0 / self.speed(i)
                for row in range(i * size, min((i + 1) * size, self.num_prompts)):
                    rows.append(record(point.method, row, i, unit.repeat, batch_size=size, tokens=4, latency=latency,
                                       draft=point.draft, rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}],
                                       process=self.process))
            self.ran.append(unit)
            yield unit, UnitResult(rows=rows, process=self.process, drift_probe_s=0.1,
                                   costs=CostProbe(c_by_draft={"draft": 0.3}, v={2: 1.2}))


def test_partial_counts_every_planned_repeat(tmp_path):
    # 8 prompts, batch 1, repeats 2: 16 batches planned per point from the start, not 8 until the second repeat
    exp = experiment(tmp_path, repeats=2)
    with pytest.raises(KeyboardInterrupt):
        exp.sweep({"ours": FakeExecutor(exp, 8, stop_after=4)})
    assert exp.progress.planned == {"baseline batch=1 greedy": 16, LABEL: 16}
    run = next(r for r in exp.folder.summary()["runs"] if r["label"] == LABEL)
    assert run["status"] == "partial" and run["batches"]["done"] == 4 and run["batches"]["planned"] == 16


def test_repeats_auto_stops_where_repeats_cannot_help(tmp_path):
    # 4 prompts: too few for an interval whatever the repeats; auto stops after one and says why
    exp = experiment(tmp_path, repeats="auto", max_repeats=5)
    executor = FakeExecutor(exp, 4)
    exp.sweep({"ours": executor})
    assert len(executor.ran) == 4  # one repeat
    assert any(n.startswith("repeats: auto stopped after 1 repeat(s)") and "few_samples" in n
               for n in exp.progress.notes)


def test_repeats_auto_goes_on_while_an_interval_is_wide(tmp_path):
    # 8 prompts alternately 1.5x and 3x faster: the CI over prompts is wide, and repeats of the same prompts
    # leave it so: auto runs to max_repeats and says that is why it stopped
    exp = experiment(tmp_path, repeats="auto", max_repeats=3)
    executor = FakeExecutor(exp, 8, speed=lambda i: [1.5, 3.0][i % 2])
    exp.sweep({"ours": executor})
    assert len(executor.ran) == 24
    assert any(n.startswith("repeats: auto stopped after 3 repeat(s) for batch=1 greedy: max_repeats (3) reached, "
                            "1 point(s) still ci_wide") for n in exp.progress.notes)
    steady = experiment(tmp_path / "b", repeats="auto", max_repeats=3)
    executor = FakeExecutor(steady, 8)
    steady.sweep({"ours": executor})
    assert len(executor.ran) == 8 and any("no speedup CI reaches beyond ci_target" in n for n in steady.progress.notes)


def test_probes_are_kept_per_process(tmp_path):
    exp = experiment(tmp_path)
    first = FakeExecutor(exp, 8, stop_after=3, process="host-1-a")
    with pytest.raises(KeyboardInterrupt):
        exp.sweep({"ours": first})
    second = FakeExecutor(exp, 8, process="host-2-b")  # the resumed run
    exp.sweep({"ours": second})
    assert set(exp.progress.costs["1"]) == {"host-1-a", "host-2-b"}
    assert exp.progress.costs["1"]["host-1-a"]["c_by_draft"] == {"draft": 0.3}
    assert exp.progress.drift["1"] == {"host-1-a": [0.1] * 3, "host-2-b": [0.1] * 5}
    assert [p["name"] for p in exp.progress.processes.values()] == ["process 1", "process 2"]


def test_env_json_keeps_every_process(tmp_path):
    exp = experiment(tmp_path)
    exp.folder.write_env({"device": "cpu", "device_name": "first cpu"}, "host-1-a")
    exp.folder.write_env({"device": "cpu", "device_name": "second cpu"}, "host-2-b")
    env = json.loads((exp.folder.path / "env.json").read_text())
    assert env["device_name"] == "first cpu"  # the run's start, as before
    assert [(p["process"], p["device_name"]) for p in env["processes"]] == [("host-1-a", "first cpu"),
                                                                           ("host-2-b", "second cpu")]


def test_repeats_auto_without_a_baseline_is_refused(tmp_path):
    # it stopped after one repeat before: no speedup, so nothing to settle
    from utils import UserError

    with pytest.raises(UserError, match="repeats: auto .* no speedup without baseline in methods"):
        experiment(tmp_path, repeats="auto", methods=["speculative"])


def test_repeats_auto_says_when_each_comparison_stopped(tmp_path):
    # batch 1: 8 prompt batches, a wide interval, on to max_repeats; batch 4: 2 prompt batches, few_samples after one
    exp = experiment(tmp_path, repeats="auto", max_repeats=2, batch_size=[1, 4])
    executor = FakeExecutor(exp, 8, speed=lambda i: [1.5, 3.0][i % 2])
    exp.sweep({"ours": executor})
    assert sorted((u.batch_size, u.repeat) for u in executor.ran).count((4, 0)) == 2
    assert not any(u.batch_size == 4 and u.repeat == 1 for u in executor.ran)
    notes = [n for n in exp.progress.notes if n.startswith("repeats: auto")]
    assert any(n.startswith("repeats: auto stopped after 1 repeat(s) for batch=4 greedy: no point has a speedup "
                            "interval that repeats could settle")
               and "1 point(s) rest on too few prompts" in n for n in notes)
    assert any(n.startswith("repeats: auto stopped after 2 repeat(s) for batch=1 greedy: max_repeats (2) reached")
               for n in notes)
    assert exp.progress.planned["baseline batch=4 greedy"] == 2 and exp.progress.planned["baseline batch=1 greedy"] == 16


class FailingExecutor(FakeExecutor):
    """gamma 2 fails from repeat 1 on (as a point that hits an error does for the rest of a session)."""

    def run(self, units, done):
        for unit in units:
            if unit.repeat >= 1:
                label = next(p for p in points_of(self.exp.config, Comparison(batch_size=1)) if p.gamma == 2)
                rows = [record("baseline", unit.batch_index, unit.batch_index, unit.repeat, tokens=4, latency=2.0,
                               process=self.process)]
                self.ran.append(unit)
                yield unit, UnitResult(rows=rows, process=self.process, failures=[
                    {**label.values(), "status": "failed", "error": "RuntimeError: boom"}])
            else:
                yield from super().run([unit], done)


def test_repeats_auto_does_not_repeat_for_a_failed_point(tmp_path):
    # gamma 2 is ci_wide after repeat 0, then fails: more repeats cannot measure it, so auto stops after repeat 1
    exp = experiment(tmp_path, repeats="auto", max_repeats=4)
    executor = FailingExecutor(exp, 8, speed=lambda i: [1.5, 3.0][i % 2])
    exp.sweep({"ours": executor})
    assert max(u.repeat for u in executor.ran) == 1
    assert any(n.startswith("repeats: auto stopped after 2 repeat(s) for batch=1 greedy: no point has a speedup interval")
               and "1 point(s) failed" in n for n in exp.progress.notes)


def test_a_resumed_auto_run_finishes_the_repeat_it_was_in(tmp_path):
    # repeat 0 is wide, the run is interrupted after 7 of repeat 1's 8 batches; the resumed run measures the 8th and
    # only then judges: 2 repeats, every batch of both on disk
    exp = experiment(tmp_path, repeats="auto", max_repeats=2)
    with pytest.raises(KeyboardInterrupt):
        exp.sweep({"ours": FakeExecutor(exp, 8, speed=lambda i: [1.5, 3.0][i % 2], stop_after=15)})
    resumed = FakeExecutor(exp, 8, speed=lambda i: [1.5, 3.0][i % 2], process="p2")
    exp.sweep({"ours": resumed})
    assert [(u.repeat, u.batch_index) for u in resumed.ran] == [(1, 7)]
    run = next(r for r in exp.folder.summary()["runs"] if r["label"] == LABEL)
    assert run["batches"]["done"] == 16 and run["batches"]["planned"] == 16 and run["status"] == "ok"
    assert any(n.startswith("repeats: auto stopped after 2 repeat(s) for batch=1 greedy") for n in exp.progress.notes)


class OtherEngine:
    """An engine that loads its own models (exclusive): it takes its units and yields none finished."""
    exclusive = True

    def __init__(self):
        self.units = []

    def run(self, units, done):
        self.units += units
        yield from ()

    def info(self):
        return {"version": "1", "order": "one engine at a time"}


def test_an_exclusive_engine_has_the_others_released_and_its_info_kept(tmp_path):
    exp = experiment(tmp_path, methods=["baseline", "speculative", "vllm_generate"])
    ours, other = FakeExecutor(exp, 4), OtherEngine()
    exp.sweep({"ours": ours, "vllm": other})
    assert len(ours.ran) == 4 and len(other.units) == 4  # every unit to each engine with points in it
    assert ours.released_for is other and "released for the other engine" in exp.progress.notes
    assert exp.progress.engine_info["vllm"]["order"] == "one engine at a time"
    assert list(exp.progress.engine_info["vllm"]["processes"].values()) == [other.info()]
