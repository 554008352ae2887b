"""python -m eval.recommend (#55) against choices worked out by hand: two K at two static loads with given step costs
and rounds, "off" where speculation is slower, a tie; K derived below a measured one; rounds binned by context; the
emitted settings parsed back; an acceptance exported and read back giving the same prediction; bad input in one
line."""
import argparse
import json
import shlex
from types import SimpleNamespace

import pytest

from eval import acceptance_io, deploy
from eval import recommend as rec
from eval.costs import Profile, TARGET, draft_model
from eval.deploy import TARGETS, AcceptanceForm, Settings, Target

# Target steps (seconds) at 1 and 2 rows by width (tokens a row feeds); the draft's step; prefills 0.01 s a target
# token-row and 0.005 s a draft token-row. The kv axis is flat (one cache).
STEPS = {1: {1: 0.8, 2: 0.9, 3: 1.0}, 2: {1: 1.0, 2: 1.5, 3: 2.4}}


def profile(draft=0.1, steps=None) -> Profile:
    steps = steps or STEPS
    points = [(TARGET, rows, width, s) for rows, by in steps.items() for width, s in by.items()]
    points += [(draft_model("d"), rows, 1, draft) for rows in steps]
    prefills = [(TARGET, 1, 10, 0.1), (TARGET, 2, 10, 0.2), (draft_model("d"), 1, 10, 0.05),
                (draft_model("d"), 2, 10, 0.1)]
    return Profile(steps=[{"model": m, "rows": r, "width": w, "kv": 100, "s": s, "reps_s": [s]} for m, r, w, s in points],
                   prefills=[{"model": m, "rows": r, "tokens": t, "s": s, "reps_s": [s]} for m, r, t, s in prefills])


def row(method, index, gamma=None, rounds=None, prompt=10, new_tokens=7):
    """A static record at batch size 2 (two rows a batch): 7 tokens, 6 after the first."""
    r = {"method": method, "batch_size": 2, "draft": "d" if gamma else None, "gamma": gamma,
         "schedule": "constant" if gamma else None, "sample_id": index, "repeat": 0, "batch_index": index // 2,
         "prompt_tokens": prompt, "new_tokens": new_tokens, "latency_s": 5.0, "prefill_s": 0.1}
    if rounds is not None:
        r["rounds"] = [{"drafted": d, "accepted": a, "emitted": a + 1} for d, a in rounds]
    return r


def run(requests=4) -> list[dict]:
    """Four requests: the baseline; gamma 1 accepting every draft (3 rounds of 2 tokens); gamma 2 accepting every
    draft (2 rounds of 3 tokens)."""
    return ([row("baseline", i) for i in range(requests)] + [row("speculative", i, 1, [(1, 1)] * 3) for i in range(requests)]
            + [row("speculative", i, 2, [(2, 2)] * 2) for i in range(requests)])


G1, G2 = "speculative draft=d gamma=1 constant", "speculative draft=d gamma=2 constant"


def by_candidate(result) -> dict:
    return {c["candidate"]: c for c in result["candidates"]}


def test_two_ks_at_two_loads_by_hand():
    results, _ = rec.recommend(run(), profile(), [("batch", 1), ("batch", 2)])
    one, two = results
    # batch 1, a request alone: prefill 0.1 (+ the draft's 0.05), then
    #   baseline 6 steps x 0.8 = 4.9 s; gamma 1: 3 rounds x (0.1 + 0.9) -> 3.15 s; gamma 2: 2 x (0.2 + 1.0) -> 2.55 s
    assert {k: c["speedup"] for k, c in by_candidate(one).items()} == pytest.approx(
        {G1: 4.9 / 3.15, G2: 4.9 / 2.55, rec.OFF: 1.0})
    assert (one["best"], one["runner_up"], one["tie"]) == (G2, G1, False)
    assert one["margin"] == pytest.approx(3.15 / 2.55)  # 1.235
    assert by_candidate(one)[G2]["latency_s"] == pytest.approx(2.55)
    assert by_candidate(one)[rec.OFF]["tok_s"] == pytest.approx(28 / 19.6)  # 4 x 7 tokens in 4 x 4.9 s
    # batch 2, two rows a batch: prefill 0.2 (+ 0.1), then baseline 6 x 1.0 -> 6.2 s; gamma 1: 3 x (0.1 + 1.5) -> 5.1 s;
    # gamma 2: 2 x (0.2 + 2.4) -> 5.5 s: the wider verification costs more at 2 rows, and K flips
    assert {k: c["speedup"] for k, c in by_candidate(two).items()} == pytest.approx(
        {G1: 6.2 / 5.1, G2: 6.2 / 5.5, rec.OFF: 1.0})
    assert (two["best"], two["runner_up"], two["tie"]) == (G1, G2, False)
    assert two["margin"] == pytest.approx(5.5 / 5.1)  # 1.078: above the 5% a prediction without interval ties within
    # K differs by batch size: one setting per batch size, each with its own K
    emitted = rec.settings_of(results, {"draft": {"model": "org/draft-0.5b"}})
    assert {load: s["vllm"]["num_speculative_tokens"] for load, s in emitted.items()} == {"batch=1": 2, "batch=2": 1}


