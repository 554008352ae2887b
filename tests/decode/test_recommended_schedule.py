"""The recommended schedule (decode/drafters/schedules.py RecommendedSchedule): one K a round from the one model of
a round (decode/k_model.py, recommend.json's k_model), by hand: as the rows in flight and their contexts change, with a
catch-up priced, with its rounds timed against their prices, exploring a neighbour K; greedy output equal to the
baseline's whatever K; rows it idles leave the draft idle; the config's refusals as one line."""
import json

import numpy as np
import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.drafters.schedules import EXPLORE_EVERY, RecommendedSchedule, make_schedule
from decode.k_model import KModel
from decode.kv import KVState
from decode.arrivals import Load
from tiny_models import VOCAB, noisy_copy, ragged_batch, tiny_model
from utils.config import ConfigError, validate

ALPHA = [0.8] * 4
# the target's seconds by width at 1 row and a short context (10 tokens): K 2 is best there (E/S: off 1/10 ms, K 1
# 1.8/13, K 2 2.44/16 = 0.1525, K 3 2.952/26, K 4 3.3616/30); at a long context (1000) and at `off_at` rows and
# more, each width costs 10 ms a token: off (K 1: 1.8/22 = 0.082 < 0.1); the short context's at each rows below it.
# A draft step 2 ms.
FAST = {1: 0.010, 2: 0.011, 3: 0.012, 4: 0.020, 5: 0.022}


def k_model(off_at: int = 3, draft: str = "d", slope: float = 0.0002) -> dict:
    steps = [[r, w, 10, s] for r in range(1, off_at) for w, s in FAST.items()]
    steps += [[r, w, 1000, 0.010 * w] for r in range(1, off_at) for w in FAST]
    steps += [[off_at, w, c, 0.010 * w] for w in FAST for c in (10, 1000)]
    return {"steps": {"target": steps, f"draft:{draft}": [[r, 1, c, 0.002] for r in range(1, off_at + 1)
                                                          for c in (10, 1000)]},
            "draft_prefill": {f"draft:{draft}": {"intercept_s": 0.0, "s_per_row_token": slope}},
            "acceptance": {draft: {"rates": ALPHA, "by_category": {}}}}


def recommended(gamma: int = 4, budget: int | None = None, ratios: dict | None = None, **model) -> RecommendedSchedule:
    return RecommendedSchedule(gamma, KModel(k_model(**model)), "d", budget, ratios)


def rows(schedule, prompts):
    schedule.start(0)
    schedule.add_rows(len(prompts), prompt_tokens=prompts)
    return schedule.lengths()


@pytest.mark.parametrize("prompts, gamma, expected", [
    ([9], 4, [2]), ([9, 9], 4, [2, 2]), ([9], 1, [1]),  # gamma caps K: of 0 and 1, K 1 (1.8/13 > 1/10)
    ([9, 9, 9], 4, [0, 0, 0]),  # three rows: off
    ([999], 4, [0]), ([9, 999], 4, [0, 0]),  # the longest context decides the round: off
])
def test_lengths_by_rows_and_context(prompts, gamma, expected):
    assert rows(recommended(gamma), prompts) == expected


def test_the_batch_shrinking_and_contexts_growing_change_k():
    schedule = recommended()
    assert rows(schedule, [9, 9, 9]) == [0] * 3
    schedule.select_rows([1, 2])
    assert schedule.lengths() == [2, 2]
    schedule.update([2, 2], [2, 1])  # contexts 13 and 12
    assert schedule.contexts == [13, 12] and schedule.lengths() == [2, 2]
    schedule.update([2, 2], [1, 1])
    schedule.contexts = [600, 15]  # half way to 1000: each width 10.5 ms + ..., K 1 1.8/(2 + 15.5) < 0.1: off
    assert schedule.lengths() == [0, 0]
    schedule.select_rows([1])
    assert schedule.lengths() == [2]


def test_a_catch_up_is_priced_by_the_tokens_left():
    """Two rows with 50 tokens their draft has not been fed: the first forward feeds 51 a row, 0.0002 x 2 x 51 =
    20.4 ms against a 2 ms step: 18.4 ms more. With one token left (budget 2) K 2 pays it whole (2.44 / 34.4 ms <
    1 / 10 ms): off. With 98 left, its share is 18.4 x 2.44 / 98 = 0.46 ms (2.44 / 16.46 ms): K 2."""
    for budget, k in ((2, 0), (100, 2)):
        schedule = recommended(budget=budget)
        rows(schedule, [9, 9])
        assert schedule.plan([50, 50]) == [k, k], budget
    assert schedule.proposed == (2, 2, pytest.approx(0.0204 + 0.002 + 0.012))  # priced with its whole catch-up


