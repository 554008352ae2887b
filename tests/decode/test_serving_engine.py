"""Serving under a load (decode/arrivals.py): requests arrive, wait for a free row, join the running batch between
rounds and leave. Greedy output per request is the target's own for every drafter, sampling stays the target's
distribution, and the queue's times (arrival, admission, first token, emissions, finish) follow the schedule."""
import pytest
import torch

from decode import DraftModelDrafter, Generation, Sampling, generate_baseline, generate_speculative
from decode.drafters.early_exit import EarlyExitDrafter
from decode.drafters.hybrid import HybridDrafter
from decode.drafters.prompt_lookup import PromptLookupDrafter
from decode.drafters.schedules import ConstantSchedule, make_schedule
from decode.drafters.suffix import SuffixCache, SuffixDrafter
from decode.drafters.draft_tree import DynamicTree, StaticTree
from decode.kv import KVState
from decode.arrivals import Load, Queue, prefill_batches
from decode.tree_layout import static_parents
from stats import PROMPT, V, chi_square, exact_joint_of_tokens_2_and_3, joint_counts, sampling_pair
from test_compiled_engine import compiled_copy
from test_hybrid_suffix import CHEAP, _repetitive
from test_sliding_window import tiny_windowed
from tiny_models import VOCAB, noisy_copy, tiny_model

LENGTHS = [6, 13, 3, 9, 1, 11, 5, 8, 2]  # 9 requests
GREEDY = Sampling()
LOADS = {"all-at-once-c1": Load([0.0] * 9, 1), "all-at-once-c3": Load([0.0] * 9, 3),
         "staggered-c4": Load([0.0, 0.0, 0.004, 0.01, 0.012, 0.02, 0.03, 0.031, 0.045], 4)}


def drafters(target, draft):
    """Each drafter of our engine, built fresh (name -> drafter)."""
    def chain(schedule):
        return DraftModelDrafter(draft, VOCAB, GREEDY, schedule=make_schedule(schedule, 4))
    c, v = CHEAP
    return {
        "chain-constant": chain("constant"),
        "chain-heuristic": chain("heuristic"),
        "chain-window": DraftModelDrafter(draft, VOCAB, GREEDY, context=4),  # the draft reads the prompt's last 4
        "static-tree": DraftModelDrafter(draft, VOCAB, GREEDY, tree=StaticTree(static_parents([3, 2, 1, 1]), GREEDY)),
        "dynamic-tree": DraftModelDrafter(draft, VOCAB, GREEDY, tree=DynamicTree(budget=10, top_k=3, sampling=GREEDY)),
        "prompt_lookup": PromptLookupDrafter(),
        "early_exit": EarlyExitDrafter(target, 1, VOCAB, GREEDY),
        "suffix": SuffixDrafter(SuffixCache(depth=12), depth=12),
        "hybrid": HybridDrafter(DraftModelDrafter(draft, VOCAB, GREEDY), VOCAB, 4, c, v, cache=SuffixCache(depth=8)),
    }


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", seed=1, layers=3)
    ids, mask = _repetitive(LENGTHS, seed=3)
    generation = Generation(max_new_tokens=14, eos_token_ids=(54,))  # some requests stop at it
    with torch.inference_mode():
        alone = [generate_baseline(target, ids[i:i + 1, -n:], mask[i:i + 1, -n:], generation)[0].output_ids
                 for i, n in enumerate(LENGTHS)]
    return target, noisy_copy(target, 0.15), ids, mask, generation, alone


def count_joins(monkeypatch) -> list[int]:
    """Per KVState.join into a running batch: the rows that were running (the join happened between rounds)."""
    joins, real = [], KVState.join

    def join(self, other):
        joins.append(self.mask.shape[0])
        real(self, other)
    monkeypatch.setattr(KVState, "join", join)
    return joins


def lengths_of(records) -> list[list[tuple]]:
    return [[(rd["drafted"], rd["accepted"], rd["emitted"]) for rd in r.rounds] for r in records]