def test_tokens_per_round_by_hand():
    """Each candidate's tokens a row commits per round (the schedule's price of a round with the speedup): over the
    rounds that drafted its K, all of them where none did."""
    rounds = row("speculative", 0, 3, [(3, 3), (3, 0), (3, 1), (1, 1)])  # 4, 1, 2 tokens; the last cut short (2)
    assert rec.tokens_per_round([rounds], 3) == pytest.approx(7 / 3)
    assert rec.tokens_per_round([rounds], 5) == pytest.approx(9 / 4)
    assert rec.tokens_per_round([row("baseline", 0)], None) is None
    # a round dealt short by a row's tokens counts as the round it was dealt: rows of 4 tokens (3 after the first)
    # from rounds of 4 and 1 tokens: the first row's 4 is cut to 3, the second's 1 then 4 cut to 2: (4 + 1 + 4) / 3
    # (leaving the cut ones out, 1.0; counting them as cut, 2.0)
    pool = [{"drafted": 3, "accepted": 3, "emitted": 4}, {"drafted": 3, "accepted": 0, "emitted": 1}]
    dealt = rec.dealt([row("speculative", i, 3, new_tokens=4) for i in range(2)], pool)
    assert [r["emitted"] for s in dealt for r in s["rounds"]] == [3, 1, 2]
    assert rec.tokens_per_round(dealt, 3) == pytest.approx(3.0)
    # nor one an EOS cut (2 accepted, 2 emitted)
    assert rec.tokens_per_round([row("speculative", 0, 3, [(3, 3)]) | {"rounds": [
        {"drafted": 3, "accepted": 3, "emitted": 4}, {"drafted": 3, "accepted": 2, "emitted": 2}]}], 3) == 4.0
    # the decode speedup is tokens a second on each side: 2 rows of 4 decode tokens in 1 + 3 s against 2 of 10 in 8 s
    # (a sampled run's rows stopping at EOS sooner) is 2.0 / 2.5 = 0.8, not 8 / 4 = 2; no time, no figure
    parts = {"draft_steps_s": 1.0, "verifications_s": 3.0, "baseline_steps_s": 8.0}
    ours, theirs = [row("speculative", i, 3, new_tokens=5) for i in range(2)], [row("baseline", i, new_tokens=11)
                                                                             for i in range(2)]
    assert rec.decode_speedup(parts, ours, theirs) == pytest.approx(0.8)
    assert rec.decode_speedup(dict(parts, verifications_s=-1.0), ours, theirs) is None
    assert rec.decode_speedup(None, ours, theirs) is None
    # and from the replay (the round's cost in plain steps is tokens / it): batch 1, the baseline's 6 steps of 0.8 s
    # against gamma 1's 3 rounds of 0.1 + 0.9 s and gamma 2's 2 of 0.2 + 1.0 s; at concurrency 1 the same
    served = [dict(s, batch_size=None, concurrency=2, request=s["sample_id"], arrival_s=0.0) for s in run()]
    for load, records in ((("batch", 1), run()), (("concurrency", 1), served)):
        results, _ = rec.recommend(records, profile(), [load])
        assert {k: c.get("tokens_per_round") for k, c in by_candidate(results[0]).items()} == {
            G1: 2.0, G2: 3.0, rec.OFF: None}
        assert {k: c.get("decode_speedup") for k, c in by_candidate(results[0]).items() if k != rec.OFF} == \
            pytest.approx({G1: 4.8 / 3.0, G2: 4.8 / 2.4}), load


def test_off_where_speculation_is_slower():
    results, _ = rec.recommend(run(), profile(draft=2.0), [("batch", 1), ("batch", 2)])
    # batch 1: gamma 1 0.15 + 3 x (2.0 + 0.9) = 8.85 s, gamma 2 0.15 + 2 x (4.0 + 1.0) = 10.15 s, off 4.9 s
    # batch 2: gamma 1 0.3 + 3 x (2.0 + 1.5) = 10.8 s, gamma 2 0.3 + 2 x (4.0 + 2.4) = 13.1 s, off 6.2 s
    assert [(r["best"], r["runner_up"]) for r in results] == [(rec.OFF, G1), (rec.OFF, G1)]
    assert [r["margin"] for r in results] == pytest.approx([8.85 / 4.9, 10.8 / 6.2])
    emitted = rec.settings_of(results, {})
    assert emitted == {"all": {"vllm": None, "sglang": [], "llama_cpp": [], "no_equivalent": {}, "notes": []}}


def test_a_tie_is_said_as_a_tie():
    steps = {1: {1: 0.8, 2: 0.9, 3: 1.325}, 2: STEPS[2]}
    results, _ = rec.recommend(run(), profile(steps=steps), [("batch", 1)])
    # gamma 1: 3.15 s as above; gamma 2: 0.15 + 2 x (0.2 + 1.325) = 3.2 s: within 5% of each other, no interval (4 batches)
    (one,) = results
    assert (one["best"], one["tie"], one["tied_with"]) == (G1, True, [G2])
    assert one["margin"] == pytest.approx(3.2 / 3.15)
    assert "tie with " + G2 in rec.table(results)


@pytest.mark.parametrize("a, b, tie", [([1.1, 1.3], [1.25, 1.4], True), ([1.1, 1.2], [1.21, 1.4], False),
                                       ([0.9, 1.02], [1.0, 1.0], True), ([1.03, 1.2], [1.0, 1.0], False)])
def test_intervals_that_overlap_tie(a, b, tie):
    assert rec.tied({"speedup": sum(a) / 2, "speedup_ci95": a}, {"speedup": sum(b) / 2, "speedup_ci95": b}) is tie


def test_a_k_not_measured_is_derived_below_a_measured_one():
    # gamma 3: accepts 3 (4 tokens: the 4th the target's bonus, never proposed), then 1 of 3 (2 tokens): 6 tokens.
    # The draft agreed at positions 0-2, position 3 is unknown, agreed at 4, disagreed at 5.
    rounds = [{"drafted": 3, "accepted": 3, "emitted": 4}, {"drafted": 3, "accepted": 1, "emitted": 2}]
    assert rec.agreements(rounds) == [True, True, True, None, True, False]
    # K 2, the bonus position agreeing: 0-1 accepted (3 tokens), then 3-4 accepted (3 tokens, the 6th the bonus)
    assert rec.derived_rounds(rounds, 2, bonus=1.0) == [{"drafted": 2, "accepted": 2, "emitted": 3}] * 2
    # the bonus position disagreeing: 0-1 (3 tokens), 3 rejected (1 token), then 1 token left to draft at 4: accepted
    assert rec.derived_rounds(rounds, 2, bonus=0.0) == [{"drafted": 2, "accepted": 2, "emitted": 3},
                                                        {"drafted": 2, "accepted": 0, "emitted": 1},
                                                        {"drafted": 1, "accepted": 1, "emitted": 2}]
    # K 1: 3 rounds accepting 1 (2 tokens each) cover the 6 tokens
    assert rec.derived_rounds(rounds, 1, bonus=1.0) == [{"drafted": 1, "accepted": 1, "emitted": 2}] * 3
    samples = [row("baseline", 0)] + [dict(row("speculative", 0, 3), rounds=rounds)]
    cands, _, notes, derived = rec.candidates(samples)
    assert sorted(rec.label_of(k) for k in derived) == ["speculative draft=d gamma=1 constant",
                                                        "speculative draft=d gamma=2 constant"]
    assert any("gamma=2" in n and "derived from gamma=3" in n for n in notes)


