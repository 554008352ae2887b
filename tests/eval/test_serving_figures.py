"""Figures under load (eval/served_figures.py) against values worked out by hand on hand-made request records: per
request TTFT, TPOT and inter-token gaps, percentiles, goodput, occupancy, acceptance pooled and per request, both speedups
and their pairing, the prediction at the mean occupancy, the crossover finder on hand-made curves, and the report
(`python -m eval DIR`) of a serving folder."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eval.records import CostProbe, Point
from eval.figure_table import columns
from eval.report import cell, markdown
from eval.served_figures import costs_at, crossing, crossing_text, inter_token_gaps, tpot
from eval.summary import summarize
from sample_records import paired_run, record

ROOT = Path(__file__).resolve().parents[2]


def request(method="baseline", index=0, concurrency=1, first=0.5, finish=1.0, tokens=5, arrival=0.0, admitted=None,
            rate=None, requests=8, emits=None, rounds=None, sample_id=None, repeat=0, batch_size=None, **extra):
    """One served request: its times from the load point's start; emits default to the first token at `first`, then
    one token at a time evenly up to `finish`."""
    if emits is None:
        step = (finish - first) / max(tokens - 1, 1)
        emits = [[first, 1]] + [[first + step * k, 1] for k in range(1, tokens)]
    return record(method, sample_id=index if sample_id is None else sample_id, repeat=repeat,
                  batch_size=concurrency if batch_size is None else batch_size,
                  batch_rows=requests, tokens=tokens, latency=finish - arrival, prefill=first - arrival, rounds=rounds,
                  concurrency=concurrency, request_rate=rate, arrival_s=arrival,
                  admitted_s=arrival if admitted is None else admitted, first_token_s=first, finish_s=finish,
                  emits=emits, **extra)


def serving_run(summary, method, **axes):
    return next(r for r in summary["serving"]["runs"] if r["method"] == method
                and all(r[k] == v for k, v in axes.items()))


def refuse(constant):
    raise ValueError(f"{constant} is not strict JSON")


# ---- per request ---------------------------------------------------------------------------------------------

def test_tpot_and_inter_token_gaps_by_hand():
    # first token at 1.0, then 2 tokens at 1.25 (one round) and 2 at 2.0: TPOT (2.0 - 1.0) / 4 = 0.25 per token;
    # the gaps count each chunk once (as vLLM's ITL): 0.25 and 0.75
    s = request(first=1.0, finish=2.0, tokens=5, emits=[[1.0, 1], [1.25, 2], [2.0, 2]])
    assert tpot(s) == pytest.approx(0.25)
    assert inter_token_gaps(s) == pytest.approx([0.25, 0.75])
    # emits that leave out the first token give the same gaps: the first token is the first emission
    assert inter_token_gaps(dict(s, emits=[[1.25, 2], [2.0, 2]])) == pytest.approx([0.25, 0.75])
    assert tpot(request(tokens=1, first=1.0, finish=1.0, emits=[[1.0, 1]])) is None  # one token: no TPOT


def test_percentiles_goodput_rates_and_occupancy_by_hand():
    # five requests at concurrency 2, all arriving at 0, each 5 tokens; first tokens at 0.1, 0.2, 0.3, 0.4, 1.0 and
    # finish = first + 4 * step: 0.14, 0.40, 0.34, 0.44, 1.04. A closed loop: request 2 gets the slot request 0 frees
    # at 0.14, request 3 request 2's at 0.34, request 4 request 1's at 0.40 (each admitted then)
    steps = [0.01, 0.05, 0.01, 0.01, 0.01]  # TPOT 10 ms but the second 50 ms
    firsts = [0.1, 0.2, 0.3, 0.4, 1.0]
    admitted = [0.0, 0.0, 0.14, 0.34, 0.40]
    rows = [request("baseline", i, concurrency=2, first=f, finish=f + 4 * st, admitted=a, requests=5)
            for i, (f, st, a) in enumerate(zip(firsts, steps, admitted))]
    config = {"load": {"concurrency": [2], "slo": {"ttft_s": 0.35, "tpot_ms": 20}}}
    m = serving_run(summarize(rows, {}, config), "baseline")["metrics"]
    # TTFT from the slot: 0.1, 0.2, 0.16, 0.06, 0.6; sorted 0.06 0.1 0.16 0.2 0.6: P50 0.16; P90 at rank 3.6:
    # 0.2 + 0.6 * 0.4 = 0.44; P99 at 3.96: 0.2 + 0.96 * 0.4 = 0.584; mean 1.12 / 5 = 0.224
    assert m["ttft_s"]["p50"] == pytest.approx(0.16) and m["ttft_s"]["p90"] == pytest.approx(0.44)
    assert m["ttft_s"]["p99"] == pytest.approx(0.584) and m["ttft_s"]["mean"] == pytest.approx(0.224)
    # E2E from the slot: 0.14, 0.40, 0.20, 0.10, 0.64; the client's wait for a slot: 0, 0, 0.14, 0.34, 0.40
    assert m["e2e_s"]["mean"] == pytest.approx(1.48 / 5) and m["e2e_s"]["p50"] == pytest.approx(0.2)
    assert m["queue_s"]["mean"] == pytest.approx(0.88 / 5) and m["queue_s"]["p50"] == pytest.approx(0.14)
    assert m["tpot_s"]["p50"] == pytest.approx(0.01) and m["tpot_s"]["mean"] == pytest.approx(0.018)
    # span: the first arrival 0 to the last finish 1.0 + 0.04 = 1.04; 25 tokens, 5 requests
    assert m["span_s"] == pytest.approx(1.04)
    assert m["output_tok_s"] == pytest.approx(25 / 1.04) and m["requests_per_s"] == pytest.approx(5 / 1.04)
    # the SLO: TTFT <= 0.35 drops request 4 (0.6); TPOT <= 20 ms drops request 1: 3 requests in 1.04 s
    assert m["goodput_req_s"] == pytest.approx(3 / 1.04) and m["slo_met"] == pytest.approx(0.6)
    # in flight from admission to finish: 0.14 + 0.40 + 0.20 + 0.10 + 0.64 = 1.48 over 1.04 s; never more than 2
    assert m["mean_in_flight"] == pytest.approx(1.48 / 1.04) and m["max_in_flight"] == 2
    # no SLO in the config: no goodput
    assert serving_run(summarize(rows, {}), "baseline")["metrics"]["goodput_req_s"] is None


def test_acceptance_pooled_and_per_request_by_hand():
    # request 0: rounds accepting 2 of 2 and 0 of 2 (acceptance 0.5, MAT (3 + 1) / 2 = 2); request 1: one round 2 of 2
    # (1.0, MAT 3). Pooled: 4 / 6 and 7 / 3 per round; per request: (0.5 + 1) / 2 = 0.75 and (2 + 3) / 2 = 2.5
    rows = [request("speculative", 0, tokens=5, rounds=[{"drafted": 2, "accepted": 2, "emitted": 3},
                                                         {"drafted": 2, "accepted": 0, "emitted": 1}], requests=2),
            request("speculative", 1, tokens=4, rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}], requests=2)]
    m = serving_run(summarize(rows, {}), "speculative")["metrics"]
    assert m["acceptance_pooled"] == pytest.approx(4 / 6) and m["acceptance_per_request"] == pytest.approx(0.75)
    assert m["mean_accepted_tokens_pooled"] == pytest.approx(7 / 3)
    assert m["mean_accepted_tokens_per_request"] == pytest.approx(2.5)


# ---- speedups --------------------------------------------------------------------------------------------------

def two_requests():
    """Baseline: 10 tokens each, E2E 2 and 4, first tokens at 0.5 and 1.0; the method: E2E 1 and 3."""
    rows = []
    for method, finishes in (("baseline", (2.0, 4.0)), ("speculative", (1.0, 3.0))):
        for i, (first, finish) in enumerate(zip((0.5, 1.0), finishes)):
            rows.append(request(method, i, concurrency=2, first=first, finish=finish, tokens=10, requests=2,
                                rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}] * 3))
    return rows


def test_speedups_by_hand_with_too_few_requests():
    m_run = serving_run(summarize(two_requests(), {}), "speculative")
    m = m_run["metrics"]
    # throughput: (20 / (1 + 3)) / (20 / (2 + 4)) = 1.5, the ratio of totals (a mean of per-request ratios: 1.667)
    assert m["speedup_tput"] == pytest.approx(1.5)
    # mean TPOT: baseline (1.5 / 9 + 3 / 9) / 2 = 0.25, the method's (0.5 / 9 + 2 / 9) / 2 = 0.1389: 1.8
    assert m["speedup_tpot"] == pytest.approx(1.8)
    # the system: 20 tokens in 3 s against 20 in 4 s
    assert m["output_tok_s_ratio"] == pytest.approx(4 / 3)
    assert m["speedup_tput_ci95"] is None and m["speedup_tpot_ci95"] is None
    assert [f["code"] for f in m_run["flags"]] == ["few_samples"]
    tput = next(c for c in columns(served=True) if c.header.startswith("speedup tput"))
    assert cell(m_run, tput) == "1.50 (n=2) !"


def test_eight_requests_get_an_interval():
    rows = []
    for i in range(8):
        rows.append(request("baseline", i, concurrency=4, first=0.2, finish=2.0, tokens=10))
        rows.append(request("speculative", i, concurrency=4, first=0.2, finish=1.0, tokens=10,
                            rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}] * 3))
    run = serving_run(summarize(rows, {}), "speculative")
    # every request twice as fast: 2.0 and an interval that cannot be anything else
    assert run["metrics"]["speedup_tput"] == pytest.approx(2.0)
    assert run["metrics"]["speedup_tput_ci95"] == pytest.approx([2.0, 2.0])
    # TPOT 1.8 / 9 against 0.8 / 9
    assert run["metrics"]["speedup_tpot_ci95"] == pytest.approx([1.8 / 0.8] * 2)
    assert run["flags"] == [] and run["metrics"]["requests_paired"] == 8


def test_a_conversations_turns_are_one_cluster_of_the_interval():
    """Under load the throughput interval resamples conversations: requests 0 and 2 are turns of conversation 0, 1 and
    3 of conversation 1; each cluster sums its turns (tokens 10 + 10, E2E 1 + 1 against 2 + 2)."""
    from eval.served_figures import REQUESTS, requests_paired, with_slots
    from eval.totals import paired_clusters

    def side(method, finish):
        return [request(method, i, concurrency=4, first=0.2, finish=finish, tokens=10, conversation=i % 2,
                        turn=1 + i // 2) for i in range(4)]

    mine, theirs = with_slots(side("speculative", 1.0)), with_slots(side("baseline", 2.0))
    tput, per_token = (paired_clusters(mine, theirs, REQUESTS, ratio_of) for ratio_of in REQUESTS.ratios)
    assert tput == [(20, 2.0, 20, 4.0)] * 2 and len(per_token) == 2 and requests_paired(mine, theirs) == 4
    single = [{k: v for k, v in r.items() if k not in ("conversation", "turn")} for r in side("baseline", 2.0)]
    assert len(paired_clusters(with_slots(single), with_slots(single), REQUESTS)) == 4  # no conversations: a request each


def test_requests_pair_by_position_when_prompts_cycle():
    # 4 requests of 2 prompts (sample ids 0, 1, 0, 1): request 2 of the method differs from request 2 of the
    # baseline, request 0 (the same prompt) does not
    rows = []
    for i in range(4):
        rows.append(request("baseline", i, sample_id=i % 2, output=[1, 2, 3, 4, 5], requests=4))
        rows.append(request("speculative", i, sample_id=i % 2, output=[1, 2, 9, 4, 5] if i == 2 else [1, 2, 3, 4, 5],
                            rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}], requests=4))
    m = serving_run(summarize(rows, {}), "speculative")["metrics"]
    assert m["requests_paired"] == 4 and m["exact_match"] == pytest.approx(0.75)
    assert [(x["request"], x["sample_id"], x["first_mismatch"]) for x in m["mismatches"]] == [(2, 0, 2)]


# ---- the prediction and the crossover ------------------------------------------------------------------------------

def probe(c, v):
    return CostProbe(c_by_draft={"d": c}, v={2: v})


def test_costs_at_the_mean_occupancy_by_hand():
    probes = {2: probe(0.2, 1.5), 4: probe(0.3, 2.5)}
    at = costs_at(probes, "d", 2, 3.0)  # halfway from 2 to 4
    assert at["c"] == pytest.approx(0.25) and at["v"] == pytest.approx(2.0) and at["probed"] == [2, 4]
    below = costs_at(probes, "d", 2, 1.85)  # within 10% below the smallest probed: the nearest probed
    assert (below["c"], below["v"], below["rows"], below["probed"]) == (0.2, 1.5, 2, [2])
    assert costs_at(probes, "d", 2, 1.2) is None and costs_at(probes, "d", 2, 4.5) is None  # farther: not priced
    assert costs_at(probes, "other", 2, 3.0) is None and costs_at(probes, "d", 4, 3.0) is None


def cost_entry(c, v):
    return {"p1": {"c_by_draft": {"d": c}, "v": {"2": v}, "target_forward_s": 0.01}}


def test_prediction_at_the_mean_occupancy_through_summarize():
    # concurrency 4, three requests in flight from 0 to 1.0: occupancy 3; every draft accepted: alpha 1, a round
    # emits 3 tokens at 2 * 0.25 + 2.0 = 2.5 target forwards: 1.2
    rows = [request(m, i, concurrency=4, first=0.2, finish=1.0, tokens=4, requests=3,
                    rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}] if m == "speculative" else None)
            for m in ("baseline", "speculative") for i in range(3)]
    progress = {"costs": {"2": cost_entry(0.2, 1.5), "4": cost_entry(0.3, 2.5)}}
    m = serving_run(summarize(rows, progress), "speculative")["metrics"]
    assert m["mean_in_flight"] == pytest.approx(3.0) and m["alpha"] == 1.0
    assert m["draft_cost_ratio_c"] == pytest.approx(0.25) and m["verify_cost_ratio_v"] == pytest.approx(2.0)
    assert m["cost_batch_sizes"] == [2, 4] and m["predicted_speedup"] == pytest.approx(1.2)


def test_crossing_of_a_falling_curve_by_hand():
    found = crossing([8, 1, 4, 2], [0.6, 1.5, 0.8, 1.2], [None, [1.4, 1.6], [0.7, 0.9], [1.05, 1.3]])
    # between 2 (1.2) and 4 (0.8): 2 + (1 - 1.2) * (4 - 2) / (0.8 - 1.2) = 3
    assert found["verdict"] == "crosses 1" and found["crossing"]["load"] == pytest.approx(3.0)
    assert found["crossing"]["between"] == [2, 4] and found["crossing"]["direction"] == "down"
    assert found["highest_load_ci_above_1"] == 2
    assert crossing_text(found, "concurrency") == "crosses 1 at 3 (between 2 and 4), falling"


def test_curves_that_never_cross_and_one_that_rises():
    above = crossing([1, 2, 4], [1.3, 1.2, 1.1], [[1.2, 1.4], [0.9, 1.5], [1.02, 1.2]])
    assert above["verdict"] == "above 1 at every load measured" and above["crossing"] is None
    assert above["highest_load_ci_above_1"] == 4  # the highest whose interval is wholly above 1, not the last in a row
    below = crossing([1, 2], [0.9, 0.7], [None, None])
    assert below["verdict"] == "below 1 at every load measured" and below["highest_load_ci_above_1"] is None
    rising = crossing([1, 3, 5], [0.8, 1.2, None])  # a load without a figure is left out
    assert rising["crossing"]["load"] == pytest.approx(2.0) and rising["crossing"]["direction"] == "up"
    assert "highest_load_ci_above_1" not in rising  # no intervals (a prediction): nothing to say there


def test_a_crossing_next_to_all_at_once_has_no_interpolated_load():
    found = crossing([2.0, math.inf], [1.1, 0.9])
    assert found["crossing"]["load"] is None and found["crossing"]["between"] == [2.0, math.inf]
    assert crossing_text(found, "request_rate") == "crosses 1 between 2/s and all at once, falling"


def sweep(concurrencies=(1, 2, 4), spec_finish=(0.5, 1.0, 2.5), requests=8) -> list[dict]:
    """Per concurrency c, `requests` requests of 10 tokens arriving at once, c at a time: each takes 1.0 s in the
    baseline, spec_finish in the method, its first token 0.1 s after its admission (the queue wait before)."""
    rows = []
    for c, spec in zip(concurrencies, spec_finish):
        for method, took in (("baseline", 1.0), ("speculative", spec)):
            for i in range(requests):
                start = (i // c) * took
                rows.append(request(method, i, concurrency=c, admitted=start, first=start + 0.1, finish=start + took,
                                    tokens=10, requests=requests, rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}] * 3
                                    if method == "speculative" else None))
    return rows


def test_the_crossover_of_a_concurrency_sweep_by_hand():
    summary = summarize(sweep(), {})
    (found,) = summary["serving"]["crossovers"]
    assert found["axis"] == "concurrency" and found["loads"] == [1, 2, 4]
    # speedups 1 / 0.5 = 2, 1, 0.4: at 2 it touches 1 (at or above), below after: the crossing at 2 + (1 - 1) ... = 2
    assert found["speedup_tput"] == pytest.approx([2.0, 1.0, 0.4])
    assert found["measured"]["crossing"]["load"] == pytest.approx(2.0)
    assert found["measured"]["highest_load_ci_above_1"] == 1  # at 2 the interval [1, 1] is not above 1
    assert found["line"] == "speculative draft=d gamma=2 constant greedy"


def schedule_sweep(requests=8):
    """At concurrency 8, `requests` requests of 10 tokens, all admitted at 0 (first token at 0.1): the baseline
    finishes each at 2.0, constant K=1 at 1.6, constant K=2 at 1.0; the recommended schedule at gamma 2 at 0.5, at
    gamma 3 the first half at 0.8 and the second at 1.2."""
    finishes = {("baseline", None, None): [2.0] * requests, ("speculative", 1, "constant"): [1.6] * requests,
                ("speculative", 2, "constant"): [1.0] * requests,
                ("speculative", 2, "recommended"): [0.5] * requests,
                ("speculative", 3, "recommended"): [0.8 if i < requests // 2 else 1.2 for i in range(requests)]}
    rounds = [{"drafted": 2, "accepted": 2, "emitted": 3}] * 3
    return [request(method, i, concurrency=8, first=0.1, finish=finish, tokens=10, requests=requests,
                    **({"gamma": gamma, "schedule": schedule, "rounds": rounds} if gamma else {}))
            for (method, gamma, schedule), ends in finishes.items() for i, finish in enumerate(ends)]


def test_a_schedule_against_the_best_fixed_k_by_hand():
    summary = summarize(schedule_sweep(), {})
    versus = {v["label"].split(" conc=")[0]: v for v in summary["serving"]["versus_fixed"]}
    assert sorted(versus) == ["speculative draft=d gamma=2 recommended", "speculative draft=d gamma=3 recommended"]
    # the best fixed K: K=2 (speedup 2.0 / 1.0 = 2.0) over K=1 (2.0 / 1.6 = 1.25), whatever the schedule's gamma
    assert {v["best_fixed_gamma"] for v in versus.values()} == {2}
    at_two, at_three = versus["speculative draft=d gamma=2 recommended"], versus["speculative draft=d gamma=3 recommended"]
    # gamma 2: (80 / 4.0) / (80 / 8.0) = 2.0, every request twice as fast: an interval of nothing else, above
    assert at_two["tput_ratio"] == pytest.approx(2.0) and at_two["tput_ratio_ci95"] == pytest.approx([2.0, 2.0])
    assert at_two["verdict"] == "above" and at_two["requests_paired"] == 8
    # gamma 3: (80 / (4 x 0.8 + 4 x 1.2)) / (80 / 8.0) = 1.0; requests 1.25 and 0.83 as fast: the interval holds 1
    assert at_three["tput_ratio"] == pytest.approx(1.0)
    low, high = at_three["tput_ratio_ci95"]
    assert low < 1 < high and at_three["verdict"] == "tied"
    # the system: 80 tokens by 1.2 against 80 by 1.0
    assert at_three["output_tok_s_ratio"] == pytest.approx(1.0 / 1.2)
    assert "Schedules against the best fixed K" in markdown(summary, "t")
    # four requests pair: no interval, no verdict beyond that
    (few, _) = summarize(schedule_sweep(requests=4), {})["serving"]["versus_fixed"]
    assert few["tput_ratio_ci95"] is None and few["verdict"] == "too few requests"


# ---- routing and the report --------------------------------------------------------------------------------------

def test_fixed_batches_are_unchanged_beside_serving_points():
    fixed = paired_run(units=8)
    alone, both = summarize(fixed, {}), summarize(fixed + sweep(), {})
    assert both["runs"] == alone["runs"] and both["best"] == alone["best"]
    assert "serving" not in alone and alone["legend"] == {k: v for k, v in both["legend"].items() if k in alone["legend"]}
    assert {r["concurrency"] for r in both["serving"]["runs"]} == {1, 2, 4}
    assert all(r["concurrency"] is None for r in both["runs"])


def test_eval_rebuilds_a_serving_folder(tmp_path):
    rows = sweep()
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in rows))
    (tmp_path / "progress.json").write_text(json.dumps({"costs": {str(c): cost_entry(0.2, 1.2 + 0.3 * c)
                                                                  for c in (1, 2, 4)}}))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"name": "served", "load": {
        "concurrency": [1, 2, 4], "slo": {"ttft_s": 0.5, "tpot_ms": 50.0}}}))
    result = subprocess.run([sys.executable, "-m", "eval", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    written = json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)
    assert written["serving"]["slo"] == {"ttft_s": 0.5, "tpot_ms": 50.0}
    # the SLO from config.yaml: the baseline's TPOT 0.9 / 9 = 100 ms misses 50 ms; the method's at concurrency 2
    # (0.9 s a request) too; at concurrency 1 (0.4 / 9 = 44 ms) every request meets TTFT 0.5, timed from its slot
    # (0.1 s; the wait for the slot is queue_s): 8 requests in 8 * 0.5 s
    assert serving_run(written, "baseline", concurrency=1)["metrics"]["goodput_req_s"] == 0
    assert serving_run(written, "speculative", concurrency=2)["metrics"]["goodput_req_s"] == 0
    assert serving_run(written, "speculative", concurrency=1)["metrics"]["goodput_req_s"] == pytest.approx(2.0)
    # occupancy 1 (one request at a time); alpha 1, gamma 2 at c 0.2 and v(1) = 1.5: 3 / 1.9
    assert serving_run(written, "speculative", concurrency=1)["metrics"]["mean_in_flight"] == pytest.approx(1.0)
    assert serving_run(written, "speculative", concurrency=1)["metrics"]["predicted_speedup"] == pytest.approx(3 / 1.9)
    text = (tmp_path / "summary.md").read_text()
    assert "## Under load" in text and "### conc=2 greedy (8 requests)" in text
    assert "| speculative draft=d gamma=2 constant greedy | concurrency (rate all at once) |" in text
    for name in ("speedup_vs_concurrency.png", "tpot_vs_throughput.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG", name
    assert not (tmp_path / "speedup.png").exists()  # no fixed batch: none of their plots


def test_a_failed_and_a_partial_load_point():
    rows = sweep(concurrencies=(1,), spec_finish=(0.5,))
    spec = next(r for r in rows if r["method"] == "speculative")
    label = "speculative draft=d gamma=2 constant conc=1 greedy"
    failed = {**Point.of(spec).values(), "concurrency": 2, "batch_size": 2, "status": "failed", "error": "boom"}
    progress = {"planned": {label: 2, "baseline conc=1 greedy": 1}, "failures": [failed]}
    summary = summarize(rows, progress)
    assert serving_run(summary, "speculative", concurrency=2)["status"] == "failed"
    partial = serving_run(summary, "speculative", concurrency=1)
    assert partial["status"] == "partial" and partial["repeats"] == {"done": 1, "planned": 2, "paired": 1,
                                                                      "cross_process": 0}
    assert any(n.startswith(f"{label}: partial, 1 of 2 repeats") for n in summary["notes"])
    assert not any("planned but not measured" in n for n in summary["notes"])
    assert "| speculative draft=d gamma=2 constant greedy | partial 1/2 |" in markdown(summary, "t")


def test_the_terminal_table_and_serving_csv(tmp_path):
    from rich.console import Console

    from eval.report import print_table, write_report

    summary = summarize(sweep(), {})
    console = Console(record=True, width=300)
    print_table(summary, console)
    text = console.export_text()
    assert "speculate under load" in text and "2.00 [2.00, 2.00]" in text and "speculate (all columns" not in text
    write_report(tmp_path, summary, "t", with_plots=False)
    rows = (tmp_path / "serving.csv").read_text().splitlines()
    assert len(rows) == 1 + 6 and rows[0].startswith("label,status,method")


def test_records_without_request_times_are_left_out_and_said():
    rows = sweep(concurrencies=(1,), spec_finish=(0.5,))
    rows[-1] = dict(rows[-1], finish_s=None)  # the method's last request
    summary = summarize(rows, {})
    assert serving_run(summary, "speculative")["metrics"]["requests"] == 7
    assert any("1 of its records carry no request times" in n for n in summary["notes"])


# ---- issue 36: figures that mean what their names say ----------------------------------------------------------

def closed_loop(count, service=0.2, prefill=0.02, concurrency=1, method="baseline"):
    """`count` requests arriving at 0 into a closed loop of one slot, each served in `service` s (its first token
    `prefill` s after admission), back to back: request i holds the slot from 0.2 i to 0.2 (i + 1)."""
    return [request(method, i, concurrency=concurrency, arrival=0.0, admitted=service * i, first=service * i + prefill,
                    finish=service * (i + 1), tokens=5, requests=count) for i in range(count)]


@pytest.mark.parametrize("count", [7, 28])
def test_a_closed_loop_times_each_request_from_its_slot_not_from_t0(count):
    # every request takes 0.02 s to its first token and 0.2 s end to end once it holds the slot, however many wait:
    # timed from t=0 instead, TTFT P50 grew with the requests (0.62 at 7, 2.72 at 28) and only request 0 met the SLO
    config = {"load": {"concurrency": [1], "slo": {"ttft_s": 0.5}}}
    m = serving_run(summarize(closed_loop(count), {}, config), "baseline")["metrics"]
    assert m["ttft_s"]["p50"] == pytest.approx(0.02) and m["ttft_s"]["p99"] == pytest.approx(0.02)
    assert m["e2e_s"]["p50"] == pytest.approx(0.2) and m["e2e_s"]["mean"] == pytest.approx(0.2)
    assert m["slo_met"] == pytest.approx(1.0) and m["goodput_req_s"] == pytest.approx(count / (0.2 * count))
    # the client's wait for the slot is beside: request i waits 0.2 i; mean 0.1 (count - 1)
    assert m["queue_s"]["mean"] == pytest.approx(0.1 * (count - 1))


def test_an_open_loop_without_a_binding_cap_times_from_arrival():
    # concurrency 4 never binds for two requests: the clock starts at arrival, the wait for the engine counts
    rows = [request("baseline", 0, concurrency=4, arrival=0.0, admitted=0.0, first=0.1, finish=0.5, requests=2),
            request("baseline", 1, concurrency=4, arrival=0.05, admitted=0.1, first=0.3, finish=0.6, requests=2)]
    m = serving_run(summarize(rows, {}), "baseline")["metrics"]
    assert m["ttft_s"]["mean"] == pytest.approx((0.1 + 0.25) / 2) and m["e2e_s"]["mean"] == pytest.approx((0.5 + 0.55) / 2)
    assert m["queue_s"]["mean"] == 0


def test_speedup_tput_pairs_e2e_from_the_slot():
    # one slot, two requests at 0, 10 tokens each: the baseline serves them in 1 s and 3 s, the method in 0.5 s and
    # 3 s. From the slot: (20 / 3.5) / (20 / 4) = 8 / 7; from t=0 it read (20 / (0.5 + 3.5)) / (20 / (1 + 4)) = 1.25
    rows = []
    for method, services in (("baseline", (1.0, 3.0)), ("speculative", (0.5, 3.0))):
        starts = (0.0, services[0])
        rows += [request(method, i, concurrency=1, admitted=starts[i], first=starts[i] + 0.1,
                         finish=starts[i] + services[i], tokens=10, requests=2,
                         rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}] * 3) for i in range(2)]
    m = serving_run(summarize(rows, {}), "speculative")["metrics"]
    assert m["speedup_tput"] == pytest.approx(8 / 7) and m["e2e_s"]["p99"] == pytest.approx(3.0, rel=0.02)


def test_hybrid_under_load_has_acceptance_by_source_with_never_chosen_sources():
    # hybrid drafted from lookup (3 of 4 accepted) and draft (1 of 2); suffix was offered and never chosen
    rounds = [{"drafted": 4, "accepted": 3, "emitted": 4, "sources": {"lookup": [4, 3]}},
              {"drafted": 2, "accepted": 1, "emitted": 2, "sources": {"draft": [2, 1]}}]
    rows = [request("hybrid", 0, rounds=rounds, requests=1, tokens=6)]
    summary = summarize(rows, {})
    table = serving_run(summary, "hybrid")["metrics"]["acceptance_by_source"]
    assert table["lookup"] == {"drafted": 4, "accepted": 3, "acceptance": 0.75, "rounds": 1}
    assert table["draft"] == {"drafted": 2, "accepted": 1, "acceptance": 0.5, "rounds": 1}
    assert table["suffix"] == {"drafted": 0, "accepted": 0, "acceptance": None, "rounds": 0}
    text = markdown(summary)
    assert "Acceptance per draft source" in text and "suffix - (0/0 in 0 rounds)" in text


def test_hybrid_sources_offered_are_the_drafters_own():
    from decode.drafters.hybrid import SOURCES
    from decode.methods import REGISTRY
    assert REGISTRY["hybrid"].draft_sources == SOURCES


def test_alpha_under_load_and_in_batches_comes_from_chain_rounds_only():
    # two chain rounds accepting 2 of 2 and 0 of 2: alpha solves 2 a (1 - a^2) / (1 - a) ... by hand: the expected
    # accepted drafts of a 2-draft chain is a + a^2, and 2 (a + a^2) = 2 gives a = 0.618 (the golden ratio's
    # inverse); a merged tree round of 4 nodes accepting 0 must not enter it (with it alpha falls)
    tree = {"drafted": 4, "accepted": 0, "emitted": 1, "parents": [-1, 0, -1, 2], "ranks": [], "tried": [2],
            "sources": {"lookup": [2, 0], "draft": [2, 0]}}
    rounds = [{"drafted": 2, "accepted": 2, "emitted": 3, "sources": {"draft": [2, 2]}},
              {"drafted": 2, "accepted": 0, "emitted": 1, "sources": {"draft": [2, 0]}}, tree]
    golden = (math.sqrt(5) - 1) / 2
    served = serving_run(summarize([request("hybrid", 0, rounds=rounds, requests=1, tokens=5)], {}), "hybrid")
    assert served["metrics"]["alpha"] == pytest.approx(golden, abs=1e-6) and served["metrics"]["alpha_rounds"] == 2
    assert served["metrics"]["acceptance_by_depth_rank"][0]["trials"] == [1, 1]  # the tree round, by depth and rank
    batch = [record("baseline", 0, tokens=5), record("hybrid", 0, tokens=5, rounds=rounds)]
    from sample_records import run as fixed_run
    assert fixed_run(summarize(batch, {}), "hybrid")["metrics"]["alpha"] == pytest.approx(golden, abs=1e-6)


def synthetic_sweep():
    """Two load points (concurrency 1 and 2), the baseline, a real speculative line and a synthetic one at 0.6."""
    rows = []
    for concurrency, slow in ((1, 1.0), (2, 1.5)):
        for method, speed, extra in (("baseline", 1.0, {}), ("speculative", 2.0, {}),
                                     ("speculative", 1.5, {"synthetic_acceptance": 0.6})):
            for i in range(2):
                service = slow / speed
                rows.append(request(method, i, concurrency=concurrency, admitted=service * i,
                                    first=service * i + 0.05, finish=service * (i + 1), tokens=10, requests=2,
                                    rounds=[{"drafted": 2, "accepted": 1, "emitted": 2}] * 5, **extra))
    return rows


def test_synthetic_points_under_load_are_marked_and_kept_out_of_crossovers():
    summary = summarize(synthetic_sweep(), {})
    synthetic = [r for r in summary["serving"]["runs"] if r.get("synthetic_acceptance") is not None]
    assert len(synthetic) == 2 and all(r["metrics"]["synthetic"] is True for r in synthetic)
    assert all(r["metrics"]["exact_match"] is None for r in synthetic)
    real = [r for r in summary["serving"]["runs"] if r["method"] == "speculative" and r not in synthetic]
    assert all(r["metrics"]["exact_match"] == 1.0 for r in real)
    lines = [c["line"] for c in summary["serving"]["crossovers"]]
    assert lines and not any("synthetic" in line for line in lines)
    text = markdown(summary)
    assert "Synthetic acceptance under load" in text and "outputs are not the target's" in text
    header = next(line for line in text.splitlines() if line.startswith("| point | status |"))
    assert "| synthetic |" in header and header.rstrip().endswith("| exact |")
    assert any("synthetic acceptance" in note and "take no part in the crossovers" in note for note in summary["notes"])


def test_a_cap_above_the_requests_is_said():
    rows = [request("baseline", i, concurrency=64, admitted=0.0, first=0.1, finish=0.5 + 0.1 * i, requests=3)
            for i in range(3)]
    summary = summarize(rows, {})
    assert serving_run(summary, "baseline")["metrics"]["max_in_flight"] == 3
    assert any("conc=64" in note and "at most 3 could be in flight" in note for note in summary["notes"])


def test_caps_above_the_requests_are_one_load_in_the_crossover():
    # 6 requests at concurrency 2, 8 and 16: 8 and 16 are the same load, 6 requests in flight (batch size 6); the
    # line runs 2 -> 6, so the speedup 2.0 at 2 and 0.5 at 6 crosses 1 at 2 + (1 - 2) * 4 / (0.5 - 2) = 4.67
    rows = []
    for c, spec in ((2, 0.5), (8, 2.0), (16, 2.0)):
        for method, took in (("baseline", 1.0), ("speculative", spec)):
            for i in range(6):
                start = (i // c) * took
                rows.append(request(method, i, concurrency=c, admitted=start, first=start + 0.1, finish=start + took,
                                    tokens=10, requests=6, batch_size=min(c, 6),
                                    rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}] * 3
                                    if method == "speculative" else None))
    (found,) = summarize(rows, {})["serving"]["crossovers"]
    assert found["loads"] == [2, 6] and found["labels"][1].startswith("speculative") and "conc=8" in found["labels"][1]
    assert found["measured"]["crossing"]["load"] == pytest.approx(2 + 4 * 2 / 3)


def test_a_light_load_is_not_priced_at_the_probed_batch_far_from_it():
    # probes at 10 rows only; a load that keeps one request at a time busy: no prediction, and the notes say why
    rows = [request(m, i, concurrency=10, arrival=float(i), admitted=float(i), first=i + 0.1, finish=i + 0.5,
                    tokens=5, requests=10, batch_size=10, rate=1.0,
                    rounds=[{"drafted": 2, "accepted": 2, "emitted": 3}] * 2 if m == "speculative" else None)
            for m in ("baseline", "speculative") for i in range(10)]
    progress = {"costs": {"10": {"p1": {"c_by_draft": {"d": 0.3}, "v": {"2": 1.2}, "target_forward_s": 0.1}}}}
    summary = summarize(rows, progress)
    m = serving_run(summary, "speculative")["metrics"]
    # in flight 0.5 s of every 1 s: 5 / 9.5 on average over the span 0 .. 9.5, 1.0 while busy
    assert m["busy_in_flight"] == pytest.approx(1.0) and m["mean_in_flight"] == pytest.approx(5.0 / 9.5)
    assert m["predicted_speedup"] is None and m["cost_rows"] is None
    assert any("1.00 requests in flight while busy" in note and "10 rows" in note for note in summary["notes"])


def test_the_span_runs_from_the_load_points_start_and_alpha_rounds_count_drafting_rounds():
    # the first request arrives 0.5 s after the start (vLLM's first gap): the span is 0 .. 2.0, not 0.5 .. 2.0
    rounds = [{"drafted": 2, "accepted": 1, "emitted": 2}, {"drafted": 0, "accepted": 0, "emitted": 1}]
    rows = [request("speculative", 0, arrival=0.5, admitted=0.5, first=0.6, finish=2.0, tokens=4, requests=1,
                    rounds=rounds)]
    m = serving_run(summarize(rows, {}), "speculative")["metrics"]
    assert m["span_s"] == pytest.approx(2.0) and m["output_tok_s"] == pytest.approx(2.0)
    assert m["alpha_rounds"] == 1  # the round that drafted nothing carries nothing of alpha


def test_slots_go_in_arrival_order_when_a_conversations_turn_arrives_after_later_requests():
    """One slot. Request 1 is request 0's next turn: it arrives at 1.5 (0.5 s after request 0's last token), after
    request 2 (0.2), which the engine admitted first at 1.0; request 1 gets the slot when request 2 leaves at 2.0."""
    from eval.served_figures import with_slots

    rows = [dict(request=0, repeat=0, concurrency=1, arrival_s=0.0, finish_s=1.0),
            dict(request=1, repeat=0, concurrency=1, arrival_s=1.5, finish_s=3.0, follows=0, think_s=0.5),
            dict(request=2, repeat=0, concurrency=1, arrival_s=0.2, finish_s=2.0)]
    slots = {s["request"]: s["slot_s"] for s in with_slots(rows)}
    assert slots == {0: 0.0, 2: 1.0, 1: 2.0}
