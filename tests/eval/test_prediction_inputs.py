"""What the predictions read (#57): a cost profile (--costs, costs.json, progress.json's probes), config.yaml,
env.json and samples.jsonl. A bad one is one line naming the file, the key and the fix, and exit 2, in
python -m eval.predict and python -m eval; what a profile and a run differ in is said beside the prediction."""
import json
import subprocess
import sys

import pytest

from eval.predict import main as predict
from helpers import ROOT, assert_one_clean_line
from sample_records import record

ROUNDS = [{"drafted": 2, "accepted": 2, "emitted": 3}, {"drafted": 2, "accepted": 0, "emitted": 1}]


def samples() -> list[dict]:
    """Two batches of one row at batch size 1: the method's two rounds (5 tokens), the baseline's 5 tokens."""
    return [r for unit in range(2) for r in (record("baseline", unit, unit, tokens=5, latency=2.6),
                                              record("speculative", unit, unit, tokens=5, rounds=ROUNDS, latency=3.0))]


def probe() -> dict:
    """progress.json's probe at batch size 1: the target's step 1.0 s, its 3-token verification 1.5 s, the draft's
    0.3 s; prefills 0.1 s (target) and 0.05 s (draft) of one 5-token prompt."""
    return {"1": {"p1": {"c_by_draft": {"d": 0.3}, "v": {"2": 1.5}, "target_forward_s": 1.0,
                         "target_reps_s": {"1": [1.0, 1.0, 1.0], "3": [1.5, 1.5, 1.5]},
                         "draft_reps_s": {"d": [0.3, 0.3, 0.3]}, "context_tokens": 10,
                         "prefills": [{"model": "target", "rows": 1, "tokens": 5, "s": 0.1},
                                      {"model": "draft:d", "rows": 1, "tokens": 5, "s": 0.05}]}}}


def profile(**meta) -> dict:
    """The same costs as a profile's file."""
    steps = [("target", 1, 1.0), ("target", 3, 1.5), ("draft:d", 1, 0.3)]
    return {"format": "speculate-cost-profile", "version": 1, "meta": meta,
            "steps": [{"model": m, "rows": 1, "width": w, "kv": 10, "s": s, "reps_s": [s, s, s]} for m, w, s in steps],
            "prefills": [{"model": "target", "rows": 1, "tokens": 5, "s": 0.1},
                         {"model": "draft:d", "rows": 1, "tokens": 5, "s": 0.05}]}