def test_a_derived_k_starts_its_rounds_where_its_own_rounds_end():
    # gamma 4: rejects at once (1 token), accepts 4 (5 tokens), accepts 1 of 4 (2 tokens): 8 tokens, agreements
    # F T T T T ? T F. K 2 runs: position 0 rejected (1 token); 1-2 accepted (3); 4 and the bonus position 5 accepted
    # (3); the last token, nothing left to draft (1): 4 rounds, as the engine would run them. Each measured round's
    # first 2 (each starting after a correction) made 5: (2,0,1), (2,2,3), (2,1,2), (2,0,1), (2,0,1).
    rounds = [{"drafted": 4, "accepted": a, "emitted": e} for a, e in ((0, 1), (4, 5), (1, 2))]
    assert rec.derived_rounds(rounds, 2, bonus=1.0) == [
        {"drafted": 2, "accepted": 0, "emitted": 1}, {"drafted": 2, "accepted": 2, "emitted": 3},
        {"drafted": 2, "accepted": 2, "emitted": 3}, {"drafted": 0, "accepted": 0, "emitted": 1}]
    # a row that stopped at its EOS: the engine's cap counts from max_new_tokens, so its last round still drafts 2
    assert rec.derived_rounds(rounds, 2, bonus=1.0, to_length=False)[-1] == {"drafted": 2, "accepted": 0,
                                                                             "emitted": 1}
    # the bonus chance: full rounds that accepted their last draft, given all before (2 of the 3 reaching it here),
    # by the rule of succession: (2 + 1) / (3 + 2)
    rows = [dict(row("speculative", 0, 4), rounds=[{"drafted": 4, "accepted": a, "emitted": a + 1} for a in (4, 3, 4)])]
    assert rec.deep_acceptance(rows) == pytest.approx(3 / 5)
    # none reaching it: the whole acceptance, smoothed: (1 + 1) / (4 + 2)
    rows = [dict(row("speculative", 0, 4), rounds=[{"drafted": 4, "accepted": 1, "emitted": 2}])]
    assert rec.deep_acceptance(rows) == pytest.approx(2 / 6)


def test_a_round_capped_by_the_tokens_left_is_still_a_chain():
    # 7 tokens, 6 after the first: gamma 3 accepts 3 (4 tokens), then 2 tokens are left: the engine drafts 1 (it
    # accepts it, 2 tokens). Before, such a row was no chain: no K derived and no acceptance exported on any real run.
    capped = row("speculative", 0, 3, [(3, 3), (1, 1)])
    assert rec.chain([capped])
    assert not rec.chain([row("speculative", 0, 3, [(3, 3), (2, 1)])])  # 2 drafted with 2 left: not the cap
    assert not rec.chain([dict(capped, schedule="cost_model")])  # K chosen per round: no one K's acceptance
    _, _, _, derived = rec.candidates([row("baseline", 0), capped])
    assert len(derived) == 2
    # the capped round says nothing of positions 2 and 3: r = [2/2, 1/1, 1/1], not [1, 1/2, 1/2]
    assert acceptance_io.position_rates(capped["rounds"], 3) == [1.0, 1.0, 1.0]
    two = [{"drafted": 2, "accepted": 2}, {"drafted": 2, "accepted": 0}, {"drafted": 1, "accepted": 1}]
    # c1 = 2/3, c2 = 1 / 1 (only the first round drafted a second and had its first accepted): r = [2/3, 2/3]
    assert acceptance_io.position_rates(two, 2) == pytest.approx([2 / 3, 2 / 3])


def test_rounds_are_binned_by_context(monkeypatch):
    # A: prompt 10, rounds at contexts 11 (3 tokens) and 14; B: prompt 40, rounds at 41 and 43
    a = row("speculative", 0, 2, [(2, 2), (2, 0)], prompt=10, new_tokens=5)
    b = row("speculative", 1, 2, [(2, 1), (2, 1)], prompt=40, new_tokens=5)
    assert rec.round_contexts(a) == [11, 14] and rec.round_contexts(b) == [41, 43]
    binned = rec.bin_rounds([a, b], [16, 64])  # the bins meet at 32, the geometric mean
    assert [r["accepted"] for r in binned[16]] == [2, 0] and [r["accepted"] for r in binned[64]] == [1, 1]
    monkeypatch.setattr(rec, "MIN_BIN_ROUNDS", 2)
    base = [row("baseline", 0, new_tokens=5), row("baseline", 1, new_tokens=5)]
    mine, theirs, note = rec.at_context([a, b], base, 64, binned)
    # at 64 both requests take B's rounds (2 tokens each), prompts 64 wide; the baseline's prompts too
    assert note is None and [[r["accepted"] for r in s["rounds"]] for s in mine] == [[1, 1], [1, 1]]
    assert [s["prompt_tokens"] for s in mine + theirs] == [64] * 4
    monkeypatch.setattr(rec, "MIN_BIN_ROUNDS", 3)
    _, _, note = rec.at_context([a, b], base, 64, binned)
    assert "2 rounds measured near it" in note