@pytest.fixture(scope="module")
def fixed_rounds(pair):
    """Each drafter's rounds per row in a fixed batch of the 9 prompts: a drafter whose choices are the row's own (all
    but hybrid, whose estimators pool the rows) drafts and accepts the same per request when served."""
    target, draft, ids, mask, generation, _ = pair
    with torch.inference_mode():
        return {name: lengths_of(generate_speculative(target, drafter, ids, mask, generation, 4))
                for name, drafter in drafters(target, draft).items() if name != "hybrid"}


@pytest.mark.parametrize("load", list(LOADS))
def test_greedy_under_load_equals_the_target_alone(pair, fixed_rounds, load, monkeypatch):
    target, draft, ids, mask, generation, alone = pair
    joins = count_joins(monkeypatch)
    with torch.inference_mode():
        served = {"baseline": generate_baseline(target, ids, mask, generation, load=LOADS[load])}
        for name, drafter in drafters(target, draft).items():
            served[name] = generate_speculative(target, drafter, ids, mask, generation, 4, load=LOADS[load])
    for name, records in served.items():
        assert [r.output_ids for r in records] == alone, f"{name}: a request's output differs from the target's"
        if name != "baseline":
            rounds = [rd for r in records for rd in r.rounds]
            assert any(rd["accepted"] > 0 for rd in rounds), f"{name} never had a draft accepted"
            assert any(rd["accepted"] < rd["drafted"] for rd in rounds), f"{name} never had a draft rejected"
        if name in fixed_rounds:  # the joined drafter state (caches, indexes, schedules) is each row's own
            assert lengths_of(records) == fixed_rounds[name], f"{name}: a request drafted otherwise when served"
    assert any(r.stop_reason == "eos" for r in served["baseline"]) and any(
        r.stop_reason == "length" for r in served["baseline"])
    if LOADS[load].concurrency > 1:  # requests joined batches that were running (target's and drafts' caches)
        assert joins and max(joins) > 1
    else:  # one row at a time: every request starts a batch of its own
        assert not joins


def test_greedy_draft_chain_under_load_with_a_sliding_window(monkeypatch):
    """Joins left pad the narrower cache: a windowed cache (counted in slots) stays hole-free, past the window."""
    target = tiny_windowed("mistral", 8, seed=1)
    draft = noisy_copy(target, 0.03)
    ids, mask = _repetitive(LENGTHS, seed=4)
    generation = Generation(max_new_tokens=16)
    joins = count_joins(monkeypatch)
    with torch.inference_mode():
        alone = [generate_baseline(target, ids[i:i + 1, -n:], mask[i:i + 1, -n:], generation)[0].output_ids
                 for i, n in enumerate(LENGTHS)]
        for load in LOADS.values():
            records = generate_speculative(target, DraftModelDrafter(draft, VOCAB, GREEDY), ids, mask, generation, 3,
                                           load=load)
            assert [r.output_ids for r in records] == alone
            assert any(rd["accepted"] < rd["drafted"] for r in records for rd in r.rounds)
    assert joins


def test_speculative_sampling_under_load_matches_target_distribution():
    sampling = Sampling(True, 1.0)
    target, draft = sampling_pair()
    requests = 8000
    ids = PROMPT.expand(requests, -1).contiguous()
    generation = Generation(max_new_tokens=4, sampling=sampling)  # tokens 2 and 3 come from a request's first round
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        records = generate_speculative(target, DraftModelDrafter(draft, V, sampling, generator), ids,
                                       torch.ones_like(ids), generation, gamma=2, generator=generator,
                                       load=Load([0.0] * requests, 2000))
    # most requests joined a running batch, their first round beside rows in their second or third
    assert sum(r.admitted_s > records[0].admitted_s for r in records) > requests / 2
    first = [r.rounds[0] for r in records]
    assert 0.05 < sum(rd["accepted"] for rd in first) / sum(rd["drafted"] for rd in first) < 0.95
    statistic, critical = chi_square(joint_counts(records), exact_joint_of_tokens_2_and_3(target, sampling))
    assert statistic < critical, f"served sampling is off the target's distribution: chi2 {statistic:.1f} > {critical:.1f}"


