"""python -m eval.recommend and what reads its recommend.json (#82): each bad input one line naming the file, flag or
key and the fix, exit 2; the settings each engine can load; the warnings an incomplete or far-off reading gets."""
import json
from types import SimpleNamespace

import pytest

from helpers import assert_one_clean_line
from test_recommend import folder, profile, row, run

from eval import recommend as rec


def one_line(code, capsys, fragment):
    assert_one_clean_line(SimpleNamespace(returncode=code, stderr=capsys.readouterr().err), fragment)


# ---- acceptance files (item 16) --------------------------------------------------------------------------------------

@pytest.mark.parametrize("data, fragment", [
    # true is no count (read as 1 before)
    ({"synthetic_acceptance_rates": [0.5], "num_speculative_tokens": True}, "num_speculative_tokens is true, not a count"),
    # vLLM refuses synthetic rates with its standard rejection sampler
    ({"rejection_sample_method": "standard", "synthetic_acceptance_rates": [0.5]},
     'rejection_sample_method is "standard" beside synthetic_acceptance_rates'),
    # rates 0.8, 0.8 x 0.5 = 0.4: acceptance_length 2.2, not 3.5
    ({"acceptance_rates": [0.8, 0.5], "acceptance_length": 3.5}, "acceptance_length is 3.5 but its acceptance_rates "
                                                                 "give 2.2"),
    ({"synthetic_acceptance_rates": [0.5], "acceptance_rates": [0.5]}, "has both synthetic_acceptance_rates"),
    ([0.8, 0.6], "is a JSON list; give vLLM's synthetic form"),
])
def test_an_acceptance_file_that_reads_two_ways_is_refused(tmp_path, capsys, data, fragment):
    (tmp_path / "a.json").write_text(json.dumps(data))
    profile().save(tmp_path / "p.json")
    one_line(rec.main(["--acceptance", str(tmp_path / "a.json"), "--costs", str(tmp_path / "p.json")]), capsys, fragment)


def test_an_acceptance_length_that_agrees_is_read():
    from eval import acceptance_io
    assert acceptance_io.parse({"acceptance_rates": [0.8, 0.5], "acceptance_length": 2.2,
                                "num_speculative_tokens": 2}) == ([0.8, 0.4], "specdec_bench")


# ---- the command's inputs (items 15, 17) ------------------------------------------------------------------------------

def test_a_run_dir_beside_an_acceptance_file_is_refused(tmp_path, capsys):
    # before: RUN_DIR was ignored, and with it the check of the profile's target against the run's
    run_dir = folder(tmp_path / "run", run())
    (tmp_path / "a.json").write_text(json.dumps({"synthetic_acceptance_rates": [0.5]}))
    one_line(rec.main([str(run_dir), "--acceptance", str(tmp_path / "a.json"), "--costs", str(run_dir / "costs.json")]),
             capsys, "and --acceptance " + str(tmp_path / "a.json") + ": give one")


def test_an_infinite_rate_is_named_as_such(capsys):
    with pytest.raises(SystemExit) as exit_:
        rec.main(["x", "--rate", "inf"])
    assert exit_.value.code == 2
    one_line(2, capsys, "'inf': every rate is a finite number of requests a second above 0")


@pytest.mark.parametrize("lines, fragment", [
    (["garbage"], "holds no record (a torn last line is skipped)"),  # before: "--batch needs static points"
    (['{"method": "speculative", "gamma": 2, "rounds": "x"}'], 'record 1 has rounds "x", not what launch.py writes'),
    (['{"method": "baseline", "prompt_tokens": "ten"}'], 'record 1 has prompt_tokens "ten"'),
])
def test_records_that_are_not_a_runs_are_one_line(tmp_path, capsys, lines, fragment):
    run_dir = folder(tmp_path / "run", run())
    good = (run_dir / "samples.jsonl").read_text()
    (run_dir / "samples.jsonl").write_text("\n".join(lines) + "\n" + (good if len(lines[0]) > 10 else ""))
    one_line(rec.main([str(run_dir), "--batch", "1"]), capsys, fragment)