def test_rounds_timed_slower_than_priced_correct_the_choice():
    """K 2 priced 16 ms at 2 rows. A round timed: the first of each (rows, K) left out (its one-time costs), then each
    one's measured / priced joins a running mean (weight 0.25): 2.0, then 2.0 + 0.25 (1.0 - 2.0) = 1.75. With K 2's
    rounds at 2x their price and plain steps as priced (1.0), K 1 untimed is priced at their mean (1.5x: 1.8/19.5 =
    0.092) and K 2 at 2.44/32 = 0.076: off."""
    schedule = recommended()
    assert rows(schedule, [9, 9]) == [2, 2]
    schedule.timed(0.5, 2, 2, 1)
    assert schedule.ratios[2, 2] == (1, None)
    schedule.timed(0.032, 2, 2, 1)
    assert schedule.ratios[2, 2] == (2, pytest.approx(2.0))
    schedule.timed(0.016, 2, 2, 1)
    assert schedule.ratios[2, 2] == (3, pytest.approx(1.75))
    schedule.timed(0.9, 3, 2, 1)  # not the round it planned (3 rows): nothing
    assert (3, 2) not in schedule.ratios
    slow = recommended(ratios={(2, 0): (3, 1.0), (2, 2): (3, 2.0)})
    assert rows(slow, [9, 9]) == [0, 0]


def test_a_k_priced_out_comes_back_by_exploration():
    """Off chosen (K 2 timed at 2x); every EXPLORE_EVERY rounds the round runs the least timed neighbour of the
    chosen K (K 1, never timed), then goes back."""
    schedule = recommended(ratios={(2, 0): (3, 1.0), (2, 2): (3, 2.0)})
    seen = []
    rows(schedule, [9, 9])
    for _ in range(2 * EXPLORE_EVERY):
        seen.append(schedule.lengths()[0])
        schedule.update([seen[-1]] * 2, [0, 0])
    assert seen.count(1) == 2 and set(seen) == {0, 1}
    assert seen[EXPLORE_EVERY - 1] == 1 and seen[2 * EXPLORE_EVERY - 1] == 1


def test_exploration_runs_no_catch_up_that_costs_more_than_its_round():
    """Off chosen, each row with tokens its draft was not fed. K 1's round at 2 rows: 2 + 11 ms. A catch-up of 50
    tokens a row (51 fed, 2 x 51 x 0.2 ms = 20.4 ms less the 2 ms step: 18.4 ms) costs more: no round explores it; of
    16 (6.8 - 2 = 4.8 ms), the 16th round explores K 1."""
    for backlog, explored in ((50, 0), (16, 1)):
        schedule = recommended(ratios={(2, 0): (3, 1.0), (2, 2): (3, 2.0)})
        rows(schedule, [9, 9])
        seen = []
        for _ in range(EXPLORE_EVERY):
            seen.append(schedule.plan([backlog, backlog])[0])
            schedule.update([seen[-1]] * 2, [0, 0])
        assert seen == [0] * (EXPLORE_EVERY - 1) + [explored]


def test_the_schedule_needs_its_model():
    with pytest.raises(ValueError, match="speculative.recommendation"):
        make_schedule("recommended", 4)
    with pytest.raises(ValueError, match="no acceptance of the draft e"):
        RecommendedSchedule(4, KModel(k_model()), "e")


# ---- in the engine: exact whatever K -----------------------------------------------------------------------------

@pytest.mark.parametrize("served", [False, True], ids=["static", "served"])
def test_greedy_output_equals_the_baseline(served):
    """Five rows, three at a time where served: off at three rows, K 2 at fewer (the batch shrinking); static, the
    rounds exploring K 1 (a prefill of 0.02 ms a row-token: their catch-ups cost less than their rounds)."""
    target = tiny_model("llama", seed=1, layers=3)
    draft = noisy_copy(target, 0.05, seed=5)
    ids, mask = ragged_batch([6, 13, 2, 9, 4])
    generation = Generation(max_new_tokens=24)
    load = Load([0.0, 0.0, 0.0, 0.0, 0.0], 3) if served else None
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        schedule = recommended(4, budget=24, off_at=3, slope=0.00002)
        drafter = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=schedule)
        spec = generate_speculative(target, drafter, ids, mask, generation, 4, load=load)
    for row, (b, s) in enumerate(zip(base, spec)):
        assert s.output_ids == b.output_ids, f"row {row} diverged"
    drafted = [r["drafted"] for s in spec for r in s.rounds]
    assert 0 in drafted and {1, 2} & set(drafted) and max(drafted) <= 2