def check_times(records, generation):
    for r in records:
        assert r.first_token_s >= r.admitted_s >= r.arrival_s
        assert r.prefill_s == pytest.approx(r.first_token_s - r.arrival_s)
        assert r.latency_s == pytest.approx(r.finish_s - r.arrival_s)
        times = [t for t, _ in r.emits]
        assert times == sorted(times) and times[0] == r.first_token_s and times[-1] == r.finish_s
        assert sum(n for _, n in r.emits) == r.new_tokens and all(n >= 1 for _, n in r.emits)


def test_arrivals_of_unlike_length_are_prefilled_apart_shortest_first():
    # sorted 74, 82, 283, 292: 82 joins 74 (2 x 82 = 164 wide for 156 tokens: 5% padding); 283 would make it 3 x 283
    # = 849 wide for 439 tokens (48%), so it starts the next, and 292 joins it (584 for 575: 2%)
    assert prefill_batches([0, 1, 2, 3], [74, 283, 82, 292]) == [[0, 2], [1, 3]]
    # 74 with 128: 256 wide for 202 tokens, 21% padding (within a quarter): one forward; 74 with 283: 37%, two
    assert prefill_batches([5, 6], [74, 128]) == [[5, 6]]
    assert prefill_batches([6, 5], [283, 74]) == [[5], [6]]
    assert prefill_batches([4, 2], [9, 9]) == [[4, 2]]  # like lengths keep their admission order
    assert prefill_batches([], []) == []


def test_a_moments_arrivals_are_prefilled_in_forwards_of_like_length(monkeypatch):
    """Three requests at once (prompts 5, 9, 3 tokens): 3 and 5 share a forward 5 wide (20% padding), 9 has its own,
    after it; each request's TTFT is its own forward's end, its target_s its forward's seconds alone."""
    import decode.generate as engine

    target = tiny_model("llama", seed=1, layers=2)
    ids, mask = _repetitive([5, 9, 3], seed=0)
    shapes, real = [], engine.prefill

    def prefill(model, prompt_ids, prompt_mask):
        shapes.append(tuple(prompt_ids.shape))
        return real(model, prompt_ids, prompt_mask)
    monkeypatch.setattr(engine, "prefill", prefill)
    with torch.inference_mode():
        served = generate_baseline(target, ids, mask, Generation(max_new_tokens=4), load=Load([0.0] * 3, 3))
        shapes_served, shapes[:] = list(shapes), []
        static = generate_baseline(target, ids, mask, Generation(max_new_tokens=4))
    assert shapes_served == [(2, 5), (1, 9)]
    assert shapes == [(3, 9)]  # a static batch: one forward over every row
    assert [r.output_ids for r in served] == [r.output_ids for r in static]
    assert served[0].admitted_s == served[2].admitted_s < served[0].first_token_s == served[2].first_token_s
    assert served[1].admitted_s == served[0].first_token_s < served[1].first_token_s  # its forward began after
    assert served[1].target_s >= served[1].first_token_s - served[1].admitted_s  # its forward, then its steps
    assert served[1].prefill_s == pytest.approx(served[1].first_token_s)  # arrived at 0