def test_a_profile_without_its_target_is_said(tmp_path, capsys):
    run_dir = folder(tmp_path / "run", run())
    (run_dir / "config.yaml").write_text("target: {model: org/Qwen2.5-1.5B-Instruct}\ndraft: {model: d}\n")
    profile().save(tmp_path / "p.json")  # its meta names no target
    assert rec.main([str(run_dir), "--batch", "1", "--costs", str(tmp_path / "p.json")]) == 0
    notes = json.loads((run_dir / "recommend.json").read_text())["notes"]
    assert f"{tmp_path / 'p.json'} names no target_model: not checked against the run's target " \
           "(org/Qwen2.5-1.5B-Instruct); the figures price whatever model it timed" in notes


def test_an_unwritable_out_is_refused_before_anything_is_written(tmp_path, capsys):
    run_dir = folder(tmp_path / "run", run())
    one_line(rec.main([str(run_dir), "--batch", "1", "--out", str(tmp_path / "absent" / "r.json")]), capsys,
             f"cannot write {tmp_path / 'absent' / 'r.json'} (no folder {tmp_path / 'absent'}); give a writable --out")
    assert not (run_dir / "acceptance").exists()


# ---- an incomplete run (item 12) --------------------------------------------------------------------------------------

def test_an_interrupted_run_is_warned_of(tmp_path, capsys):
    # run()'s points have 2 batches each (4 rows of batch 2); 8 were planned and the run was interrupted
    run_dir = folder(tmp_path / "run", run())
    planned = {label: 8 for label in ("baseline batch=2 greedy", "speculative draft=d gamma=1 constant batch=2 greedy",
                                      "speculative draft=d gamma=2 constant batch=2 greedy")}
    (run_dir / "progress.json").write_text(json.dumps({"status": "interrupted", "planned": planned}))
    assert rec.main([str(run_dir), "--batch", "1"]) == 0
    warning = ("the run is incomplete (status interrupted; 3 point(s) short of their plan, e.g. baseline batch=2 "
               "greedy: 2 of 8)")
    assert capsys.readouterr().out.splitlines()[0].startswith("warning: " + warning)
    assert json.loads((run_dir / "recommend.json").read_text())["warnings"][0].startswith(warning)
    # finished as planned: no warning
    (run_dir / "progress.json").write_text(json.dumps({"status": "finished", "planned": {
        label: 2 for label in planned}}))
    assert rec.main([str(run_dir), "--batch", "1"]) == 0
    assert "warning" not in capsys.readouterr().out
    assert json.loads((run_dir / "recommend.json").read_text())["warnings"] == []


# ---- a recommend.json the recommended schedule reads (item 13) --------------------------------------------------------

def chain(k, speedup, **extra):
    return {"candidate": f"speculative draft=d gamma={k}", "method": "speculative", "gamma": k, "draft": "d",
            "speedup": speedup, "axes": {"method": "speculative", "draft": "d", "gamma": k}, **extra}


OFF = {"candidate": "off", "method": None, "gamma": None, "draft": None, "speedup": 1.0}


def schedule_config(tmp_path, loads):
    from utils.config import validate
    (tmp_path / "recommend.json").write_text(json.dumps({"loads": loads}))
    return validate({"target": {"model": "org/t"}, "draft": {"model": "d"},
                     "dataset": {"path": "x.jsonl", "preset": "gsm8k"}, "methods": ["baseline", "speculative"],
                     "speculative": {"schedule": ["recommended"], "recommendation": str(tmp_path / "recommend.json")}})


