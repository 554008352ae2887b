"""The recommended schedule (decode/drafters/schedules.py RecommendedSchedule, decode/methods/speculative.py): a
recommend.json read into K(batch, context) by hand, the lengths rows get from it as the batch and their contexts
change, "off" as K 0, greedy output equal to the baseline's, and the config's refusals as one line."""
import json
import math

import numpy as np
import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.drafters.schedules import RecommendedSchedule, make_schedule
from decode.kv import KVState
from decode.methods.speculative import catch_up_prices, lone_prices, plain_prices, recommended_table, round_prices
from decode.serving import Load
from tiny_models import VOCAB, noisy_copy, ragged_batch, tiny_model
from utils.config import ConfigError, validate


def chain(k, speedup, draft="d", **axes):
    return {"candidate": f"speculative draft={draft} gamma={k}", "method": "speculative", "gamma": k, "draft": draft,
            "speedup": speedup, "axes": {"method": "speculative", "draft": draft, "gamma": k, **axes}}


def off():
    return {"candidate": "off", "method": None, "gamma": None, "draft": None, "speedup": 1.0}


# eval.recommend's loads (its recommend.json "loads"), two batch sizes x two contexts; what the schedule may not run
# (hybrid, another draft's chain, a tree, a schedule) is ranked above it and must be passed over
NOT_OURS = [{"candidate": "hybrid", "method": "hybrid", "gamma": 4, "draft": "d", "speedup": 3.0, "axes": {}},
            chain(3, 2.9, draft="other"), chain(3, 2.8, tree="2-2"), chain(3, 2.7, schedule="cost_model")]
LOADS = [
    # batch 1: K 4 at a short context (1.5 over K 2's 1.3), K 2 at a long one (1.2 over 1.1)
    {"load": "batch=1", "context": 256, "candidates": [chain(2, 1.3), chain(4, 1.5), off(), *NOT_OURS]},
    {"load": "batch=1", "context": 4096, "candidates": [chain(2, 1.2), chain(4, 1.1), off(), *NOT_OURS]},
    # batch 2: K 2 short (1.1 over 0.9); long, off (both under 1)
    {"load": "batch=2", "context": 256, "candidates": [chain(2, 1.1), chain(4, 0.9), off(), *NOT_OURS]},
    {"load": "batch=2", "context": 4096, "candidates": [chain(2, 0.95), chain(4, 0.8), off(), *NOT_OURS]},
    # a rate is no batch size; a concurrency is used under a load only
    {"load": "rate=2.0/s", "context": 256, "candidates": [chain(4, 9.0), off()]},
    {"load": "conc=2", "context": 256, "candidates": [chain(3, 1.4), chain(4, 1.2), off()]},
]
TABLE = {1: {256: 4, 4096: 2}, 2: {256: 2, 4096: 0}}


def test_the_table_by_hand():
    data = {"loads": LOADS}
    assert recommended_table(data, "d", served=False) == TABLE
    assert recommended_table(data, "d", served=True) == {2: {256: 3}}
    # a tie goes to off, then to the shorter K
    tied = {"loads": [{"load": "batch=1", "context": None, "candidates": [chain(4, 1.0), off()]},
                      {"load": "batch=2", "context": None, "candidates": [chain(4, 1.2), chain(2, 1.2), off()]}]}
    assert recommended_table(tied, "d", served=False) == {1: {None: 0}, 2: {None: 2}}
    with pytest.raises(ValueError, match="no batch or concurrency load with a candidate of the draft other2"):
        recommended_table(data, "other2", served=False)


def rows(schedule, prompts):
    schedule.start(0)
    schedule.add_rows(len(prompts), prompt_tokens=prompts)
    return schedule.lengths()


@pytest.mark.parametrize("prompts, gamma, expected", [
    # one row: batch 1's. Context = prompt + 1; bins meet at sqrt(256 * 4096) = 1024
    ([100], 4, [4]), ([3000], 4, [2]), ([100], 3, [3]),  # gamma caps K
    # three rows: the largest tabulated batch at or below 3, batch 2's; a long row off
    ([100, 3000, 1022], 4, [2, 0, 2]),
    ([1023], 4, [4]),  # context 1024, where the bins meet (4x from each): the shorter bin
])
def test_lengths_by_batch_and_context(prompts, gamma, expected):
    assert rows(RecommendedSchedule(gamma, TABLE), prompts) == expected


def test_the_batch_shrinking_and_contexts_growing_change_k():
    schedule = RecommendedSchedule(4, TABLE)
    assert rows(schedule, [100, 3000, 1000]) == [2, 0, 2]  # batch 2's row
    schedule.select_rows([1, 2])  # the first row finished: still batch 2's
    assert schedule.lengths() == [0, 2]
    # a round: the long row took a plain step (1 token), the other accepted 1 of 2 (2 tokens): 3002 and 1003
    schedule.update([0, 2], [0, 1])
    assert schedule.contexts == [3002, 1003] and schedule.lengths() == [0, 2]
    schedule.select_rows([1])  # one row left: batch 1's; 1003 still in the short bin
    assert schedule.lengths() == [4]
    schedule.update([4], [4])  # 1003 + 5 = 1008
    schedule.update([4], [4])  # 1013
    schedule.update([4], [4])  # 1018
    schedule.update([4], [4])  # 1023
    assert schedule.lengths() == [4]
    schedule.update([4], [1])  # 1025: past 1024, the long bin
    assert schedule.contexts == [1025] and schedule.lengths() == [2]
    schedule.add_rows(1, prompt_tokens=[50])  # a request joins: batch 2's again
    assert schedule.lengths() == [0, 2]


def test_the_schedule_needs_its_table():
    with pytest.raises(ValueError, match="speculative.recommendation"):
        make_schedule("recommended", 4)
    with pytest.raises(ValueError, match="K >= 0"):
        RecommendedSchedule(4, {1: {None: -1}})


# ---- in the engine: exact whatever K -----------------------------------------------------------------------------

# contexts run from the prompts (2..13 tokens) to ~37: K 3 and 1 for one row, off and 2 for three or more
ENGINE_TABLE = {1: {8: 3, 24: 1}, 3: {8: 0, 24: 2}}