# GPU-shaped prices (point 4 of the one model of K): a verification costs the same 2 ms however wide until the rows x
# tokens it computes pass 8, then 0.25 ms a row-token (compute-bound); a draft step 0.2 ms at any rows, its prefill a
# step. With b = 0.8 (E(K) 1, 1.8, 2.44, 2.952, 3.3616), E/S by hand:
#   1 row : every width 2 ms: K 4 3.3616/2.8 = 1.201 over K 3 2.952/2.6 = 1.135           -> K 4
#   2 rows: width 5 2.5 ms: K 4 3.3616/3.3 = 1.019 under K 3 2.952/2.6 = 1.135            -> K 3
#   3 rows: widths 3, 4 2.25, 3 ms: K 2 2.44/2.65 = 0.921 over K 1 1.8/2.2 = 0.818, K 3 2.952/3.6 = 0.820 -> K 2
#   4 rows: widths 2, 3 2, 3 ms: K 1 1.8/2.2 = 0.818 over K 2 2.44/3.4 = 0.718, off 1/2 = 0.5   -> K 1
GPU_TABLE = {1: 4, 2: 3, 3: 2, 4: 1}


def gpu_shaped() -> dict:
    verify = [[rows, w, c, max(0.002, 0.00025 * rows * w)] for rows in GPU_TABLE for w in FAST for c in (10, 1000)]
    step = [[rows, 1, c, 0.0002] for rows in GPU_TABLE for c in (10, 1000)]
    return {"steps": {"target": verify, "draft:d": step},
            "draft_prefill": {"draft:d": {"intercept_s": 0.0, "s_per_row_token": 0.0}},
            "acceptance": {"d": {"rates": ALPHA, "by_category": {}}}}


def test_a_gpu_shaped_model_runs_the_tables_k_per_batch_size(monkeypatch):
    """Six requests served four at a time, each round timed at its price (a GPU running as profiled): every round
    that does not explore runs the K the table gives its rows in flight, as the rows fall from 4 to 1; the greedy
    output the baseline's."""
    target = tiny_model("llama", seed=1, layers=3)
    draft = noisy_copy(target, 0.05, seed=5)
    ids, mask = ragged_batch([6, 13, 2, 9, 4, 7])
    generation = Generation(max_new_tokens=16)
    timed, plan, seen = RecommendedSchedule.timed, RecommendedSchedule.plan, []

    def planned(self, backlogs):
        lengths = plan(self, backlogs)
        if lengths and self.rounds % EXPLORE_EVERY != EXPLORE_EVERY - 1:
            seen.append((self.rows, lengths[0]))
        return lengths

    monkeypatch.setattr(RecommendedSchedule, "plan", planned)
    monkeypatch.setattr(RecommendedSchedule, "timed", lambda self, seconds, rows, width, fed: timed(
        self, self.proposed[2] if self.proposed else seconds, rows, width, fed))
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        schedule = RecommendedSchedule(4, KModel(gpu_shaped()), "d", 16)
        drafter = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=schedule)
        spec = generate_speculative(target, drafter, ids, mask, generation, 4, load=Load([0.0] * 6, 4))
    assert [s.output_ids for s in spec] == [b.output_ids for b in base]
    assert {rows for rows, _ in seen} >= {4, 1} and len({rows for rows, _ in seen}) >= 3, seen
    assert all(k == GPU_TABLE[rows] for rows, k in seen), seen


# ---- rows the schedule idles leave the draft idle ----------------------------------------------------------------