def folder(tmp_path, rows=None, costs=None, config=None, env=None):
    """A report folder: samples.jsonl, progress.json with the probe, config.yaml and env.json of a CPU fp32 run."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (rows or samples())))
    (tmp_path / "progress.json").write_text(json.dumps({"costs": probe() if costs is None else costs}))
    (tmp_path / "config.yaml").write_text(config if config is not None else
                                          "name: run\ntarget: {model: m, dtype: float32, quantization: none}\n"
                                          "engine: {compile: false}\n")
    (tmp_path / "env.json").write_text(json.dumps(env or {"device": "cpu", "device_name": "Some CPU"}))
    return tmp_path


def one_line(capsys, fragment):
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], err


def mended(change) -> dict:
    data = profile()
    change(data)
    return data


@pytest.mark.parametrize("bad, fragment", [
    (mended(lambda p: p["steps"][0].update(reps_s=[1.0, -1.0, 1.0])), "steps[0].reps_s[1] is -1.0"),
    (mended(lambda p: p["steps"][1].update(reps_s=[1.5, float("nan")])), "steps[1].reps_s[1] is nan"),
    (mended(lambda p: p["steps"][2].update(reps_s=["0.3", "0.3"])), "steps[2].reps_s[0] is '0.3'"),
    (mended(lambda p: p["prefills"][0].update(tokens=0)), "prefills[0].tokens is 0"),
    (mended(lambda p: p["steps"][0].update(s=0, reps_s=[])), "steps[0].s is 0"),
    (mended(lambda p: p["steps"][0].update(s=1e300, reps_s=[])), "steps[0].s is 1e+300"),
    (mended(lambda p: p["steps"][2].update(s=True, reps_s=[])), "steps[2].s is True"),
    (mended(lambda p: p["steps"][2].update(s="0.05", reps_s=[])), "steps[2].s is '0.05'"),
    (mended(lambda p: p["steps"][0].update(rows=1.7)), "steps[0].rows is 1.7"),
], ids=["negative-rep", "nan-rep", "string-reps", "prefill-0-tokens", "zero-s", "s-1e300", "bool-s", "string-s",
        "fractional-rows"])
def test_a_profile_with_a_time_that_is_no_time_is_one_line_and_exit_2(tmp_path, capsys, bad, fragment):
    run = folder(tmp_path / "run")
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    assert predict([str(run), "--costs", str(tmp_path / "bad.json")]) == 2
    one_line(capsys, f"bad.json: {fragment}")
    assert predict([str(run), "--costs", str(tmp_path / "ok.json")]) == 2  # the same folder, a missing profile
    capsys.readouterr()
    (tmp_path / "ok.json").write_text(json.dumps(profile()))
    assert predict([str(run), "--costs", str(tmp_path / "ok.json")]) == 0  # and with a sound one, a prediction


def torn_middle(path):
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + '{"method": "bas\n' + "".join(lines[1:]))


@pytest.mark.parametrize("spoil, fragment", [
    (lambda d: (d / "progress.json").write_text(json.dumps({"costs": {"1": {"p1": dict(
        probe()["1"]["p1"], target_reps_s={"1": [1.0, -1.0, 1.0], "3": [1.5]})}}})),
     "progress.json: costs.1.p1.target_reps_s.1[1] is -1.0"),
    (lambda d: (d / "progress.json").write_text('{"costs": {"1": '), "progress.json is not readable as JSON"),
    (lambda d: (d / "config.yaml").write_text("name: [run\n"), "config.yaml is not readable as YAML"),
    (lambda d: torn_middle(d / "samples.jsonl"), "samples.jsonl: line 2 is not a JSON record"),
], ids=["negative-probe-rep", "torn-progress", "bad-yaml", "corrupt-middle-line"])
def test_a_bad_input_of_the_rebuild_and_the_prediction_is_one_line_and_exit_2(tmp_path, capsys, spoil, fragment):
    run = folder(tmp_path)
    spoil(run)
    assert predict([str(run)]) == 2
    one_line(capsys, fragment)
    result = subprocess.run([sys.executable, "-m", "eval", str(run)], capture_output=True, text=True, cwd=ROOT,
                            timeout=120)
    assert_one_clean_line(result, fragment)


def test_resume_refuses_a_torn_or_impossible_progress_json_in_one_line(tmp_path):
    import yaml

    from runner.storage import ReportFolder
    from utils import UserError

    run = folder(tmp_path)
    config = yaml.safe_load((run / "config.yaml").read_text())
    (run / "progress.json").write_text('{"costs": ')
    with pytest.raises(UserError, match="progress.json is not readable as JSON"):
        ReportFolder(run, config, "run", None, False).reopen()
    (run / "progress.json").write_text(json.dumps({"costs": {"1": {"p1": dict(probe()["1"]["p1"], context_tokens=-3)}}}))
    with pytest.raises(UserError, match=r"costs.1.p1.context_tokens is -3"):
        ReportFolder(run, config, "run", None, False).reopen()


def test_a_torn_last_line_of_samples_is_still_skipped(tmp_path, capsys):
    run = folder(tmp_path)
    with open(run / "samples.jsonl", "a") as handle:
        handle.write('{"method": "basel')
    assert predict([str(run)]) == 0
    # both batches replayed: the method 0.1 + 0.05 + 2 x (2 x 0.3 + 1.5) = 4.35 s, the baseline 0.1 + 4 x 1.0
    assert "| 0.87 | 0.94 | 0.92 |" in capsys.readouterr().out


def test_without_a_profile_it_says_give_costs(tmp_path, capsys):
    run = folder(tmp_path, costs={})
    assert predict([str(run)]) == 2
    one_line(capsys, "no profile")
    (run / "progress.json").unlink()
    assert predict([str(run)]) == 2
    one_line(capsys, "give --costs PROFILE.json")


def test_records_that_cannot_be_replayed_say_the_records_lack_it(tmp_path, capsys):
    rows = [{k: v for k, v in r.items() if k != "prompt_tokens"} for r in samples()]
    assert predict([str(folder(tmp_path, rows))]) == 0
    out = capsys.readouterr().out
    assert "the records lack their prompt lengths" in out and "the profile lacks" not in out
    prediction = json.loads((tmp_path / "prediction.json").read_text())["points"][0]
    assert prediction["predicted"] is None and prediction["missing"].startswith("the records lack")


def test_a_static_points_missing_replay_is_in_the_summarys_notes():
    from eval.summary import summarize

    costs = probe()
    del costs["1"]["p1"]["prefills"]
    notes = summarize(samples(), {"costs": costs})["notes"]
    assert "no replayed prediction for speculative draft=d gamma=2 constant batch=1 greedy: the run's cost profile " \
           "lacks the target's prefill (no prefill profiled)" in notes


@pytest.mark.parametrize("meta, said", [
    ({"dtype": "bfloat16"}, "the profile's dtype bfloat16 against the run's float32"),
    ({"quantization": "4bit"}, "the profile's quantization 4bit against the run's none"),
    ({"compile": True}, "the profile is of the compiled engine, the run eager"),
    ({"device": "cuda", "device_name": "NVIDIA H200"}, "the profile is of cuda (NVIDIA H200), the run of cpu (Some CPU)"),
    ({"device_name": "Other CPU"}, "the profile is of cpu (Other CPU), the run of cpu (Some CPU)"),
    ({"target_model": "other"}, "the profile is of other, the run of m"),
], ids=["dtype", "quantization", "compile", "device", "device-name", "target"])
def test_what_the_profile_and_the_run_differ_in_is_said(tmp_path, capsys, meta, said):
    run = folder(tmp_path / "run")
    same = {"dtype": "float32", "quantization": "none", "compile": False, "device": "cpu", "device_name": "Some CPU",
            "target_model": "m"}
    for name, values, expected in (("same.json", same, None), ("other.json", dict(same, **meta), said)):
        (tmp_path / name).write_text(json.dumps(dict(profile(), meta=values)))
        assert predict([str(run), "--costs", str(tmp_path / name)]) == 0
        out = capsys.readouterr().out
        assert ("the profile is" in out or "the profile's" in out) == (expected is not None), out
        assert expected is None or expected in out


@pytest.mark.parametrize("target, verify, draft, said", [
    # the machine ran the target's step 2x slower than profiled (1.0 s against 0.5), and the 3-token verification
    # at 1.5x a step where the profile prices it 1.2x (0.6 / 0.5): both said; the draft's c is 0.3 in both
    (0.5, 0.6, 0.15, ["the target's step at 1 row (10-token cache) ran 1.000 s in the run and is priced 0.500 s "
                      "(2.00x)", "a verification of 3 at 1 row and a 10-token cache ran 1.50x the target's step in "
                      "the run and is priced 1.20x"]),
    # the draft's c 0.3 in the run, 0.2 in the profile (0.18 / 0.9): its step said, the target's 1.11x is within 1.25
    (0.9, 1.35, 0.18, ["the draft d's 1-token step at 1 row and a 10-token cache ran 0.30x the target's step in the "
                       "run and is priced 0.20x"]),
    # within both: 1.0 / 0.9 = 1.11x, and the verification 1.5 against 1.4 / 0.9 = 1.56 (1.04x apart)
    (0.9, 1.4, 0.28, []),
], ids=["slower-and-verification-cheaper", "draft", "within"])
def test_a_profile_that_prices_the_runs_steps_otherwise_is_said(tmp_path, capsys, target, verify, draft, said):
    """The run's probes (probe(): the target's step 1.0 s, a 3-token verification 1.5 s, the draft 0.3 s) against a
    profile of the same machine that priced them otherwise."""
    run = folder(tmp_path / "run")
    data = profile(device="cpu", device_name="Some CPU")
    for step, s in zip(data["steps"], (target, verify, draft)):
        step.update(s=s, reps_s=[s, s, s])
    (tmp_path / "p.json").write_text(json.dumps(data))
    assert predict([str(run), "--costs", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert ("prices this run's steps otherwise" in out) == bool(said), out
    for fragment in said:
        assert fragment in out, out
    assert ("the target's step at" in out) == any("the target's step at" in f for f in said)
