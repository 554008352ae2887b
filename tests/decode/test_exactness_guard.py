"""The greedy exactness guard in bf16: the baseline records its top-2 logit gap per token, and a speculative engine bug
that changes a token where that gap is wide is flagged possible_bug even though bf16 drift explains near-ties."""
import json

import pytest
import torch
import yaml

import launch
from decode import Generation, Sampling, generate_baseline
from decode import generate as engine
from decode.numerics import numerics_probe
from helpers import base_config, save_tiny_pair, write_prompts
from tiny_models import ragged_batch, tiny_model
from utils.io import read_jsonl

# the injected bug swaps the correct token for the target's second best where their verified logits lie this far apart:
# far beyond bf16 rounding of these logits (a few units: an ulp is ~0.03), so no rounding flip can make such a change
BUG_GAP = 1.0


def test_baseline_records_each_tokens_top2_gap():
    target = tiny_model("llama", seed=1, layers=2)
    ids, mask = ragged_batch([4, 9, 2], seed=3)
    with torch.inference_mode():
        free = generate_baseline(target, ids, mask, Generation(max_new_tokens=10))
        # an EOS that ends the first row early and never comes in the second: one row drops out of the batch mid-way
        eos = next(t for t in free[0].output_ids[1:] if t not in free[1].output_ids)
        rows = generate_baseline(target, ids, mask, Generation(max_new_tokens=10, eos_token_ids=(eos,)))
        sampled = generate_baseline(target, ids, mask, Generation(10, Sampling(True, 1.0)),
                                    torch.Generator().manual_seed(0))
        for row, record in enumerate(rows):
            assert len(record.top2_gaps) == record.new_tokens  # rows that stop early (EOS) keep their own steps
            prompt = ids[row, mask[row].bool()].tolist()
            for step in (0, record.new_tokens - 1):  # the prefill's token and the last one, each forwarded alone
                logits = target(torch.tensor([prompt + record.output_ids[:step]])).logits[0, -1]
                ordered = logits.sort(descending=True).values
                assert record.top2_gaps[step] == pytest.approx(float(ordered[0] - ordered[1]), abs=1e-4)
    assert rows[0].stop_reason == "eos" and rows[0].new_tokens < 10 and rows[1].stop_reason == "length"
    assert all(r.top2_gaps == [] for r in sampled)  # sampling: no argmax to guard


def test_the_numerics_probe_reads_each_verify_width():
    """A kernel path taken at one width alone (here: +1 on a logit in 4-token forwards) shows at that width only, and in
    the drift the guard uses (the max over widths)."""
    model = tiny_model("llama", seed=1, layers=1)

    def at_width_four(module, inputs, logits):
        return logits + (logits.shape[1] == 4) * torch.nn.functional.one_hot(torch.tensor(7), logits.shape[-1])

    model.lm_head.register_forward_hook(at_width_four)
    ids, mask = ragged_batch([3, 9, 5], seed=2)
    result = numerics_probe(model, ids, mask, widths=(2, 4))
    assert set(result["verify_vs_stepwise_by_width"]) == {"2", "4"}
    assert result["verify_vs_stepwise_by_width"]["2"] < 1e-3  # fp32 rounding
    assert result["verify_vs_stepwise_by_width"]["4"] == pytest.approx(1.0, abs=1e-3)
    assert result["verify_vs_stepwise_max_logit_diff"] == pytest.approx(1.0, abs=1e-3)


def _swap_where_wide(accept_greedy):
    """accept_greedy with a bug: in rounds of 3 or more drafts, a next token whose logit leads the second best by more
    than BUG_GAP becomes the second best."""
    def buggy(draft_tokens, target_logits, draft_limit):
        accepted_len, token = accept_greedy(draft_tokens, target_logits, draft_limit)
        if draft_tokens.shape[1] < 3:
            return accepted_len, token
        scored = target_logits[torch.arange(len(token)), accepted_len]  # [B, V] the logits the next token comes from
        top = scored.topk(2, dim=-1)
        wide = top.values[:, 0] - top.values[:, 1] > BUG_GAP
        return accepted_len, torch.where(wide, top.indices[:, 1], token)
    return buggy


def test_an_engine_bug_in_bf16_is_flagged_and_a_correct_run_is_not(tmp_path, monkeypatch):
    target, draft = save_tiny_pair(tmp_path)
    config = base_config(target, draft, write_prompts(tmp_path / "prompts.jsonl", count=2),
                         methods=["baseline", "speculative"], batch_size=[1], speculative={"gamma": [1, 3]},
                         generation={"max_new_tokens": 10}, warmup=0)
    config["target"]["dtype"] = "bfloat16"
    (tmp_path / "bf16.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setattr(engine, "accept_greedy", _swap_where_wide(engine.accept_greedy))  # gamma 3 only
    assert launch.main(["--config", str(tmp_path / "bf16.yaml"), "--output-dir", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    records = read_jsonl(tmp_path / "out" / "samples.jsonl")
    for record in records:  # the raw records carry the gaps: a report rebuilt from them applies the same rule
        assert (record["top2_gaps"] is not None) == (record["method"] == "baseline")
        if record["top2_gaps"]:
            assert len(record["top2_gaps"]) == record["new_tokens"]
    numerics = summary["numerics"]["target"]
    # bf16: probed at each verify width the run uses, M = gamma + 1
    assert numerics["dtype"] == "bfloat16" and set(numerics["verify_vs_stepwise_by_width"]) == {"2", "4"}
    draft_numerics = summary["numerics"]["drafts"]["llama-draft"]  # fp32 (auto on a CPU): one probe, as before
    assert draft_numerics["dtype"] == "float32" and set(draft_numerics["verify_vs_stepwise_by_width"]) == {"5"}
    drift = max(numerics["verify_vs_stepwise_max_logit_diff"], numerics["batched_vs_single_max_logit_diff"])
    runs = {r["gamma"]: r for r in summary["runs"] if r["method"] == "speculative" and r["group"] is None}

    bugged = runs[3]
    wide = [m for m in bugged["metrics"]["mismatches"] if m["baseline_gap"] > 2 * drift]
    assert wide, (bugged["metrics"]["mismatches"], drift)  # the bug changed tokens where the drift cannot reach
    flags = [f["message"] for f in bugged["flags"] if f["code"] == "possible_bug"]
    assert len(flags) == 1 and f"in {len(wide)} sample(s)" in flags[0] and f"{drift:.2g}" in flags[0]
    # the same run without the bug (gamma 1): whatever bf16 flips, none is flagged
    assert not [f for f in runs[1]["flags"] if f["code"] == "possible_bug"]
    assert all(m["baseline_gap"] <= 2 * drift for m in runs[1]["metrics"]["mismatches"])