@pytest.mark.parametrize("served", [False, True], ids=["static", "served"])
def test_greedy_output_equals_the_baseline(served):
    target = tiny_model("llama", seed=1, layers=3)
    draft = noisy_copy(target, 0.05, seed=5)
    ids, mask = ragged_batch([6, 13, 2, 9, 4])
    generation = Generation(max_new_tokens=24)
    load = Load([0.0, 0.0, 0.0, 0.0, 0.0], 3) if served else None
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        drafter = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=RecommendedSchedule(4, ENGINE_TABLE))
        spec = generate_speculative(target, drafter, ids, mask, generation, 4, load=load)
    for row, (b, s) in enumerate(zip(base, spec)):
        assert s.output_ids == b.output_ids, f"row {row} diverged"
    drafted = [r["drafted"] for s in spec for r in s.rounds]
    assert 0 in drafted and {1, 2, 3} & set(drafted) and max(drafted) <= 3  # off rows, drafting rows; never gamma 4


# ---- rows the schedule idles leave the draft idle ----------------------------------------------------------------

IDLE_TABLE = {1: {None: 2}, 2: {None: 0}}  # K 2 alone, off with company


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
        idle = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=RecommendedSchedule(4, IDLE_TABLE))
        eager = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=make_schedule("constant", 4))
        for drafter in (idle, eager):
            drafter.reset()
            drafter.add_rows(ids[:1], mask[:1])  # alone: K 2, prefilled now
            drafter.add_rows(ids[1:], mask[1:])  # with company: K 0
    assert idle.forwards == 1 and eager.forwards == 2
    assert idle.state.mask_host.shape[0] == 2 and not idle.state.mask_host[1].any()
    assert idle.pending == [[], ids[1, -6:].tolist()]


def test_idled_rows_cost_no_draft_forward_and_stay_exact(monkeypatch):
    """Five requests at concurrency 2, the greedy output the target's whatever the table. Drafting only when alone:
    rows that only ever ran with company never cost the draft a forward (not even a prefill). Drafting with company
    at short contexts only: a long row joining a draft cache that exists joins it empty."""
    target = tiny_model("llama", seed=1, layers=3)
    draft = noisy_copy(target, 0.05, seed=5)
    ids, mask = ragged_batch([6, 13, 2, 9, 4])  # contexts 7, 14, 3, 10, 5 at the first round
    generation = Generation(max_new_tokens=12, eos_token_ids=(54,))
    empty_joins, real = [], KVState.add_empty_rows
    monkeypatch.setattr(KVState, "add_empty_rows", lambda self, rows: (empty_joins.append(rows), real(self, rows)))
    with torch.inference_mode():
        alone = [generate_baseline(target, ids[i:i + 1], mask[i:i + 1], generation)[0].output_ids for i in range(5)]
        served = {}
        for name, table in {"alone": IDLE_TABLE, "short": {1: {None: 2}, 2: {4: 2, 16: 0}}}.items():
            drafter = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=RecommendedSchedule(4, table))
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
    assert empty_joins == [1]


def test_a_joining_row_is_prefilled_where_its_tokens_left_repay_its_own_forward():
    """By hand: K 2 at one and two rows, 0.01 s saved a token, 0.001 s a row-token fed, 12 tokens a request (11 left
    as a row joins: 0.11 s). A row joining beside others is prefilled in a forward of its own: 100 tokens cost 0.1 s,
    repaid (a round's catch-up at two rows would cost 0.2 s); 120 tokens, 0.12 s, wait in the pending tokens."""
    draft = tiny_model("llama", seed=2)
    ids, mask = ragged_batch([8, 100, 120])
    schedule = RecommendedSchedule(4, {1: {None: 2}, 2: {None: 2}}, ({1: {None: 0.01}, 2: {None: 0.01}}, 0.001), 12)
    with torch.inference_mode():
        drafter = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=schedule)
        drafter.reset()
        for row, n in enumerate([8, 100, 120]):  # each as the engine admits it: its own width, no left padding
            drafter.add_rows(ids[row:row + 1, -n:], mask[row:row + 1, -n:])
    assert drafter.forwards == 2
    assert drafter.pending == [[], [], ids[2, -120:].tolist()]


def test_rows_joining_together_pay_one_forward_as_wide_as_the_widest():
    """By hand: K 2 at two rows; a row saves 0.03 s a token at context 50 and 0.01 s at 300 (every row's forward runs
    over the batch's longest cache: beside a 300-token row, a short one saves the lower, 0.01 s); 0.001 s a row-token
    fed; 32 tokens (31 left as they join). Rows of 49 and 299 tokens joining together are fed in one forward of 2
    rows x 299 (0.598 s) and save 31 x 0.01 x 2 = 0.62 s: repaid; fed 320 wide (0.64 s) they are not (the short row's
    own 49 tokens at its own 0.03 s would have been: 0.93 s against 0.098 s). Where the table runs the long context off
    at two rows, the short row saves nothing beside it and the two wait."""
    def joined(long_k):
        table = {1: {50: 3, 300: 3}, 2: {50: 2, 300: long_k}}
        prices = ({1: {50: 0.05, 300: 0.04}, 2: {50: 0.03, 300: 0.01 if long_k else 0.0}}, 0.001)
        schedule = RecommendedSchedule(4, table, prices, 32)
        schedule.start(0)
        schedule.add_rows(2, prompt_tokens=[49, 299])
        return schedule

    both = joined(2)
    assert both.lengths() == [2, 2]
    assert both.joining_repaid([0, 1], 299) and not both.joining_repaid([0, 1], 320)
    short_only = joined(0)
    assert short_only.lengths() == [2, 0] and not short_only.joining_repaid([0, 1], 1)


def shrinking(waiting=0, **options):
    """Three rows in flight with 5, 12 and 20 tokens left of 32 (27, 20 and 12 so far) at K 2, at most four in flight
    (the cap: no growth to weigh); a fourth, a 100-token prompt, joins where four rows run off."""
    schedule = RecommendedSchedule(4, {1: {None: 3}, 2: {None: 2}, 4: {None: 0}},
                                   ({1: {None: 0.01}, 2: {None: 0.004}, 4: {None: 0.0}}, 0.001), 32, most_rows=4,
                                   **options)
    schedule.start(0)
    schedule.add_rows(3, prompt_tokens=[10, 20, 30])
    schedule.update([2, 2, 2], [25, 18, 10])
    schedule.queued(waiting)
    schedule.add_rows(1, prompt_tokens=[100])
    return schedule


def test_a_newcomer_is_priced_at_the_fewer_rows_it_outlives_the_batch_at():
    """By hand: K 3 alone (0.01 s a token), K 2 at two or three rows (0.004 s), off at four (nothing); 0.001 s a
    row-token fed. The newcomer's 31 tokens: 5 at four rows (0), 7 at three (0.028 s), 8 at two (0.032 s), 11 alone
    (0.11 s): 0.17 s, which repays its own prefill 160 wide (0.16 s), not 180 (0.18 s), though its K is 0 now. With a
    request waiting, the first row to end is refilled: 12 at four rows, 8 at three (0.032 s), 11 at two (0.044 s):
    0.076 s, 70 wide, not 80. A row near its end outlives none: the first saves 5 x 0 s."""
    alone = shrinking()
    assert alone.lengths() == [0, 0, 0, 0]
    assert alone.joining_repaid([3], 160) and not alone.joining_repaid([3], 180)
    queued = shrinking(waiting=1)
    assert queued.joining_repaid([3], 70) and not queued.joining_repaid([3], 80)
    assert alone.catch_up_saving(0) == 0.0


