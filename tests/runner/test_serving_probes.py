"""A serving run's probes (runner/session.py, runner/experiment.py): a load point's warmup and cost probes run at the
most requests it can have in flight, min(concurrency, its requests), on its own requests (prompts cycling), and are
kept under that batch size; its costs are probed at 1 row too (its first request), so that the replay prices the
steps at fewer rows as requests leave and arrive; its drift probe runs again after each point, so a machine that
changes speed between the baseline and a method inside one load point raises the drift flag."""
import json

import pytest
from rich.console import Console

from helpers import base_config, save_tiny_pair, write_prompts
from runner.plan import comparisons
from utils.config import validate
from utils.io import read_jsonl


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("serving-probes")
    target, draft = save_tiny_pair(root)
    return root, target, draft, write_prompts(root / "prompts.jsonl", count=3)


def serve(tiny, out, **load):
    """A whole serving run in this process (3 prompts, baseline and one speculative point, all at once); returns the
    rows of every cost probe's batch, the folder's progress.json and samples.jsonl, the config and summary.json."""
    import runner.session as session
    from runner.experiment import Experiment

    root, target, draft, data = tiny
    raw = base_config(target, draft, data, batch_size=1, methods=["baseline", "speculative"],
                      speculative={"gamma": [2]}, generation={"max_new_tokens": 4}, load=load,
                      report={"plots": False})
    config = validate(raw)
    probed = []
    real = session.comparison_costs

    def comparison_costs(config, target, drafts, points, ids, mask, *args):
        probed.append([row[m.bool()].tolist() for row, m in zip(ids, mask)])
        return real(config, target, drafts, points, ids, mask, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(session, "comparison_costs", comparison_costs)
        assert Experiment(config, raw, out, Console(file=open("/dev/null", "w"))).run() == 0
    return probed, json.loads((out / "progress.json").read_text()), read_jsonl(out / "samples.jsonl"), config, \
        json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def above(tiny, tmp_path_factory):
    """Concurrency 8 over 3 requests."""
    return serve(tiny, tmp_path_factory.mktemp("above") / "out", concurrency=[8])


def test_a_concurrency_above_the_requests_probes_the_requests_in_flight(above):
    probed, progress, samples, config, _ = above
    (comparison,) = comparisons(config, 3)
    assert comparison.concurrency == 8 and comparison.batch_size == 3
    assert [len(rows) for rows in probed] == [3, 1]  # 3 requests: at most 3 rows ever in flight; and 1
    assert probed[1] == probed[0][:1]  # the first request alone
    assert set(progress["costs"]) == {"1", "3"} and set(progress["drift"]) == {"3"}
    assert {(s["concurrency"], s["batch_size"]) for s in samples} == {(8, 3)}


def test_a_load_point_is_replayed_at_every_row_count_it_ran(above):
    """Its steps at 1, 2 and 3 rows are priced (1 and 3 probed, 2 between them): the replay predicts the point."""
    *_, summary = above
    (point,) = [r for r in summary["serving"]["runs"] if r["method"] == "speculative"]
    assert point["metrics"]["replay_missing"] is None and point["metrics"]["predicted_speedup_replay"] > 0


def test_a_load_point_probes_drift_as_it_starts_and_after_each_point(above):
    _, progress, samples, _, _ = above
    assert len({(s["method"], s["gamma"]) for s in samples}) == 2  # the baseline and one speculative point
    (readings,) = progress["drift"]["3"].values()
    assert len(readings) == 3 and all(r > 0 for r in readings)


def test_more_requests_than_prompts_probe_the_requests_cycling_through_the_prompts(tiny, tmp_path):
    probed, progress, samples, config, _ = serve(tiny, tmp_path / "out", concurrency=[8], requests=5)
    assert comparisons(config, 5)[0].batch_size == 5
    first = {s["request"]: s["sample_id"] for s in samples if s["method"] == "baseline"}
    assert [first[i] for i in range(5)] == [first[0], first[1], first[2], first[0], first[1]]
    rows, one = probed
    assert len(rows) == 5 and rows[3] == rows[0] and rows[4] == rows[1] and rows[0] != rows[1] and one == rows[:1]
    assert set(progress["costs"]) == {"1", "5"}


def test_a_rate_without_a_cap_probes_every_request():
    config = validate({"target": {"model": "t"}, "draft": {"model": "d"}, "dataset": {"path": "x.jsonl"},
                       "load": {"request_rate": [2.0, float("inf")]}})
    assert [(c.concurrency, c.batch_size) for c in comparisons(config, 6)] == [(6, 6), (6, 6)]
    capped = validate({"target": {"model": "t"}, "draft": {"model": "d"}, "dataset": {"path": "x.jsonl"},
                       "load": {"concurrency": [2, 16], "requests": 6}})
    assert [(c.concurrency, c.batch_size) for c in comparisons(capped, 6)] == [(2, 2), (16, 6)]


def test_a_drift_probe_that_moved_inside_a_load_point_flags_it():
    """The readings of one load point's unit (as it started and after each point: baseline, then the method) are one
    process's list under its batch size: a slowdown between the points (13% here) is the drift flag of that load
    point's runs, and of no other load point's."""
    from eval.flags import DRIFT_LIMIT, probe_drift
    from eval.summary import summarize
    from sample_records import record

    def served(method, i, concurrency, batch_size):
        return record(method, sample_id=i, batch_size=batch_size, batch_rows=3, tokens=5, latency=1.0, prefill=0.2,
                      rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}] * 2, concurrency=concurrency,
                      request_rate=None, request=i, arrival_s=0.0, admitted_s=0.0, first_token_s=0.2, finish_s=1.0,
                      emits=[[0.2, 1], [0.6, 2], [1.0, 2]])

    rows = [served(m, i, c, b) for m in ("baseline", "speculative") for i in range(3) for c, b in ((8, 3), (2, 2))]
    moved = {"drift": {"3": {"p1": [0.100, 0.101, 0.113]}, "2": {"p1": [0.100, 0.101, 0.100]}}}
    assert probe_drift(moved, 3) == pytest.approx(0.13) and probe_drift(moved, 3) > DRIFT_LIMIT
    runs = summarize(rows, moved)["serving"]["runs"]
    flags = {(r["method"], r["concurrency"]): [f["code"] for f in r["flags"]] for r in runs}
    assert all("drift" in flags[(m, 8)] for m in ("baseline", "speculative"))
    assert all("drift" not in flags[(m, 2)] for m in ("baseline", "speculative"))


def test_a_folder_written_with_the_concurrency_as_batch_size_resumes_without_rerunning(above, tmp_path):
    """Before, a serving record's batch_size was its concurrency (8 over 3 requests): --resume reads it as
    min(concurrency, requests), so the finished load point is kept, not run again beside itself."""
    import shutil

    import yaml
    from runner.storage import ReportFolder

    _, _, samples, config, _ = above
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "samples.jsonl").write_text("".join(json.dumps(dict(s, batch_size=8)) + "\n" for s in samples))
    raw = config.model_dump(mode="json")
    (folder / "config.yaml").write_text(yaml.safe_dump(raw))
    opened = ReportFolder(folder, raw, "old", None, False)
    opened.reopen()
    assert len(opened.samples) == len(samples) and {s["batch_size"] for s in opened.samples} == {3}
    keys = {(s["method"], s["gamma"], s["concurrency"], s["batch_size"], s["repeat"]) for s in samples}
    assert {(s["method"], s["gamma"], s["concurrency"], s["batch_size"], s["repeat"]) for s in opened.samples} == keys
    assert {json.loads(line)["batch_size"] for line in (folder / "samples.jsonl").read_text().splitlines()} == {3}
    shutil.rmtree(folder)
