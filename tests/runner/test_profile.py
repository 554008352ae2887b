"""python -m runner.profile (#33): a cost profile of a config's models, with no benchmark and no dataset; and the
prefill points the run's cost probes carry (eval/records.py CostProbe.prefills)."""
import statistics
import subprocess
import sys

import pytest
import yaml

from helpers import ROOT, assert_one_clean_line

PROMPT = 8
ROWS = [1, 2]
KV = [PROMPT, PROMPT + 6]


@pytest.fixture(scope="module")
def config_path(tmp_path_factory):
    """A synthetic pair on a CPU; its dataset does not exist: the profile reads none."""
    root = tmp_path_factory.mktemp("profile")
    config = {"name": "tiny-profile", "device": "cpu", "target": {"model": "synthetic:llama-tiny"},
              "draft": {"model": "synthetic:llama-tiny?layers=2", "label": "d"},
              "dataset": {"path": str(root / "not-there.jsonl")}, "speculative": {"gamma": [2, 4]},
              "generation": {"max_new_tokens": 6}, "batch_size": [1, 2]}
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_profile_command_writes_a_profile_of_the_pair(config_path, tmp_path, capsys):
    from eval.costs import TARGET, Profile, draft_model
    from runner.profile import main

    out = tmp_path / "sub" / "profile.json"
    assert main(["--config", str(config_path), "--rows", ",".join(map(str, ROWS)), "--kv", ",".join(map(str, KV)),
                 "--prompt-tokens", str(PROMPT), "--reps", "2", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    profile = Profile.load(out)
    widths = [1, 3, 5]  # 1, and gamma + 1 of gamma 2 and 4
    steps = [(p["model"], p["rows"], p["width"], p["kv"]) for p in profile.steps]
    assert sorted(steps) == sorted([(TARGET, r, w, kv) for r in ROWS for w in widths for kv in KV]
                                   + [(draft_model("d"), r, w, kv) for r in ROWS for w in (1, 2) for kv in KV])
    assert all(len(p["reps_s"]) == (4 if p["model"] == TARGET and p["width"] == 1 else 2) for p in profile.steps)
    prefills = {(p["model"], p["rows"], p["tokens"]) for p in profile.prefills}
    for model in (TARGET, draft_model("d")):
        assert {(model, r, PROMPT) for r in ROWS} | {(model, 1, 2 * PROMPT)} <= prefills
        assert profile.prefill_s(model, 4, PROMPT) is not None
    assert profile.drafts() == ["d"] and profile.rows_measured() == ROWS and profile.widths_measured() == widths
    # the step's seconds at a measured point are that point's median
    point = next(p for p in profile.steps if (p["model"], p["rows"], p["width"], p["kv"]) == (TARGET, 2, 3, KV[1]))
    assert profile.step_s(TARGET, 2, 3, KV[1]) == statistics.median(point["reps_s"])
    meta = profile.meta
    assert (meta["device"], meta["dtype"], meta["compile"], meta["engine"]) == ("cpu", "float32", False, "ours")
    assert meta["torch"] and meta["prompt_tokens"] == PROMPT and meta["elapsed_s"] > 0
    assert meta["models"] == {TARGET: "synthetic:llama-tiny", draft_model("d"): "synthetic:llama-tiny?layers=2"}
    assert meta["command"].startswith("python -m runner.profile --config")


def test_the_repetitions_are_shared_over_passes_over_every_probe(config_path, tmp_path, monkeypatch):
    """5 repetitions over 3 passes: 2, 2 and 1, each pass over every rows x cache in turn (not one probe's 5 at once),
    the batch's prefills timed in the first pass only; each step's repetitions are every pass's."""
    from eval.costs import TARGET, Profile
    from runner import probes, profile as command

    assert command.pass_shares(9, 3) == [3, 3, 3] and command.pass_shares(5, 3) == [2, 2, 1]
    assert command.pass_shares(2, 3) == [1, 1] and command.pass_shares(4, 1) == [4]
    calls, real = [], probes.measure_costs

    def spy(target, drafts, ids, mask, widths, clock, reps, **kwargs):
        calls.append((ids.shape[0], kwargs["context"] + PROMPT, reps, kwargs["prefills"]))
        return real(target, drafts, ids, mask, widths, clock, reps=reps, **kwargs)

    monkeypatch.setattr(probes, "measure_costs", spy)
    out = tmp_path / "profile.json"
    assert command.main(["--config", str(config_path), "--rows", "1,2", "--kv", ",".join(map(str, KV)),
                         "--prompt-tokens", str(PROMPT), "--reps", "5", "--out", str(out)]) == 0
    one_pass = [(1, KV[0]), (1, KV[1]), (2, KV[0]), (2, KV[1])]
    assert [(r, kv) for r, kv, _, _ in calls] == one_pass * 3
    assert [reps for _, _, reps, _ in calls] == [2] * 4 + [2] * 4 + [1] * 4
    assert [prefills for *_, prefills in calls] == [True, False] * 2 + [False] * 8
    profile = Profile.load(out)
    assert profile.meta["passes"] == 3 and profile.meta["reps"] == 5
    # the unit step is timed first and last in each repetition: 10 of it, 5 of every other step
    assert all(len(p["reps_s"]) == (10 if p["model"] == TARGET and p["width"] == 1 else 5) for p in profile.steps)


@pytest.mark.parametrize("args, fragment", [(["--rows", "0"], "--rows"), (["--rows", "x"], "--rows"),
                                            (["--prompt-tokens", "0"], "--prompt-tokens")])
def test_bad_arguments_are_one_line_and_exit_2(config_path, args, fragment):
    result = subprocess.run([sys.executable, "-m", "runner.profile", "--config", str(config_path), *args],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert_one_clean_line(result, fragment)


def test_a_missing_config_is_one_line_and_exit_2(tmp_path):
    result = subprocess.run([sys.executable, "-m", "runner.profile", "--config", str(tmp_path / "none.yaml")],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert_one_clean_line(result, "does not exist")


def test_the_cost_probes_prefills_round_trip():
    from eval.records import CostProbe

    prefills = [{"model": "target", "rows": 2, "tokens": 12, "s": 0.01, "reps_s": [0.01, 0.012]},
                {"model": "draft:d", "rows": 1, "tokens": 7, "s": 0.002, "reps_s": [0.002, 0.003]}]
    probe = CostProbe(c_by_draft={"d": 0.3}, v={2: 1.2}, context_tokens=14, prefills=prefills)
    assert CostProbe.from_json(probe.to_json()).prefills == prefills
    older = probe.to_json()
    del older["prefills"]  # a report folder written before the prefill points
    assert CostProbe.from_json(older).prefills == []