@pytest.mark.parametrize("loads, fragment", [
    ([1, 2], "loads[0] is 1, not a load"),  # before: an internal error, exit 1
    ([{"load": "batch=1", "context": None, "candidates": [{"candidate": "x", "gamma": 2}, OFF]}],
     "loads[0].candidates[0].speedup is null, not a predicted speedup above 0"),
    ([{"load": "batch=1", "context": None, "candidates": [chain(2, None), OFF]}], "candidates[0].speedup is null"),
    ([{"load": "batch=1", "context": None, "candidates": [chain("four", 1.2), OFF]}],
     'loads[0].candidates[0].gamma is "four", not a K'),
    ([{"load": "batch=1", "context": None, "candidates": [chain(-3, 1.2), OFF]}], "candidates[0].gamma is -3, not a K"),
    ([{"load": "batch=0", "context": None, "candidates": [chain(2, 1.2), OFF]}],
     'loads[0].load is "batch=0", not batch= a count of at least 1'),
    ([{"load": "batch=1", "context": None, "candidates": [chain(2, 1.2, speedup_ci95={"a": 1}), OFF]}],
     "candidates[0].speedup_ci95 is {\"a\": 1}, not an interval"),
])
def test_a_corrupt_recommendation_is_one_line_naming_the_file_and_key(tmp_path, loads, fragment):
    from utils.config import ConfigError
    with pytest.raises(ConfigError) as error:
        schedule_config(tmp_path, loads)
    said = str(error.value)
    assert f"speculative.recommendation: {tmp_path / 'recommend.json'}: " in said and fragment in said
    assert "\n" not in said


def test_launch_refuses_a_corrupt_recommendation_with_exit_2(tmp_path):
    import yaml

    from helpers import base_config, run_launch
    raw = base_config(tmp_path / "t", tmp_path / "d", tmp_path / "p.jsonl", methods=["baseline", "speculative"])
    (tmp_path / "r.json").write_text(json.dumps({"loads": [1, 2]}))
    raw["speculative"].update(schedule=["recommended"], recommendation=str(tmp_path / "r.json"))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    assert_one_clean_line(run_launch(["--config", tmp_path / "c.yaml"]), "loads[0] is 1, not a load")


def test_a_sound_recommendation_reads(tmp_path):
    from decode.methods.speculative import read_recommendation
    loads = [{"load": "batch=1", "context": 128, "candidates": [chain(2, 1.2, speedup_ci95=[1.1, 1.3]), OFF],
              "best": "speculative draft=d gamma=2"},
             {"load": "rate=2.0/s conc=4", "context": None, "candidates": [chain(3, 0.9), OFF], "best": "off"}]
    (tmp_path / "recommend.json").write_text(json.dumps({"loads": loads, "draft_prefill": {}}))
    assert read_recommendation(str(tmp_path / "recommend.json"))["loads"] == loads


# ---- benchmarks/recommend_check.py (item 14) --------------------------------------------------------------------------

@pytest.mark.parametrize("recommend, within, fragment", [
    ({"loads": [1, 2]}, "0.03", "r.json: loads[0] is 1, not a load"),  # before: a traceback
    ({"loads": [{"load": "batch=1", "context": None, "candidates": [chain(2, 1.2), OFF]}]}, "0.03",
     "r.json: loads[0] names no best"),
    ({"loads": []}, "-1", "'-1' is not a share from 0 up to 1"),  # before: accepted
    ({"loads": []}, "1.5", "'1.5' is not a share from 0 up to 1"),
])
def test_recommend_check_refuses_what_it_cannot_check_in_one_line(tmp_path, recommend, within, fragment):
    import subprocess
    import sys

    from helpers import ROOT
    (tmp_path / "r.json").write_text(json.dumps(recommend))
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "summary.json").write_text(json.dumps({"runs": []}))
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "recommend_check.py"), "--recommend",
                             tmp_path / "r.json", "--sweeps", tmp_path / "sweep", "--within", within],
                            capture_output=True, text=True, timeout=120)
    assert_one_clean_line(result, fragment)


# ---- the settings to paste (items 6, 7) -------------------------------------------------------------------------------

def test_sglangs_ngram_is_a_chain_of_breadth_one():
    """SGLang sets NGRAM's top-k from --speculative-ngram-max-bfs-breadth (default 10, a tree of drafts): a chain of
    K is breadth 1; its --speculative-eagle-topk would be overwritten, so it is not emitted."""
    import argparse
    import shlex

    from eval import deploy
    flags = deploy.settings({"method": "prompt_lookup", "gamma": 4, "draft": None}, {}, {"ngram_max": 2})["sglang"]
    sglang = argparse.ArgumentParser()
    for flag in ("--speculative-algorithm", "--speculative-num-steps", "--speculative-ngram-max-bfs-breadth",
                 "--speculative-num-draft-tokens"):
        sglang.add_argument(flag)
    assert vars(sglang.parse_args(shlex.split(shlex.join(flags)))) == {
        "speculative_algorithm": "NGRAM", "speculative_num_steps": "4", "speculative_ngram_max_bfs_breadth": "1",
        "speculative_num_draft_tokens": "5"}