@pytest.mark.parametrize("method", ["baseline", "speculative"])
def test_queue_waits_count_in_ttft(method):
    target = tiny_model("llama", seed=1, layers=2)
    ids, mask = _repetitive([5, 9, 3], seed=0)
    generation = Generation(max_new_tokens=10)

    def serve(load):
        if method == "baseline":
            return generate_baseline(target, ids, mask, generation, load=load)
        return generate_speculative(target, DraftModelDrafter(noisy_copy(target, 0.1), VOCAB, GREEDY), ids, mask,
                                    generation, 3, load=load)
    with torch.inference_mode():
        queued = serve(Load([0.0, 0.0, 0.0], 1))
        # the third arrives well after the first two can finish together: 3 x what two took one after the other on
        # this machine just now (a fixed 0.2 s failed on a loaded 2-core machine)
        arrival = 3 * queued[1].finish_s
        late = serve(Load([0.0, 0.0, arrival], 2))
    check_times(queued, generation)
    check_times(late, generation)
    # one row at a time: request k is admitted once request k - 1 has finished, and its TTFT holds the wait
    for before, after in zip(queued, queued[1:]):
        assert after.admitted_s >= before.finish_s
        assert after.prefill_s >= after.admitted_s - after.arrival_s > 0
    assert all(r.new_tokens == 10 for r in queued)
    if method == "speculative":  # a round's accepted drafts and the target's token come in one emission
        assert any(n > 1 for r in queued for _, n in r.emits)
    # the third arrives after the first two finished: the loop waits for it, not admitting it earlier
    assert max(r.finish_s for r in late[:2]) < arrival <= late[2].admitted_s
    assert late[2].prefill_s == pytest.approx(late[2].first_token_s - arrival)
    assert late[0].admitted_s == late[1].admitted_s  # both at once: one prefill for the two


def test_the_drafter_hears_how_many_requests_wait_for_a_row():
    """Three requests at once, one row: as each is admitted the others still wait (2, then 1, then none), and the
    drafter whose schedule reads the queue (Schedule.reads_queue) is told before each
    admission and each round, with the rate they arrived at so far: none for a burst; one whose schedule does not is
    never told (the loop does not scan the queue for it). The rate by hand: n - 1 gaps over the first to the last
    arrival seen, nothing of those not yet arrived."""
    target = tiny_model("llama", seed=1, layers=2)
    ids, mask = _repetitive([5, 9, 3], seed=0)
    heard, rates = {}, {}

    class Listening(DraftModelDrafter):
        def queued(self, requests, rate=None):
            heard.setdefault(self.name, []).append(requests)
            rates.setdefault(self.name, []).append(rate)
            super().queued(requests, rate)

    class Reading(ConstantSchedule):
        reads_queue = True

    with torch.inference_mode():
        for name, schedule in (("reading", Reading(3)), ("constant", make_schedule("constant", 3))):
            drafter = Listening(noisy_copy(target, 0.1), VOCAB, GREEDY, schedule=schedule)
            drafter.name = name
            generate_speculative(target, drafter, ids, mask, Generation(max_new_tokens=6), 3,
                                 load=Load([0.0, 0.0, 0.0], 1))
    told = heard["reading"]
    assert told == sorted(told, reverse=True) and sorted(set(told)) == [0, 1, 2] and "constant" not in heard
    assert rates["reading"] == [None] * len(told)
    queue = Queue(Load([1.0, 2.0, 4.0, 100.0], 1))
    assert queue.rate(1.5) is None and queue.rate(5.0) == pytest.approx(2 / 3)
    queue.admit(5.0, 1)  # admitted or waiting, an arrival counts the same
    assert queue.rate(5.0) == pytest.approx(2 / 3) and queue.rate(100.0) == pytest.approx(3 / 99)
    assert queue.waiting(5.0) == 2 and queue.waiting(100.0) == 3  # 1.0 admitted; 2.0 and 4.0 wait, then 100.0
    # a follower arrives when its turn before it ends: request 1 follows request 0 by 0.5 s of thinking
    queue = Queue(Load([0.0, 0.0, 3.0], 1, follows=[None, 0, None], think_s=0.5))
    assert queue.waiting(1.0) == 1 and queue.admit(1.0, 1) == [0] and queue.waiting(1.0) == 0
    assert queue.finished(0, 2.0) == [1]  # arrives at 2.5
    assert [queue.waiting(t) for t in (2.4, 2.6, 3.0)] == [0, 1, 2]
    assert queue.rate(3.0) == pytest.approx(2 / 3)  # arrivals 0.0, 2.5, 3.0: two gaps over 3 s


