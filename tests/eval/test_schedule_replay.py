"""The schedule replayed in seconds with a cost profile (eval/replay.py simulate, eval/costs.py Profile, eval/predict.py)
against schedules worked out by hand: two rows of known acceptance and known step costs, a static batch whose fast
row leaves, a request joining mid-round; Leviathan's closed form at batch 1."""
import json
import subprocess
import sys

import pytest

from eval.costs import Profile, ProfileError, TARGET, draft_model
from eval.leviathan import predicted_speedup, solve_alpha
from eval.predict import predict_run
from eval.replay import MissingCost, Pricer, as_request, replay_load, simulate


def profile(steps=None, prefills=None) -> Profile:
    """Target steps: rows 1 -> 0.8 s (1 token), 1.2 s (3 tokens); rows 2 -> 1.0 s, 1.5 s. Draft step: 0.25 s, 0.3 s.
    Prefills: 0.01 s a target token, 0.005 s a draft token (rows x width)."""
    steps = steps or [(TARGET, 1, 1, 0.8), (TARGET, 1, 3, 1.2), (TARGET, 2, 1, 1.0), (TARGET, 2, 3, 1.5),
                      (draft_model("d"), 1, 1, 0.25), (draft_model("d"), 2, 1, 0.3)]
    prefills = prefills if prefills is not None else [(TARGET, 1, 10, 0.1), (TARGET, 2, 10, 0.2),
                                                      (draft_model("d"), 1, 10, 0.05), (draft_model("d"), 2, 10, 0.1)]
    return Profile(steps=[{"model": m, "rows": r, "width": w, "kv": 100, "s": s, "reps_s": [s]} for m, r, w, s in steps],
                   prefills=[{"model": m, "rows": r, "tokens": t, "s": s, "reps_s": [s]} for m, r, t, s in prefills])


def request(rounds=None, new_tokens=None, arrival=0.0, prompt=10):
    if rounds is not None:
        rounds = [{"drafted": d, "accepted": a, "emitted": a + 1} for d, a in rounds]
        new_tokens = 1 + sum(r["emitted"] for r in rounds)
    return {"arrival_s": arrival, "prompt_tokens": prompt, "new_tokens": new_tokens, "rounds": rounds}


def test_two_rows_of_a_static_batch_by_hand():
    # A: 2 rounds of gamma 2 (3 then 1 tokens), 5 tokens; B: 1 round (2 tokens), 3 tokens; prompts 10 and 8
    a, b = request([(2, 2), (2, 0)]), request([(2, 1)], prompt=8)
    timed = simulate([a, b], 2, Pricer(profile(), "d"))
    # prefill of 2 rows 10 wide: 0.2, first tokens at 0.2; the draft's prefill 0.1; round 1 over 2 rows: 2 x 0.3 +
    # 1.5 = 2.1 -> 2.4, B done; round 2 over A alone: 2 x 0.25 + 1.2 = 1.7 -> 4.1
    assert [t["first_token_s"] for t in timed] == pytest.approx([0.2, 0.2])
    assert [t["finish_s"] for t in timed] == pytest.approx([4.1, 2.4])
    # the baseline of the same rows: prefill 0.2, 2 steps over 2 rows (B's 2 tokens after its first) -> 2.2,
    # then A's last 2 alone at 0.8 -> 3.8
    base = simulate([request(new_tokens=5), request(new_tokens=3, prompt=8)], 2, Pricer(profile()))
    assert [t["finish_s"] for t in base] == pytest.approx([3.8, 2.2])