def test_rows_that_end_are_refilled_as_requests_arrive():
    """By hand, the batch above with requests arriving at 0.1 a second and a plain step 0.3 s a token at four rows:
    the rows beside the newcomer end after 1.5, 3.6 and 6 s (5, 12 and 20 tokens), by when 0.15, 0.36 and 0.6
    requests are expected (Poisson). After the first end: three rows with probability e^-0.15 = 0.8607, else four:
    7 x 0.004 x 0.8607 = 0.02410 s; after the second: two or three rows (e^-0.36 (1 + 0.36) = 0.9488): 8 x 0.004 x
    0.9488 = 0.03036 s; after the third: alone with e^-0.6 = 0.5488 (0.01 s a token), two or three rows with 0.4281
    (0.004): 11 x 0.00720 = 0.07921 s. 0.1337 s in all (0.17 s where nobody arrives) repays 130 tokens, not 135."""
    schedule = shrinking(plain={1: {None: 0.2}, 2: {None: 0.25}, 4: {None: 0.3}})
    schedule.queued(0, 0.1)
    assert schedule.catch_up_saving(3) == pytest.approx(
        7 * 0.004 * math.exp(-0.15) + 8 * 0.004 * math.exp(-0.36) * 1.36
        + 11 * (0.01 * math.exp(-0.6) + 0.004 * math.exp(-0.6) * (0.6 + 0.18)))
    assert schedule.joining_repaid([3], 130) and not schedule.joining_repaid([3], 135)
    many = RecommendedSchedule(4, {1: {None: 3}, 2: {None: 2}}, ({1: {None: 0.01}, 2: {None: 0.004}}, 0.001), 512,
                               plain={1: {None: 0.2}, 2: {None: 0.25}})
    many.start(0)
    many.add_rows(300, prompt_tokens=list(range(10, 310)))
    many.update([0] * 300, list(range(300)))  # tokens left 510 down to 211
    many.queued(0, 50.0)  # 50 a second: thousands expected by each end, every row that ends refilled
    assert many.catch_up_saving(0) == pytest.approx(510 * 0.004)  # (no overflow at large means)


def test_a_newcomer_is_priced_by_what_its_prefill_lets_the_batch_save():
    """By hand, the batch above where four rows run off by the table but a round of K 2 at four rows is priced at a
    decode speedup of 1.2 and 2 tokens a row (its cost in plain steps: 4 x 2 / 1.2 = 6.667), a plain step 0.3 s a
    token. Every row caught up, the newcomer riding: 8 tokens, value 1.2; held: 7 tokens, 1.05. Until the first row
    ends (5 tokens) the batch's 1.5 s off become 1.5 / 1.05 held and 1.5 / 1.2 with it: 0.1786 s, on top of its own
    0.17 s: 0.3486 s repays 340 tokens, not 350. The first row's draft behind (5 tokens pending, held either way): 7
    tokens (1.05) against 6 (0.9: off), 1.5 x (1 - 1 / 1.05) = 0.0714 s: 240 tokens, not 245. A request waiting
    refills that row: 12 tokens, 0.4286 s + its own 0.076 s: 500, not 510. Without the plain step's price, none."""
    options = {"rounds": {1: {None: {2: (1.5, 2.0)}}, 2: {None: {2: (1.3, 2.0)}}, 4: {None: {2: (1.2, 2.0)}}},
               "plain": {1: {None: 0.2}, 2: {None: 0.25}, 4: {None: 0.3}}}
    caught_up = shrinking(**options)
    assert caught_up.enabling([3], [1, 1, 1]) == pytest.approx(1.5 * (1 / 1.05 - 1 / 1.2))
    assert caught_up.joining_repaid([3], 340, [1, 1, 1]) and not caught_up.joining_repaid([3], 350, [1, 1, 1])
    assert caught_up.joining_repaid([3], 240, [5, 1, 1]) and not caught_up.joining_repaid([3], 245, [5, 1, 1])
    queued = shrinking(waiting=1, **options)
    assert queued.joining_repaid([3], 500, [1, 1, 1]) and not queued.joining_repaid([3], 510, [1, 1, 1])
    assert shrinking(rounds=options["rounds"]).enabling([3], [1, 1, 1]) == 0.0
    static = RecommendedSchedule(4, {4: {None: 0}}, ({4: {None: 0.0}}, 0.001), 32, **options)
    static.start(0)
    static.add_rows(4, prompt_tokens=[100] * 4)  # a batch that starts together: the table's off stands
    assert static.enabling([0, 1, 2, 3], []) == 0.0 and not static.joining_repaid([0, 1, 2, 3], 1, [])
    free = RecommendedSchedule(4, {4: {None: 0}}, ({4: {None: 0.0}}, 0.0), 32)  # a free prefill saving nothing
    free.start(0)
    free.add_rows(4, prompt_tokens=[100] * 4)
    assert not free.joining_repaid([0, 1, 2, 3], 100, [])


def test_a_newcomer_whose_k_is_0_now_is_prefilled_where_the_batch_shrinking_repays_it():
    """The drafter asks the schedule as the row joins: the same batch as above (its rows prefilled as they joined),
    a newcomer of 160 tokens is prefilled in a forward of its own; one of 180 waits in the pending tokens, as does
    the 160 one where a request waits to refill the first row that ends."""
    draft = tiny_model("llama", seed=2)
    ids, mask = ragged_batch([10, 20, 30, 160])
    results = {}
    for name, width, waiting in (("repaid", 160, 0), ("wide", 180, 0), ("queued", 160, 1)):
        ids, mask = ragged_batch([10, 20, 30, width])
        schedule = RecommendedSchedule(4, {1: {None: 3}, 2: {None: 2}, 4: {None: 0}},
                                       ({1: {None: 0.01}, 2: {None: 0.004}, 4: {None: 0.0}}, 0.001), 32, most_rows=4)
        with torch.inference_mode():
            drafter = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=schedule)
            drafter.reset()
            for row, n in enumerate([10, 20, 30]):
                drafter.add_rows(ids[row:row + 1, -n:], mask[row:row + 1, -n:])
            schedule.update([2, 2, 2], [25, 18, 10])
            forwards = drafter.forwards
            drafter.queued(waiting)
            drafter.add_rows(ids[3:, -width:], mask[3:, -width:])
        results[name] = (drafter.forwards - forwards, len(drafter.pending[3]))
    assert results == {"repaid": (1, 0), "wide": (0, 180), "queued": (0, 160)}