@pytest.mark.parametrize("entry, vllm, llama, said", [
    # a hub id: vLLM's and SGLang's as it is; llama-server's a GGUF the user converts (before: the hub id, which
    # llama-server cannot load: "failed to load draft model")
    ({"model": "org/draft-0.5b", "label": "d"}, "org/draft-0.5b", "d.gguf",
     ["llama.cpp: the draft org/draft-0.5b is no GGUF file and llama-server loads GGUF only: convert it (llama.cpp's "
      "convert_hf_to_gguf.py org/draft-0.5b --outfile d.gguf) and give that file in place of d.gguf"]),
    # a GGUF file: llama-server's as it is; vLLM and SGLang a folder converted from it (before: the .gguf, which
    # vLLM refuses as a draft)
    ({"model": "/m/draft.Q4.gguf", "label": "d"}, "d-hf", "/m/draft.Q4.gguf",
     [f"{engine}: the draft /m/draft.Q4.gguf is a GGUF file and {engine} loads a transformers folder or hub id: "
      "convert it (transformers' from_pretrained(..., gguf_file=...) then save_pretrained('d-hf')), or give the "
      "model's original folder or hub id, in place of d-hf" for engine in ("vLLM", "SGLang")]),
    # a hub repository's GGUF file (gguf_file): the file inside it for llama-server, downloaded
    ({"model": "org/draft-GGUF", "gguf_file": "d.Q8.gguf", "label": "d"}, "d-hf", "org/draft-GGUF/d.Q8.gguf",
     [f"{engine}: the draft org/draft-GGUF/d.Q8.gguf is a GGUF file and {engine} loads a transformers folder or hub "
      "id: convert it (transformers' from_pretrained(..., gguf_file=...) then save_pretrained('d-hf')), or give the "
      "model's original folder or hub id, in place of d-hf" for engine in ("vLLM", "SGLang")]
     + ["llama.cpp: org/draft-GGUF/d.Q8.gguf is a file of the hub repository org/draft-GGUF; download it and give its "
        "local path"]),
])
def test_each_engine_is_given_the_draft_in_the_form_it_loads(entry, vllm, llama, said):
    from eval import deploy
    s = deploy.settings({"method": "speculative", "gamma": 3, "draft": "d"}, deploy.drafts_of({"draft": entry}))
    assert s["vllm"]["model"] == vllm
    assert s["sglang"][s["sglang"].index("--speculative-draft-model-path") + 1] == vllm
    assert s["llama_cpp"][s["llama_cpp"].index("--model-draft") + 1] == llama
    assert [n for n in s["notes"] if n.split(":")[0] in ("vLLM", "SGLang", "llama.cpp")] == \
        [n for n in said if n.startswith("vLLM")] + [n for n in said if n.startswith("SGLang")] + \
        [n for n in said if n.startswith("llama.cpp")]


def test_a_synthetic_or_offline_draft_gets_a_note(monkeypatch, tmp_path):
    from eval import deploy
    monkeypatch.setenv("SPECULATE_CACHE", str(tmp_path))
    s = deploy.settings({"method": "speculative", "gamma": 2, "draft": "d"},
                        deploy.drafts_of({"draft": {"model": "synthetic:qwen3-4b?layers=2", "label": "d"}}))
    assert [n.split(":")[0] for n in s["notes"]] == ["vLLM", "SGLang", "llama.cpp"]
    assert all("is built in the process that runs it (random weights of a shape): no server loads it" in n
               for n in s["notes"])
    offline = deploy.settings({"method": "speculative", "gamma": 2, "draft": "smollm2-135m-instruct"},
                              deploy.drafts_of({"draft": {"model": "smollm2-135m-instruct"}}))
    # vLLM and SGLang: the transformers copy our engine loaded; llama-server: the joined GGUF
    assert offline["vllm"]["model"] == str(tmp_path / "models" / "smollm2-135m-instruct")
    assert offline["llama_cpp"][offline["llama_cpp"].index("--model-draft") + 1] == \
        str(tmp_path / "models" / "smollm2-135m-instruct.gguf")
    assert "HuggingFaceTB/SmolLM2-135M-Instruct on the hub is the original" in offline["notes"][0]


