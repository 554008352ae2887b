"""benchmarks/recommend_check.py on sweeps and recommendations written by hand: each load and context checked on the
sweep nearest its context, the ratio to the best measured, and "off" judged against the measured intervals."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRAFT = "d"


def _run(method, gamma, batch, tok_s, speedup=None, ci=None):
    label = (f"{method} batch={batch} greedy" if method == "baseline"
             else f"{method} draft={DRAFT} gamma={gamma} constant batch={batch} greedy")
    return {"method": method, "draft": None if method == "baseline" else DRAFT, "gamma": gamma,
            "batch_size": batch, "concurrency": None, "request_rate": None, "group": None, "label": label,
            "status": "ok", "metrics": {"throughput_tok_s": tok_s, "speedup": speedup, "speedup_ci95": ci}}


def _served(method, gamma, concurrency, tok_s, ratio, speedup_tput):
    run = _run(method, gamma, 1, None)
    run.update(concurrency=concurrency, label=run["label"].replace("batch=1", f"conc={concurrency}"),
               metrics={"output_tok_s": tok_s, "output_tok_s_ratio": ratio, "speedup_tput": speedup_tput,
                        "speedup_tput_ci95": [0.9, 1.0]})
    return run


def _sweep(folder: Path, prompt_tokens: list[int], runs: list[dict], served: list[dict] = ()) -> Path:
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"runs": runs, "serving": {"runs": list(served)}}))
    (folder / "samples.jsonl").write_text("".join(
        json.dumps({"method": m, "prompt_tokens": n}) + "\n" for n in prompt_tokens for m in ("baseline", "speculative")))
    return folder


def _candidate(gamma, speedup, ci):
    if gamma is None:
        return {"candidate": "off", "method": None, "gamma": None, "draft": None, "speedup": 1.0,
                "speedup_ci95": [1.0, 1.0]}
    return {"candidate": f"speculative draft={DRAFT} gamma={gamma}", "method": "speculative", "gamma": gamma,
            "draft": DRAFT, "speedup": speedup, "speedup_ci95": ci}


def _load(load, context, best, candidates, tied_with=()):
    return {"load": load, "context": context, "best": best, "tie": bool(tied_with), "tied_with": list(tied_with),
            "candidates": candidates}


def test_each_recommendation_is_checked_on_its_nearest_sweep(tmp_path):
    short = _sweep(tmp_path / "short", [70, 90], [      # mean context 80
        _run("baseline", None, 1, 10.0), _run("speculative", 2, 1, 13.0, 1.3, [1.2, 1.4]),
        _run("speculative", 4, 1, 13.2, 1.32, [1.25, 1.4]),
        _run("baseline", None, 4, 30.0), _run("speculative", 2, 4, 27.0, 0.9, [0.85, 0.95]),
        _run("speculative", 4, 4, 24.0, 0.8, [0.75, 0.85])], [
        # under load the system's tok/s and its ratio, not the per-request rate (speedup_tput) and its interval
        _served("baseline", None, 2, 5.0, 1.0, 1.0), _served("speculative", 2, 2, 5.2, 1.04, 0.97),
        _served("baseline", None, 1, 4.0, 1.0, 1.0), _served("speculative", 2, 1, 4.04, 1.01, 1.02)])
    # the long sweep's batch 1 flagged drift (the machine changed speed during its points): its miss says so
    drifted = {**_run("baseline", None, 1, 8.0), "flags": [{"code": "drift", "message": "moved by 25%"}]}
    long = _sweep(tmp_path / "long", [300], [
        drifted, _run("speculative", 2, 1, 8.4, 1.05, [0.98, 1.12]),
        _run("speculative", 4, 1, 7.6, 0.95, [0.9, 1.0])])
    k2, off = f"speculative draft={DRAFT} gamma=2", "off"
    recommend = {"loads": [
        _load("batch=1", 75, k2, [_candidate(2, 1.31, [1.2, 1.4]), _candidate(4, 1.28, [1.2, 1.36]),
                                  _candidate(None, 1, None)]),
        _load("batch=4", 75, k2, [_candidate(2, 1.02, [1.01, 1.05]), _candidate(None, 1, None)]),
        _load("batch=1", 310, off, [_candidate(2, 0.99, [0.95, 1.0]), _candidate(None, 1, None)]),
        _load("conc=2", 75, off, [_candidate(2, 0.98, None), _candidate(None, 1, None)]),
        _load("conc=4", 75, off, [_candidate(None, 1, None)]),
        _load("conc=1", 75, off, [_candidate(2, 0.97, None), _candidate(None, 1, None)])]}
    path = tmp_path / "recommend.json"
    path.write_text(json.dumps(recommend))
    out = tmp_path / "check.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "recommend_check.py"), "--recommend", path,
                             "--sweeps", short, long, "--json", out], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["rows"]
    first, second, third, fourth, fifth, sixth = rows
    # batch 1 at 75 tokens: the sweep at 80 (nearer than 300); K=2 measured 13.0 against K=4's 13.2
    assert first["sweep_context"] == 80 and abs(first["ratio"] - 13.0 / 13.2) < 1e-12 and first["within"]
    assert first["speculation_pays"] == "yes" and first["off_right"]
    # batch 4: every K measured below 1 with its interval below 1, and K=2 (27 of the target's 30) was recommended
    assert abs(second["ratio"] - 0.9) < 1e-12 and not second["within"] and second["verdict"] == "no (one reading)"
    assert second["speculation_pays"] == "no" and not second["off_right"]
    # batch 1 at 310 tokens: off (8.0) against K=2's 8.4, whose interval holds 1: a tie, so off is not wrong
    assert third["sweep_context"] == 300 and abs(third["ratio"] - 8.0 / 8.4) < 1e-12 and not third["within"]
    assert third["speculation_pays"] == "tied" and third["off_right"]
    # concurrency 2: off (5.0 tok/s) against K=2's 5.2 (1.04 without interval: speculation measured above 1)
    assert abs(fourth["ratio"] - 5.0 / 5.2) < 1e-12 and not fourth["within"]
    assert fourth["best_speedup"] == 1.04  # output_tok_s_ratio, not speedup_tput (0.97)
    assert fourth["speculation_pays"] == "yes" and not fourth["off_right"]
    assert fifth == {"load": "conc=4", "context": 75, "why": "no sweep measured it"}
    # concurrency 1: off (4.0 tok/s) against K=2's one reading of 1.01 (4.04), within the check's 3% of 1: a tie,
    # so off is not wrong there (the within check reads it 4.0 / 4.04, inside 3% too)
    assert abs(sixth["ratio"] - 4.0 / 4.04) < 1e-12 and sixth["within"]
    assert sixth["speculation_pays"] == "tied" and sixth["off_right"]
    assert third["drift"] and not first["drift"] and not second["drift"]
    assert "**no (one reading)** (drift)" in result.stdout and "**no (one reading)** |" in result.stdout
    assert ("within 3%: 2 of 5 (1 of the misses read under the sweep's drift flag); off right: 3 of 5; "
            "worst ratio 0.900") in result.stdout
    assert "| K=4: 1.32 |" in result.stdout  # a draft's chain printed as its K (13.2 tok/s against the target's 10.0)


def test_repeats_tell_a_miss_from_the_sweeps_own_noise(tmp_path):
    """Each repeat's reading gives the ratio once per repeat: a pooled miss that some repeat reads within is
    "unresolved", one that every repeat reads below is "no"."""
    runs = [_run("baseline", None, 1, 10.0), _run("speculative", 2, 1, 13.0, 1.3, [1.2, 1.4]),
            _run("speculative", 4, 1, 13.5, 1.35, [1.25, 1.45]),
            _run("baseline", None, 4, 30.0), _run("speculative", 2, 4, 27.0, 0.9, [0.85, 0.95])]
    # each repeat's batch: its tokens in 1 s (the baseline at batch 4 ran a third repeat: pairs on the two both ran)
    static = [dict(method=run["method"], draft=run["draft"], gamma=run["gamma"],
                   schedule=None if run["method"] == "baseline" else "constant", batch_size=run["batch_size"],
                   repeat=repeat, batch_index=0, new_tokens=tokens, latency_s=1.0, prompt_tokens=80)
              for run, repeats in zip(runs, ([10, 10], [12, 14], [14, 13], [30, 30, 30], [27, 27]))
              for repeat, tokens in enumerate(repeats)]
    # concurrency 2, two requests of 10 tokens a repeat: the baseline's last finishes at 5.0 s and 4.0 s (4.0 and
    # 5.0 tok/s, 40 / 9 pooled), K=2's at 4.0 s and 4.5 s (5.0 and 4.444 tok/s, 40 / 8.5 pooled)
    finishes = {"baseline": [[4.0, 5.0], [3.0, 4.0]], "speculative": [[3.0, 4.0], [4.5, 4.5]]}
    served = [_served("baseline", None, 2, 40 / 9, 1.0, 1.0), _served("speculative", 2, 2, 40 / 8.5, 1.06, 1.0)]
    folder = _sweep(tmp_path / "sweep", [80], runs, served)
    with (folder / "samples.jsonl").open("a") as f:
        f.write("".join(json.dumps(row) + "\n" for row in static))
        for method, repeats in finishes.items():
            for repeat, ends in enumerate(repeats):
                for request, end in enumerate(ends):
                    f.write(json.dumps({"method": method, "draft": None if method == "baseline" else DRAFT,
                                        "gamma": None if method == "baseline" else 2,
                                        "schedule": None if method == "baseline" else "constant", "concurrency": 2,
                                        "batch_size": 1, "repeat": repeat, "request": request, "new_tokens": 10,
                                        "arrival_s": 0.0, "first_token_s": 1.0, "finish_s": end,
                                        "prompt_tokens": 80}) + "\n")
    k2, off = f"speculative draft={DRAFT} gamma=2", "off"
    path = tmp_path / "recommend.json"
    path.write_text(json.dumps({"loads": [
        _load("batch=1", 80, k2, [_candidate(2, 1.31, [1.2, 1.4]), _candidate(None, 1, None)]),
        _load("batch=4", 80, k2, [_candidate(2, 1.02, [1.01, 1.05]), _candidate(None, 1, None)]),
        _load("conc=2", 80, off, [_candidate(None, 1, None)]),
        # the recommendation's contexts bin a sweep's length to the nearer in ratio: 80 is 80's, none is 310's
        _load("batch=1", 310, k2, [_candidate(2, 1.2, [1.1, 1.3]), _candidate(None, 1, None)])]}))
    out = tmp_path / "check.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "recommend_check.py"), "--recommend", path,
                             "--sweeps", folder, "--json", out], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    first, second, third, fourth = json.loads(out.read_text())["rows"]
    assert fourth == {"load": "batch=1", "context": 310, "why": "no sweep near context 310"}
    # batch 1: K=2 13.0 against K=4's 13.5 pooled (0.963), but 12/14 and 14/13 by repeat: the repeats disagree
    assert abs(first["ratio"] - 13.0 / 13.5) < 1e-12 and not first["within"] and first["verdict"] == "unresolved"
    assert [round(x, 6) for x in first["ratio_repeats"]] == [round(12 / 14, 6), round(14 / 13, 6)]
    # batch 4: 27 of 30 in both repeats
    assert second["verdict"] == "no" and second["ratio_repeats"] == [0.9, 0.9]
    # concurrency 2: off 40/9 against K=2's 40/8.5 pooled (0.944); by repeat 4.0 / 5.0 and 5.0 / (10 / 4.5 * 2)
    assert abs(third["ratio"] - 8.5 / 9) < 1e-12 and third["verdict"] == "unresolved"
    assert [round(x, 6) for x in third["ratio_repeats"]] == [0.8, 1.125]
    assert "within 3%: 0 of 3 (2 of the rest unresolved by the repeats)" in result.stdout
    assert "**unresolved** (repeats: 0.857, 1.077)" in result.stdout


def test_a_load_read_in_two_sweeps_pools_their_readings(tmp_path):
    """Concurrency 4 read twice at the same context, off recommended: the first sweep K=2 10.8 tok/s against the target
    alone's 10.0, the second 12.24 against 12.0. Pooled, each the geometric mean of its readings: off over K=2 is
    sqrt(10 x 12) / sqrt(10.8 x 12.24) = 1 / sqrt(1.08 x 1.02) = 0.953, a miss, but the readings disagree (0.926 and
    0.980): unresolved. K=2's speedup sqrt(1.08 x 1.02) = 1.050, no interval. Concurrency 2, read in the first
    only, as it read."""
    first = _sweep(tmp_path / "first", [80], [], [
        _served("baseline", None, 4, 10.0, 1.0, 1.0), _served("speculative", 2, 4, 10.8, 1.08, 1.0),
        _served("baseline", None, 2, 6.0, 1.0, 1.0), _served("speculative", 2, 2, 6.6, 1.1, 1.0)])
    second = _sweep(tmp_path / "second", [70, 90], [], [
        _served("baseline", None, 4, 12.0, 1.0, 1.0), _served("speculative", 2, 4, 12.24, 1.02, 1.0)])
    k2, off = f"speculative draft={DRAFT} gamma=2", "off"
    path = tmp_path / "recommend.json"
    path.write_text(json.dumps({"loads": [
        _load("conc=4", 75, off, [_candidate(2, 0.97, None), _candidate(None, 1, None)]),
        _load("conc=2", 75, k2, [_candidate(2, 1.1, None), _candidate(None, 1, None)])]}))
    out = tmp_path / "check.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "recommend_check.py"), "--recommend", path,
                             "--sweeps", first, second, "--json", out], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    four, two = json.loads(out.read_text())["rows"]
    assert four["readings"] == 2 and abs(four["ratio"] - (1.08 * 1.02) ** -0.5) < 1e-12
    assert four["verdict"] == "unresolved" and not four["within"]
    assert [round(x, 6) for x in four["ratio_repeats"]] == [round(1 / 1.08, 6), round(1 / 1.02, 6)]
    assert abs(four["best_speedup"] - (1.08 * 1.02) ** 0.5) < 1e-12 and four["speculation_pays"] == "yes"
    assert two["readings"] == 1 and abs(two["ratio"] - 1.0) < 1e-12 and two["best_speedup"] == 1.1
    assert "| conc=4 | 75 (80, 2 sweeps) |" in result.stdout and "| conc=2 | 75 (80) |" in result.stdout


def test_a_missing_folder_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "recommend_check.py"), "--recommend",
                             tmp_path / "none.json", "--sweeps", tmp_path], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "does not exist" in result.stderr