def test_the_drafts_window_is_the_prefill_the_replay_prices():
    # the rows of the test above, their draft prefilled over a window of 4 tokens (speculative.draft_context)
    records = [dict(prompt_tokens=10, new_tokens=5, rounds=[{"drafted": 2, "accepted": 2, "emitted": 3},
                                                            {"drafted": 2, "accepted": 0, "emitted": 1}]),
               dict(prompt_tokens=8, new_tokens=3, rounds=[{"drafted": 2, "accepted": 1, "emitted": 2}])]
    windowed = [as_request(dict(r, draft_context=4)) for r in records]
    assert [r["draft_tokens"] for r in windowed] == [4, 4]
    timed = simulate(windowed, 2, Pricer(profile(), "d"))
    # the draft's prefill of 2 rows x 4 tokens on the line through (10, 0.05) and (20, 0.1): 0.04, not 0.1; then as
    # above: round 1 2.1 -> 2.34, B done; round 2 1.7 -> 4.04
    assert [t["draft_prefill_s"] for t in timed] == pytest.approx([0.04, 0.04])
    assert [t["finish_s"] for t in timed] == pytest.approx([4.04, 2.34])
    # a window wider than the prompts, or none: the prompts' 10 tokens, as above
    for window in (12, None):
        requests = [as_request(dict(r, draft_context=window)) for r in records]
        assert [t["finish_s"] for t in simulate(requests, 2, Pricer(profile(), "d"))] == pytest.approx([4.1, 2.4])
    # the draft's steps read its own cache: with draft steps of 2 rows timed at a cache of 5 (0.2 s) and of 100
    # (0.3 s), round 1 (caches 4 + 1 and 10 + 1 tokens) prices its 2 draft forwards at the cache of 5, 0.2 s each:
    # 0.2 + 0.04 + 2 x 0.2 + 1.5 = 2.14, B done; round 2 (A: 4 + 4) alone at the single row's 0.25: 1.7 -> 3.84
    kv_profile = profile()
    kv_profile.steps.append({"model": draft_model("d"), "rows": 2, "width": 1, "kv": 5, "s": 0.2, "reps_s": [0.2]})
    timed = simulate(windowed, 2, Pricer(kv_profile, "d"))
    assert [t["finish_s"] for t in timed] == pytest.approx([3.84, 2.14])


def test_a_compiled_batch_keeps_its_capacity_and_its_compiled_width():
    # A: rounds of 2 then 1 drafted (3 + 1 tokens), 5 tokens; B: one round of 1 drafted and accepted, 3 tokens
    a, b = request([(2, 2), (1, 0)]), request([(1, 1)])
    eager, compiled = profile(), profile()
    compiled.meta["compile"] = True
    # eager: prefill 0.2 + draft's 0.1; round 1 over both, its widest draft 2: 2 x 0.3 + 1.5 -> 2.4, B done; round 2
    # over A alone, 1 drafted: 0.25 + the 2-token step between 1 (0.8) and 3 (1.2) tokens, 1.0 -> 3.65
    assert [t["finish_s"] for t in simulate([a, b], 2, Pricer(eager, "d"))] == pytest.approx([3.65, 2.4])
    # compiled: round 2 still runs the batch's 2 rows (B a dead row) at the compiled width 3: 0.3 + 1.5 -> 4.2
    assert [t["finish_s"] for t in simulate([a, b], 2, Pricer(compiled, "d"))] == pytest.approx([4.2, 2.4])
    # a batch of 1 on a profile of rows 2 only: its capacity is 2 from its prefill on (0.2 + 0.1, then 2.1 and 1.8)
    only_two = profile([(TARGET, 2, 1, 1.0), (TARGET, 2, 3, 1.5), (draft_model("d"), 2, 1, 0.3)])
    only_two.meta["compile"] = True
    assert simulate([a], 1, Pricer(only_two, "d"))[0]["finish_s"] == pytest.approx(0.3 + 2.1 + 1.8)
    # a compiled profile prices no load (its row buckets are not priced yet)
    with pytest.raises(MissingCost, match="row buckets"):
        replay_load([dict(a, request=0, arrival_s=0.0)], Pricer(compiled, "d"), True)


def test_a_request_joining_mid_round_waits_for_the_round():
    # A arrives at 0, B at 0.5, during A's first round (0.15 -> 1.85): B is admitted when it ends
    a, b = request([(2, 2), (2, 0)]), request([(2, 1)], arrival=0.5)
    timed = simulate([a, b], 2, Pricer(profile(), "d"))
    # A: prefill 0.1, draft prefill 0.05, round over A alone 1.7 -> 1.85; B: prefill 0.1 -> 1.95, draft 0.05 -> 2.0;
    # a round over both (A's second, B's first): 2.1 -> 4.1
    assert timed[0]["first_token_s"] == pytest.approx(0.1)
    assert (timed[1]["admitted_s"], timed[1]["first_token_s"]) == pytest.approx((1.85, 1.95))
    assert [t["finish_s"] for t in timed] == pytest.approx([4.1, 4.1])
    # with one slot, B waits for A to finish: A's two rounds alone 0.15 + 1.7 + 1.7 = 3.55
    one = simulate([a, b], 1, Pricer(profile(), "d"))
    assert one[1]["admitted_s"] == pytest.approx(3.55)


