"""Figures of a run measured by several processes (Ray workers, a resumed run): each point's costs from the
processes that ran it, drift within each process, workers that disagree flagged, pairs across processes said."""
import json
from dataclasses import asdict

import pytest

from eval.summary import summarize
from sample_records import SPEC_LABEL, codes, costs, paired_run, record, run


def on(samples, process, worker=None):
    for s in samples:
        s["process"], s["worker"] = process, worker
    return samples


def probes(**by_process):
    """progress.json's costs: batch size 1 -> process -> its CostProbe (c for draft d, v for gamma 2)."""
    return {"1": {name: costs(c, {"2": v}, process=name)["1"][name] for name, (c, v) in by_process.items()}}


def test_each_point_takes_the_costs_of_the_worker_that_ran_it():
    # gamma 2 ran on w0 (c 0.3, v 1.2), gamma 4 on w1 (c 0.5); the first worker to finish no longer speaks for both
    g2 = on(paired_run(units=8), "w0-proc", "w0")
    g4 = on([dict(s, gamma=4, new_tokens=6, rounds=[{"drafted": 4, "accepted": 4, "emitted": 5}])
             for s in paired_run(units=8) if s["method"] == "speculative"], "w1-proc", "w1")
    progress = {"costs": {"1": {"w0-proc": costs(0.3, {"2": 1.2, "4": 1.4})["1"]["p1"],
                                "w1-proc": costs(0.5, {"2": 1.2, "4": 1.4})["1"]["p1"]}},
                "processes": {"w0-proc": {"name": "w0", "worker": "w0"}, "w1-proc": {"name": "w1", "worker": "w1"}}}
    summary = summarize(g2 + g4, progress)
    assert run(summary, "speculative", gamma=2)["metrics"]["draft_cost_ratio_c"] == 0.3
    assert run(summary, "speculative", gamma=4)["metrics"]["draft_cost_ratio_c"] == 0.5
    # alpha 1 (every draft accepted): gamma 4 predicts 5 / (4 * 0.5 + 1.4) = 1.4706, from w1's costs alone
    assert run(summary, "speculative", gamma=4)["metrics"]["predicted_speedup"] == pytest.approx(5 / 3.4)


def test_a_point_run_on_two_workers_takes_their_median_and_flags_their_disagreement():
    samples = on(paired_run(units=8)[:8], "w0-proc", "w0") + on(paired_run(units=8)[8:], "w1-proc", "w1")
    progress = {"costs": probes(**{"w0-proc": (0.3, 1.2), "w1-proc": (0.5, 1.2)}),
                "processes": {"w0-proc": {"name": "w0"}, "w1-proc": {"name": "w1"}}}
    summary = summarize(samples, progress)
    m = run(summary, "speculative")["metrics"]
    assert m["draft_cost_ratio_c"] == pytest.approx(0.4)  # the median of 0.3 and 0.5
    assert codes(summary) == ["cost_unstable"]  # (0.5 - 0.3) / 0.4 = 50% apart
    assert "w0 0.300, w1 0.500" in run(summary, "speculative")["flags"][0]["message"]
    agreeing = {"costs": probes(**{"w0-proc": (0.30, 1.2), "w1-proc": (0.32, 1.25)})}
    assert codes(summarize(samples, agreeing)) == []


def test_drift_is_read_within_each_worker_and_batch_size():
    samples = paired_run(units=8)
    # w1 slowed by 30% during batch size 1; w0 was steady and runs 3x slower hardware: no drift between workers
    moved = {"1": {"w0-proc": [0.30, 0.30, 0.31], "w1-proc": [0.10, 0.13]}}
    assert "drift" in codes(summarize(samples, {"drift": moved}))
    steady = {"1": {"w0-proc": [0.30, 0.30, 0.31], "w1-proc": [0.10, 0.10]}, "4": {"w1-proc": [0.1, 0.5]}}
    assert codes(summarize(samples, {"drift": steady})) == []


def test_pairs_measured_by_two_processes_are_said():
    # a resumed run: the baseline of prompts 0-2 was measured before the interruption, their speculative batches after
    samples = on(paired_run(units=8), "first")
    for s in samples:
        if s["method"] == "speculative" and s["batch_index"] < 3:
            s["process"] = "second"
    summary = summarize(samples, {})
    assert run(summary, "speculative")["batches"]["cross_process"] == 3
    assert codes(summary) == ["cross_process"]
    assert any(n.startswith(SPEC_LABEL + ": flagged cross_process: 3 of its 8 paired batches were paired with a "
                            "baseline measured by another process") for n in summary["notes"])
    assert codes(summarize(on(paired_run(units=8), "first"), {})) == []
    # a resumed folder written before processes were recorded: the old records have none, the new ones do
    old = paired_run(units=8)
    for s in old:
        s.pop("process")
        if s["method"] == "speculative" and s["batch_index"] >= 4:
            s["process"] = "resumed"
    assert run(summarize(old, {}), "speculative")["batches"]["cross_process"] == 4


def test_a_restarted_worker_keeps_its_own_costs():
    # w0 died and Ray restarted it: two processes named w0, each with its probe; neither may hide the other
    samples = on(paired_run(units=8)[:8], "A", "w0") + on(paired_run(units=8)[8:], "B", "w0")
    progress = {"costs": probes(A=(0.3, 1.2), B=(0.6, 2.0)),
                "processes": {"A": {"name": "w0", "worker": "w0"}, "B": {"name": "w0", "worker": "w0"}}}
    summary = summarize(samples, progress)
    m = run(summary, "speculative")["metrics"]
    assert m["draft_cost_ratio_c"] == pytest.approx(0.45) and m["verify_cost_ratio_v"] == pytest.approx(1.6)
    assert "w0 0.300, w0#2 0.600" in run(summary, "speculative")["flags"][0]["message"]