def test_the_emitted_settings_parse_back():
    drafts = deploy.drafts_of({"draft": [{"model": "org/draft-0.5b"}, {"model": "/heads/e3", "kind": "eagle3",
                                                                         "label": "head"}]})
    s = deploy.settings({"method": "speculative", "gamma": 3, "draft": "draft-0.5b"}, drafts)
    text = "\n".join(deploy.lines({"all": s}))
    vllm_line = next(line for line in text.splitlines() if "vLLM:" in line)
    words = shlex.split(vllm_line.split("vLLM:", 1)[1])
    assert words[0] == "--speculative-config"
    assert json.loads(words[1]) == {"method": "draft_model", "model": "org/draft-0.5b", "num_speculative_tokens": 3}
    sglang = argparse.ArgumentParser()
    for flag in ("--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
                 "--speculative-eagle-topk", "--speculative-num-draft-tokens"):
        sglang.add_argument(flag)
    line = next(line for line in text.splitlines() if "SGLang:" in line)
    parsed = sglang.parse_args(shlex.split(line.split("SGLang:", 1)[1]))
    assert vars(parsed) == {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": "org/draft-0.5b",
                            "speculative_num_steps": "3", "speculative_eagle_topk": "1",
                            "speculative_num_draft_tokens": "4"}
    # llama-server b11434's own flag names (common/arg.cpp); --draft-max and --draft-min were removed there
    llama = argparse.ArgumentParser()
    for flag in ("--spec-type", "--model-draft", "--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min",
                 "--spec-ngram-simple-size-n", "--spec-ngram-simple-size-m"):
        llama.add_argument(flag)
    line = next(line for line in text.splitlines() if "llama.cpp:" in line)
    assert {k: v for k, v in vars(llama.parse_args(shlex.split(line.split("llama.cpp:", 1)[1]))).items() if v} == {
        "spec_type": "draft-simple", "model_draft": "draft-0.5b.gguf", "spec_draft_n_max": "3",
        "spec_draft_n_min": "3", "spec_draft_p_min": "0"}  # the hub id converted, as its note says (llama.cpp: GGUF)
    # prompt lookup: vLLM's n-gram, SGLang's NGRAM, llama.cpp's ngram-simple (a 2-token lookup, 4 drafted)
    lookup = deploy.settings({"method": "prompt_lookup", "gamma": 4, "draft": None}, drafts, {"ngram_max": 2})
    assert lookup["vllm"] == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                              "prompt_lookup_max": 2}
    assert lookup["sglang"][:2] == ["--speculative-algorithm", "NGRAM"]
    assert {k: v for k, v in vars(llama.parse_args(lookup["llama_cpp"])).items() if v} == {
        "spec_type": "ngram-simple", "spec_ngram_simple_size_n": "2", "spec_ngram_simple_size_m": "4"}


@pytest.mark.parametrize("choice, vllm, sglang, llama_cpp", [
    # hybrid: no engine has it (before: vLLM's config with an invented method "hybrid")
    ({"method": "hybrid", "gamma": 4, "draft": "draft-0.5b"}, None, None, None),
    # a tree: not one chain of K (before: emitted as a chain, its tree dropped)
    ({"method": "speculative", "gamma": 4, "draft": "draft-0.5b", "tree": "2x2"}, None, None, None),
    # EAGLE-3: vLLM's eagle3 with the head, SGLang's EAGLE3; llama.cpp's needs its own GGUF of the head
    ({"method": "eagle3", "gamma": 3, "draft": "head"}, {"method": "eagle3", "model": "/heads/e3",
                                                         "num_speculative_tokens": 3}, "EAGLE3", None),
    # suffix: vLLM's suffix (Arctic Inference); neither SGLang nor llama.cpp has it
    ({"method": "suffix", "gamma": 5, "draft": None}, {"method": "suffix", "num_speculative_tokens": 5}, None, None),
    ({"method": "early_exit", "gamma": 2, "draft": None}, None, None, None),
])
def test_each_method_gets_its_settings_or_no_equivalent_with_a_reason(choice, vllm, sglang, llama_cpp):
    drafts = deploy.drafts_of({"draft": [{"model": "org/draft-0.5b"}, {"model": "/heads/e3", "kind": "eagle3",
                                                                         "label": "head"}]})
    s = deploy.settings(choice, drafts)
    assert s["vllm"] == vllm and (s["sglang"] or [None, None])[1] == sglang and s["llama_cpp"] == llama_cpp
    assert sorted(s["no_equivalent"]) == sorted(e for e, v in (("vllm", vllm), ("sglang", sglang),
                                                               ("llama_cpp", llama_cpp)) if v is None)
    assert all(s["no_equivalent"].values())
    text = "\n".join(deploy.lines({"all": s}))
    assert "speculation off" not in text and text.count("no equivalent: ") == len(s["no_equivalent"])