def test_arrivals_of_unlike_length_are_replayed_as_the_engines_separate_prefills():
    # A (10 tokens) and B (40) arrive together: 40 x 2 = 80 wide for 50 tokens is 38% padding, so the engine
    # prefills them apart, the shorter first (decode/arrivals.py prefill_batches), then the draft both at once
    p = profile(prefills=[(TARGET, 1, 10, 0.1), (TARGET, 1, 40, 0.4), (TARGET, 2, 10, 0.2), (TARGET, 2, 40, 0.8),
                          (draft_model("d"), 1, 10, 0.05), (draft_model("d"), 1, 40, 0.2),
                          (draft_model("d"), 2, 10, 0.1), (draft_model("d"), 2, 40, 0.4)])
    a, b = request([(2, 1)], prompt=10), request([(2, 1)], prompt=40)
    served = simulate([a, b], 2, Pricer(p, "d"))
    # A's forward 0.1, B's 0.4 -> 0.5; the draft's, 2 rows 40 wide, 0.4 -> 0.9; one round over both 2 x 0.3 + 1.5
    # -> 3.0
    assert [t["admitted_s"] for t in served] == pytest.approx([0.0, 0.1])  # B's prefill began after A's
    assert [t["first_token_s"] for t in served] == pytest.approx([0.1, 0.5])
    assert [t["draft_prefill_s"] for t in served] == pytest.approx([0.4, 0.4])
    assert [t["target_s"] for t in served] == pytest.approx([0.1 + 1.5, 0.4 + 1.5])
    assert [t["finish_s"] for t in served] == pytest.approx([3.0, 3.0])
    # a static batch is one forward over both, 40 wide: 0.8, the draft's 0.4 -> 1.2, the round -> 3.3
    static = simulate([a, b], 2, Pricer(p, "d"), served=False)
    assert [t["first_token_s"] for t in static] == pytest.approx([0.8, 0.8])
    assert [t["finish_s"] for t in static] == pytest.approx([3.3, 3.3])


def test_a_conversations_next_turn_is_replayed_after_its_previous_answer():
    # A (arrives 0) and C (arrives 0.2) on the schedule; B follows A, 0.5 s after A's last token; one slot
    a, b, c = request([(2, 2)]), dict(request([(2, 1)]), follows=0), request([(2, 0)], arrival=0.2)
    timed = simulate([a, b, c], 1, Pricer(profile(), "d"), think_s=0.5)
    # A: prefill 0.1, draft prefill 0.05, one round alone 2 x 0.25 + 1.2 = 1.7 -> 1.85; B arrives 2.35, C (waiting
    # since 0.2) goes first: 1.85 -> prefill 1.95, draft 2.0, round 3.7; B: 3.7 -> 3.8, 3.85, round 5.55
    assert timed[1]["arrival_s"] == pytest.approx(2.35)
    assert [t["admitted_s"] for t in timed] == pytest.approx([0.0, 3.7, 1.85])
    assert [t["finish_s"] for t in timed] == pytest.approx([1.85, 5.55, 3.7])
    # two slots: C joins at A's round's end (1.85), B arrives at 2.35 during C's round (2.0 -> 3.7, alone: 1.7)
    two = simulate([a, b, c], 2, Pricer(profile(), "d"), think_s=0.5)
    assert two[1]["arrival_s"] == pytest.approx(2.35) and two[1]["admitted_s"] == pytest.approx(3.7)
    # the same from a load point's records (runner/load.py request_fields: every request carries the think time; the
    # follower's measured arrival, 9.0 here, is the measurement's, not the replay's)
    from eval.replay import replay_load

    records = [dict(r, request=i, concurrency=1, think_s=0.5, follows=j, arrival_s=arrival, sample_id=i, repeat=0,
                    draft_forwards=0) for i, (r, j, arrival) in enumerate([(a, None, 0.0), (b, 0, 9.0), (c, None, 0.2)])]
    replayed = {r["request"]: r for r in replay_load(records, Pricer(profile(), "d"), True)}
    assert replayed[1]["arrival_s"] == pytest.approx(2.35) and replayed[1]["finish_s"] == pytest.approx(5.55)


def test_a_cost_outside_the_profile_is_missing_not_guessed():
    with pytest.raises(MissingCost, match="3 rows"):
        simulate([request([(2, 1)])] * 3, 3, Pricer(profile(), "d"))
    with pytest.raises(MissingCost, match="prefill"):
        simulate([request([(2, 1)])], 1, Pricer(profile(prefills=[]), "d"))