# ---- loads and contexts (items 9, 10, 11) -----------------------------------------------------------------------------

def test_a_rate_measured_at_two_concurrencies_is_read_at_each(tmp_path, capsys):
    """run()'s records as a load at 2 requests/s measured at concurrency 1 and at 2: each is its own load, labelled
    with its concurrency (before: the first concurrency's point alone, as rate=2.0/s). At concurrency 1 each request
    runs alone (the batch-1 speedups: gamma 2 4.9 / 2.55); at 2 in pairs (gamma 1 6.2 / 5.1)."""
    samples = [dict(s, batch_size=None, concurrency=c, request_rate=2.0, request=s["sample_id"], arrival_s=0.0)
               for c in (1, 2) for s in run()]
    run_dir = folder(tmp_path / "run", samples)
    assert rec.main([str(run_dir), "--rate", "2"]) == 0
    loads = json.loads((run_dir / "recommend.json").read_text())["loads"]
    assert [r["load"] for r in loads] == ["rate=2.0/s conc=1", "rate=2.0/s conc=2"]
    speedups = [{c["candidate"]: c["speedup"] for c in r["candidates"]}[r["best"]] for r in loads]
    assert speedups == pytest.approx([4.9 / 2.55, 6.2 / 5.1])
    assert "| rate=2.0/s conc=1 |" in capsys.readouterr().out


def test_a_context_beyond_the_targets_positions_is_refused(tmp_path, capsys):
    # synthetic:qwen3-tiny has 512 positions; run()'s requests generate 7 tokens: at most 505
    run_dir = folder(tmp_path / "run", run())
    (run_dir / "config.yaml").write_text("target: {model: 'synthetic:qwen3-tiny'}\ndraft: {model: d}\n")
    one_line(rec.main([str(run_dir), "--batch", "1", "--context", "1000000000"]), capsys,
             "--context 1000000000: the target synthetic:qwen3-tiny has 512 positions (its max_position_embeddings) "
             "and the run's requests generate up to 7 tokens; give a context of at most 505")
    assert rec.main([str(run_dir), "--batch", "1", "--context", "505"]) == 0


def test_a_context_far_beyond_every_round_is_said_with_its_candidate(tmp_path):
    """run()'s prompts of 10 tokens: gamma 1's rounds at contexts 11, 13, 15; gamma 2's at 11, 14. At 512 every
    round falls in its one bin (12 and 8 rounds: fewer than 30, so the point's rounds, said) and each note names its
    candidate (before: "context 512: ..." with no candidate, and nothing of how far the rounds were)."""
    run_dir = folder(tmp_path / "run", run())
    assert rec.main([str(run_dir), "--batch", "1", "--context", "512"]) == 0
    notes = json.loads((run_dir / "recommend.json").read_text())["loads"][0]["notes"]
    for label, rounds, longest in (("speculative draft=d gamma=1 constant", 12, 15),
                                   ("speculative draft=d gamma=2 constant", 8, 14)):
        assert f"{label}: context 512: {rounds} rounds measured near it (fewer than 30): the point's rounds at every " \
               f"context are used; context 512: every round was measured at {longest} tokens or fewer (under 1/2 of " \
               "it): its acceptance is read from far shorter contexts" in notes
    # at 16, within twice the rounds' contexts: nothing said of how far
    assert rec.main([str(run_dir), "--batch", "1", "--context", "16"]) == 0
    notes = json.loads((run_dir / "recommend.json").read_text())["loads"][0]["notes"]
    assert not any("far shorter" in n for n in notes)