def folder(tmp_path, samples, prof=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (prof or profile()).save(tmp_path / "costs.json")
    (tmp_path / "config.yaml").write_text("draft: {model: org/draft-0.5b, label: d}\n")
    return tmp_path


def test_the_command_and_an_exported_acceptance_read_back(tmp_path, capsys):
    # gamma 2 over 4 requests of 6 tokens: 12 rounds, 4 accepting 2, 4 accepting 1, 4 none: r1 = 8/12, r2 = 4/12
    samples = [row("baseline", i) for i in range(4)] + [
        row("speculative", i, 2, rounds) for i, rounds in enumerate([[(2, 2), (2, 2)], [(2, 2), (2, 2)],
                                                                     [(2, 1)] * 3, [(2, 1)] + [(2, 0)] * 4])]
    run_dir = folder(tmp_path / "run", samples)
    assert rec.main([str(run_dir), "--batch", "1,2"]) == 0
    out = capsys.readouterr().out
    assert "settings, ready to paste:" in out and "--speculative-config" in out
    written = json.loads((run_dir / "recommend.json").read_text())
    assert [r["load"] for r in written["loads"]] == ["batch=1", "batch=2"]
    # the draft's prefill line: 0.05 s at 10 row-tokens, 0.1 s at 20
    line = written["draft_prefill"]["draft:d"]
    assert line["intercept_s"] == pytest.approx(0.0, abs=1e-12) and line["s_per_row_token"] == pytest.approx(0.005)
    files = written["exported_acceptance"]["speculative draft=d gamma=2 constant"]
    vllm = json.loads(open(files["vllm"]).read())
    assert vllm == {"rejection_sample_method": "synthetic", "num_speculative_tokens": 2,
                    "synthetic_acceptance_rates": [0.666667, 0.333333]}
    specdec = json.loads(open(files["specdec_bench"]).read())
    assert specdec == {"num_speculative_tokens": 2, "acceptance_rates": [0.666667, 0.5], "acceptance_length": 2.0}
    # each file read back, with the profile, gives the same prediction as the rates in memory
    expected, _ = rec.recommend(rec.imported_samples([2 / 3, 1 / 3], profile(), 10, 7, [("batch", 2)]), profile(),
                                [("batch", 2)])
    assert open(files["llama_cpp"]).read() == ("--spec-type draft-simple --spec-draft-n-max 2 --spec-draft-n-min 2 "
                                               "--spec-draft-p-min 0 --spec-synth-rates 0.666667,0.333333\n")
    for form in ("vllm", "specdec_bench", "llama_cpp"):
        out_file = tmp_path / f"{form}.json"
        assert rec.main(["--acceptance", files[form], "--costs", str(run_dir / "costs.json"), "--batch", "2",
                         "--prompt-tokens", "10", "--new-tokens", "7", "--out", str(out_file)]) == 0
        loads = json.loads(out_file.read_text())["loads"]
        assert [(c["candidate"], c["speedup"]) for c in loads[0]["candidates"]] == \
            [(c["candidate"], pytest.approx(c["speedup"])) for c in expected[0]["candidates"]]
    # the pool the rates are laid out as has their shares (to 4 decimals): 0.3333 accept none, 0.3334 one, 0.3333 two
    pool = acceptance_io.synthetic_rounds([2 / 3, 1 / 3])
    assert [sum(r["accepted"] == j for r in pool) for j in range(3)] == [3333, 3334, 3333]


def bad_runs(tmp_path):
    return {"no folder": [str(tmp_path / "absent")],
            "no speculative point": [str(folder(tmp_path / "base", [row("baseline", i) for i in range(2)]))],
            "a load not priced": [str(folder(tmp_path / "r3", run())), "--batch", "3"],
            "concurrency of a static run": [str(folder(tmp_path / "r4", run())), "--concurrency", "2"],
            "a rate not measured": [str(folder(tmp_path / "r5", [dict(s, batch_size=None, concurrency=2, request_rate=2.0,
                                                                       request=s["sample_id"], arrival_s=0.0)
                                                                  for s in run()])), "--rate", "3"],
            "acceptance without costs": ["--acceptance", str(tmp_path / "a.json")],
            # an older folder (docs/sample-report, docs/load-benchmark): its probes timed no prefill
            "a profile without prefill": [str(folder(tmp_path / "r6", run(), Profile(steps=profile().steps)))],
            "not an acceptance": ["--acceptance", str(tmp_path / "bad.json"), "--costs", str(tmp_path / "p.json")]}


@pytest.mark.parametrize("case, fragment", [
    ("no folder", "has no samples.jsonl"), ("no speculative point", "no speculative point"),
    ("a load not priced", "batch=3 cannot be priced"), ("concurrency of a static run", "needs load points"),
    ("a rate not measured", "--rate 3.0: the run measured rates [2.0]"), ("acceptance without costs", "needs --costs"), ("not an acceptance", "neither synthetic_acceptance_rates"),
    ("a profile without prefill", "lacks the target's prefill (no prefill profiled): give --costs PROFILE.json of a "
                                  "profile with it (python -m runner.profile --config ")])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, case, fragment):
    (tmp_path / "bad.json").write_text(json.dumps({"rates": [0.5]}))
    profile().save(tmp_path / "p.json")
    code = rec.main(bad_runs(tmp_path)[case])
    err = capsys.readouterr().err
    from helpers import assert_one_clean_line
    assert_one_clean_line(SimpleNamespace(returncode=code, stderr=err), fragment)


@pytest.mark.parametrize("text, fragment", [
    ('{"synthetic_acceptance_rates": [1.2, 0.5]}', "not a list of rates in [0, 1]"),
    ('{"synthetic_acceptance_rates": [0.5, 0.7]}', "rise"),
    ('{"synthetic_acceptance_rates": []}', "not a list of rates"),
    ('{"acceptance_rates": [0.9, 1.5]}', "not a list of rates in [0, 1]"),
    ("", "not a list of rates"),
    ("--spec-synth-rates 0.5,0.7", "rises"),
    ("--spec-draft-n-max 3 --spec-synth-rates 0.8,0.6", "--spec-draft-n-max is 3 but it has 2 rates"),
    ("--spec-synth-rates 0.8,x", "not a list of rates"),
])
def test_a_bad_acceptance_file_is_one_line_and_exit_2(tmp_path, capsys, text, fragment):
    (tmp_path / "a").write_text(text)
    profile().save(tmp_path / "p.json")
    code = rec.main(["--acceptance", str(tmp_path / "a"), "--costs", str(tmp_path / "p.json")])
    from helpers import assert_one_clean_line
    assert_one_clean_line(SimpleNamespace(returncode=code, stderr=capsys.readouterr().err), fragment)


def test_llama_cpps_bare_rates_read_back():
    assert TARGETS["llama_cpp"].acceptance.parse("0.8,0.6\n", "f") == [0.8, 0.6]


