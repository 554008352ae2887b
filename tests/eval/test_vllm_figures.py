"""vLLM points in eval, from hand-made records: ratios against vllm_generate (never our baseline), the engine
comparison, no borrowed costs, and rounds rebuilt from vLLM's per-request counters. No vLLM needed."""
from eval.summary import summarize
from runner.engines.vllm.engine import rounds_of
from sample_records import costs, record, run

ROUND = [{"drafted": 2, "accepted": 2, "emitted": 3}]


def _two_engines(prompts=8):
    """Per prompt (batch size 1, 4 tokens each): our baseline 2.0 s, our speculative 1.0 s; vLLM's reference
    0.5 s, vllm_draft 0.4 s. vLLM's reference disagrees with ours on prompt 0's tokens; vllm_draft agrees with it."""
    samples = []
    for i in range(prompts):
        ours = [1, 2, 3, 4]
        theirs = [1, 2, 9, 9] if i == 0 else ours
        samples += [record("baseline", i, i, tokens=4, latency=2.0, output=ours),
                    record("speculative", i, i, tokens=4, latency=1.0, output=ours, rounds=ROUND),
                    record("vllm_generate", i, i, tokens=4, latency=0.5, prefill=None, output=theirs),
                    record("vllm_draft", i, i, tokens=4, latency=0.4, prefill=None, output=theirs, rounds=ROUND,
                           extra={"engine": "vllm", "vllm_ttft_s": 0.1, "vllm_latency_s": 0.3})]
    return samples


def test_a_vllm_point_pairs_with_vllm_generate_and_borrows_no_costs():
    summary = summarize(_two_engines(), {"costs": costs(c=0.3), "processes": {"p1": {"name": "process 1"}}})
    mine = run(summary, "vllm_draft")["metrics"]
    assert abs(mine["speedup"] - 0.5 / 0.4) < 1e-12  # 1.25 against vllm_generate, not 5.0 against our baseline
    assert mine["exact_match"] == 1.0  # against vllm_generate's tokens, which differ from ours on prompt 0
    assert mine["acceptance_rate"] == 1.0 and mine["mean_accepted_tokens"] == 3.0
    assert mine["draft_cost_ratio_c"] is None and mine["predicted_speedup"] is None  # p1's c is our engine's
    assert mine["decode_speedup"] is None and mine["draft_time_share"] is None
    # latency and TTFT are vLLM's per request; throughput stays on the batch's generate wall (0.4 s)
    assert mine["ttft_s"]["mean"] == 0.1 and mine["latency_s"]["p50"] == 0.3 and mine["tpot_s"]["mean"] == 0.3 / 4
    assert abs(mine["throughput_tok_s"] - 32 / 3.2) < 1e-12
    assert run(summary, "speculative")["metrics"]["draft_cost_ratio_c"] == 0.3
    assert abs(run(summary, "speculative")["metrics"]["speedup"] - 2.0) < 1e-12
    assert not [f for f in run(summary, "vllm_draft")["flags"] if f["code"] == "possible_bug"]
    assert any("vllm_draft" in n and "vLLM runs draft and target" in n for n in summary["notes"])


def test_the_engine_comparison_by_hand():
    summary = summarize(_two_engines(), {})
    (row,) = summary["engines"]
    ref = row["reference"]
    assert (row["engine"], row["batch_size"], row["temperature"]) == ("vllm", 1, None)
    assert abs(ref["theirs_tok_s"] - 32 / 4.0) < 1e-12 and abs(ref["ours_tok_s"] - 32 / 16.0) < 1e-12
    assert abs(ref["tok_s_ratio"] - 4.0) < 1e-12 and ref["prompt_batches"] == 8
    assert ref["exact_match"] == 7 / 8  # prompt 0 differs
    (pair,) = row["points"]
    assert pair["theirs"] == "vllm_draft draft=d gamma=2 batch=1 greedy"
    assert pair["ours"] == "speculative draft=d gamma=2 constant batch=1 greedy"
    assert abs(pair["theirs_speedup"] - 1.25) < 1e-12 and abs(pair["ours_speedup"] - 2.0) < 1e-12


def test_the_engine_comparison_uses_only_batches_both_references_measured():
    samples = [s for s in _two_engines() if not (s["method"] == "vllm_generate" and s["batch_index"] >= 4)]
    (row,) = summarize(samples, {})["engines"]
    ref = row["reference"]
    # 4 paired prompts: vLLM 16 tokens in 2.0 s, ours 16 in 8.0 s; too few prompts for an interval
    assert ref["prompt_batches"] == 4 and ref["tok_s_ratio_ci95"] is None
    assert abs(ref["theirs_tok_s"] - 8.0) < 1e-12 and abs(ref["ours_tok_s"] - 2.0) < 1e-12
    assert abs(ref["tok_s_ratio"] - ref["theirs_tok_s"] / ref["ours_tok_s"]) < 1e-12
    (pair,) = row["points"]
    assert pair["theirs_prompt_batches"] == 4 and pair["ours_prompt_batches"] == 8 and "few_samples" in pair["theirs_flags"]
    from eval.report import engine_lines

    text = "\n".join(engine_lines([row]))
    assert "4.00 (n=4)" in text and "1.25 (n=4) !" in text