def test_held_rows_keep_the_draft_cache_whole():
    """The draft a copy of the target: where its cache holds exactly each row's tokens, every draft is accepted. A
    long row off with company builds a backlog in rounds nobody drafts and is held when a short newcomer drafts (K 2
    below a context of 8 with company): its cache must stay whole, and, held after its prefill, its records say so
    ("lagging", with its catch-ups)."""
    target = tiny_model("llama", seed=1, layers=3)
    ids, mask = ragged_batch([2, 30, 2, 2])
    with torch.inference_mode():
        drafter = DraftModelDrafter(noisy_copy(target, 0.0), VOCAB, Sampling(),
                                    schedule=RecommendedSchedule(4, {1: {None: 2}, 2: {4: 2, 16: 0}}))
        served = generate_speculative(target, drafter, ids, mask, Generation(max_new_tokens=20), 4,
                                      load=Load([0.0] * 4, 2))
    rounds = [r for s in served for r in s.rounds if r["drafted"]]
    assert rounds and all(r["accepted"] == r["drafted"] for r in rounds)
    long_row = served[1].rounds
    assert not any(r["drafted"] for r in long_row) and any(r.get("lagging") for r in long_row)
    assert all(r["catch_up"] == 0 for r in long_row if r.get("lagging"))  # held: fed nothing it had waited with


def test_rows_whose_tokens_left_cannot_repay_their_catch_up_stay_off():
    """The same five requests with prices at which no row's catch-up is repaid (a row saves a microsecond a token, a
    forward costs a second a row-token fed): every row joined with company, off, and none drafts when it is alone
    either; the output is still the target's."""
    target = tiny_model("llama", seed=1, layers=3)
    draft = noisy_copy(target, 0.05, seed=5)
    ids, mask = ragged_batch([6, 13, 2, 9, 4])
    generation = Generation(max_new_tokens=12, eos_token_ids=(54,))
    prices = ({1: {None: 1e-6}, 2: {None: 0.0}}, 1.0)
    with torch.inference_mode():
        alone = [generate_baseline(target, ids[i:i + 1], mask[i:i + 1], generation)[0].output_ids for i in range(5)]
        drafter = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=RecommendedSchedule(4, IDLE_TABLE, prices, 12))
        served = generate_speculative(target, drafter, ids, mask, generation, 4, load=Load([0.0] * 5, 2))
    assert [s.output_ids for s in served] == alone
    assert all(r["drafted"] == 0 for s in served for r in s.rounds) and all(s.draft_forwards == 0 for s in served)


def test_a_catch_up_is_paid_where_the_tokens_left_repay_it():
    """By hand: alone, K 3 saves 0.01 s a token; with company K 2 saves 0.004 s; a forward costs 0.001 s a row-token
    fed; 32 tokens a request, at most two in flight (the batch's growth is weighed in the test below). A row's tokens
    left are 32 less those it has (its prefill's first, then accepted + 1)."""
    schedule = RecommendedSchedule(4, {1: {None: 3}, 2: {None: 2}}, ({1: {None: 0.01}, 2: {None: 0.004}}, 0.001), 32,
                                   most_rows=2)
    schedule.start(0)
    schedule.add_rows(1, prompt_tokens=[100])
    assert schedule.catch_up_repaid(0, 300) and not schedule.catch_up_repaid(0, 320)  # 31 left: 0.31 s saved
    schedule.update([3], [2])  # 3 more tokens: 28 left, 0.28 s
    assert schedule.catch_up_repaid(0, 270) and not schedule.catch_up_repaid(0, 290)
    # two rows: the forward feeds both rows' width (0.002 s a token). The newcomer saves 0.004 s a token for the 28
    # the first row has left, then 0.01 s alone for its last 3: 0.142 s
    schedule.add_rows(1, prompt_tokens=[10])
    assert schedule.catch_up_repaid(1, 70) and not schedule.catch_up_repaid(1, 72)
    assert schedule.catch_up_repaid(0, 55) and not schedule.catch_up_repaid(0, 57)  # the first: 28 x 0.004 = 0.112 s
    assert RecommendedSchedule(4, {1: {None: 3}}).catch_up_repaid(0, 10 ** 6)  # without prices: drafts where K says


def test_a_catch_up_is_weighed_by_how_long_the_batch_lasts():
    """By hand: K 3 alone, K 2 at two or three rows (0.004 s a token), off at four (nothing saved); a forward costs
    0.001 s a row-token fed; 32 tokens a request. A row alone for 9 rounds, then two join before one round: one growth
    in 9 rounds that could grow, so a batch lasts m = (9 + 32) / 1 = 41 rounds. A joiner of 31 tokens left at a token a
    round makes E[min(X, 31)] / 31 = (41 / 31)(1 - e^(-31/41)) = 0.7016 of them before the next growth, after which
    (four rows) it saves nothing: 31 x 0.004 x 0.7016 = 0.0870 s, which repays 29 tokens fed at three rows (0.087 s),
    not 30; at two tokens a round (`rounds`) the share is (41 / 15.5)(1 - e^(-15.5/41)) = 0.8327: 34 tokens, not 35.
    A batch that has not grown, one at the load's cap, and one that only replaces the row that left are priced as
    before: 31 x 0.004 = 0.124 s repays 41 tokens at three rows, not 42 (the replaced row's companions have 30 tokens
    left, it outlives them alone for its last: 30 x 0.004 + 0.01 = 0.13 s, 43 tokens, not 44)."""
    table, prices = {1: {None: 3}, 2: {None: 2}, 4: {None: 0}}, ({1: {None: 0.01}, 2: {None: 0.004}, 4: {None: 0.0}}, 0.001)

    def joined(**options):
        schedule = RecommendedSchedule(4, table, prices, 32, **options)
        schedule.start(0)
        schedule.add_rows(1, prompt_tokens=[100])
        for _ in range(9):
            schedule.update([0], [0])
        schedule.add_rows(1, prompt_tokens=[10])
        schedule.add_rows(1, prompt_tokens=[20])  # before a round: the same growth
        return schedule

    grown = joined()
    assert grown.growths == 1 and grown.lengths() == [2, 2, 2]
    assert grown.catch_up_repaid(2, 29) and not grown.catch_up_repaid(2, 30)
    faster = joined(rounds={2: {None: {2: (1.2, 2.0)}}, 4: {None: {}}})
    assert faster.catch_up_repaid(2, 34) and not faster.catch_up_repaid(2, 35)
    capped = joined(most_rows=3)  # three rows in flight at most: the batch cannot grow
    assert capped.catch_up_repaid(2, 41) and not capped.catch_up_repaid(2, 42)
    replaced = RecommendedSchedule(4, table, prices, 32)
    replaced.start(0)
    replaced.add_rows(3, prompt_tokens=[100, 10, 30])
    replaced.update([0, 0, 0], [0, 0, 0])
    replaced.select_rows([1, 2])  # one leaves, one joins: three rows as before
    replaced.add_rows(1, prompt_tokens=[20])
    assert replaced.growths == 0
    assert replaced.catch_up_repaid(2, 43) and not replaced.catch_up_repaid(2, 44)
    emptied = RecommendedSchedule(4, table, prices, 32)
    emptied.start(0)
    emptied.add_rows(1, prompt_tokens=[100])
    emptied.update([0], [0])
    emptied.start(0)  # the batch emptied (the drafter's reset): the next rows start a batch, they do not grow one
    emptied.add_rows(2, prompt_tokens=[10, 20])
    assert emptied.growths == 0