def test_an_engine_without_the_choice_gets_the_best_it_runs():
    # hybrid 1.5x (no engine runs it), prompt lookup 1.3x (vLLM and SGLang run it, llama.cpp as ngram-simple),
    # eagle3 1.4x (vLLM and SGLang; not llama.cpp), off
    def cand(name, method, speedup, gamma=4, draft=None):
        return {"candidate": name, "speedup": speedup,
                "axes": {"method": method, "gamma": gamma, "draft": draft} if method else None}
    result = {"load": "batch=1", "context": None, "best": "hybrid",
              "candidates": [cand("hybrid", "hybrid", 1.5, draft="d"), cand("eagle3", "eagle3", 1.4, 3, "head"),
                             cand("lookup", "prompt_lookup", 1.3), cand(rec.OFF, None, 1.0)]}
    config = {"draft": [{"model": "org/d", "label": "d"}, {"model": "/heads/e3", "kind": "eagle3", "label": "head"}]}
    s = rec.settings_of([result], config)["all"]
    assert s["vllm"]["method"] == "eagle3" and s["sglang"][1] == "EAGLE3"  # the next best, 1.4x
    assert s["llama_cpp"][:2] == ["--spec-type", "ngram-simple"]  # llama.cpp runs no eagle3 here: lookup, 1.3x
    assert s["no_equivalent"] == {} and len(s["notes"]) == 3
    assert "llama_cpp: hybrid has no equivalent" in s["notes"][2] and "lookup (1.30x against 1.50x)" in s["notes"][2]


def test_a_profile_of_another_target_is_refused(tmp_path, capsys):
    run_dir = folder(tmp_path / "run", run())
    (run_dir / "config.yaml").write_text("target: {model: org/Qwen2.5-1.5B-Instruct}\ndraft: {model: d}\n")
    other = profile()
    other.meta = {"target_model": "synthetic:qwen3-4b?layers=6"}
    other.save(tmp_path / "other.json")
    code = rec.main([str(run_dir), "--batch", "1", "--costs", str(tmp_path / "other.json")])
    from helpers import assert_one_clean_line
    assert_one_clean_line(SimpleNamespace(returncode=code, stderr=capsys.readouterr().err),
                          "profiles the target synthetic:qwen3-4b?layers=6, the run measured org/Qwen2.5-1.5B-Instruct")
    # synthetic shapes of the same architecture, or the same model elsewhere, are the same target
    for name in ("synthetic:qwen2.5-1.5b", "/models/qwen2.5-1.5b-instruct"):
        rec.check_target({"target_model": name}, {"target_model": "org/Qwen2.5-1.5B-Instruct"}, tmp_path)


def test_a_context_the_profile_did_not_time_is_said():
    # the tests' profile times every step at one cache (100 tokens): no context changes a step's cost
    assert "one cache (100 tokens)" in rec.context_notes(profile(), [512])[0]
    two = profile()
    two.steps += [dict(s, kv=400) for s in two.steps]  # caches 100 and 400
    assert rec.context_notes(two, [100, 400]) == []
    assert rec.context_notes(two, [50, 1600]) == [
        "context 50: below the profile's caches (100-400 tokens): its steps are extrapolated",
        "context 1600: outside the profile's caches (100-400 tokens): its steps are extrapolated along their line, "
        "4.0x the longest"]


def test_a_concurrency_of_one_replays_the_requests_one_after_another():
    # the records of run() served (all arriving at 0, measured at concurrency 2): at concurrency 1 each request runs
    # alone, as at batch 1 (gamma 2: 2.55 s a request, the baseline 4.9 s), so the speedups are the batch-1 ones;
    # at 2 the pairs run together, as at batch 2 (5.5 s and 6.2 s a pair)
    served = [dict(s, batch_size=None, concurrency=2, request=s["sample_id"], arrival_s=0.0) for s in run()]
    results, _ = rec.recommend(served, profile(), [("concurrency", 1), ("concurrency", 2)])
    one, two = results
    assert {k: c["speedup"] for k, c in by_candidate(one).items()} == pytest.approx(
        {G1: 4.9 / 3.15, G2: 4.9 / 2.55, rec.OFF: 1.0})
    assert by_candidate(one)[G2]["what_if"] and not by_candidate(two)[G2]["what_if"]
    # E2E from each request's slot (its clock starts when the one before it leaves): 2.55 s each, 4.9 s off
    assert (by_candidate(one)[G2]["e2e_p50_s"], by_candidate(one)[rec.OFF]["e2e_p50_s"]) == pytest.approx((2.55, 4.9))
    assert {k: c["speedup"] for k, c in by_candidate(two).items()} == pytest.approx(
        {G1: 6.2 / 5.1, G2: 6.2 / 5.5, rec.OFF: 1.0})
    assert (one["best"], two["best"]) == (G2, G1)


def test_a_target_registered_elsewhere_gets_its_settings_and_acceptance(tmp_path, capsys, monkeypatch):
    """Adding a target is one Target: registered here, it appears in recommend.json's settings, the printed
    settings and the exported acceptance, and its form is read back."""
    toy = Target(name="toy", title="Toy", rank=9,
                 settings=Settings(emit=lambda c: (["--toy-k", str(c.gamma), "--toy-draft", c.model], ["toy note"]),
                                   show=" ".join, off=[], off_text="toy off", no_equivalent={"hybrid": "no toy hybrid"}),
                 acceptance=AcceptanceForm(suffix="toy.json", key="toy_rates", export=lambda r: {"toy_rates": r},
                                           parse=lambda data, where: data["toy_rates"], describe="the toy's"))
    monkeypatch.setitem(TARGETS, "toy", toy)
    run_dir = folder(tmp_path / "run", run())
    assert rec.main([str(run_dir), "--batch", "1,2"]) == 0
    out = capsys.readouterr().out
    written = json.loads((run_dir / "recommend.json").read_text())
    # batch 1 takes gamma 2, batch 2 gamma 1 (test_two_ks_at_two_loads_by_hand): one setting each
    assert {load: s["toy"] for load, s in written["settings"].items()} == {
        "batch=1": ["--toy-k", "2", "--toy-draft", "org/draft-0.5b"], "batch=2": ["--toy-k", "1", "--toy-draft",
                                                                                  "org/draft-0.5b"]}
    assert "  Toy:       --toy-k 2 --toy-draft org/draft-0.5b" in out.splitlines()
    assert "  note: toy note" in out.splitlines()
    assert deploy.settings({"method": "hybrid", "gamma": 2, "draft": None}, {})["no_equivalent"]["toy"] == \
        "no toy hybrid"
    # every candidate measured (gamma 1 and 2, both accepting every draft) exported in its form too
    files = written["exported_acceptance"]["speculative draft=d gamma=2 constant"]
    assert json.loads(open(files["toy"]).read()) == {"toy_rates": [1.0, 1.0]}
    assert acceptance_io.read(files["toy"]) == ([1.0, 1.0], "toy")