def test_the_schedule_times_each_round_it_proposed():
    """The engine tells a drafter what each round it proposed took (Drafter.timed), and the draft model's drafter its
    schedule: the rows, the round's width (the most a row drafted, 0 for a plain step) and the tokens it fed a row,
    each round a positive time."""
    target = tiny_model("llama", seed=1, layers=2)
    ids, mask = _repetitive([5, 9], seed=0)
    told = []

    class Timing(ConstantSchedule):
        def timed(self, seconds, rows, width, fed):
            told.append((seconds, rows, width, fed))

    schedule = Timing(3)
    drafter = DraftModelDrafter(noisy_copy(target, 0.1), VOCAB, GREEDY, schedule=schedule)
    with torch.inference_mode():
        records = generate_speculative(target, drafter, ids, mask, Generation(max_new_tokens=6), 3)
    rounds = max(len(r.rounds) for r in records)
    assert told and all(seconds > 0 and rows in (1, 2) and 0 <= width <= 3 and 0 <= fed <= 4
                        for seconds, rows, width, fed in told)
    assert any(width == 3 for _, _, width, _ in told) and len(told) <= rounds


@pytest.mark.parametrize("method", ["baseline", "speculative"])
def test_a_conversations_next_turn_arrives_after_its_previous_answer(method):
    """Request 1 follows request 0 (a conversation's turn 2): it arrives think_s after request 0's last token, and
    request 2, on the schedule at 0, takes the one slot before it (arrival order, not index order)."""
    target = tiny_model("llama", seed=1, layers=2)
    ids, mask = _repetitive([5, 9, 3], seed=0)
    generation = Generation(max_new_tokens=6)
    think = 0.05
    load = Load([0.0, 0.0, 0.0], 1, follows=[None, 0, None], think_s=think)
    with torch.inference_mode():
        if method == "baseline":
            served = generate_baseline(target, ids, mask, generation, load=load)
        else:
            served = generate_speculative(target, DraftModelDrafter(noisy_copy(target, 0.1), VOCAB, GREEDY), ids,
                                          mask, generation, 3, load=load)
        alone = [generate_baseline(target, ids[i:i + 1], mask[i:i + 1], generation)[0].output_ids for i in range(3)]
    check_times(served, generation)
    assert [r.output_ids for r in served] == alone
    first, follower, other = served
    assert follower.arrival_s == pytest.approx(first.finish_s + think)
    assert first.finish_s <= other.admitted_s < follower.arrival_s  # request 2 went first: it had arrived
    assert follower.admitted_s >= other.finish_s  # one slot: the follower waited for request 2


def test_a_load_refuses_a_request_that_follows_a_later_one():
    with pytest.raises(ValueError, match="follows"):
        Load([0.0, 0.0], 1, follows=[1, None]).check(2)
    with pytest.raises(ValueError, match="think"):
        Load([0.0, 0.0], 1, follows=[None, 0], think_s=-1.0).check(2)
    Load([0.0, 5.0, 1.0], 1, follows=[None, None, 0]).check(3)  # a follower's own arrival is not used


def test_fixed_batch_records_have_no_serving_fields_and_a_load_needs_its_arrivals():
    target = tiny_model("llama", seed=1, layers=2)
    ids, mask = _repetitive([5, 9], seed=0)
    generation = Generation(max_new_tokens=4)
    with torch.inference_mode():
        records = generate_baseline(target, ids, mask, generation)
        assert all(r.arrival_s is None and r.emits is None and r.finish_s is None for r in records)
        with pytest.raises(ValueError, match="arrival times"):
            generate_baseline(target, ids, mask, generation, load=Load([0.0], 2))


