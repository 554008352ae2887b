"""The one model of a round (decode/k_model.py): E(K) and the tie rule by hand, and the three callers (eval.recommend's
model choice, the replay's pricing, the runtime recommended schedule) giving the same K on the same inputs."""
import pytest

from decode.drafters.schedules import RecommendedSchedule, make_schedule
from decode.k_model import KModel, best_k, conditional, expected_tokens, pick
from eval.costs import Profile
from eval.recommend import choose, k_model_of, model_choices
from eval.replay import Pricer, priced_k

ALPHA = [0.8] * 4  # a chain accepting each draft with 0.8 whatever came before
# seconds of a target step at 2 rows by width (a cache of 10): 1 wide 10 ms ... 5 wide 22 ms; a draft step 2 ms
TARGET_S = {1: 0.010, 2: 0.011, 3: 0.012, 4: 0.020, 5: 0.022}
DRAFT_S = 0.002


def test_expected_tokens_and_conditional_rates_by_hand():
    assert [expected_tokens(ALPHA, k) for k in range(5)] == pytest.approx([1, 1.8, 2.44, 2.952, 3.3616])
    assert conditional([0.8, 0.4, 0.1]) == pytest.approx([0.8, 0.5, 0.25])
    assert expected_tokens([0.8, 0.5], 2) == pytest.approx(1 + 0.8 + 0.4)


def test_the_tie_rule():
    """Values within a relative 1e-9 of the best are the best's: the smallest K (off, 0, before any) wins; a value
    1e-6 above is not a tie."""
    assert pick({0: 1.0, 2: 1.0 + 1e-12, 4: 1.0}) == 0
    assert pick({0: 1.0, 2: 1.0 + 1e-6}) == 2
    rows = [{"candidate": "speculative gamma=4", "gamma": 4, "speedup": 1.2},
            {"candidate": "speculative gamma=10", "gamma": 10, "speedup": 1.2},
            {"candidate": "off", "gamma": None, "speedup": 1.0}]
    # by K, not by label ("gamma=10" sorts before "gamma=4" as text)
    assert choose(rows)["best"] == "speculative gamma=4"
    rows[2]["speedup"] = 1.2  # off as fast: off
    assert choose(rows)["best"] == "off"


def test_best_k_by_hand():
    """alpha 0.8 at 2 rows: E/S = 1/10 off, 1.8/13 = 0.138 at K 1, 2.44/(4 + 12) = 0.1525 at K 2, 2.952/26 = 0.114
    at K 3, 3.3616/30 = 0.112 at K 4: K 2. With its rounds measured 1.6x their price (2.44/25.6 = 0.095), off."""
    def target(w):
        return TARGET_S[w]

    def draft(w):
        return DRAFT_S

    assert best_k(ALPHA, target, draft, range(5)) == 2
    assert best_k(ALPHA, target, draft, range(5), scale=lambda k: 1.6 if k == 2 else 1.0) == 1  # 1.8/13 > 0.1
    assert best_k(ALPHA, target, draft, [0, 2], scale=lambda k: 1.6 if k == 2 else 1.0) == 0
    assert best_k(ALPHA, lambda w: TARGET_S.get(w), draft, range(8)) == 2  # K 5-7 are not priced: no candidates


def profile() -> Profile:
    steps = [{"model": "target", "rows": 2, "width": w, "kv": 10, "s": s, "reps_s": [s]} for w, s in TARGET_S.items()]
    steps += [{"model": "draft:d", "rows": 2, "width": 1, "kv": 10, "s": DRAFT_S, "reps_s": [DRAFT_S]}]
    prefills = [{"model": m, "rows": 1, "tokens": 100, "s": 0.01, "reps_s": [0.01]} for m in ("target", "draft:d")]
    return Profile(meta={}, steps=steps, prefills=prefills)


def test_the_three_callers_give_the_same_k():
    """The same profile and acceptance (alpha 0.8 at 2 rows, a cache of 10): eval.recommend's model choice, the replay's
    pricing of each K's round and the runtime schedule (reading the k_model eval.recommend writes) each give K 2."""
    costs = profile()
    data = k_model_of([], costs)  # the step table and prefill lines; no run, so the acceptance is given
    data["acceptance"] = {"d": {"rates": ALPHA, "context": 10}}
    results = [{"load": "batch=2", "context": None}, {"load": "conc=2", "context": 10}, {"load": "rate=1.0/s"}]
    model_choices(results, data, costs, 8)
    assert [r.get("model_k") for r in results] == [{"d": 2}, {"d": 2}, None]
    assert priced_k(Pricer(costs, "d"), ALPHA, 2, 10, range(5)) == 2
    schedule = RecommendedSchedule(4, KModel(data), "d")
    schedule.start(0)
    schedule.add_rows(2, prompt_tokens=[9, 9])  # contexts 10
    assert schedule.lengths() == [2, 2]
    assert RecommendedSchedule(1, KModel(data), "d").ks == range(2)  # gamma caps the candidates