# ---- a recommendation off everywhere (item 18) ------------------------------------------------------------------------

@pytest.mark.parametrize("schedule, why", [
    ("recommended", "the recommended schedule chose K 0 in every round: by its prices the drafts do not pay at these "
                    "loads"),  # before: "the max_new_tokens budget left none"
    ("constant", "the max_new_tokens budget left none"),
    ("heuristic", "the heuristic schedule chose K 0 in every round"),
])
def test_a_schedule_that_drafted_nothing_says_why(schedule, why):
    from eval.flags import run_notes
    from eval.records import Point
    point = Point(method="speculative", batch_size=1, draft="d", gamma=2, schedule=schedule)
    run = {"batches": {"done": 2, "paired": 2, "planned": 2}, "status": "ok"}
    notes = run_notes(run, point, {"rounds": 12, "acceptance_rate": None, "speedup": 1.0}, {}, "baseline")
    assert notes == [f"{point.label}: no round drafted a token ({why}): acceptance figures, alpha and the prediction "
                     "are null"]


@pytest.mark.parametrize("served", [False, True], ids=["static", "served"])
def test_a_round_that_drafted_nothing_adds_no_draft_seconds(served):
    """max_new_tokens 2: the prefill's token, then one round with one token left, in which no row drafts and the draft
    model runs no forward (as where a schedule turns every row off): the rows' draft seconds are their draft prefill's
    alone, the round's seconds the target's (before: the round's time before its verification was added as draft)."""
    import torch

    from decode import DraftModelDrafter, Generation, Sampling, generate_speculative
    from decode.arrivals import Load
    from tiny_models import VOCAB, noisy_copy, ragged_batch, tiny_model
    target = tiny_model("llama", seed=1)
    ids, mask = ragged_batch([5, 7])
    with torch.inference_mode():
        records = generate_speculative(target, DraftModelDrafter(noisy_copy(target, 0.05), VOCAB, Sampling()), ids,
                                       mask, Generation(max_new_tokens=2), 3,
                                       load=Load([0.0, 0.0], 2) if served else None)
    for record in records:
        assert [r["drafted"] for r in record.rounds] == [0]
        assert record.draft_s == record.draft_prefill_s and record.target_s > 0


def test_a_recommendation_off_everywhere_says_why(tmp_path, capsys):
    # a draft step of 2.0 s: batch 1 gamma 1 8.85 s against off's 4.9 s (0.554x), gamma 2 10.15 s; batch 2 gamma 1
    # 10.8 s against 6.2 s (0.574x), gamma 2 13.1 s (test_recommend.py test_off_where_speculation_is_slower)
    run_dir = folder(tmp_path / "run", run(), profile(draft=2.0))
    assert rec.main([str(run_dir), "--batch", "1,2"]) == 0
    # no interval (4 batches): no tie with off (a tie without intervals is within 5%)
    said = ("off at every load and context asked: no candidate's predicted speedup is above the target alone's; the "
            f"closest, speculative draft=d gamma=1 constant, at {6.2 / 10.8:.2f}x; none ties with off (each interval "
            "below 1, or without one more than 5% below): the drafts do not pay at these loads")
    assert said in json.loads((run_dir / "recommend.json").read_text())["notes"]
    assert f"- {said}" in capsys.readouterr().out.splitlines()
    assert rec.off_everywhere([{"best": "x", "candidates": []}]) == []
    # a candidate whose interval reaches 1 ties with off: not said to lose
    tied = [{"load": "batch=1", "context": None, "best": rec.OFF, "tied_with": ["k1"],
             "candidates": [{"candidate": "k1", "speedup": 0.92, "speedup_ci95": [0.78, 1.06]},
                            {"candidate": rec.OFF, "speedup": 1.0}]}]
    assert rec.off_everywhere(tied) == [
        "off at every load and context asked: no candidate's predicted speedup is above the target alone's; the "
        "closest, k1, at 0.92x [0.78, 1.06]; at batch=1 candidates tie with off (their intervals reach 1): off is "
        "chosen on the tie, the drafts are not shown to lose there"]