def test_without_vllm_generate_a_vllm_point_has_no_ratio():
    samples = [s for s in _two_engines() if s["method"] != "vllm_generate"]
    summary = summarize(samples, {})
    assert run(summary, "vllm_draft")["metrics"]["speedup"] is None  # our baseline is not its reference
    assert any("no vllm_generate batch" in n for n in summary["notes"])
    assert "engines" not in summary


def test_rounds_from_vllms_per_step_counters_and_steps():
    plain = {"drafted": 0, "accepted": 0, "emitted": 1}
    # the prefill's token, then three verification steps drafting 3: accepted 2, 0, 1 -> 3, 1, 2 tokens
    spec = {"per_step_accepted": [2, 0, 1], "per_step_drafted": [3, 3, 3], "num_spec_steps": 3}
    assert rounds_of(spec, 7, [1, 3, 1, 2]) == [{"drafted": 3, "accepted": 2, "emitted": 3},
                                                {"drafted": 3, "accepted": 0, "emitted": 1},
                                                {"drafted": 3, "accepted": 1, "emitted": 2}]
    # n-gram: 4 decode steps, one counted (2 drafted, 1 accepted: 2 tokens), 3 that drafted nothing
    spec = {"per_step_accepted": [1], "per_step_drafted": [2], "num_spec_steps": 1}
    assert rounds_of(spec, 6, [1, 1, 1, 2, 1]) == [{"drafted": 2, "accepted": 1, "emitted": 2}] + [plain] * 3
    # the stop cut the last step: it explains 4 tokens, gave 1
    spec = {"per_step_accepted": [3, 3], "per_step_drafted": [3, 3], "num_spec_steps": 2}
    assert rounds_of(spec, 6, [1, 4, 1]) == [{"drafted": 3, "accepted": 3, "emitted": 4},
                                             {"drafted": 3, "accepted": 3, "emitted": 1}]
    # plain steps AND a cut last step (their counts cancel in the tokens alone): 3 misses, then 4 of 4 accepted cut
    # to 2 tokens at max_new_tokens 6: 5 forwards (tau 6/5), MAT (2 + 3) / 4
    spec = {"per_step_accepted": [4], "per_step_drafted": [4], "num_spec_steps": 1}
    rounds = rounds_of(spec, 6, [1, 1, 1, 1, 2])
    assert rounds == [{"drafted": 4, "accepted": 4, "emitted": 2}] + [plain] * 3
    assert 1 + len(rounds) == 5 and sum(r["emitted"] for r in rounds) / len(rounds) == 1.25
    # no step had drafts (vLLM omits the arrays): every decode step is a plain round
    assert rounds_of({"num_spec_steps": 0, "num_draft_tokens": 0}, 3, [1, 1, 1]) == [plain] * 2
    # counters that disagree with the steps (one counted step more than there were decode steps): no rounds
    assert rounds_of({"per_step_accepted": [0, 1], "per_step_drafted": [2, 2]}, 3, [1, 2]) is None
    assert rounds_of(None, 5, [1, 1, 1, 1, 1]) is None
    assert rounds_of({"per_step_accepted": [1], "per_step_drafted": [2]}, 3, None) is None


def test_engine_info_reads_the_new_key_and_an_older_folder_s():
    """progress.json keeps each engine's info under engine_info; a folder written before kept vLLM's under "vllm"."""
    from eval.report import markdown

    info = {"version": "0.1", "python": "/env/bin/python", "pairing": "batch", "order": "each batch back to back"}
    for progress in ({"engine_info": {"vllm": info}}, {"vllm": info}):
        summary = summarize(_two_engines(), progress)
        assert summary["engine_info"] == {"vllm": info} and "vllm" not in summary
        assert ("order of the vLLM points (vLLM 0.1, /env/bin/python): each batch back to back"
                in markdown(summary))
    assert "engine_info" not in summarize(_two_engines(), {"vllm": {}})  # an older run without vLLM


def test_the_engine_comparison_rows_follow_the_runs_order():
    """Batch sizes 2 and 10, greedy and T=0.7: greedy first, then batch sizes by value (10 after 2)."""
    samples = []
    for temperature in (0.7, None):
        for batch_size in (10, 2):
            for i in range(batch_size):
                for method, latency in (("baseline", 2.0), ("vllm_generate", 0.5)):
                    samples.append(record(method, i, 0, batch_size=batch_size, tokens=4, latency=latency,
                                          temperature=temperature))
    rows = summarize(samples, {})["engines"]
    assert [(r["batch_size"], r["temperature"]) for r in rows] == [(2, None), (10, None), (2, 0.7), (10, 0.7)]