def test_a_lone_catch_up_is_weighed_by_how_long_it_stays_alone():
    """By hand, at most two rows in flight: alone, K 3 saves 0.01 s a token, with company K 2 0.004 s; 0.001 s a
    row-token fed; 32 tokens. A row alone for 9 rounds, one joins (a growth), 5 rounds at the cap (not rounds the
    batch could grow in), the first leaves: m = (9 + 32) / 1 = 41. The joiner (10-token prompt, 6 tokens so far: 26
    left, a token a round) makes (41 / 26)(1 - e^(-26/41)) = 0.7405 of them alone, the rest with company: 26 x
    (0.7405 x 0.01 + 0.2595 x 0.004) = 0.2195 s, which repays 219 tokens fed alone, not 220 (as if the batch lasted:
    0.26 s, 260 tokens; the rounds at the cap counted: m = 46, 223 tokens)."""
    schedule = RecommendedSchedule(4, {1: {None: 3}, 2: {None: 2}}, ({1: {None: 0.01}, 2: {None: 0.004}}, 0.001), 32,
                                   lone={None: (3, 0.01)}, most_rows=2)
    schedule.start(0)
    schedule.add_rows(1, prompt_tokens=[100])
    for _ in range(9):
        schedule.update([0], [0])
    schedule.add_rows(1, prompt_tokens=[10])
    for _ in range(5):
        schedule.update([0, 0], [0, 0])
    # at the cap the batch cannot grow: the first row's 17 tokens left at two rows (0.004 s a token), the joiner's
    # last 9 alone (0.01 s): 0.158 s repays 78 tokens fed at two rows (0.156 s), not 80 (0.160 s)
    assert schedule.catch_up_repaid(1, 78) and not schedule.catch_up_repaid(1, 80)
    schedule.select_rows([1])
    assert schedule.growths == 1 and schedule.lengths() == [3]
    assert schedule.catch_up_repaid(0, 219) and not schedule.catch_up_repaid(0, 220)


def test_a_k_tied_with_off_is_off():
    """A K whose predicted speedup's 95% interval reaches 1 cannot be told from off: the table leaves it out (off, or
    the best K whose interval is above 1, and saves nothing a token where off); one above 1 is followed."""
    def load(n, interval, *more):
        return {"load": f"conc={n}", "context": None,
                "candidates": [{**chain(2, 1.05), "speedup_ci95": interval, "decode_speedup": 1.25}, *more,
                               {**off(), "tok_s": 4.0}]}
    data = {"loads": [load(1, [1.01, 1.1]), load(2, [0.99, 1.1]), load(4, [1.0, 1.1]),
                      load(8, [1.0, 1.1], {**chain(4, 1.02), "speedup_ci95": [1.01, 1.03]}),
                      load(16, [1.0, 1.1], {**chain(4, 1.02), "speedup_ci95": [None, None]})],
            "draft_prefill": {"draft:d": {"intercept_s": 0.0, "s_per_row_token": 0.001}}}
    assert recommended_table(data, "d", served=True) == {1: {None: 2}, 2: {None: 0}, 4: {None: 0}, 8: {None: 4},
                                                         16: {None: 4}}
    data["loads"] = data["loads"][:3]
    assert catch_up_prices(data, "d", served=True)[0] == {1: {None: pytest.approx(0.25 * 0.2)},  # 1 / 4 x (1 - 1 / 1.25)
                                                          2: {None: 0.0}, 4: {None: 0.0}}


def test_catch_up_prices_by_hand():
    """recommend.json -> each load's saving a token once the draft has caught up: off's seconds a token (its TPOT,
    0.2 s, where the load has one, else concurrency / its tok/s: 4 / 10) x (1 - 1 / the K's decode speedup: after the
    prefills, which a catch-up is charged for apart); 0 where off is recommended; and the draft's prefill slope. None
    where the file has no draft prefill line, or the recommended K no decode speedup."""
    def k(gamma, speedup, decode_speedup):
        return {**chain(gamma, speedup), "decode_speedup": decode_speedup}
    data = {"loads": [{"load": "conc=1", "context": None,
                       "candidates": [k(2, 1.25, 1.5), {**off(), "tok_s": 4.0, "tpot_mean_ms": 200.0}]},
                      {"load": "conc=2", "context": None, "candidates": [k(2, 0.9, 1.2), {**off(), "tok_s": 7.0}]},
                      {"load": "conc=4", "context": None, "candidates": [k(3, 1.6, 2.0), {**off(), "tok_s": 10.0}]}],
            "draft_prefill": {"draft:d": {"intercept_s": 0.01, "s_per_row_token": 0.002}}}
    savings, slope = catch_up_prices(data, "d", served=True)
    assert slope == 0.002
    assert savings[1][None] == pytest.approx(0.2 / 3) and savings[2][None] == 0.0
    assert savings[4][None] == pytest.approx(0.4 * 0.5)
    assert catch_up_prices({"loads": data["loads"]}, "d", served=True) is None
    lacking = json.loads(json.dumps(data))
    del lacking["loads"][2]["candidates"][0]["decode_speedup"]
    assert catch_up_prices(lacking, "d", served=True) is None