def grouped(groups) -> list[dict]:
    """(group, requests, gamma 2's rounds): each request 13 tokens (12 after the first), gamma 1 accepting every
    draft (6 rounds of 2 tokens), the baseline."""
    samples, first = [], 0
    for group, requests, g2_rounds in groups:
        for i in range(first, first + requests):
            samples += [dict(row(method, i, gamma, rounds, new_tokens=13), group=group) for method, gamma, rounds in
                        (("baseline", None, None), ("speculative", 1, [(1, 1)] * 6), ("speculative", 2, g2_rounds))]
        first += requests
    return samples


def test_each_category_gets_its_own_choice_from_its_own_acceptance():
    """Category a accepts every draft at both K, b accepts one of gamma 2's two: a takes gamma 2, b gamma 1 (batch 1,
    the steps of test_two_ks_at_two_loads_by_hand); c has too few rounds to say."""
    samples = grouped([("a", 8, [(2, 2)] * 4), ("b", 8, [(2, 1)] * 6), ("c", 2, [(2, 2)] * 4)])
    categories = {c["category"]: c for c in rec.by_category(samples, profile(), [("batch", 1)])}
    (a,), (b,) = categories["a"]["loads"], categories["b"]["loads"]
    # a: baseline 0.1 + 12 x 0.8 = 9.7 s; gamma 1 0.15 + 6 x (0.1 + 0.9) = 6.15 s; gamma 2 0.15 + 4 x (0.2 + 1.0) =
    # 4.95 s (32 rounds)
    assert {k: c["speedup"] for k, c in by_candidate(a).items()} == pytest.approx(
        {G1: 9.7 / 6.15, G2: 9.7 / 4.95, rec.OFF: 1.0})
    assert (a["best"], a["runner_up"], a["tie"], a["margin"]) == (G2, G1, False, pytest.approx(6.15 / 4.95))
    # b: gamma 2 accepts 1 of 2, 2 tokens a round: 0.15 + 6 x (0.2 + 1.0) = 7.35 s; gamma 1 as in a
    assert (b["best"], b["runner_up"], b["tie"], b["margin"]) == (G1, G2, False, pytest.approx(7.35 / 6.15))
    # 8 prompts alike: each interval is the figure itself (the bootstrap over the category's prompts)
    assert by_candidate(b)[G1]["speedup_ci95"] == pytest.approx([9.7 / 6.15] * 2)
    # c: 2 requests, gamma 2's 8 rounds: no figure, said so
    assert categories["c"]["loads"] == [] and "8 rounds of " + G2 in categories["c"]["note"]
    text = rec.category_table(list(categories.values()))
    assert f"| b | batch=1 | as measured | {G1} | 1.58 [1.58, 1.58] |" in text and "too few to say" in text


def test_the_categories_are_a_section_of_the_command(tmp_path, capsys):
    run_dir = folder(tmp_path / "run", grouped([("x", 2, [(2, 2)] * 4), ("y", 2, [(2, 2)] * 4)]))
    assert rec.main([str(run_dir), "--batch", "1"]) == 0
    assert "by category:" in capsys.readouterr().out
    assert [c["category"] for c in json.loads((run_dir / "recommend.json").read_text())["by_category"]] == ["x", "y"]


def served(samples, concurrency=1):
    return [dict(s, batch_size=None, concurrency=concurrency, request=s["sample_id"], arrival_s=0.0) for s in samples]