def test_served_rounds_carry_the_draft_prefills_of_the_requests_joining():
    """Requests arriving, each with a 100-token prompt: its draft prefill is 0.01 s (the profile's line, 1e-4 s a
    token), and a round of K at 2 rows carries 2 x 0.01 x E(K) / new_tokens of them. 8 new tokens: K 1 1.8 / (13 +
    4.5 ms) = 103, K 2 2.44 / (16 + 6.1) = 110, off 100: K 2. 4 new tokens: K 1 1.8 / (13 + 9) = 82, K 2 2.44 / (16 +
    12.2) = 87, off 100: off. A static batch of 4 new tokens (its prefills paid before its rounds): K 2. The three
    callers agree."""
    costs = profile()
    data = k_model_of([], costs)
    data["acceptance"] = {"d": {"rates": ALPHA, "context": 100}}
    for new_tokens, served_k in ((8, 2), (4, 0)):
        results = [{"load": "batch=2", "context": 100}, {"load": "conc=2", "context": 100}]
        model_choices(results, data, costs, new_tokens)
        assert [r["model_k"] for r in results] == [{"d": 2}, {"d": served_k}]
        assert priced_k(Pricer(costs, "d"), ALPHA, 2, 100, range(5), (100, new_tokens)) == served_k
        for served, k in ((True, served_k), (False, 2)):
            schedule = RecommendedSchedule(4, KModel(data), "d", budget=new_tokens, served=served)
            schedule.start(0)
            schedule.add_rows(2, prompt_tokens=[100, 100])
            assert schedule.lengths() == [k, k]


def test_a_served_round_carries_the_draft_prefills_of_its_window_only():
    """The same 100-token prompts, the draft reading their last 50 (speculative.draft_context): a joining request's
    draft prefill is 0.005 s. At 4 new tokens a round at 2 rows then carries 2 x 0.005 x E(K) / 4: K 1 1.8 / (13 +
    4.5 ms) = 103, K 2 2.44 / (16 + 6.1) = 110, off 100: K 2, where the whole prompt's prefill made it off."""
    data = k_model_of([], profile())
    data["acceptance"] = {"d": {"rates": ALPHA, "context": 100}}
    for window, k in ((None, 0), (50, 2), (500, 0)):
        schedule = make_schedule("recommended", 4, budget=4, model=KModel(data), draft="d", served=True, window=window)
        schedule.start(0)
        schedule.add_rows(2, prompt_tokens=[100, 100])
        assert schedule.lengths() == [k, k], window


def test_a_k_model_that_is_not_one_is_refused_in_one_line():
    with pytest.raises(ValueError, match="k_model is not a step table") as error:
        KModel({"steps": {"target": [[1, 1]]}, "acceptance": {}})
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="no target steps"):
        KModel({"steps": {}, "acceptance": {}})


def test_a_step_between_and_beyond_the_profiled_rows():
    """The target's 1-token step 10 ms at 1 row, 14 at 2, 20 at 4 (a cache of 10): at 3 rows 17 ms, linear between 2
    and 4 as the replay's profile prices it (before, the 2 rows' 14); at 6 rows 26 ms, along the line through 2 and 4
    (the profile leaves it unpriced; before, the 4 rows' 20)."""
    steps = [{"model": "target", "rows": r, "width": 1, "kv": 10, "s": s, "reps_s": [s]}
             for r, s in ((1, 0.010), (2, 0.014), (4, 0.020))]
    costs = Profile(meta={}, steps=steps, prefills=[])
    data = k_model_of([], costs)
    data["acceptance"] = {}
    model = KModel(data)
    assert [model.seconds("target", r, 1, 10) for r in (1, 2, 3, 4, 6)] == \
        pytest.approx([0.010, 0.014, 0.017, 0.020, 0.026])
    assert costs.step_s("target", 3, 1, 10) == pytest.approx(0.017)
    assert costs.step_s("target", 6, 1, 10) is None
    assert model.seconds("target", 3, 2, 10) is None  # a width outside the table's