@pytest.mark.parametrize("name", ["heuristic", "cost_model"])
def test_a_joining_row_starts_as_a_new_batchs_row_and_the_others_keep_their_state(name):
    import copy

    schedule = make_schedule(name, 4, c=0.05, v={k: 1.0 + 0.05 * k for k in range(1, 5)})
    schedule.start(2)
    for _ in range(7):  # row 0 accepts everything, row 1 little: their lengths part (cost_model: a probe is due)
        lengths = schedule.lengths()
        schedule.update(lengths, [lengths[0], min(1, lengths[1])])
    before, fresh = copy.deepcopy(schedule), copy.deepcopy(schedule)
    schedule.add_rows(1)
    fresh.start(1)  # a new batch's row, with the same pool
    kept = before.lengths()  # (cost_model's lengths count rounds toward a probe: asked once each)
    assert schedule.lengths() == kept + fresh.lengths()
    assert kept[0] > kept[1]  # the rows had parted


def test_requests_done_at_their_first_token_never_join(pair):
    """A request whose first token is EOS (or whose budget is one token) leaves at its prefill; the rest of its group
    joins the running batch, cut to its own width."""
    target, draft, ids, mask, generation, alone = pair
    eos = alone[0][0]  # request 0's first token: it leaves its group of three at once
    cut = [output[:output.index(eos) + 1] if eos in output else output for output in alone]
    assert cut[0] == [eos] and sum(len(c) > 1 for c in cut) >= 6
    eos_generation = Generation(generation.max_new_tokens, GREEDY, (54, eos))
    with torch.inference_mode():
        fixed = lengths_of(generate_speculative(target, PromptLookupDrafter(), ids, mask, eos_generation, 4))
        for load in (LOADS["all-at-once-c3"], LOADS["staggered-c4"]):
            base = generate_baseline(target, ids, mask, eos_generation, load=load)
            spec = generate_speculative(target, DraftModelDrafter(draft, VOCAB, GREEDY), ids, mask, eos_generation, 4,
                                        load=load)
            lookup = generate_speculative(target, PromptLookupDrafter(), ids, mask, eos_generation, 4, load=load)
            assert [r.output_ids for r in base] == cut and [r.output_ids for r in spec] == cut
            assert lengths_of(lookup) == fixed  # the drafter got the prompts of the requests that joined
            assert spec[0].rounds == [] and spec[0].emits == [(spec[0].first_token_s, 1)] \
                and spec[0].finish_s == spec[0].first_token_s
        one = generate_speculative(target, DraftModelDrafter(draft, VOCAB, GREEDY), ids, mask,
                                   Generation(1, GREEDY), 4, load=LOADS["all-at-once-c3"])
    assert [r.output_ids for r in one] == [output[:1] for output in alone]
    assert all(r.rounds == [] and r.draft_forwards == 0 and r.target_forwards == 1 for r in one)


@pytest.mark.parametrize("name", ["chain-heuristic", "chain-window", "static-tree", "hybrid"])
def test_a_static_batch_is_the_serving_loop_with_every_request_at_once(pair, name):
    # one loop (decode/generate.py _Loop): a static batch and the same rows served all at once with room for every
    # one take the same rounds, row for row (drafted, accepted, emitted), and emit the same tokens
    target, draft, ids, mask, generation, _ = pair
    with torch.inference_mode():
        static = generate_speculative(target, drafters(target, draft)[name], ids, mask, generation, 4)
        served = generate_speculative(target, drafters(target, draft)[name], ids, mask, generation, 4,
                                      load=Load([0.0] * len(LENGTHS), len(LENGTHS)))
    facts = lambda rows: [[(r["drafted"], r["accepted"], r["emitted"]) for r in row.rounds] for row in rows]
    assert [r.output_ids for r in static] == [r.output_ids for r in served]
    assert facts(static) == facts(served)
    assert all(r.arrival_s is None and r.emits is None for r in static)  # a static batch's records carry no serving times