def test_the_profile_interpolates_between_measured_rows_widths_and_caches():
    p = profile(steps=[(TARGET, 1, 1, 1.0), (TARGET, 4, 1, 2.5), (TARGET, 1, 5, 1.4)])
    assert p.step_s(TARGET, 2, 1) == pytest.approx(1.5)  # a third of the way from 1 to 4 rows
    assert p.step_s(TARGET, 1, 3) == pytest.approx(1.2)  # halfway from width 1 to 5
    assert p.step_s(TARGET, 1, 6) is None and p.step_s(TARGET, 5, 1) is None
    two_caches = Profile(steps=[{"model": TARGET, "rows": 1, "width": 1, "kv": kv, "s": s}
                                for kv, s in ((100, 1.0), (300, 1.4))])
    assert two_caches.step_s(TARGET, 1, 1, kv=200) == pytest.approx(1.2)
    assert two_caches.step_s(TARGET, 1, 1, kv=400) == pytest.approx(1.6)  # a longer cache, linearly
    # a prefill is a line in rows x tokens: through (10, 0.1) and (20, 0.2)
    assert profile().prefill_s(TARGET, 3, 10) == pytest.approx(0.3)


def test_at_batch_one_and_constant_gamma_it_is_leviathans_decode_speedup():
    # no prefill cost, a cache-independent step: the decode alone. T = 1, v(2 drafts) = 1.2, c = 0.3
    p = profile(steps=[(TARGET, 1, 1, 1.0), (TARGET, 1, 3, 1.2), (draft_model("d"), 1, 1, 0.3)],
                prefills=[(TARGET, 1, 10, 0.0), (draft_model("d"), 1, 10, 0.0)])
    accepted = [2, 0, 1, 2, 2, 0, 1, 1, 2, 0]
    spec = simulate([request([(2, x) for x in accepted])], 1, Pricer(p, "d"))[0]
    tokens = sum(x + 1 for x in accepted)
    base = simulate([request(new_tokens=1 + tokens)], 1, Pricer(p))[0]
    alpha = solve_alpha([{"drafted": 2, "accepted": x, "emitted": x + 1} for x in accepted])
    assert base["finish_s"] / spec["finish_s"] == pytest.approx(predicted_speedup(alpha, 2, 0.3, 1.2))


