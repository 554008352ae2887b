"""host_bound: c against the draft's weight bytes over the target's, or the GPU's busy share of the draft's forward where
CUDA measured one; the flag, the 'bytes' column and the note in a report rebuilt from raw records. Every figure by hand."""
import json

import pytest
import yaml

from eval.__main__ import rebuild
from eval.records import CostProbe
from eval.summary import summarize
from sample_records import SPEC_LABEL, codes, costs, paired_run, run


def probe(c, target_bytes=None, draft_bytes=None, target_busy=None, draft_busy=None, process="p1") -> dict:
    """progress.json's costs of batch size 1 (a steady probe, a 1-token target forward of 1.0 s) with the models' weight
    bytes and the GPU's busy seconds per 1-token forward where given."""
    entry = costs(c, process=process)
    row = entry["1"][process]
    row.update(target_weight_bytes=target_bytes, draft_weight_bytes={} if draft_bytes is None else {"d": draft_bytes},
               target_busy_s=target_busy, draft_busy_s={} if draft_busy is None else {"d": draft_busy})
    return entry


def flagged(progress_costs) -> list[str]:
    return codes(summarize(paired_run(units=8), {"costs": progress_costs}))


# Qwen3 0.6B -> 4B in bf16 on an H100, eager: c 0.78 against a bytes ratio of 0.15 (1.2 GB / 8 GB)
GPU_EAGER = dict(c=0.78, target_bytes=8_000_000_000, draft_bytes=1_200_000_000)
# the offline CPU pair in fp32, untied embeddings as converted: 630,167,424 and 1,777,088,000 parameters of 4 bytes
CPU_PAIR = dict(c=0.371, target_bytes=4 * 1_777_088_000, draft_bytes=4 * 630_167_424)


def test_a_draft_dearer_than_its_bytes_is_flagged_and_says_what_the_speedup_measures():
    summary = summarize(paired_run(units=8), {"costs": probe(**GPU_EAGER)})
    assert codes(summary) == ["host_bound"]
    metrics = run(summary, "speculative")["metrics"]
    assert metrics["weight_bytes_ratio"] == pytest.approx(0.15)
    assert metrics["draft_busy_share"] is None and metrics["target_busy_share"] is None  # no CUDA busy times
    message = run(summary, "speculative")["flags"][0]["message"]
    assert "c = 0.780 is 5.2x" in message and "(0.150)" in message  # 0.78 / 0.15
    assert "kernel-launch overhead" in message and "engine.compile: true" in message and "vllm_*" in message
    assert codes(summary, "baseline") == []  # a point without a draft has no c


@pytest.mark.parametrize("case, expected", [
    (CPU_PAIR, []),  # 0.371 / (630,167,424 / 1,777,088,000 = 0.3546) = 1.05x: the forwards read their weights
    (dict(c=0.5, target_bytes=100, draft_bytes=26), []),  # 0.5 < 2 x 0.26
    (dict(c=0.55, target_bytes=100, draft_bytes=26), ["host_bound"]),  # 0.55 >= 0.52 and >= 0.3
    (dict(c=0.25, target_bytes=100, draft_bytes=5), []),  # 5x its bytes, but below c 0.3: a cheap draft either way
    # a tiny random pair of the tests (1 and 3 layers of width 64, 96 words): 197,440 / 493,376 bytes, c near 1
    (dict(c=0.95, target_bytes=493_376, draft_bytes=197_440), ["host_bound"]),
    (dict(c=0.95), []),  # a folder from before weight bytes were recorded: nothing to compare c with
])
def test_the_rule_without_busy_times(case, expected):
    assert flagged(probe(**case)) == expected


def test_the_cpu_pair_shows_its_bytes_ratio_beside_c():
    metrics = run(summarize(paired_run(units=8), {"costs": probe(**CPU_PAIR)}), "speculative")["metrics"]
    assert metrics["weight_bytes_ratio"] == pytest.approx(0.354607, abs=1e-6)
    assert metrics["draft_cost_ratio_c"] == 0.371