def test_lone_prices_by_hand():
    """recommend.json -> at the load of one row, context -> (the best K, a K tied with off included; the seconds a
    token saves once the draft has the context: off's seconds a token (its TPOT, 0.15 s, where the load has one, else
    1 / its tok/s) x (1 - 1 / the K's decode speedup)), while the table's row of one runs the tied K off; off where no K is above off, or where the best K's decode speedup is not above 1. None
    without a load of one row or without decode speedups."""
    def load(n, context, *candidates, tok_s=5.0, **tpot):
        return {"load": f"conc={n}", "context": context, "candidates": [*candidates, {**off(), "tok_s": tok_s, **tpot}]}

    def k(gamma, speedup, interval, decode_speedup):
        return {**chain(gamma, speedup), "speedup_ci95": interval, "decode_speedup": decode_speedup}
    data = {"loads": [load(1, 75, k(3, 1.2, [1.05, 1.3], 1.35), k(2, 1.1, [1.02, 1.2], 1.3), tpot_mean_ms=150.0),
                      load(1, 310, k(2, 1.01, [0.95, 1.08], 1.2), k(3, 1.03, [0.98, 1.10], 1.25)),
                      load(1, 1200, k(3, 0.97, [0.9, 1.05], 1.1)), load(1, 5000, k(2, 1.02, [0.9, 1.1], 0.99)),
                      load(2, 75, k(3, 1.1, [1.02, 1.2], 1.3), tok_s=8.0)]}
    assert recommended_table(data, "d", served=True) == {1: {75: 3, 310: 0, 1200: 0, 5000: 0}, 2: {75: 3}}
    assert lone_prices(data, "d", served=True) == {75: (3, pytest.approx(0.15 * 0.35 / 1.35)),
                                                   310: (3, pytest.approx(0.2 / 5)), 1200: (0, 0.0), 5000: (0, 0.0)}
    assert lone_prices({"loads": data["loads"][4:]}, "d", served=True) is None  # no load of one row
    lacking = json.loads(json.dumps(data))
    del lacking["loads"][1]["candidates"][1]["decode_speedup"]
    assert lone_prices(lacking, "d", served=True) is None


def test_a_row_alone_is_decided_by_its_own_catch_up():
    """By hand: the table runs a long context off at one row (its K 3 tied with off) and alone the row saves 0.04 s a
    token at K 3; the draft's forward costs 0.003 s a row-token fed; 32 tokens a request. A row of a 309-token prompt
    (context 310, 31 tokens left: 1.24 s) drafts K 3 where its catch-up is up to 413 tokens (1.239 s), not 414; with
    company the table's off (and its saving of 0) stands; without `lone`, or without catch-up prices to weigh it
    with, the row alone is off (the table's)."""
    table = {1: {75: 3, 310: 0}, 2: {75: 3, 310: 0}}
    catch_up = ({1: {75: 0.05, 310: 0.0}, 2: {75: 0.02, 310: 0.0}}, 0.003)
    schedule = RecommendedSchedule(4, table, catch_up, 32, lone={75: (3, 0.05), 310: (3, 0.04)})
    schedule.start(0)
    schedule.add_rows(1, prompt_tokens=[309])
    assert schedule.lengths() == [3]
    assert schedule.catch_up_repaid(0, 413) and not schedule.catch_up_repaid(0, 414)
    schedule.add_rows(1, prompt_tokens=[74])
    assert schedule.lengths() == [0, 3] and not schedule.catch_up_repaid(0, 2)
    schedule.select_rows([0])  # the short row left: alone again
    assert schedule.lengths() == [3] and schedule.catch_up_repaid(0, 2)
    without = RecommendedSchedule(4, table, catch_up, 32)
    unpriced = RecommendedSchedule(4, table, None, 32, lone={75: (3, 0.05), 310: (3, 0.04)})  # nothing weighs it
    for schedule in (without, unpriced):
        schedule.start(0)
        schedule.add_rows(1, prompt_tokens=[309])
        assert schedule.lengths() == [0]
    assert not without.catch_up_repaid(0, 2)


def test_a_lone_row_drafts_where_the_table_has_it_off_and_stays_exact():
    """Three requests one at a time, the table off at one row: with `lone` at a K of 2 and a saving that repays any
    catch-up, every request drafts from its first round and the output is the target's; at a saving that repays none
    (a microsecond a token against a millisecond a prompt token), or without `lone`, none drafts, and the draft runs
    no forward, not even a prefill as the row joins."""
    target = tiny_model("llama", seed=1, layers=3)
    draft = noisy_copy(target, 0.05, seed=5)
    ids, mask = ragged_batch([6, 13, 9])
    generation = Generation(max_new_tokens=12)
    with torch.inference_mode():
        alone = [generate_baseline(target, ids[i:i + 1], mask[i:i + 1], generation)[0].output_ids for i in range(3)]
        served = {}
        for name, lone in {"lone": {None: (2, 1.0)}, "unrepaid": {None: (2, 1e-6)}, "table": None}.items():
            schedule = RecommendedSchedule(4, {1: {None: 0}}, ({1: {None: 0.0}}, 1e-3), 12, lone=lone)
            drafter = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=schedule)
            served[name] = generate_speculative(target, drafter, ids, mask, generation, 4, load=Load([0.0] * 3, 1))
            assert [s.output_ids for s in served[name]] == alone, name
    assert all(s.rounds[0]["drafted"] == 2 and s.draft_forwards > 0 for s in served["lone"])
    for name in ("unrepaid", "table"):
        assert all(r["drafted"] == 0 for s in served[name] for r in s.rounds), name
        assert all(s.draft_forwards == 0 for s in served[name]), name


def test_round_prices_by_hand():
    """recommend.json -> batch -> context -> K -> (predicted decode speedup, tokens per round), for every K of the
    draft, a K tied with off included (a row rides along at it), the faster of two candidates of one K (here a draft
    window's); None where a candidate lacks either."""
    def load(context, *candidates):
        return {"load": "conc=2", "context": context, "candidates": [*candidates, off(), *NOT_OURS]}

    def priced(k, decode_speedup, tokens, **axes):
        return {**chain(k, 1.0, **axes), "decode_speedup": decode_speedup, "tokens_per_round": tokens}
    data = {"loads": [load(75, priced(3, 1.2, 3.0), priced(1, 1.1, 1.7), priced(3, 1.1, 2.9, draft_context=64)),
                      load(310, {**priced(3, 0.9, 2.7), "speedup_ci95": [0.8, 1.0]})]}
    assert round_prices(data, "d", served=True) == {2: {75: {3: (1.2, 3.0), 1: (1.1, 1.7)}, 310: {3: (0.9, 2.7)}}}
    for missing in ("tokens_per_round", "decode_speedup"):
        lacking = json.loads(json.dumps(data))
        del lacking["loads"][1]["candidates"][0][missing]
        assert round_prices(lacking, "d", served=True) is None, missing