def test_the_profile_file_is_versioned(tmp_path):
    path = tmp_path / "p.json"
    profile().save(path)
    assert Profile.load(path).step_s(TARGET, 2, 3) == 1.5
    data = json.loads(path.read_text())
    data["version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="version 99"):
        Profile.load(path)
    path.write_text("{}")
    with pytest.raises(ProfileError, match="not a cost profile"):
        Profile.load(path)


def sample(method, index, rounds=None, new_tokens=None, **extra):
    row = {"method": method, "batch_size": 2, "draft": "d" if method == "speculative" else None,
           "gamma": 2 if method == "speculative" else None, "schedule": "constant" if method == "speculative" else None,
           "sample_id": index, "repeat": 0, "batch_index": 0, "prompt_tokens": 10, "latency_s": 9.0, "prefill_s": 0.1}
    if rounds is not None:
        row["rounds"] = [{"drafted": d, "accepted": a, "emitted": a + 1} for d, a in rounds]
        new_tokens = 1 + sum(a + 1 for _, a in rounds)
    return dict(row, new_tokens=new_tokens, **extra)


def test_predict_a_run_folder_with_a_profile(tmp_path):
    # the static batch of the first test (prompts both 10 wide): measured latencies 4.0 and 3.8 s
    samples = [sample("speculative", 0, [(2, 2), (2, 0)], latency_s=4.0), sample("speculative", 1, [(2, 1)], latency_s=2.0),
               sample("baseline", 0, new_tokens=5, latency_s=3.8), sample("baseline", 1, new_tokens=3, latency_s=2.2)]
    rows = predict_run(samples, profile())
    assert len(rows) == 1
    assert rows[0]["predicted"]["speedup"] == pytest.approx(3.8 / 4.1)
    assert rows[0]["measured"]["speedup"] == pytest.approx(3.8 / 4.0)
    assert rows[0]["measured_over_predicted"] == pytest.approx(4.1 / 4.0)
    # what if the rows ran one at a time: A alone 0.1 + 0.05 + 1.7 + 1.7, B 0.1 + 0.05 + 1.7 (5.4 s for 8 tokens);
    # the baseline 0.1 + 4 x 0.8 and 0.1 + 2 x 0.8 (5.0 s): no measurement beside it
    alone = [r for r in predict_run(samples, profile(), batch_sizes=[1]) if r["batch_size"] == 1]
    assert alone[0]["measured"] is None and alone[0]["predicted"]["speedup"] == pytest.approx(5.0 / 5.4)
    # the command: the table and prediction.json (strict JSON); a profile that is not one: exit 2, one line
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    profile().save(tmp_path / "p.json")
    done = subprocess.run([sys.executable, "-m", "eval.predict", str(tmp_path), "--costs", str(tmp_path / "p.json")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "| 0.95 | 0.93 | 1.02 |" in done.stdout
    assert json.loads((tmp_path / "prediction.json").read_text())["points"][0]["predicted"]["speedup"] == \
        pytest.approx(3.8 / 4.1)
    (tmp_path / "bad.json").write_text("[]")
    bad = subprocess.run([sys.executable, "-m", "eval.predict", str(tmp_path), "--costs", str(tmp_path / "bad.json")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "not a cost profile" in bad.stderr


def probe(rows: int, steps: dict, draft: float, prefills: list) -> dict:
    """progress.json's probe entry at one batch size (seconds): target widths -> s, the draft's step, prefills."""
    return {"p1": {"c_by_draft": {"d": draft / steps[1]}, "v": {str(w - 1): s / steps[1] for w, s in steps.items() if w > 1},
                   "target_forward_s": steps[1], "target_reps_s": {str(w): [s] for w, s in steps.items()},
                   "draft_reps_s": {"d": [draft]}, "context_tokens": 100, "prefills": prefills}}


def test_a_load_point_in_the_report_is_predicted_by_its_replayed_schedule():
    from eval.summary import summarize
    from test_serving_figures import request as served

    # the profile of the first tests, as the probes of two load points (1 and 2 rows) write it
    costs = {"1": probe(1, {1: 0.8, 3: 1.2}, 0.25, [{"model": "target", "rows": 1, "tokens": 10, "s": 0.1},
                                                   {"model": "draft:d", "rows": 1, "tokens": 10, "s": 0.05}]),
             "2": probe(2, {1: 1.0, 3: 1.5}, 0.3, [{"model": "target", "rows": 2, "tokens": 10, "s": 0.2},
                                                  {"model": "draft:d", "rows": 2, "tokens": 10, "s": 0.1}])}
    a, b = [{"drafted": 2, "accepted": 2, "emitted": 3}, {"drafted": 2, "accepted": 0, "emitted": 1}], \
        [{"drafted": 2, "accepted": 1, "emitted": 2}]
    rows = [served("speculative", 0, concurrency=2, first=0.1, finish=4.0, tokens=5, rounds=a, requests=2, prompt_tokens=10),
            served("speculative", 1, concurrency=2, first=2.0, finish=4.0, tokens=3, arrival=0.5, rounds=b, requests=2,
                   prompt_tokens=10),
            served("baseline", 0, concurrency=2, first=0.1, finish=3.8, tokens=5, requests=2, prompt_tokens=10),
            served("baseline", 1, concurrency=2, first=1.0, finish=3.0, tokens=3, arrival=0.5, requests=2,
                   prompt_tokens=10)]
    summary = summarize(rows, {"costs": costs}, {"load": {"concurrency": [2]}})
    m = next(r for r in summary["serving"]["runs"] if r["method"] == "speculative")["metrics"]
    # the method (the join test): A's E2E 4.1, B's 4.1 - 0.5 = 3.6. The baseline: A prefilled 0.1, one step alone
    # 0.8 -> 0.9; B joins (prefill 0.1 -> 1.0); two steps over both, 1.0 each -> 3.0 (B done); A's last alone -> 3.8:
    # E2E 3.8 and 2.5. Throughput speedup (8 / 7.7) / (8 / 6.3)
    assert m["predicted_speedup_replay"] == pytest.approx(6.3 / 7.7)
    assert m["replay"]["ttft_p50_s"] == pytest.approx((0.1 + 1.45) / 2)  # A 0.1; B 1.95 - 0.5
    assert m["predicted_speedup_replay_ci95"] is None  # 2 requests: no interval
    # measured (8 / 7.5) / (8 / 6.3) = 0.84: within 5% of 0.818, not flagged
    assert m["speedup_tput"] == pytest.approx(6.3 / 7.5) and m["prediction_off"] is None


def test_what_the_records_or_the_profile_cannot_say_is_missing_not_guessed(tmp_path):
    # a speculative row whose rounds emit fewer tokens than it has; a drafter that ran forwards of a model the profile
    # has no steps for (early exit's layers): no prediction rather than a fast one
    from eval.replay import as_request
    with pytest.raises(MissingCost, match="rounds"):
        as_request({"prompt_tokens": 10, "new_tokens": 50, "rounds": []})
    with pytest.raises(MissingCost, match="early exit"):
        simulate([dict(request([(2, 1)]), draft_forwards=4)], 1, Pricer(profile()))
    # a profile with a time that is no number of seconds is refused whole, in one line
    path = tmp_path / "p.json"
    broken = profile().to_json()
    broken["steps"][0]["s"] = float("nan")
    path.write_text(json.dumps(broken))
    with pytest.raises(ProfileError, match="finite"):
        Profile.load(path)


def test_a_deferred_draft_prefill_is_priced_in_the_round_that_drafts_first():
    """hybrid prefills its draft model in its first round that drafts with it (its rounds' catch_up: the tokens that
    forward feeds); a request that never drafts with it pays no draft prefill."""
    def hybrid(rounds):
        return dict(request(prompt=100, rounds=[(d, a) for d, a, _, _ in rounds]),
                    rounds=[{"drafted": d, "accepted": a, "emitted": a + 1, "sources": sources, "catch_up": catch}
                            for d, a, sources, catch in rounds])

    free = (2, 2, {"lookup": [2, 2]}, 0)
    drafted = (2, 1, {"draft": [2, 1]}, 104)  # the prompt's 100 tokens, the 3 since and the last one
    # the target's prefill of 100 tokens: 1.0; round 1 (lookup's 2, width 3): 1.2 -> 2.2; round 2: the catch-up
    # forward as a draft prefill of 104 tokens, 0.52 (over a 0.25 step), one more draft step 0.25, verification 1.2:
    # 1.97 -> 4.17
    timed = simulate([hybrid([free, drafted])], 1, Pricer(profile(), "d"))[0]
    assert timed["finish_s"] == pytest.approx(4.17) and timed["draft_prefill_s"] == 0.0
    assert simulate([hybrid([free])], 1, Pricer(profile(), "d"))[0]["finish_s"] == pytest.approx(2.2)
    # without catch_up (an eager prefill): 0.5 at admission and 2 draft steps in round 2: 1.0 + 0.5 + 1.2 + 1.7
    eager = hybrid([free, drafted])
    eager["rounds"] = [{k: v for k, v in r.items() if k != "catch_up"} for r in eager["rounds"]]
    assert simulate([eager], 1, Pricer(profile(), "d"))[0]["finish_s"] == pytest.approx(4.4)


TWO_TOKEN_DRAFT = [(TARGET, 1, 1, 0.8), (TARGET, 1, 3, 1.2), (TARGET, 2, 1, 1.0), (TARGET, 2, 3, 1.5),
                   (draft_model("d"), 1, 1, 0.25), (draft_model("d"), 2, 1, 0.3),
                   (draft_model("d"), 1, 2, 0.35), (draft_model("d"), 2, 2, 0.4)]


def test_a_round_after_a_full_accept_feeds_the_draft_two_tokens():
    """The last draft of a fully accepted chain was never fed to the draft: the next round's first forward feeds it
    and the last token (decode/drafters/draft_model.py), priced at the profile's 2-token draft step."""
    # prefill 0.1, the draft's 0.05 -> 0.15; round 1 (unfed nothing): 2 x 0.25 + 1.2 -> 1.85; round 2 after its full
    # accept: 0.35 + 0.25 + 1.2 -> 3.65
    two = Pricer(profile(TWO_TOKEN_DRAFT), "d")
    assert simulate([request([(2, 2), (2, 0)])], 1, two)[0]["finish_s"] == pytest.approx(3.65)
    # a profile without the 2-token step (written before it was probed): the 1-token step, 3.55
    assert simulate([request([(2, 2), (2, 0)])], 1, Pricer(profile(), "d"))[0]["finish_s"] == pytest.approx(3.55)
    # a round nobody drafts leaves its last token unfed: round 1 1.85 (a partial accept), round 2 a plain step 0.8
    # -> 2.65, round 3 feeds that token and the last one: 0.35 + 0.25 + 1.2 -> 4.45
    assert simulate([request([(2, 1), (0, 0), (2, 1)])], 1, two)[0]["finish_s"] == pytest.approx(4.45)


def test_a_held_rows_unfed_tokens_widen_the_round_it_drafts_in():
    """A row that drafts nothing beside drafting rows whose catch-up is narrower than its unfed tokens is held (its
    last token waits too); the round it drafts in feeds them all, priced as a draft prefill of that width where that
    costs more than the 2-token step."""
    prefills = [(TARGET, 1, 10, 0.1), (TARGET, 2, 10, 0.2), (draft_model("d"), 1, 10, 1.0),
                (draft_model("d"), 2, 10, 2.0)]  # the draft's line: 0.1 s a row-token
    a = request([(2, 2), (0, 0), (2, 0)])  # a full accept, then nothing drafted, held
    b = request([(2, 1), (2, 1), (2, 0)])
    timed = simulate([a, b], 2, Pricer(profile(TWO_TOKEN_DRAFT, prefills), "d"))
    # prefills 0.2 + 2.0 -> 2.2; round 1: 2 x 0.3 + 1.5 -> 4.3 (A keeps its last draft unfed); round 2: B's catch-up
    # is 1 token, so A (1 unfed) is held, its last token unfed too: 0.6 + 1.5 -> 6.4; round 3 feeds A's 2 unfed and
    # its last: max(0.4, 0.1 x 2 x 3) = 0.6, one more step 0.3, the verification 1.5 -> 8.8
    assert [t["finish_s"] for t in timed] == pytest.approx([8.8, 8.8])


def test_a_cache_line_beyond_its_profiled_caches_never_falls_and_the_prediction_says_so():
    # a probe that timed the longer cache cheaper (noise): the target's step 1.0 s at a cache of 16, 0.5 s at 40; its
    # 3-token verification 1.5 and 0.75; the draft's step 0.3 and 0.15. Prefills 0.01 s a target token, 0.005 a draft's
    falling = [(TARGET, 1, 16, 1.0), (TARGET, 1, 40, 0.5), (TARGET, 3, 16, 1.5), (TARGET, 3, 40, 0.75),
               (draft_model("d"), 1, 16, 0.3), (draft_model("d"), 1, 40, 0.15)]
    p = profile()
    p.steps = [{"model": m, "rows": 1, "width": w, "kv": kv, "s": s, "reps_s": [s]} for m, w, kv, s in falling]
    assert p.step_s(TARGET, 1, 1, kv=28) == pytest.approx(0.75)  # between the caches: the line
    # beyond them the nearest cache's time, not the line on to 0 s (reached at a cache of 64); below, not above 1.0
    assert p.step_s(TARGET, 1, 1, kv=70) == pytest.approx(0.5) and p.step_s(TARGET, 1, 1, kv=8) == pytest.approx(1.0)
    rising = Profile(steps=[{"model": TARGET, "rows": 1, "width": 1, "kv": kv, "s": s} for kv, s in ((16, 0.5), (40, 1.0))])
    # a longer cache costs more, on along the line; a shorter one never less than the cheapest point
    assert rising.step_s(TARGET, 1, 1, kv=64) == pytest.approx(1.5) and rising.step_s(TARGET, 1, 1, kv=4) == 0.5
    # a batch of one 60-token prompt: the method's prefills 0.6 + 0.3, two rounds of 2 x 0.15 + 0.75 at caches of 61
    # and 64: 3.0 s; the baseline's 0.6 + 4 x 0.5 = 2.6 s
    samples = [sample("speculative", 0, [(2, 2), (2, 0)], batch_size=1, prompt_tokens=60),
               sample("baseline", 0, new_tokens=5, batch_size=1, prompt_tokens=60)]
    row, = predict_run(samples, p)
    assert row["predicted"]["speedup"] == pytest.approx(2.6 / 3.0)
    assert row["predicted"]["caches_priced_beyond"] == [61, 64]
    from eval.predict import table
    assert "steps at caches of 61 to 64 tokens priced beyond the profiled caches (16, 40 tokens)" in table([row], p)
    # within the profiled caches nothing is said
    within = predict_run([dict(s, prompt_tokens=20) for s in samples], p)[0]
    assert within["predicted"]["caches_priced_beyond"] == [] and "beyond" not in table([within], p)


def test_a_profile_without_the_runs_batch_size_is_missing_not_priced_at_another():
    only_two = profile([(TARGET, 2, 1, 1.0), (TARGET, 2, 3, 1.5), (draft_model("d"), 2, 1, 0.3)])
    # a batch-1 run on a profile of 2 rows: no step at 1 row (not every step at 2 rows' cost)
    ones = [sample("speculative", 0, [(2, 2), (2, 0)], batch_size=1), sample("baseline", 0, new_tokens=5, batch_size=1)]
    row, = predict_run(ones, only_two)
    assert row["predicted"] is None
    assert row["missing"].startswith("the profile lacks the draft model's step at 1 rows (profiled: rows [2])")
    # a batch of 2 whose row leaves: its tail priced at 2 rows, said (prefill 0.2 + 0.1, a round over both 2.1 -> 2.4,
    # A's second round alone at 2 rows' 2.1 -> 4.5; the baseline 0.2 + 2 x 1.0 and A's 2 more -> 4.2)
    twos = [sample("speculative", 0, [(2, 2), (2, 0)]), sample("speculative", 1, [(2, 1)]),
            sample("baseline", 0, new_tokens=5), sample("baseline", 1, new_tokens=3)]
    row, = predict_run(twos, only_two)
    assert row["predicted"]["speedup"] == pytest.approx(4.2 / 4.5) and row["predicted"]["rows_priced_above"] == [1]


def test_a_replayed_interval_that_misses_its_own_point_is_withheld():
    from eval.served_figures import load_prediction, withheld

    # Sixteen requests at concurrency 2, arriving in pairs 100 s apart (each pair alone): pairs that both draft 3
    # rounds of 2 (10 tokens) and pairs that both draft none (9 one-token rounds), as a schedule that chose K for the
    # batch records them. A verification 3 wide at 2 rows costs 2.4 s here: a pair drafting together pays a prefill of
    # 0.2 + 0.1 (draft) and 3 x (2 x 0.3 + 2.4) = 9.3 s; a pair drafting none 0.2 + 0.1 (the draft's prefill at
    # admission: no round records a deferred one) + 9 x 1.0 = 9.3 s; the baseline's pair 0.2 + 9 x 1.0 = 9.2 s. Both
    # sides finish in pairs: the throughput speedup is 9.2 / 9.3, whichever pairs draft. A resample that puts a
    # drafting request beside one that drafts none runs 3 wide for both (9.3 s, then the other alone 6 x 0.8 s):
    # every resample but those keeping all 8 pairs pure (a chance of 1 in 2^8) lies below what ran, so the interval
    # cannot hold its point, and is withheld.
    steps = [(TARGET, 1, 1, 0.8), (TARGET, 1, 3, 1.2), (TARGET, 2, 1, 1.0), (TARGET, 2, 3, 2.4),
             (draft_model("d"), 1, 1, 0.25), (draft_model("d"), 2, 1, 0.3)]
    drafts, plain = [{"drafted": 2, "accepted": 2, "emitted": 3}] * 3, [{"drafted": 0, "accepted": 0, "emitted": 1}] * 9
    mine = [{"request": i, "sample_id": i, "repeat": 0, "arrival_s": 100.0 * (i // 2), "prompt_tokens": 10,
             "new_tokens": 10, "concurrency": 2, "rounds": drafts if (i // 2) % 2 == 0 else plain} for i in range(16)]
    theirs = [{k: v for k, v in s.items() if k != "rounds"} for s in mine]
    figures = load_prediction(mine, theirs, profile(steps), "d")
    assert figures["speedup"] == pytest.approx(9.2 / 9.3)
    assert figures["speedup_ci95"] is None and "lies outside" in figures["speedup_ci95_withheld"]
    # every request drafting: each resample is what ran, its interval holds its point and is given
    alike = [dict(s, rounds=drafts) for s in mine]
    assert load_prediction(alike, theirs, profile(steps), "d")["speedup_ci95"] is not None
    # by hand: a point on its interval's bound is inside; one outside by any margin is not
    assert withheld(0.942, [0.617, 0.942]) is None and withheld(1.0, None) is None
    assert "0.974" in withheld(0.974, [0.617, 0.942]) and withheld(0.6, [0.617, 0.942])