def test_a_row_joining_as_an_empty_row_reads_as_if_prefilled():
    """KVState.add_empty_rows: a row with nothing cached, fed its prompt beside a running row, gets the logits of its
    own prefill, and the running row those of its own next step."""
    model = tiny_model("llama", seed=1, layers=2)
    a, b = [5, 9, 17, 4, 33], [8, 21, 40]
    with torch.inference_mode():
        running = KVState()
        running.forward(model, torch.tensor([a[:-1]]))
        running.add_empty_rows(1)
        assert running.mask_host.tolist() == [[1, 1, 1, 1], [0, 0, 0, 0]]
        both = running.forward(model, torch.tensor([[0, 0, a[-1]], b]), np.array([[0, 0, 1], [1, 1, 1]]))[:, -1]
        alone_a, alone_b = KVState().forward(model, torch.tensor([a]))[0, -1], KVState().forward(
            model, torch.tensor([b]))[0, -1]
    torch.testing.assert_close(both[0], alone_a, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(both[1], alone_b, atol=1e-4, rtol=1e-4)


def test_empty_rows_left_alone_still_follow_the_rows_that_leave():
    """When the one row with cached tokens leaves, the empty rows' cache keeps no column, and its rows must still follow
    the rows that leave (a served rate sweep failed here: a cache of 7 rows fed 3)."""
    model = tiny_model("llama", seed=1)
    b = [8, 21, 40]
    with torch.inference_mode():
        state = KVState()
        state.forward(model, torch.tensor([[5, 9, 17]]))
        state.add_empty_rows(2)
        state.select_rows([1, 2])  # the cached row leaves: no column is left
        assert state.length == 0
        state.select_rows([0])
        last = state.forward(model, torch.tensor([b]))[0, -1]
        alone = KVState().forward(model, torch.tensor([b]))[0, -1]
    torch.testing.assert_close(last, alone, atol=1e-4, rtol=1e-4)


def test_a_row_the_schedule_idles_is_not_prefilled_until_it_drafts():
    """A row joining where its K is 0 (off with company) waits in the pending tokens, its cache row empty: the draft
    runs no forward for it. A constant schedule prefills it at once."""
    draft = tiny_model("llama", seed=2)
    ids, mask = ragged_batch([4, 6])
    with torch.inference_mode():
        idle = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=recommended(4, off_at=2))
        eager = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=make_schedule("constant", 4))
        for drafter in (idle, eager):
            drafter.reset()
            drafter.add_rows(ids[:1], mask[:1])  # alone: K 2, prefilled now
            drafter.add_rows(ids[1:], mask[1:])  # with company: K 0
    assert idle.forwards == 1 and eager.forwards == 2
    assert idle.state.mask_host.shape[0] == 2 and not idle.state.mask_host[1].any()
    assert idle.pending == [[], ids[1, -6:].tolist()]


def test_a_row_joins_idle_where_the_coming_round_with_its_catch_ups_is_off():
    """The first row, alone, drafts (K 2: prefilled), then runs off 50 tokens its draft is not fed. A second row
    joins: at 2 rows K 2 reads 2.44 / 16 ms without that catch-up, but the coming round feeds it (2 x 51 x 0.2 ms =
    20.4 ms less the 2 ms step: 18.4 ms), K 2 then 2.44 / 34.4 ms and K 1 1.8 / 31.4 ms under off's 1 / 10 ms: the
    round is off, and the joining row waits unprefilled."""
    draft = tiny_model("llama", seed=2)
    ids, mask = ragged_batch([4, 6])
    with torch.inference_mode():
        drafter = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=recommended(4, off_at=3))
        drafter.reset()
        drafter.add_rows(ids[:1], mask[:1])
        drafter.pending[0] = [7] * 50
        drafter.add_rows(ids[1:], mask[1:])
    assert drafter.forwards == 1 and drafter.pending[1] == ids[1, -6:].tolist()


def test_idled_rows_cost_no_draft_forward_and_stay_exact(monkeypatch):
    """Five requests at concurrency 2, the greedy output the target's whatever the table. Drafting only when alone:
    rows that only ever ran with company never cost the draft a forward (not even a prefill)."""
    target = tiny_model("llama", seed=1, layers=3)
    draft = noisy_copy(target, 0.05, seed=5)
    ids, mask = ragged_batch([6, 13, 2, 9, 4])  # contexts 7, 14, 3, 10, 5 at the first round
    generation = Generation(max_new_tokens=12, eos_token_ids=(54,))
    empty_joins, real = [], KVState.add_empty_rows
    monkeypatch.setattr(KVState, "add_empty_rows", lambda self, rows: (empty_joins.append(rows), real(self, rows)))
    with torch.inference_mode():
        alone = [generate_baseline(target, ids[i:i + 1], mask[i:i + 1], generation)[0].output_ids for i in range(5)]
        served = {}
        for name in ("alone",):
            drafter = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=recommended(4, off_at=2))
            served[name] = generate_speculative(target, drafter, ids, mask, generation, 4, load=Load([0.0] * 5, 2))
            assert [s.output_ids for s in served[name]] == alone, name
            assert any(r["drafted"] == 2 for s in served[name] for r in s.rounds), name
            if name == "alone":
                never = [s for s in served[name] if not any(r["drafted"] for r in s.rounds)]
                assert never and all(s.draft_forwards == 0 for s in never)
                assert not empty_joins  # no cache existed while rows joined
                # every row joined with company: each round's record says its catch-up (0 where nothing was
                # drafted), so the replay prices its prefill where it ran; the first round that drafts feeds the
                # prompt and every token before the round (the prefill's first one and each plain step's)
                for s, prompt in zip(served[name], [6, 13, 2, 9, 4]):
                    assert all("catch_up" in r for r in s.rounds)
                    first = next((n for n, r in enumerate(s.rounds) if r["drafted"]), None)
                    assert all(r["catch_up"] == 0 for r in s.rounds[:first])
                    if first is not None:
                        assert s.rounds[first]["catch_up"] == prompt + 1 + sum(r["emitted"] for r in s.rounds[:first])
            # a row is caught up in its own drafting round only: a neighbour's drafting holds it (it was fed in the
            # first round any row drafted)
            waited = [s for s in served[name] if s.rounds and "catch_up" in s.rounds[0]]
            assert waited and all(r["drafted"] for s in waited for r in s.rounds if r.get("catch_up")), name
    assert not empty_joins