@pytest.mark.parametrize("lengths, off, g1", [
    # 8 requests alike: every resample is the same, the interval is the figure: off 0.1 + 6 x 0.8 = 4.9 s, gamma 1
    # 0.15 + 3 x (0.1 + 0.9) = 3.15 s
    ([7] * 8, [4.9, 4.9], [3.15, 3.15]),
    # one prompt: no interval (fewer than 8 batches), as the speedup's
    ([7], None, None),
])
def test_a_static_latency_has_the_interval_of_its_prompts(lengths, off, g1):
    samples = [row(method, i, gamma, None if gamma is None else [(1, 1)] * ((n - 1) // 2), new_tokens=n)
               for i, n in enumerate(lengths) for method, gamma in (("baseline", None), ("speculative", 1))]
    (result,), _ = rec.recommend(samples, profile(), [("batch", 1)])
    cands = by_candidate(result)
    assert cands[rec.OFF]["latency_s_ci95"] == (None if off is None else pytest.approx(off))
    assert cands[G1]["latency_s_ci95"] == (None if g1 is None else pytest.approx(g1))
    assert (f"3.15 [3.15, 3.15] s/request" in rec.table([result])) is (g1 is not None)


def test_a_latency_interval_spans_its_prompts_spread():
    # 4 requests of 7 tokens (off 4.9 s, gamma 1 3.15 s) and 4 of 13 (off 0.1 + 12 x 0.8 = 9.7 s, gamma 1 0.15 + 6 x
    # 1.0 = 6.15 s): the means 7.3 s and 4.65 s, their intervals inside the two lengths' seconds, not a point
    samples = [row(method, i, gamma, None if gamma is None else [(1, 1)] * ((n - 1) // 2), new_tokens=n)
               for i, n in enumerate([7, 13] * 4) for method, gamma in (("baseline", None), ("speculative", 1))]
    (result,), _ = rec.recommend(samples, profile(), [("batch", 1)])
    for candidate, mean, low, high in ((rec.OFF, 7.3, 4.9, 9.7), (G1, 4.65, 3.15, 6.15)):
        c = by_candidate(result)[candidate]
        lo, hi = c["latency_s_ci95"]
        assert c["latency_s"] == pytest.approx(mean) and low <= lo < mean < hi <= high


def test_a_loads_latency_has_its_interval():
    # concurrency 1, 8 requests alike all arriving at 0: one after another, each timed from its slot (the serving
    # figures' clock). Off: E2E 0.1 + 6 x 0.8 = 4.9 s, TTFT 0.1 s, TPOT 4.8 s / 6 = 800 ms; gamma 1: E2E 0.15 + 3 x
    # (0.1 + 0.9) = 3.15 s. Every resample alike: the interval is a point.
    samples = served([row(method, i, gamma, None if gamma is None else [(1, 1)] * 3)
                      for i in range(8) for method, gamma in (("baseline", None), ("speculative", 1))])
    (result,), _ = rec.recommend(samples, profile(), [("concurrency", 1)])
    off, g1 = by_candidate(result)[rec.OFF], by_candidate(result)[G1]
    assert (off["e2e_p50_s_ci95"], off["ttft_p50_s_ci95"], off["tpot_mean_ms_ci95"]) == (
        pytest.approx([4.9] * 2), pytest.approx([0.1] * 2), pytest.approx([800] * 2))
    assert g1["e2e_p50_s_ci95"] == pytest.approx([3.15] * 2)
    assert "TTFT 0.10 [0.10, 0.10] s, TPOT 800 [800, 800] ms, E2E 4.90 [4.90, 4.90] s" in rec.table([result])
    # two requests: none
    (two,), _ = rec.recommend(served(samples[:4]), profile(), [("concurrency", 1)])
    assert by_candidate(two)[rec.OFF]["e2e_p50_s_ci95"] is None


def test_a_profile_that_prices_the_runs_steps_otherwise_is_said(tmp_path, capsys):
    """The run's own probes (costs.json: STEPS) against a profile of the machine at half those times, the 2-row
    verifications priced as at 1 row in units of a step (1.125x and 1.25x where the run measured 1.5x and 2.4x): the
    note names the target's speed and the furthest apart of the shapes, the 3-token verification at 2 rows
    (2.4 against 1.25: 1.92x apart)."""
    run_dir = folder(tmp_path / "run", run())
    half = {1: {1: 0.4, 2: 0.45, 3: 0.5}, 2: {1: 0.5, 2: 0.5625, 3: 0.625}}
    profile(draft=0.05, steps=half).save(tmp_path / "other.json")
    assert rec.main([str(run_dir), "--batch", "1", "--costs", str(tmp_path / "other.json")]) == 0
    out = capsys.readouterr().out
    notes = json.loads((run_dir / "recommend.json").read_text())["notes"]
    said = [n for n in notes if "prices this run's steps otherwise" in n]
    assert len(said) == 1 and said[0] in out.replace("\n- ", "\n")
    assert "the target's step at 1 row (100-token cache) ran 0.800 s in the run and is priced 0.400 s (2.00x)" in said[0]
    assert "a verification of 3 at 2 rows and a 100-token cache ran 2.40x the target's step in the run and is " \
           "priced 1.25x" in said[0]
    # the same profile as the run's: nothing said
    assert rec.main([str(run_dir), "--batch", "1", "--costs", str(run_dir / "costs.json")]) == 0
    assert "prices this run's steps otherwise" not in capsys.readouterr().out


def test_a_latency_interval_that_misses_its_point_is_dropped_and_said(monkeypatch):
    # the load of test_a_loads_latency_has_its_interval (off: TTFT 0.1 s, TPOT 800 ms, E2E 4.9 s; gamma 1: the first
    # token at the target's prefill, 0.1 s, the draft's 0.05 s in the first round: TPOT (3.15 - 0.1) s / 6 = 508.3 ms),
    # its resamples made to put TPOT at 900-950 ms and TTFT at 0-10 s: TPOT's interval
    # misses both points and is dropped, each said with its load; TTFT's holds its points and stays
    monkeypatch.setattr(rec, "load_latency_ci95", lambda *a, **k: {
        "ttft_p50_s_ci95": [0.0, 10.0], "tpot_mean_ms_ci95": [900.0, 950.0], "e2e_p50_s_ci95": None})
    samples = served([row(method, i, gamma, None if gamma is None else [(1, 1)] * 3)
                      for i in range(8) for method, gamma in (("baseline", None), ("speculative", 1))])
    (result,), _ = rec.recommend(samples, profile(), [("concurrency", 1)])
    off, g1 = by_candidate(result)[rec.OFF], by_candidate(result)[G1]
    assert (off["tpot_mean_ms"], off["tpot_mean_ms_ci95"], g1["tpot_mean_ms"], g1["tpot_mean_ms_ci95"]) == (
        pytest.approx(800), None, pytest.approx(3050 / 6), None)
    assert off["ttft_p50_s_ci95"] == g1["ttft_p50_s_ci95"] == [0.0, 10.0]
    assert "TTFT 0.10 [0.00, 10.00] s, TPOT 800 ms, E2E 4.90 s" in rec.table([result])
    assert "conc=1, off: TPOT's replay of what ran (800) lies outside its resamples' [900, 950]: no interval" in (
        result["notes"])
    assert [n for n in result["notes"] if n.startswith(f"conc=1, {G1}: TPOT's replay of what ran (508.3)")]
    # a point on its interval's edge is inside it
    edge = {"latency_s": 2.0, "latency_s_ci95": [2.0, 3.0]}
    assert rec.without_stray_intervals(edge) == [] and edge["latency_s_ci95"] == [2.0, 3.0]


def test_position_rates_censor_a_round_cut_at_an_eos():
    """Rounds (drafted, accepted, emitted): (2, 2, 3) all accepted and a bonus; (2, 1, 1) cut at an EOS that was its
    first draft (accepted, emitted, nothing of position 2); (2, 0, 1) rejected at once. c1 = 2/3; at position 2 only
    the first round was tried: c2 = 1/1, so r = [2/3, 2/3] (counting the cut round as a rejection would give 1/3)."""
    from eval.acceptance_io import position_rates

    rounds = [{"drafted": 2, "accepted": 2, "emitted": 3}, {"drafted": 2, "accepted": 1, "emitted": 1},
              {"drafted": 2, "accepted": 0, "emitted": 1}]
    assert position_rates(rounds, 2) == pytest.approx([2 / 3, 2 / 3])