def test_plain_prices_by_hand():
    """recommend.json -> batch -> context -> a row's seconds a token off: off's TPOT (ms) where the load has one, else
    the batch over off's tok/s; None where off has neither."""
    def load(context, **figures):
        return {"load": "conc=2", "context": context, "candidates": [chain(2, 1.2), {**off(), **figures}]}
    data = {"loads": [load(75, tpot_mean_ms=250.0, tok_s=100.0), load(310, tok_s=5.0)]}
    assert plain_prices(data, "d", served=True) == {2: {75: 0.25, 310: 0.4}}
    assert plain_prices({"loads": [load(75)]}, "d", served=True) is None


# two rows at concurrency 2: K 3 at a context of 75, off at 310 (eval.recommend's K 3 there: 1.0, 2.7 tokens a round)
ROUNDS = {2: {75: {3: (1.2, 3.0), 1: (1.1, 1.7)}, 310: {3: (1.0, 2.7), 1: (0.95, 1.5)}}}


def two_rows(rounds=ROUNDS):
    schedule = RecommendedSchedule(4, {2: {75: 3, 310: 0}}, rounds=rounds)
    schedule.start(0)
    schedule.add_rows(2, prompt_tokens=[74, 309])
    assert schedule.lengths() == [3, 0]
    return schedule


def test_a_round_is_weighed_as_a_whole():
    """By hand: both rows' forwards run over the longest cache, so a round of K 3 costs each row tokens / decode
    speedup at the long context, 2.7 / 1.0 = 2.7 plain steps, 5.4 for the two, against 2 plain steps' 2 tokens (a
    value of 1 a row-step)."""
    schedule = two_rows()
    # the long row held (a backlog of 300 beyond the short row's 1): 3.0 + 1 tokens for 5.4, 0.74: off for both
    assert schedule.round_lengths([3, 0], [1, 300], [4, 4]) == [0, 0]
    # its cache current (within the catch-up's width): it drafts the round's K too, 3.0 + 2.7 for 5.4, 1.06
    assert schedule.round_lengths([3, 0], [1, 1], [4, 4]) == [3, 3]
    # the short row one token from its end drafts 1: a round of K 1, 1.7 + 1.5 tokens for 2 x 1.5 / 0.95 = 3.16
    # plain steps, 1.01: both draft 1
    assert schedule.round_lengths([1, 0], [1, 1], [1, 4]) == [1, 1]
    # the long row one token from its end: it drafts what it may (0), and the round is 3.0 + 1 for 5.4: off
    assert schedule.round_lengths([3, 0], [1, 1], [4, 0]) == [0, 0]
    # a dearer round at the long context: 3.0 + 2.7 tokens for 2 x 2.7 / 0.9 = 6.0, 0.95: off (each row's own
    # context's cost, 2.5 + 3.0 = 5.5, would have drafted)
    assert two_rows({2: {75: ROUNDS[2][75], 310: {3: (0.9, 2.7), 1: (0.95, 1.5)}}}).round_lengths(
        [3, 0], [1, 1], [4, 4]) == [0, 0]
    # a full accept's last draft beside a row that accepted less (one token ahead) rides; two ahead, it is held
    assert schedule.round_lengths([3, 0], [0, 1], [4, 4]) == [3, 3]
    assert schedule.round_lengths([3, 0], [0, 2], [4, 4]) == [0, 0]
    # two rows at the short context: K 3 as the table says, 6.0 for 2 x 3.0 / 1.2 = 5.0 (1.2); the best K, not the
    # first above 1: K 1 is 3.4 for 2 x 1.7 / 1.1 = 3.09 (1.1)
    schedule.contexts[1] = 75
    assert schedule.round_lengths([3, 3], [1, 1], [4, 4]) == [3, 3]
    assert schedule.round_lengths([3, 1], [1, 1], [4, 4]) == [3, 3]
    slower = two_rows({2: {75: {3: (1.05, 3.0), 1: (1.1, 1.7)}, 310: ROUNDS[2][310]}})  # K 3: 6.0 for 5.71, 1.05
    slower.contexts[1] = 75
    assert slower.round_lengths([3, 1], [1, 1], [4, 4]) == [1, 1]
    # without a price for the K, or without prices: as the table says
    assert two_rows({2: {75: {3: (1.2, 3.0)}, 310: {1: (0.95, 1.5)}}}).round_lengths([3, 0], [1, 1], [4, 4]) == [3, 0]
    assert two_rows(None).round_lengths([3, 0], [1, 300], [4, 4]) == [3, 0]


def test_rows_whose_draft_has_caught_up_draft_on_where_the_table_is_off():
    """By hand, the table off for both rows (its end-to-end figure charges each row's prefill); rows whose draft cache
    has caught up (a backlog of at most one token) weigh every priced K at the longest context (ROUNDS at 310: K 1
    (0.95, 1.5), K 3 (1.0, 2.7)): K 1 is 1.7 + 1.5 tokens for 2 x 1.5 / 0.95 = 3.16 plain steps (1.01), K 3 is 3.0 +
    2.7 for 2 x 2.7 / 1.0 = 5.4 (1.06): both draft 3. At gamma 2 only K 1 is weighed: both draft 1. The long row
    behind by 300 is held: K 1 is 1.7 + 1 for 3.16 (0.85), K 3 is 3.0 + 1 for 5.4 (0.74): off. Neither caught up:
    off, as the table says. A dearer long context (K 3 at 0.9: 5.7 for 6.0, 0.95) leaves K 1."""
    def off_rows(gamma=4, rounds=ROUNDS):
        schedule = RecommendedSchedule(gamma, {2: {75: 0, 310: 0}}, rounds=rounds)
        schedule.start(0)
        schedule.add_rows(2, prompt_tokens=[74, 309])
        assert schedule.lengths() == [0, 0]
        return schedule

    assert off_rows().round_lengths([0, 0], [1, 1], [4, 4]) == [3, 3]
    assert off_rows(2).round_lengths([0, 0], [1, 1], [2, 2]) == [1, 1]
    assert off_rows().round_lengths([0, 0], [1, 300], [4, 4]) == [0, 0]
    assert off_rows().round_lengths([0, 0], [2, 2], [4, 4]) == [0, 0]
    dearer = {2: {75: ROUNDS[2][75], 310: {3: (0.9, 2.7), 1: (0.95, 1.5)}}}
    assert off_rows(rounds=dearer).round_lengths([0, 0], [1, 1], [4, 4]) == [1, 1]