# ---- the config: speculative.recommendation ----------------------------------------------------------------------

VALID = {"target": {"model": "org/Qwen2.5-Coder-1.5B-Instruct"}, "draft": {"model": "d"},
         "dataset": {"path": "x.jsonl", "preset": "gsm8k"}, "methods": ["baseline", "speculative"]}


def config(tmp_path, data, **speculative):
    path = tmp_path / "recommend.json"
    if data is not None:
        path.write_text(data if isinstance(data, str) else json.dumps(data))
    return validate({**VALID, "speculative": {"schedule": ["constant", "recommended"],
                                              "recommendation": str(path), **speculative}})


def test_a_recommendation_of_this_target_reads(tmp_path):
    data = {"profile_meta": {"target_model": "qwen2.5-coder-1.5b-instruct"}, "loads": [], "k_model": k_model()}
    assert config(tmp_path, data).speculative.recommendation == str(tmp_path / "recommend.json")


@pytest.mark.parametrize("data, fragment", [
    (None, "cannot read"),
    ("{not json", "is not JSON"),
    ({"rows": []}, "has no loads"),
    ({"profile_meta": {"target_model": "llama-3-8b"}, "loads": []}, "recommends for the target llama-3-8b"),
    ({"loads": []}, "has no k_model"),
    ({"loads": [], "k_model": {"steps": {"target": "x"}}}, "k_model is not a step table"),
    ({"loads": [], "k_model": k_model(draft="other")}, "no acceptance of the draft d"),
])
def test_bad_recommendations_are_refused(tmp_path, data, fragment):
    with pytest.raises(ConfigError, match="speculative.recommendation") as error:
        config(tmp_path, data)
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_the_schedule_without_a_recommendation_is_refused():
    with pytest.raises(ConfigError, match="set speculative.recommendation"):
        validate({**VALID, "speculative": {"schedule": ["recommended"]}})


def test_launch_refuses_a_missing_recommendation_in_one_line(tmp_path):
    from helpers import assert_one_clean_line, base_config, run_launch
    import yaml

    raw = base_config(tmp_path / "t", tmp_path / "d", tmp_path / "p.jsonl",
                      methods=["baseline", "speculative"])
    raw["speculative"].update(schedule=["recommended"], recommendation=str(tmp_path / "none.json"))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    assert_one_clean_line(run_launch(["--config", tmp_path / "c.yaml"]), "speculative.recommendation")


def test_the_measuring_config_parses(tmp_path):
    """configs/recommended-schedule.yaml with its command's settings: a rate sweep, constant K 1-4 and the schedule."""
    from pathlib import Path

    from utils.config import load_config

    draft = "qwen2.5-coder-0.5b-instruct"  # the config's draft label, which the config's check finds in the file
    data = {"profile_meta": {"target_model": "qwen2.5-coder-1.5b-instruct"}, "loads": [], "k_model": k_model(draft=draft)}
    (tmp_path / "recommend.json").write_text(json.dumps(data))
    loaded, _ = load_config(Path(__file__).resolve().parents[2] / "configs/recommended-schedule.yaml",
                            ["speculative.schedule=[constant,recommended]",
                             f"speculative.recommendation={tmp_path / 'recommend.json'}"])
    assert loaded.speculative.schedule == ["constant", "recommended"] and loaded.speculative.gamma == [1, 2, 3, 4]
    assert loaded.load.request_rate == [0.05, 0.5] and loaded.load.concurrency == [4]