def test_a_process_without_costs_borrows_none():
    # the resumed process's cost probe failed: its point has no prediction, not the first process's
    samples = on(paired_run(units=8), "second")
    summary = summarize(samples, {"costs": probes(first=(0.3, 1.2))})
    m = run(summary, "speculative")["metrics"]
    assert m["draft_cost_ratio_c"] is None and m["predicted_speedup"] is None
    assert any("predicted speedup and efficiency are null" in n and "no cost probe ran" in n for n in summary["notes"])
    # half its batches from a process with costs: those costs, and a note naming the process without
    mixed = on(paired_run(units=8)[:8], "first") + on(paired_run(units=8)[8:], "second")
    summary = summarize(mixed, {"costs": probes(first=(0.3, 1.2)),
                                "processes": {"first": {"name": "process 1"}, "second": {"name": "process 2"}}})
    assert run(summary, "speculative")["metrics"]["draft_cost_ratio_c"] == 0.3
    assert any(n == f"{SPEC_LABEL}: c, v and the prediction come from process 1; process 2 also ran it and measured "
               "no costs" for n in summary["notes"])


def test_resuming_a_folder_from_before_keeps_its_probes_apart(tmp_path):
    # progress.json written before probes were kept per process: on --resume its costs and drift become the
    # earlier process's, beside the new process's own
    from runner.storage import ReportFolder

    old = {"costs": {"1": {"c": 0.3, "c_by_draft": {"d": 0.3}, "v": {"2": 1.2}, "reps_s": {"target_1": [1.0, 1.0]}}},
           "drift": {"1": {"start_s": 1.0, "end_s": 1.05, "probes_s": [1.0, 1.05]}}}
    folder = ReportFolder(tmp_path, {"name": "t"}, "t", None, False)
    folder.create()
    (tmp_path / "progress.json").write_text(json.dumps(old))
    folder.reopen()
    assert folder.progress.costs["1"]["earlier"]["v"] == {"2": 1.2}
    assert folder.progress.drift["1"] == {"earlier": [1.0, 1.05]}
    samples = [dict(s, process=None) for s in paired_run(units=8)]
    for s in samples:
        if s["method"] == "speculative" and s["batch_index"] >= 4:
            s["process"] = "new"
    folder.progress.costs["1"]["new"] = costs(0.9, {"2": 0.5}, process="new")["1"]["new"]
    folder.progress.drift["1"]["new"] = [1.0, 1.5, 2.0]
    summary = summarize(samples, asdict(folder.progress))
    assert codes(summary) == ["cost_implausible", "cost_unstable", "cross_process", "drift"]
    assert run(summary, "speculative")["metrics"]["verify_cost_ratio_v"] == pytest.approx(0.85)  # median of 1.2, 0.5


def test_a_folder_resumed_between_formats_keeps_both_processes():
    # an older folder's entries with a new process's beside them (resumed by a version in between)
    old_probe = costs(0.3, {"2": 1.2})["1"]["p1"]
    progress = {"costs": {"1": {**old_probe, "p2": costs(0.6, {"2": 1.5})["1"]["p1"]}},
                "drift": {"1": {"probes_s": [1.0, 1.0], "p2": [1.0, 1.5]}}}
    samples = paired_run(units=8)
    for s in samples:
        s["process"] = None if s["batch_index"] < 4 else "p2"
    m = run(summarize(samples, progress), "speculative")["metrics"]
    assert m["draft_cost_ratio_c"] == pytest.approx(0.45) and m["verify_cost_ratio_v"] == pytest.approx(1.35)
    assert codes(summarize(samples, progress)) == ["cost_unstable", "drift"]


def test_the_missing_costs_note_is_for_points_with_a_prediction():
    samples = on(paired_run(units=8)[:8], "first") + on(paired_run(units=8)[8:], "second")
    summary = summarize(samples, {"costs": probes(second=(0.3, 1.2))})
    said = [n for n in summary["notes"] if "measured no costs" in n]
    assert len(said) == 1 and said[0].startswith(SPEC_LABEL)


def test_pairs_from_server_blocks_minutes_apart_are_flagged_by_hand():
    """An engine in its own process runs each point in a server block of its own: 8 paired batches, the reference's
    block started at 1000 s and the point's at 1300 s (the first 4 batches) and 1420 s (the last 4): 8 batches, a
    median of (300 + 420) / 2 / 60 = 6.0 min apart; back-to-back records (or older ones without the fields) add none."""
    samples = []
    for i in range(8):
        samples.append(record("baseline", i, i, tokens=4, latency=2.0,
                              extra={"pairing": "engine", "back_to_back": True, "block_started_unix_s": 1000.0}))
        samples.append(record("speculative", i, i, tokens=4, latency=1.0, rounds=[{"drafted": 2, "accepted": 2,
                                                                                    "emitted": 3}],
                              extra={"pairing": "engine", "back_to_back": False,
                                     "block_started_unix_s": 1300.0 if i < 4 else 1420.0}))
    summary = summarize(samples, {})
    assert run(summary, "speculative")["batches"]["blocks_apart"] == {"batches": 8, "median_minutes": 6.0}
    assert "not_back_to_back" in codes(summary)
    assert "blocks_apart" not in run(summarize(paired_run(), {}), "speculative")["batches"]