def test_rows_ride_along_where_the_round_pays_and_none_drafts_where_it_does_not():
    """A static batch of a short and a long row, the table K 2 for the short one with company and off otherwise (alone
    too). Priced so that the long row riding along pays (2.0 + 1.8 tokens for 2 x 1.8 / 1.0 = 3.6 plain steps at the
    longest context: 1.06; at K 1, 1.5 + 1.4 for 2.8), it drafts every round the short one does though its K is 0;
    priced so that it does not (1.2 tokens at a speedup of 0.5: 3.2 for 4.8, 0.67; at K 1, 1.5 + 1.1 for 2 x 1.1 /
    0.6 = 3.67, 0.71), no round drafts; without prices the short row drafts alone. The output is the target's in
    each."""
    target = tiny_model("llama", seed=1, layers=3)
    draft = noisy_copy(target, 0.05, seed=5)
    ids, mask = ragged_batch([2, 30])  # contexts 3 and 31: bins 4 and 64 (they meet at 16; the short row ends at 15)
    generation = Generation(max_new_tokens=12)
    table = {1: {4: 0, 64: 0}, 2: {4: 2, 64: 0}}

    def prices(long_2, long_1):  # the long row's K 2 and K 1 (the short row's last rounds draft 1)
        at = {4: {2: (1.05, 2.0), 1: (1.02, 1.5)}, 64: {2: long_2, 1: long_1}}
        return {1: at, 2: at}
    with torch.inference_mode():
        base = generate_baseline(target, ids, mask, generation)
        runs = {}
        for name, rounds in {"ride": prices((1.0, 1.8), (1.0, 1.4)), "off": prices((0.5, 1.2), (0.6, 1.1)),
                             "table": None}.items():
            drafter = DraftModelDrafter(draft, VOCAB, Sampling(), schedule=RecommendedSchedule(4, table, rounds=rounds))
            runs[name] = generate_speculative(target, drafter, ids, mask, generation, 4)
            assert [s.output_ids for s in runs[name]] == [b.output_ids for b in base], name
    short, long_ = ([r["drafted"] for r in s.rounds] for s in runs["ride"])
    # while both are in flight every round drafts, both rows (but the short row's last, which may have nothing to
    # draft); then the long one alone is off
    assert all(short[:-1]) and all(b for a, b in zip(short, long_) if a) and not any(long_[len(short):])
    assert max(long_) <= 2
    assert not any(r["drafted"] for s in runs["off"] for r in s.rounds)
    short, long_ = ([r["drafted"] for r in s.rounds] for s in runs["table"])
    assert any(short) and not any(long_)


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
    data = {"profile_meta": {"target_model": "qwen2.5-coder-1.5b-instruct"}, "loads": LOADS}
    assert config(tmp_path, data).speculative.recommendation == str(tmp_path / "recommend.json")


@pytest.mark.parametrize("data, fragment", [
    (None, "cannot read"),
    ("{not json", "is not JSON"),
    ({"rows": []}, "has no loads"),
    ({"profile_meta": {"target_model": "llama-3-8b"}, "loads": LOADS}, "recommends for the target llama-3-8b"),
    ({"loads": [{"load": "batch=1", "context": None, "candidates": [chain(2, 1.2, draft="other"), off()]}]},
     "candidate of the draft d"),
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
    data = {"profile_meta": {"target_model": "qwen2.5-coder-1.5b-instruct"},
            "loads": [{"load": f"conc={c}", "context": 128, "candidates": [chain(2, 1.2, draft=draft), off()]}
                      for c in (1, 2, 4)]}
    (tmp_path / "recommend.json").write_text(json.dumps(data))
    loaded, _ = load_config(Path(__file__).resolve().parents[2] / "configs/recommended-schedule.yaml",
                            ["speculative.schedule=[constant,recommended]",
                             f"speculative.recommendation={tmp_path / 'recommend.json'}"])
    assert loaded.speculative.schedule == ["constant", "recommended"] and loaded.speculative.gamma == [1, 2, 3, 4]
    assert loaded.load.request_rate == [0.05, 0.5] and loaded.load.concurrency == [4]


def test_a_round_timed_slower_than_priced_stops_being_chosen():
    """By hand: four rows at one context that the table runs off, their drafts caught up; K 2 priced at a decode
    speedup of 1.2 and 2.4 tokens a round (2.0 plain steps a round: a value of 1.2, so they draft on), a plain step
    at 0.2 s. Timed: plain steps at 0.2 s (measured / priced 1.0) and K 2 rounds at 0.6 s against 0.2 x 2.0 = 0.4
    priced (1.5). From the third of each (after the first, left out), K 2 costs 2.0 x 1.5 = 3.0 plain steps, a
    value of 0.8: off."""
    schedule = RecommendedSchedule(2, {4: {None: 0}}, rounds={4: {None: {2: (1.2, 2.4)}}}, plain={4: {None: 0.2}})
    schedule.start(0)
    schedule.add_rows(4, prompt_tokens=[99] * 4)
    caught_up = ([0] * 4, [1] * 4, [2] * 4)  # the table's K, each row's backlog, each row's cap
    assert schedule.round_lengths(*caught_up) == [2] * 4
    schedule.timed(5.0, 4, 0, 1)  # the first round of each shape: its one-time costs, left out
    schedule.timed(5.0, 4, 2, 1)
    for _ in range(3):
        schedule.timed(0.2, 4, 0, 1)
    schedule.timed(0.6, 4, 2, 1)
    schedule.timed(0.6, 4, 2, 2)
    schedule.timed(9.0, 4, 2, 300)  # a round that fed a backlog: its catch-up's seconds, left out
    schedule.timed(9.0, 3, 2, 1)  # a round of another batch size: not this one's
    assert schedule._timing(2) == 1.0 and schedule.round_lengths(*caught_up) == [2] * 4  # two K 2 rounds: as priced
    schedule.timed(0.6, 4, 2, 1)
    assert schedule._timing(2) == pytest.approx(1.5) and schedule.round_lengths(*caught_up) == [0] * 4
    # rounds timed as priced against plain steps that ran slow too (a slower sitting of the machine): K 2 again
    slower = RecommendedSchedule(2, {4: {None: 0}}, rounds={4: {None: {2: (1.2, 2.4)}}}, plain={4: {None: 0.2}})
    slower.start(0)
    slower.add_rows(4, prompt_tokens=[99] * 4)
    for seconds, width in ((9.0, 0), (0.3, 0), (0.3, 0), (0.9, 0), (9.0, 2), (0.6, 2), (0.6, 2), (0.6, 2)):
        slower.timed(seconds, 4, width, 1)
    assert slower._timing(2) == pytest.approx(1.0) and slower.round_lengths(*caught_up) == [2] * 4