def test_cuda_busy_times_decide_where_they_exist():
    # the draft's wall time is c x the target's 1.0 s = 0.78 s; busy 0.2 s of it is 26%, the target's 0.9 s is 90%
    summary = summarize(paired_run(units=8), {"costs": probe(**GPU_EAGER, target_busy=0.9, draft_busy=0.2)})
    assert codes(summary) == ["host_bound"]
    metrics = run(summary, "speculative")["metrics"]
    assert metrics["draft_busy_share"] == pytest.approx(0.2 / 0.78) and metrics["target_busy_share"] == 0.9
    assert "busy 26% of the draft's 1-token forward, the target's 90%" in run(summary, "speculative")["flags"][0]["message"]
    # busy 0.468 s of 0.78 s = 60%: the GPU worked through most of it, though c is 5.2x the bytes ratio
    assert flagged(probe(**GPU_EAGER, target_busy=0.95, draft_busy=0.468)) == []
    # busy times alone, no weight bytes: 0.3 s of 0.78 s = 38%
    assert flagged(probe(0.78, draft_busy=0.3)) == ["host_bound"]
    # a draft at c 0.1 busy 0.02 s of its 0.1 s (20%): it costs a tenth of a target step whatever keeps it waiting
    assert flagged(probe(0.1, draft_busy=0.02)) == []


def test_a_compiled_step_waiting_on_the_host_is_not_told_to_compile():
    """Seen on an H100: a compiled 1B pair's draft step busy 43% of its 1.49 ms. The flag stands (the speedups
    measure the engine's host work), but its advice is not engine.compile: true, which it ran."""
    summary = summarize(paired_run(units=8), {"costs": probe(**GPU_EAGER, target_busy=0.9, draft_busy=0.3)},
                        {"engine": {"compile": True}})
    message = run(summary, "speculative")["flags"][0]["message"]
    assert message.startswith("the GPU was busy 38% of the draft's 1-token forward") and "though compiled" in message
    assert "engine.compile: true" not in message


def test_workers_probes_give_their_medians():
    one = CostProbe.from_json(probe(0.7, 1000, 150, 0.9, 0.1)["1"]["p1"])
    two = CostProbe.from_json(probe(0.8, 1000, 150, 0.9, 0.3)["1"]["p1"])
    both = CostProbe.across_workers({"w0": one, "w1": two})
    assert both.c_for("d") == pytest.approx(0.75) and both.bytes_ratio_for("d") == pytest.approx(0.15)
    assert both.draft_busy_s == {"d": pytest.approx(0.2)}
    assert both.busy_share_for("d") == pytest.approx(0.2 / 0.75)  # the medians: busy 0.2 s, wall 0.75 x 1.0 s


def test_the_report_rebuilt_from_raw_records_flags_it_and_shows_the_bytes(tmp_path):
    samples, progress = paired_run(units=8), {"costs": probe(**GPU_EAGER)}
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (tmp_path / "progress.json").write_text(json.dumps(progress))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"name": "host", "report": {"plots": False}}))
    rebuild(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert codes(summary) == ["host_bound"]
    text = (tmp_path / "summary.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| point |"))
    assert "| c | bytes | v |" in header
    row = next(line for line in text.splitlines() if line.startswith(f"| {SPEC_LABEL} |"))
    assert "| 0.780 | 0.150 | 1.200 |" in row and " ! |" in row  # c, bytes, v; the speedup marked flagged
    assert f"- {SPEC_LABEL}: flagged host_bound: c = 0.780 is 5.2x" in text
    assert "host_bound:" in summary["legend"]["flags"] and "bytes" in summary["legend"]["weight_bytes_ratio"]
    with open(tmp_path / "summary.csv") as handle:
        assert "weight_bytes_ratio" in handle.readline()
