"""c and v at each run's own context (eval/records.py CostProbe.at_cache, eval/summary.py): a probe timed at several
caches gives each run the one nearest its rows' mean decoding cache, and a run whose probe was timed far from it is
said in a note. Values worked out by hand."""
import pytest

from eval.records import CostProbe
from eval.summary import summarize
from sample_records import costs, record, run

ROUND = [{"drafted": 2, "accepted": 2, "emitted": 3}]


def probe_at(context, c, v, by_context=None) -> dict:
    """sample_records.costs' probe of batch size 1 (process p1) timed at `context` tokens of cache, with c and v
    at other caches beside it."""
    entry = costs(c=c, v={"2": v})
    probe = entry["1"]["p1"]
    probe["context_tokens"] = context
    if by_context:
        probe["by_context"] = {str(k): dict(costs(c=bc, v={"2": bv})["1"]["p1"], context_tokens=k)
                               for k, (bc, bv) in by_context.items()}
    return entry


def test_the_probe_nearest_a_cache_in_ratio():
    probe = CostProbe.from_json(probe_at(100, 0.3, 1.2, {800: (0.5, 1.5)})["1"]["p1"])
    assert probe.by_context[800].c_by_draft == {"d": 0.5}
    assert probe.at_cache(700).c_by_draft == {"d": 0.5} and probe.at_cache(700).context_tokens == 800
    assert probe.at_cache(700).v == {2: 1.5} and probe.at_cache(700).target_busy_s is None
    # 283 is as far from 100 as from 800 in ratio (sqrt(80000) = 282.8): 250 is nearer 100, 300 nearer 800
    assert probe.at_cache(250) is probe and probe.at_cache(300).context_tokens == 800
    assert probe.at_cache(None) is probe
    assert CostProbe.from_json(probe.to_json()).by_context[800].v == {2: 1.5}  # kept in progress.json


def two_groups(long_prompt=745):
    """8 prompts (batch size 1, 4 new tokens): 4 of 20 tokens in group short, 4 of `long_prompt` in group long;
    baseline 2.0 s, speculative 1.0 s, its rounds draft 2 and accept both (alpha 1)."""
    samples = []
    for i in range(8):
        group, prompt = ("short", 20) if i < 4 else ("long", long_prompt)
        samples += [record("baseline", i, i, tokens=4, latency=2.0, group=group, prompt_tokens=prompt),
                    record("speculative", i, i, tokens=4, latency=1.0, group=group, prompt_tokens=prompt,
                           rounds=ROUND)]
    return samples


def test_each_group_reads_c_and_v_at_its_own_cache():
    progress = {"group_by": "category", **{"costs": probe_at(22, 0.3, 1.2, {747: (0.5, 1.5)})}}
    summary = summarize(two_groups(), progress)
    short, long = run(summary, "speculative", "short"), run(summary, "speculative", "long")
    # short decodes at 20 + 4 / 2 = 22, long at 745 + 2 = 747; overall at (22 + 747) / 2 = 384.5, nearer 747
    assert short["cost_context"] == {"probed": 22, "decoding": 22.0}
    assert long["cost_context"] == {"probed": 747, "decoding": 747.0}
    assert run(summary, "speculative")["cost_context"] == {"probed": 747, "decoding": 384.5}
    assert short["metrics"]["draft_cost_ratio_c"] == 0.3 and short["metrics"]["verify_cost_ratio_v"] == 1.2
    assert long["metrics"]["draft_cost_ratio_c"] == 0.5 and long["metrics"]["verify_cost_ratio_v"] == 1.5
    # alpha 1: gamma + 1 = 3 tokens a round, over 2 c + v target steps: 3 / 1.8 and 3 / 2.5
    assert short["metrics"]["predicted_speedup"] == pytest.approx(3 / 1.8)
    assert long["metrics"]["predicted_speedup"] == pytest.approx(3 / 2.5)
    assert not [n for n in summary["notes"] if "c and v were probed at a cache" in n]


def test_a_run_probed_far_from_its_own_cache_is_said():
    summary = summarize(two_groups(), {"group_by": "category", "costs": probe_at(95, 0.3, 1.2)})
    long = run(summary, "speculative", "long")
    assert long["cost_context"] == {"probed": 95, "decoding": 747.0}
    assert len([n for n in summary["notes"] if "c and v were probed at a cache" in n]) == 3
    # 747 / 95 = 7.86; short (22: 95 / 22 = 4.3, shorter) is said too, overall (384.5 / 95 = 4.05) as well
    assert "[category=long]: c and v were probed at a cache of 95 tokens, its rows decode at a mean cache of 747 " \
           "(prompt + half the new tokens, 7.9x)" in "\n".join(summary["notes"])
    assert "[category=short]: c and v were probed at a cache of 95 tokens, its rows decode at a mean cache of 22 " \
           "(prompt + half the new tokens, 0.2x)" in "\n".join(summary["notes"])
    assert "[overall]" in "\n".join(summary["notes"])
